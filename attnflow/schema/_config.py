"""The typed schema of a study's configuration, and how a config is composed.

The dataclasses below say what each key is (its type, its choices) and what it means
(its `help`, which `attnflow --help` shows); the YAML files in `conf/` (shipped as
`attnflow.conf`) hold the default values and nothing else. The command line composes
the files through Hydra, which checks the keys (the schema's keys are registered in
Hydra's ConfigStore and named in each YAML file's defaults list); each job then types
the values with `compose`, as the Python API does with the same files, through the one
schema mechanism of `_schema.py` (`typed`): types, booleans, choices and unknown keys
are checked against the schema, and a bad value becomes a one-sentence `ConfigError`.
Nothing here imports Hydra unless `register_schema` runs.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import importlib.resources
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf import errors as oc_errors

from ._errors import ConfigError
from ._methods import SOLVERS
from ._metric_registry import METRIC_NAMES
from ._schema import _keys_of, explain, kind_of, setting, to_container, typed
from .initial import INITS
from .initial import InitialCondition as InitConfig  # the schema's name for the base of every init kind
from .weights import KINDS as WEIGHT_KINDS

# The choices come from the components that implement them, read without JAX (the
# solvers' table, the kinds of initial condition and weight matrix, the metrics'
# registry); the noise kinds and the schemes are spelt out here.
NOISE_KINDS = ("projected", "ambient")
NOISE_PATHS = ("tree", "increments")
SCHEME_NAMES = ("none", "sphere", "pre", "peri")


class Choice(str, enum.Enum):
    """One of a fixed set of names; it compares equal to (and prints as) its name."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


def choice(name: str, names: tuple[str, ...]) -> type[Choice]:
    """A `Choice` of `names`: the type of a schema field that takes one of them."""
    return Choice(name, [(n, n) for n in names], module=__name__)  # pyright: ignore[reportReturnType] Enum's functional API makes a class


_choice = choice


AttentionKind = _choice("AttentionKind", ("sa", "usa", "sinkhorn", "hardmax"))
Scheme = _choice("Scheme", SCHEME_NAMES)
NormKind = _choice("NormKind", ("sphere", "rms", "layer"))
MatrixKind = _choice("MatrixKind", tuple(WEIGHT_KINDS))  # one file each, attnflow/schema/weights/
Law = _choice("Law", ("gaussian", "product", "goe", "wishart", "orthogonal"))
Activation = _choice("Activation", ("gelu", "gelu_tanh", "relu", "silu", "swiglu", "geglu"))
DType = _choice("DType", ("float32", "float64"))
Solver = _choice("Solver", tuple(SOLVERS))  # one line each, attnflow/numerics/_solvers.py
Spacing = _choice("Spacing", ("linear", "log"))
Metric = _choice("Metric", METRIC_NAMES)
# A metric of the `metrics` list: one of `METRIC_NAMES`, or the import path of a function
# registered with `attnflow.metric` (`module.function`), checked when a study is resolved.
MetricName = str
MatmulPrecision = _choice("MatmulPrecision", ("highest", "high", "default"))
PlotlyJS = _choice("PlotlyJS", ("embed", "directory"))
NoiseKind = _choice("NoiseKind", NOISE_KINDS)
NoisePath = _choice("NoisePath", NOISE_PATHS)
HeadsCombine = _choice("HeadsCombine", ("sum", "mean"))
CrossKind = _choice("CrossKind", ("sa", "usa"))
Summation = _choice("Summation", ("direct", "harmonic", "auto"))


# Each key's meaning is its field's `help` (`setting(default, "meaning")`), which `attnflow
# --help` and the docs' reference page show; its default is in the YAML files of conf/.
# pyright cannot read a Choice made at run time as a type: the fields typed by one say so.


