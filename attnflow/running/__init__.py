"""Ensembles and studies: construction from the settings (`_build`, `_components`), the
ensemble planner and solver (`_ensemble`), a study from its config to its results
(`_study`) and the progress of a run (`_progress`). It imports the numerics, the storage
and the schema."""
