"""The figures of the self-attention-dynamics literature, one experiment each.

An experiment is a config, `conf/experiment/NAME.yaml` (run as `attnflow
experiment=NAME`, any key overridable on top; the names of these files are the list of
experiments, `EXPERIMENTS`), and one subclass of `Experiment` in the module
`attnflow.experiments.NAME` that says what to compute beyond the core studies and how to
draw it: its `title` and `paper`, its `Options` (a dataclass, read as attributes), its
`check`, `panels`, `pieces`, `analyse`, and its static `draw` and `write_files` (see
`Experiment`). A researcher's own experiment is the same class in their own module, its
YAML in their own config folder naming it (`experiment._target_: module.Class`), run as
`attnflow --config-dir DIR experiment=NAME` (docs/extending.md). What several experiments
share lives in the private modules beside them (`_common`, `_phase_diagrams`,
`_random_laws`, `_spectra`, `_magnitudes`, `_text`, `_trained`), never in a sibling.

A plain study (`attnflow KEY=VALUE ...`, a config with `experiment: null`) runs through
the same pipeline as the experiment of one panel (`_plain_study.PlainStudy`, listed in
no help: it is not a figure): `plan_experiment(cfg)` checks and plans either kind,
`solve_experiment(plan)` solves it, `draw_experiment(ds, folder)` draws a study's
`summary.png` or an experiment's figures.

`run_experiment(name, overrides)` runs one from Python (`attnflow.run(config)` runs
either kind); `experiment_figures(ds)` returns its figures; `draw_experiment(ds, folder)`
writes them and the other files. The command line runs the same code and writes
`results.nc` and the figures into the run directory; `attnflow plot DIR` redraws them
from `results.nc`. `animate_states`, `animation` and `sphere_html` draw the GIF and the
interactive HTML view of stored token states.

Names are imported on first use (`lazy_loader`, from the names in `__init__.pyi`), so
that drawing a study's results (`draw_experiment`, `experiment_figures`: the module
`_registry`) loads no JAX.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
