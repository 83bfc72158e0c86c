"""The public names of `attnflow`, for editors and type checkers; at run time
`lazy_loader` reads this stub and imports each name's module on first use."""

__version__: str
"""attnflow's version, from the installed package's metadata."""

from ._adaptive import Retracted as Retracted, RK4 as RK4
from ._build import (
    build_field as build_field,
    build_init as build_init,
    build_system as build_system,
    ConfiguredSystem as ConfiguredSystem,
    resolve_study as resolve_study,
    Study as Study,
    validate_config as validate_config,
)
from ._config import compose as compose, Config as Config
from ._ensemble import EnsembleResult as EnsembleResult, solve_ensemble as solve_ensemble
from ._errors import (
    CheckpointError as CheckpointError,
    ConfigError as ConfigError,
    NonFiniteStateError as NonFiniteStateError,
    RunNote as RunNote,
    SolverFailure as SolverFailure,
    StorageError as StorageError,
)
from ._field import VectorField as VectorField
from ._noise import (
    BrownianNoise as BrownianNoise,
    attention_mode as attention_mode,
    brownian_noise as brownian_noise,
    critical_sigma as critical_sigma,
    first_mode_rate as first_mode_rate,
)
from ._geometry import AbstractGeometry as AbstractGeometry, Euclidean as Euclidean, Sphere as Sphere
from ._grid import (
    grid_times as grid_times,
    save_steps as save_steps,
    save_times as save_times,
    step_count as step_count,
    time_grid as time_grid,
    TimeGrid as TimeGrid,
)
from ._initial import (
    AbstractInitialCondition as AbstractInitialCondition,
    GaussianMixture as GaussianMixture,
    Given as Given,
    Orthonormal as Orthonormal,
    SphericalCaps as SphericalCaps,
    UniformCube as UniformCube,
    UniformSphere as UniformSphere,
)
from ._metric_registry import metric as metric
from ._metrics import (
    cluster_count as cluster_count,
    cluster_labels as cluster_labels,
    cluster_sizes as cluster_sizes,
    cosines as cosines,
    gram as gram,
    interaction_energy as interaction_energy,
    log_interaction_energy as log_interaction_energy,
    MetricContext as MetricContext,
    sinkhorn_energy as sinkhorn_energy,
    normalized_energy as normalized_energy,
    numerical_rank as numerical_rank,
    order_parameter as order_parameter,
    pair_density as pair_density,
    Recorder as Recorder,
)
from ._plots import plot_summary as plot_summary, summary_figure as summary_figure
from ._random_matrices import draw_matrix as draw_matrix
from ._schedules import (
    AbstractSchedule as AbstractSchedule,
    Constant as Constant,
    Identity as Identity,
    Interpolated as Interpolated,
    PiecewiseConstant as PiecewiseConstant,
    PiecewiseSchedule as PiecewiseSchedule,
    Scaled as Scaled,
)
from ._simulate import simulate as simulate, Solution as Solution
from ._solvers import SOLVERS as SOLVERS, Tableau as Tableau, tableau as tableau
from ._store import load_results as load_results, Results as Results, write_results as write_results
from ._study import run as run
from ._terms import (
    AbstractInteraction as AbstractInteraction,
    MLP as MLP,
    Rotary as Rotary,
    SelfAttention as SelfAttention,
    TokenNorm as TokenNorm,
    hardmax_weights as hardmax_weights,
    sinkhorn_log as sinkhorn_log,
)
from .experiments import (
    draw_experiment as draw_experiment,
    experiment_figures as experiment_figures,
    run_experiment as run_experiment,
)
from .analysis.equiangular import equiangular_rate as equiangular_rate, equiangular_time as equiangular_time
from .analysis.meanfield import (
    circle_growth_rate as circle_growth_rate,
    circle_stationary_order as circle_stationary_order,
    circle_wasserstein as circle_wasserstein,
    meanfield_circle as meanfield_circle,
    MeanFieldSolution as MeanFieldSolution,
)
from .analysis.pair_exponents import Sensitivity as Sensitivity, token_sensitivity as token_sensitivity
from .analysis.plateaus import (
    detect_metastability as detect_metastability,
    Merges as Merges,
    merges as merges,
    partition_level as partition_level,
    Plateaus as Plateaus,
    plateaus as plateaus,
)
from .analysis.spectrum import lyapunov_spectrum as lyapunov_spectrum, rotation_orbit as rotation_orbit

__all__ = [
    "AbstractGeometry",
    "AbstractInitialCondition",
    "AbstractInteraction",
    "AbstractSchedule",
    "CheckpointError",
    "Config",
    "ConfigError",
    "ConfiguredSystem",
    "Constant",
    "EnsembleResult",
    "Euclidean",
    "GaussianMixture",
    "Given",
    "Identity",
    "Interpolated",
    "MLP",
    "MeanFieldSolution",
    "Merges",
    "MetricContext",
    "NonFiniteStateError",
    "Orthonormal",
    "PiecewiseConstant",
    "PiecewiseSchedule",
    "Plateaus",
    "RK4",
    "Recorder",
    "Results",
    "Retracted",
    "Rotary",
    "RunNote",
    "SOLVERS",
    "Scaled",
    "SelfAttention",
    "Sensitivity",
    "Solution",
    "SolverFailure",
    "Sphere",
    "SphericalCaps",
    "StorageError",
    "Study",
    "Tableau",
    "TimeGrid",
    "TokenNorm",
    "UniformCube",
    "UniformSphere",
    "VectorField",
    "BrownianNoise",
    "brownian_noise",
    "attention_mode",
    "critical_sigma",
    "first_mode_rate",
    "build_field",
    "build_init",
    "build_system",
    "circle_growth_rate",
    "circle_stationary_order",
    "circle_wasserstein",
    "cluster_count",
    "cluster_labels",
    "cluster_sizes",
    "compose",
    "cosines",
    "detect_metastability",
    "draw_experiment",
    "draw_matrix",
    "equiangular_rate",
    "equiangular_time",
    "experiment_figures",
    "gram",
    "hardmax_weights",
    "grid_times",
    "interaction_energy",
    "load_results",
    "log_interaction_energy",
    "lyapunov_spectrum",
    "meanfield_circle",
    "merges",
    "metric",
    "normalized_energy",
    "numerical_rank",
    "order_parameter",
    "pair_density",
    "partition_level",
    "plateaus",
    "plot_summary",
    "resolve_study",
    "rotation_orbit",
    "run",
    "run_experiment",
    "save_steps",
    "save_times",
    "simulate",
    "sinkhorn_energy",
    "sinkhorn_log",
    "solve_ensemble",
    "step_count",
    "summary_figure",
    "tableau",
    "time_grid",
    "token_sensitivity",
    "validate_config",
    "write_results",
]