@dataclass
class TokenNormConfig:
    """The normalization N of the `pre` and `peri` schemes."""

    kind: NormKind = setting(MISSING, "sphere | rms | layer")  # pyright: ignore[reportInvalidTypeForm] a Choice
    eps: float = setting(MISSING, "added to the variance (rms, layer); 0: the geometric normalization")
    gamma: Any = setting(MISSING, "scale: a number or d numbers (rms, layer)")
    shift: Any = setting(MISSING, "additive beta of LayerNorm: a number or d numbers (layer)")


@dataclass
class MatrixConfig:
    """One of Q, K, V, O: a constant kind, then optional switches and a polynomial factor."""

    kind: MatrixKind = setting(  # pyright: ignore[reportInvalidTypeForm] a Choice
        MISSING,
        "identity | matrix (takes value) | random (takes law) | tied (v only: V = sign scale Q^T K) | none (o only)",
    )
    law: Law = setting(  # pyright: ignore[reportInvalidTypeForm] a Choice
        MISSING,
        "kind=random: gaussian (N(0, 1/d) entries) | product (G1 G2/sqrt(d)) | goe ((G + G^T)/sqrt(2)) | wishart "
        "(G G^T/sqrt(d)) | orthogonal",
    )
    scale: float = setting(MISSING, "multiplies every kind")
    value: Any = setting(
        MISSING,
        "kind=matrix: nested lists (rows, cols) or (heads, rows, cols); one per piece of switch_times to switch "
        "matrices",
    )
    sign: float = setting(MISSING, "kind=tied: V = sign scale Q^T K")
    transpose: bool = setting(
        MISSING, "use W^T (matrix, random, tied): what a code that multiplies row vectors, x W, applies to columns"
    )
    switch_times: list[float] = setting(
        MISSING, "a piecewise-constant factor switches at these times (a switch time belongs to the new piece)"
    )
    factors: list[float] = setting(
        MISSING, "the factor of each piece: switch_times=[5] factors=[1,-1] flips the sign at t = 5"
    )
    redraw_every: float | None = setting(MISSING, "kind=random: redraw the matrix every this long (null: never)")
    poly: list[float] | None = setting(
        MISSING, "coefficients c_k: the matrix times f(t) = sum_k c_k t^k (null: constant)"
    )


@dataclass
class WeightsConfig:
    """The matrices of every head."""

    shared: bool = setting(MISSING, "random weights drawn once for the ensemble (false: per member)")
    per_beta: bool = setting(
        MISSING, "true: random weights drawn anew for every beta (false: one draw used at every beta)"
    )
    q: MatrixConfig = setting(MISSING, "Q per head")
    k: MatrixConfig = setting(MISSING, "K per head")
    v: MatrixConfig = setting(MISSING, "V per head")
    o: MatrixConfig = setting(MISSING, "O per head")


@dataclass
class MLPConfig:
    """A random MLP term of the field."""

    enabled: bool = setting(MISSING, "true adds a random MLP term")
    hidden: int | None = setting(MISSING, "default 4 d")
    activation: Activation = setting(MISSING, "gelu | gelu_tanh | relu | silu | swiglu | geglu")  # pyright: ignore[reportInvalidTypeForm] a Choice
    scale: float = setting(MISSING, "multiplies the MLP term")
    bias: bool = setting(MISSING, "random biases in the MLP")


@dataclass
class SinkhornConfig:
    """Doubly stochastic attention (`attention_kind: sinkhorn`): a fixed number of Sinkhorn
    alternations in log space, and the column error the run's `marginal_error` metric is
    held to (checked on the saved states, not a stopping rule)."""

    iterations: int = setting(MISSING, "Sinkhorn alternations (column then row normalisation), a fixed number")
    tol: float = setting(
        MISSING, "the column-sum error |sum_i a_ij - 1| the run is checked against (metric marginal_error)"
    )


@dataclass
class HardmaxConfig:
    """The beta -> infinity limit (`attention_kind: hardmax`): ties within `ties` of the row
    maximum are averaged; `self_attention: false` leaves j = i out."""

    ties: float = setting(MISSING, "keys within this of the row maximum of <Q x_i, K x_j> tie and are averaged")
    self_attention: bool = setting(MISSING, "false: a token never attends to itself (j != i)")


