"""attnflow: self-attention dynamics as an interacting particle system, in JAX.

The one-system entry point is `simulate`; ensembles go through `solve_ensemble`; a
whole configured study (the `attnflow` command without Hydra) is `run(config)`.
"""

from ._build import ConfiguredSystem, build_field, build_init, build_system, save_plan, save_times, validate_config
from ._ensemble import EnsembleResult, solve_ensemble
from ._errors import ConfigError, NonFiniteStateError, SolverFailure
from ._field import VectorField
from ._geometry import AbstractGeometry, Euclidean, Sphere
from ._initial import (
    AbstractInitialCondition,
    GaussianMixture,
    Given,
    Orthonormal,
    SphericalCaps,
    UniformCube,
    UniformSphere,
)
from ._metrics import (
    Recorder,
    cluster_count,
    cluster_labels,
    cluster_sizes,
    cosines,
    gram,
    interaction_energy,
    log_interaction_energy,
    normalized_energy,
    numerical_rank,
    order_parameter,
    pair_density,
)
from ._plots import plot_summary
from ._random_matrices import draw as draw_matrix
from ._schedules import AbstractSchedule, Constant, Identity, PiecewiseConstant, PiecewiseSchedule, Scaled
from ._simulate import Solution, simulate
from ._solvers import RK4, SOLVERS, Retracted, solver_from_name
from ._study import load_results, run, write_results
from ._terms import MLP, AbstractInteraction, SelfAttention, TokenNorm

__all__ = [name for name in dir() if not name.startswith("_")]
