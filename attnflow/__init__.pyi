"""The public names of `attnflow`, for editors and type checkers; at run time
`lazy_loader` reads this stub and imports each name's module on first use."""

__version__: str
"""attnflow's version, from the installed package's metadata."""

from .analysis.equiangular import equiangular_rate as equiangular_rate
from .analysis.equiangular import equiangular_time as equiangular_time
from .analysis.meanfield import (
    MeanFieldSolution as MeanFieldSolution,
)
from .analysis.meanfield import (
    circle_growth_rate as circle_growth_rate,
)
from .analysis.meanfield import (
    circle_stationary_order as circle_stationary_order,
)
from .analysis.meanfield import (
    circle_wasserstein as circle_wasserstein,
)
from .analysis.meanfield import (
    meanfield_circle as meanfield_circle,
)
from .analysis.pair_exponents import Sensitivity as Sensitivity
from .analysis.pair_exponents import token_sensitivity as token_sensitivity
from .analysis.plateaus import (
    Merges as Merges,
)
from .analysis.plateaus import (
    Plateaus as Plateaus,
)
from .analysis.plateaus import (
    detect_metastability as detect_metastability,
)
from .analysis.plateaus import (
    merges as merges,
)
from .analysis.plateaus import (
    partition_level as partition_level,
)
from .analysis.plateaus import (
    plateaus as plateaus,
)
from .analysis.spectrum import lyapunov_spectrum as lyapunov_spectrum
from .analysis.spectrum import rotation_orbit as rotation_orbit
from .experiments import (
    draw_experiment as draw_experiment,
)
from .experiments import (
    experiment_figures as experiment_figures,
)
from .experiments import (
    run_experiment as run_experiment,
)
from .experiments._runner import run as run
from .numerics._adaptive import RK4 as RK4
from .numerics._adaptive import Retracted as Retracted
from .numerics._cross import CrossAttention as CrossAttention
from .numerics._field import VectorField as VectorField
from .numerics._geometry import AbstractGeometry as AbstractGeometry
from .numerics._geometry import Euclidean as Euclidean
from .numerics._geometry import Sphere as Sphere
from .numerics._grid import (
    TimeGrid as TimeGrid,
)
from .numerics._grid import (
    grid_times as grid_times,
)
from .numerics._grid import (
    save_steps as save_steps,
)
from .numerics._grid import (
    save_times as save_times,
)
from .numerics._grid import (
    step_count as step_count,
)
from .numerics._grid import (
    time_grid as time_grid,
)
from .numerics._initial import (
    AbstractInitialCondition as AbstractInitialCondition,
)
from .numerics._initial import (
    GaussianMixture as GaussianMixture,
)
from .numerics._initial import (
    Given as Given,
)
from .numerics._initial import (
    Orthonormal as Orthonormal,
)
from .numerics._initial import (
    SphericalCaps as SphericalCaps,
)
from .numerics._initial import (
    UniformCube as UniformCube,
)
from .numerics._initial import (
    UniformSphere as UniformSphere,
)
from .numerics._metrics import (
    MetricContext as MetricContext,
)
from .numerics._metrics import (
    Recorder as Recorder,
)
from .numerics._metrics import (
    cluster_count as cluster_count,
)
from .numerics._metrics import (
    cluster_labels as cluster_labels,
)
from .numerics._metrics import (
    cluster_sizes as cluster_sizes,
)
from .numerics._metrics import (
    cosines as cosines,
)
from .numerics._metrics import (
    gram as gram,
)
from .numerics._metrics import (
    interaction_energy as interaction_energy,
)
from .numerics._metrics import (
    log_interaction_energy as log_interaction_energy,
)
from .numerics._metrics import (
    normalized_energy as normalized_energy,
)
from .numerics._metrics import (
    numerical_rank as numerical_rank,
)
from .numerics._metrics import (
    order_parameter as order_parameter,
)
from .numerics._metrics import (
    pair_density as pair_density,
)
from .numerics._metrics import (
    sinkhorn_energy as sinkhorn_energy,
)
from .numerics._noise import (
    BrownianNoise as BrownianNoise,
)
from .numerics._noise import (
    attention_mode as attention_mode,
)
from .numerics._noise import (
    brownian_noise as brownian_noise,
)
from .numerics._noise import (
    critical_sigma as critical_sigma,
)
from .numerics._noise import (
    euler_critical_sigma as euler_critical_sigma,
)
from .numerics._noise import (
    euler_first_mode_factor as euler_first_mode_factor,
)
from .numerics._noise import (
    first_mode_rate as first_mode_rate,
)
from .numerics._random_matrices import draw_matrix as draw_matrix
from .numerics._schedules import (
    AbstractSchedule as AbstractSchedule,
)
from .numerics._schedules import (
    Constant as Constant,
)
from .numerics._schedules import (
    Identity as Identity,
)
from .numerics._schedules import (
    Interpolated as Interpolated,
)
from .numerics._schedules import (
    PiecewiseConstant as PiecewiseConstant,
)
from .numerics._schedules import (
    PiecewiseSchedule as PiecewiseSchedule,
)
from .numerics._schedules import (
    Scaled as Scaled,
)
from .numerics._simulate import Solution as Solution
from .numerics._simulate import simulate as simulate
from .numerics._solvers import SOLVERS as SOLVERS
from .numerics._solvers import Tableau as Tableau
from .numerics._solvers import tableau as tableau
from .numerics._terms import (
    MLP as MLP,
)
from .numerics._terms import (
    AbstractInteraction as AbstractInteraction,
)
from .numerics._terms import (
    Rotary as Rotary,
)
from .numerics._terms import (
    SelfAttention as SelfAttention,
)
from .numerics._terms import (
    TokenNorm as TokenNorm,
)
from .numerics._terms import (
    hardmax_weights as hardmax_weights,
)
from .numerics._terms import (
    sinkhorn_log as sinkhorn_log,
)
from .presentation._plots import plot_summary as plot_summary
from .presentation._plots import summary_figure as summary_figure
from .running._build import (
    ConfiguredSystem as ConfiguredSystem,
)
from .running._build import (
    Study as Study,
)
from .running._build import (
    build_field as build_field,
)
from .running._build import (
    build_init as build_init,
)
from .running._build import (
    build_system as build_system,
)
from .running._build import (
    resolve_study as resolve_study,
)
from .running._build import (
    validate_config as validate_config,
)
from .running._ensemble import EnsembleResult as EnsembleResult
from .running._ensemble import solve_ensemble as solve_ensemble
from .schema._config import Config as Config
from .schema._config import compose as compose
from .schema._errors import (
    CheckpointError as CheckpointError,
)
from .schema._errors import (
    ConfigError as ConfigError,
)
from .schema._errors import (
    NonFiniteStateError as NonFiniteStateError,
)
from .schema._errors import (
    RunNote as RunNote,
)
from .schema._errors import (
    SolverFailure as SolverFailure,
)
from .schema._errors import (
    StorageError as StorageError,
)
from .schema._harmonic_degree import harmonic_degree as harmonic_degree
from .schema._metric_registry import metric as metric
from .storage._store import Results as Results
from .storage._store import load_results as load_results
from .storage._store import write_atomically as write_atomically
from .storage._store import write_results as write_results

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
    "CrossAttention",
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
    "euler_critical_sigma",
    "euler_first_mode_factor",
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
    "harmonic_degree",
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
    "write_atomically",
    "write_results",
]