@dataclass
class TimeChangeConfig:
    """The flow at constant speed, $dX/ds = c F(X)/|F(X)|$ in a rescaled time s, and the
    collisions of its fixed steps (docs/model.md)."""

    speed: Any = setting(MISSING, 'null: real time; a number c > 0; log_beta: c = log(beta) ("Dynamic metastability")')
    collisions: float | None = setting(
        MISSING, "fixed steps: tokens closer than this are merged after every step (null: never)"
    )


@dataclass
class NoiseConfig:
    """The stochastic dynamics $dX = F\\,dt + \\sigma\\,dW$ (fixed steps; docs/model.md)."""

    sigma: float = setting(MISSING, "0: the deterministic flow; > 0: a Brownian path per member from its key")
    kind: NoiseKind = setting(  # pyright: ignore[reportInvalidTypeForm] a Choice
        MISSING, "projected: Brownian motion of the sphere (tangent increment); ambient: the R^d increment"
    )
    path: NoisePath = setting(  # pyright: ignore[reportInvalidTypeForm] a Choice
        MISSING,
        "tree: a Brownian tree, one path at every dyadic dt; increments: a fresh normal per step (fast at large n)",
    )
    depth: int | None = setting(
        MISSING,
        "the Brownian tree resolves (t1 - t0)/2^depth (null: the least depth resolving dt); dyadic dt see one path",
    )
    switch_times: list[float] = setting(
        MISSING, "the strength's schedule, as weights.*: sigma(t) = sigma * factors[k] * f(t) on the piece k"
    )
    factors: list[float] = setting(
        MISSING,
        "(a switch time belongs to the new piece): switch_times=[1] factors=[1,0] stops the noise at t = 1",
    )
    poly: list[float] | None = setting(
        MISSING, "coefficients c_k of f(t) = sum_k c_k t^k (null: f = 1), e.g. [1, -0.1]: sigma (1 - t/10)"
    )


@dataclass
class CrossWeightsConfig:
    """The matrices of every cross-attention head (random ones follow `weights.shared`
    and `weights.per_beta`)."""

    q: MatrixConfig = setting(MISSING, "Q per head: reads the target tokens")
    k: MatrixConfig = setting(MISSING, "K per head: reads the source tokens")
    v: MatrixConfig = setting(MISSING, "V per head: reads the source tokens")
    o: MatrixConfig = setting(MISSING, "O per head")


@dataclass
class CrossConfig:
    """Cross-attention to a second population, the source: m tokens that the target (the
    study's n tokens) attends to, held fixed while the target flows, as a decoder attends
    to its encoder's output (docs/model.md, "Cross-attention")."""

    enabled: bool = setting(MISSING, "true adds the cross-attention term to the target's field")
    m: int = setting(MISSING, "source tokens")
    source_time: float = setting(
        MISSING,
        "T_e: the source first runs its own non-causal self-attention flow for this time (the study's "
        "attention weights, solver and dt), then is held fixed; 0: it stays at its initial tokens",
    )
    source_beta: float | None = setting(MISSING, "beta of the source's own flow (null: the study's beta)")
    beta: float | None = setting(MISSING, "beta_c of the cross-attention logits (null: the study's beta)")
    attention_kind: CrossKind = setting(  # pyright: ignore[reportInvalidTypeForm] a Choice
        MISSING, "sa (softmax over the source tokens) | usa (unnormalized, 1/m)"
    )
    heads: int = setting(MISSING, "cross-attention heads, combined as heads_combine says")
    d_k: int | None = setting(MISSING, "query/key rows (default d)")
    d_v: int | None = setting(MISSING, "value rows (default d)")
    init: InitConfig = setting(
        MISSING, "the source's initial tokens: cross.init.kind=KIND with that kind's keys (cross.init.k=3)", kinds=INITS
    )
    weights: CrossWeightsConfig = setting(MISSING, "the matrices Q, K, V and O of every cross-attention head")


