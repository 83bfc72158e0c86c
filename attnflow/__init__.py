"""attnflow: self-attention dynamics as an interacting particle system, in JAX.

The one-system entry point is `simulate`; ensembles go through `solve_ensemble`; a
whole configured study (the `attnflow` command without Hydra) is `run(config)`, and a
figure of the literature is `run_experiment(name, overrides)`.

Names are imported on first use, so that `import attnflow` (and the command line)
only pays for the parts a run needs: matplotlib for plots, diffrax for adaptive runs.
"""

from __future__ import annotations

import importlib
import os

# JAX's CPU LAPACK kernels (eig, svd, qr) run on the OpenBLAS that scipy ships. Its own
# thread pool, stacked on XLA's threads, thrashed a small machine (the QK/OV spectra of
# SmolLM2: 45 s against 4 s with one thread); set before scipy loads, a user's own
# setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

_EXPORTS = {
    "_adaptive": ("RK4", "Retracted"),
    "_build": ("ConfiguredSystem", "build_field", "build_init", "build_system", "validate_config"),
    "_config": ("Config", "compose"),
    "_ensemble": ("EnsembleResult", "solve_ensemble"),
    "_errors": ("CheckpointError", "ConfigError", "NonFiniteStateError", "SolverFailure", "StorageError"),
    "analysis.equiangular": ("equiangular_rate", "equiangular_time"),
    "experiments": ("draw_experiment", "run_experiment"),
    "_field": ("VectorField",),
    "_geometry": ("AbstractGeometry", "Euclidean", "Sphere"),
    "_grid": ("grid_times", "save_steps", "save_times", "step_count"),
    "_initial": (
        "AbstractInitialCondition",
        "GaussianMixture",
        "Given",
        "Orthonormal",
        "SphericalCaps",
        "UniformCube",
        "UniformSphere",
    ),
    "analysis.spectrum": ("lyapunov_spectrum", "rotation_orbit"),
    "analysis.pair_exponents": ("Sensitivity", "token_sensitivity"),
    "_metrics": (
        "Recorder",
        "cluster_count",
        "cluster_labels",
        "cluster_sizes",
        "cosines",
        "gram",
        "interaction_energy",
        "log_interaction_energy",
        "normalized_energy",
        "numerical_rank",
        "order_parameter",
        "pair_density",
    ),
    "analysis.plateaus": ("Merges", "Plateaus", "detect_metastability", "merges", "partition_level", "plateaus"),
    "_plots": ("plot_summary", "summary_figure"),
    "_random_matrices": ("draw_matrix",),
    "_schedules": ("AbstractSchedule", "Constant", "Identity", "Interpolated", "PiecewiseConstant", "PiecewiseSchedule", "Scaled"),
    "_simulate": ("Solution", "simulate"),
    "_solvers": ("SOLVERS", "Tableau", "tableau"),
    "_store": ("Results", "load_results", "write_results"),
    "_study": ("run",),
    "_terms": ("MLP", "AbstractInteraction", "Rotary", "SelfAttention", "TokenNorm"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'attnflow' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