@dataclass
class ExperimentConfig:
    """Set by `experiment=NAME`: which experiment draws the figures, and its own options
    (checked by the experiment's code, `attnflow.experiments`)."""

    name: str = setting(MISSING, "the experiment: conf/experiment/NAME.yaml")
    options: Any = setting(None, "a mapping of the experiment's options")
    _target_: str | None = setting(
        None, "the experiment's class, module.Class (a researcher's own, from their config folder)"
    )


@dataclass
class Config:
    """A whole study: the system, the ensemble, the time stepping and the output."""

    n: int = setting(MISSING, "tokens")
    d: Any = setting(MISSING, "dimension (tokens live on S^{d-1} when scheme=sphere)")
    beta: Any = setting(MISSING, "inverse temperature: a number, or a list -> `beta` dimension (${linspace:0.1,9,90})")
    attention_kind: AttentionKind = setting(  # pyright: ignore[reportInvalidTypeForm] a Choice
        MISSING,
        "sa (softmax self-attention) | usa (unnormalized, 1/n) | sinkhorn (doubly stochastic) | hardmax (beta -> "
        "infinity)",
    )
    scheme: Scheme = setting(MISSING, "none | sphere | pre | peri")  # pyright: ignore[reportInvalidTypeForm] a Choice
    token_norm: TokenNormConfig = setting(MISSING, "N(x) used by pre/peri")
    attention: bool = setting(MISSING, "false switches the attention term off")
    causal: bool = setting(MISSING, "mask j > i")
    alibi: Any = setting(MISSING, "ALiBi slope(s) lambda: -lambda |i - j| added to the logits")
    heads: int = setting(MISSING, "attention heads, summed or averaged (heads_combine)")
    heads_combine: HeadsCombine = setting(  # pyright: ignore[reportInvalidTypeForm] a Choice
        MISSING, "sum (trained models) | mean: 1/H times the sum, the scaling with a limit as heads grow"
    )
    d_k: int | None = setting(MISSING, "query/key rows (default d)")
    d_v: int | None = setting(MISSING, "value rows (default d)")
    attention_block: int | None = setting(
        MISSING,
        "logits and Gram matrices in tiles of this many tokens (memory n * block, not n^2): null: tiles of 512 "
        "above n = 1024, whole below; 0: always whole",
    )
    summation: Summation = setting(  # pyright: ignore[reportInvalidTypeForm] a Choice
        MISSING,
        "how the attention sums over keys: direct (every pair, whole or in tiles) | harmonic (tokens on the circle "
        "or the sphere: an expansion in harmonics, cost n L or n L^2) | auto (harmonic where it serves and is faster)",
    )
    summation_tol: float = setting(
        MISSING, "summation=harmonic: the expansion's coefficient tail at the largest logit radius (sets its degree)"
    )
    weights: WeightsConfig = setting(MISSING, "the matrices Q, K, V and O of every head")
    mlp: MLPConfig = setting(MISSING, "a random MLP term")
    sinkhorn: SinkhornConfig = setting(
        MISSING, "attention_kind=sinkhorn: attention made doubly stochastic in log space (Sinkformers)"
    )
    hardmax: HardmaxConfig = setting(
        MISSING, "attention_kind=hardmax: each token moves toward the mean of its argmax keys"
    )
    cross: CrossConfig = setting(MISSING, "cross-attention to m fixed source tokens (an encoder's output)")
    terms: dict[str, Any] = setting(
        MISSING,
        "more terms of the field, by a name of yours: +terms.NAME._target_=module.Class (a subclass of "
        "attnflow.AbstractInteraction, or one of attnflow's: external_field), +terms.NAME.FIELD=value",
    )
    init: InitConfig = setting(
        MISSING, "the initial tokens: init=KIND picks conf/init/KIND.yaml (init=caps init.k=3)", kinds=INITS
    )
    members: int = setting(MISSING, "systems in the ensemble, each from its own initial tokens")
    seed: int = setting(MISSING, "random seed of the tokens and weights: the same seed gives the same result")
    dtype: DType = setting(MISSING, "float32 | float64 (switches on jax_enable_x64)")  # pyright: ignore[reportInvalidTypeForm] a Choice
    t0: float = setting(MISSING, "start time")
    t1: float = setting(MISSING, "end time")
    dt: float | None = setting(MISSING, "(t1 - t0)/dt must be a whole number of steps (the first step when adaptive)")
    solver: Solver = setting(  # pyright: ignore[reportInvalidTypeForm] a Choice
        MISSING, "euler | euler_renorm | heun | midpoint | ralston | bosh3 | rk4 | tsit5 | dopri5 | dopri8"
    )
    adaptive: bool = setting(MISSING, "true: adaptive steps (PID control of the step size, by rtol and atol)")
    rtol: float = setting(MISSING, "adaptive only")
    atol: float = setting(MISSING, "adaptive only")
    max_steps: int = setting(MISSING, "adaptive only")
    time_change: TimeChangeConfig = setting(
        MISSING, "the flow at constant speed: dX/ds = c F(X)/|F(X)|, time is then the rescaled time s"
    )
    chunk_size: int | None = setting(
        MISSING, "at most this many members solved at once on each device (default: sized to the CPU cache and memory)"
    )
    noise: NoiseConfig = setting(MISSING, 'the SDE dX = F dt + sigma dW, fixed steps (docs/model.md, "Noise")')
    saves: int = setting(MISSING, "about this many output times from t0 to t1 (on the step grid)")
    save_spacing: Spacing = setting(MISSING, "linear | log")  # pyright: ignore[reportInvalidTypeForm] a Choice
    exact_times: bool = setting(MISSING, "true: exactly `saves` times, interpolated between grid steps")
    save_states: bool = setting(MISSING, "also store the states x (member, time, token, dim)")
    metrics: list[MetricName] = setting(
        MISSING,
        "statistics stored over time (or module.function)",
        choices=Metric,
        other="module.function of a metric of your own",
    )
    cluster_eps: float = setting(MISSING, "clustering threshold: cos(x_i, x_j) > 1 - cluster_eps")
    rank_rtol: float | None = setting(MISSING, "attention_rank threshold (default n * machine epsilon)")
    max_output_gib: float = setting(MISSING, "refuse a run whose results would be larger than this (GiB)")
    overwrite: bool = setting(MISSING, "replace a results.nc that holds a different config")
    plot: bool = setting(MISSING, "also draw summary.png next to results.nc")
    plotly_js: PlotlyJS = setting(  # pyright: ignore[reportInvalidTypeForm] a Choice
        MISSING,
        "interactive HTML views: embed (plotly.js inside each page, opens offline) | directory (one plotly.min.js "
        "beside the pages, which then stay small)",
    )
    compilation_cache: bool = setting(
        MISSING, "keep compiled programs in ~/.cache/attnflow/jax (or $ATTNFLOW_CACHE_DIR)"
    )
    cpu_devices: int | None = setting(
        MISSING,
        "on a CPU, the JAX devices an ensemble's members are shared out over (default: one per usable core; "
        "1: a single device); set before JAX starts, as the command line does",
    )
    matmul_precision: MatmulPrecision = setting(  # pyright: ignore[reportInvalidTypeForm] a Choice
        MISSING,
        "float32 products on a GPU or TPU: highest (full float32) | high | default (TF32 or bfloat16 passes: "
        "faster, about 1e-3 relative error); a CPU ignores it",
    )
    experiment: ExperimentConfig | None = setting(MISSING, "set by experiment=NAME: {name, options}")
    checkpoint: str | None = setting(
        MISSING, "experiment=checkpoint: a model directory, a .gguf file, or minilm | smollm2"
    )
    text: str | None = setting(MISSING, "experiment=checkpoint: the sentence run through the model")
    trust_pickle: bool = setting(MISSING, "experiment=checkpoint: allow pytorch_model.bin / .pt (pickle) files")


# Keys that say what to do with a result, not what the result is.
NOT_RESULT_KEYS = ("overwrite", "plot", "plotly_js", "compilation_cache", "cpu_devices")


# --- keys renamed ---------------------------------------------------------------------

# The keys of a study renamed in attnflow `RENAMED_IN`, old name -> new: the one table
# that every refusal of an old key (`refuse_renamed`, `renamed_key`) and every reading of
# a config stored before (`current_config`) reads.
RENAMED = {"norm": "scheme", "dynamics": "attention_kind", "eps": "cluster_eps"}
RENAMED_IN = "0.2.0"
# The groups of a study's config added since attnflow 0.1.0, whose defaults leave a run as
# it was (cross-attention off, direct summation, the Brownian tree): a config stored before
# them reads as if it had them; `group.key` is a key added to a group.
ADDED = ("cross", "summation", "summation_tol", "noise.path")
# The options of attnflow's experiments that hold a study config of their own (keys over
# the defaults), by experiment: their keys were renamed too.
STUDY_OPTIONS = {"metastability": ("staircase",)}


# Keys of a group that follow the study's renamed keys from the start: the name a
# reader of the old study keys would guess, refused with the group's own name.
GUESSED = {"cross.dynamics": "cross.attention_kind"}


def renamed_key(key: str, experiment: str | None = None) -> str | None:
    """The new name of a dotted key that names a renamed key of a study config (`norm`,
    or `experiment.options.staircase.eps` in experiment metastability), or the name of a
    group's key given by the study's old name (`cross.dynamics`: `GUESSED`); None for any
    other key (`token_norm.eps` included)."""
    if key in GUESSED:
        return GUESSED[key]
    *parent, last = key.split(".")
    studies = [[], *(["experiment", "options", option] for option in STUDY_OPTIONS.get(experiment or "", ()))]
    return ".".join([*parent, RENAMED[last]]) if last in RENAMED and parent in studies else None


def renamed_error(old: str, new: str, setting: str) -> ConfigError:
    """The refusal of the renamed key `old` (dotted) whose name is now `new`, showing the
    user's own setting with the new name (`setting`)."""
    if old in GUESSED:
        return ConfigError(
            f"{old} is called {new}, as the study's own key is (dynamics before attnflow {RENAMED_IN}); "
            f"write {setting}."
        )
    return ConfigError(f"the key {old} was renamed {new} in attnflow {RENAMED_IN}; write {setting}.")


def _study_configs(config: Mapping):
    """The study configs in a config mapping, with the dotted prefix of their keys: the
    config itself, and those the options of its experiment hold (`STUDY_OPTIONS`)."""
    yield "", config
    experiment = config.get("experiment")
    if not (isinstance(experiment, Mapping) and isinstance(experiment.get("options"), Mapping)):
        return
    for option in STUDY_OPTIONS.get(str(experiment.get("name")), ()):
        study = experiment["options"].get(option)
        if isinstance(study, Mapping):
            yield f"experiment.options.{option}.", study


def refuse_renamed(config: Mapping, file: str | None = None) -> None:
    """Refuse, in one sentence naming the new key, a renamed key (`RENAMED`) that a user
    gave in `config`, a config mapping as `compose` takes it (or as the YAML `file` of
    the user's own holds it)."""
    for group_key, new in GUESSED.items():
        group, key = group_key.split(".")
        node = config.get(group)
        if isinstance(node, Mapping) and key in node:
            shown = node[key]
            setting = f"{new}={shown}" if file is None else f"{new.split('.')[-1]}: {shown} in {file}"
            raise renamed_error(group_key, new, setting)
    for where, study in _study_configs(config):
        old = next((key for key in study if key in RENAMED), None)
        if old is not None:
            value = study[old]
            shown = str(value).lower() if isinstance(value, bool) else "null" if value is None else value
            new = f"{where}{RENAMED[old]}"
            setting = f"{new}={shown}" if file is None else f"{RENAMED[old]}: {shown} in {file}"
            raise renamed_error(f"{where}{old}", new, setting)


def current_config(stored: Any) -> Any:
    """A config that an attnflow before `RENAMED_IN` stored (a results file's `config`,
    a panel's of `panel_configs`, a pieces folder's plan), with its renamed keys under
    their new names and the groups added since (`ADDED`) at their defaults; a config of
    this attnflow, or anything else, as it is."""
    if not isinstance(stored, Mapping):
        return stored
    config = dict(stored)
    if "solver" in config and "n" in config:  # a whole study's config, as a run stores it
        for key in ADDED:
            group, _, leaf = key.rpartition(".")
            if group and isinstance(config.get(group), Mapping) and leaf not in config[group]:
                # a key added to a group: the group's copy gets its default
                default = to_container(getattr(getattr(_default_config(), group), leaf))
                config[group] = {**config[group], leaf: default}
            elif not group and key not in config:  # stored before the key was added: its default is what the run meant
                config[key] = to_container(getattr(_default_config(), key))
    for where, study in list(_study_configs(config)):
        if not any(key in RENAMED for key in study):
            continue
        renamed = {RENAMED.get(key, key): value for key, value in study.items()}
        if not where:
            config = renamed
        else:  # the study config an experiment's option holds, in copies of the mappings above it
            option = where.split(".")[2]
            experiment = config["experiment"] = dict(config["experiment"])
            experiment["options"] = {**experiment["options"], option: renamed}
    return config


def config_source() -> tuple[str, Any]:
    """Where the YAML configs are: `("pkg://attnflow.conf", files)` once installed, or the
    repository's `conf/` folder when attnflow is imported from a source checkout."""
    try:
        return "pkg://attnflow.conf", importlib.resources.files("attnflow.conf")
    except ModuleNotFoundError:
        folder = Path(__file__).resolve().parents[2] / "conf"
        return str(folder), folder


def hydra_context(job_name: str = "app"):
    """Hydra's compose API over attnflow's configs (`config_source`): the installed
    package's `attnflow.conf`, or a source checkout's `conf/` folder."""
    from hydra import initialize_config_dir, initialize_config_module  # lazy: start-up (the core never needs Hydra)

    source, folder = config_source()
    if source.startswith("pkg://"):
        return initialize_config_module(source[len("pkg://") :], version_base=None, job_name=job_name)
    return initialize_config_dir(str(folder), version_base=None, job_name=job_name)


def linspace(start: Any, stop: Any, num: Any) -> list[float]:
    """`${linspace:START,STOP,NUM}` in a config: NUM evenly spaced numbers from START to
    STOP, both included (NumPy's `linspace`), e.g. `beta: ${linspace:0.1,9,90}`."""
    try:
        start, stop, count = float(start), float(stop), int(num)
    except (TypeError, ValueError):
        raise ValueError(f"linspace takes two numbers and a count, got {start!r}, {stop!r}, {num!r}") from None
    if count < 1 or count != float(num):
        raise ValueError(f"linspace needs a whole count of at least 1, got {num!r}")

    return np.linspace(start, stop, count).tolist()


OmegaConf.register_new_resolver("linspace", linspace, replace=True)


def register_schema() -> None:
    """Put the schema's keys in Hydra's ConfigStore, where the YAML defaults lists find them.

    Hydra composes the keys: a misspelt key or group option stops the command at once.
    The values are typed by `compose` when each job starts (`typed_job_config`), so that
    a bad value in one job of a sweep fails that job alone, as any other bad value does.
    """
    from hydra.core.config_store import ConfigStore  # lazy: start-up

    store = ConfigStore.instance()
    store.store(group="attnflow_schema", name="config", node=_keys_of(Config))
    for name, cls in INITS.items():
        store.store(group="attnflow_schema", name=f"init_{name}", node=_keys_of(cls))


def typed_job_config(cfg: Mapping) -> Config:
    """The config Hydra composed for one job (or one run), typed and checked by the schema."""
    return compose(cfg, complete=True)


def _values(*parts: str) -> dict:
    """A YAML file of `conf/` without its defaults list (and Hydra's own settings), as
    plain containers."""
    text = config_source()[1].joinpath(*parts).read_text()
    node = typing.cast(DictConfig, OmegaConf.create(text))  # each file of conf/ is a mapping
    for name in ("defaults", "hydra"):
        node.pop(name, None)
    return typing.cast(dict, OmegaConf.to_container(node))  # a mapping, `${...}` kept as written


@functools.cache
def _root_defaults() -> tuple[dict, str]:
    """The values of conf/config.yaml, and the init kind its defaults list names."""
    root_text = config_source()[1].joinpath("config.yaml").read_text()
    entries = typing.cast(DictConfig, OmegaConf.create(root_text)).get("defaults", [])  # config.yaml is a mapping
    init_kind = next(entry["init"] for entry in entries if isinstance(entry, Mapping) and "init" in entry)
    return _values("config.yaml"), init_kind


@functools.cache
def _init_defaults(kind: str) -> dict:
    """The values of conf/init/KIND.yaml."""
    return _values("init", f"{kind}.yaml")


def _plain(value: Any) -> Any:
    """Nested Python containers and numbers (NumPy and JAX arrays become lists)."""
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True, enum_to_str=True)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_container(value)
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.name
    if hasattr(value, "tolist") and hasattr(value, "dtype"):
        return value.tolist()  # pyright: ignore[reportAttributeAccessIssue] Any, wrongly narrowed by is_dataclass
    return value


def compose(config: Any = None, *, complete: bool = False) -> Config:
    """The defaults of `conf/` with `config` on top, typed by the schema (`_schema.typed`).

    `config` is a (nested) mapping with any subset of the keys, as the command line
    would give them; `init` may be the name of an initial condition. `complete=True`
    takes no defaults: every key must be given (what Hydra composed for a job, where a
    missing key was deleted with `~key`). Raises `ConfigError` for a wrong type, an
    unknown choice, an unknown key or a renamed one (`RENAMED`: its sentence names the
    new key). Ranges, shapes and combinations are checked by `validate_config` (NaN and
    infinity too, in words of its own).
    """
    # A Config instance goes through the schema too: its fields may have been replaced
    # by hand (`dataclasses.replace(cfg, solver="rk4")`) with values of any type.
    try:
        user = _plain(config if config is not None else {})
    except oc_errors.OmegaConfBaseException as error:  # an interpolation that cannot be resolved
        raise ConfigError(explain(error, Config)) from None
    if not isinstance(user, Mapping):
        raise ConfigError(f"a config must be a mapping of keys to values, got {type(config).__name__}.")
    user = dict(user)
    user.pop("hydra", None)
    refuse_renamed(user)
    values, default_kind = _root_defaults()
    if not complete:
        kind, init = kind_of({} if user.get("init") is None else user["init"], INITS, "init", default_kind)
        user["init"] = {**_init_defaults(kind), **init}
    cross = user.get("cross")
    if cross is None or isinstance(cross, Mapping):
        # The source's initial tokens, a group of kinds inside `cross`: the chosen kind's
        # defaults under what was given (the command line adds its keys, `cli.main`).
        cross = dict(cross or {})
        given = cross.get("init", values["cross"]["init"])
        kind, init = kind_of({} if given is None else given, INITS, "cross.init", values["cross"]["init"]["kind"])
        user["cross"] = {**cross, "init": {**_init_defaults(kind), **init}}
    return typed(Config, user, complete=complete, defaults=values, numbers=False)


@functools.cache
def _default_config() -> Config:
    return compose({})


def defaults() -> Config:
    """The default study (what a bare `attnflow` runs)."""
    return copy.deepcopy(_default_config())
