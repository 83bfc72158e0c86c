"""The typed schema of a study's configuration, and how a config is composed.

The dataclasses below say what each key is (its type, its choices); the YAML files in
`conf/` (shipped as `attnflow.conf`) hold the default values and nothing else. The
command line composes the files through Hydra, which checks the keys (the schema's keys
are registered in Hydra's ConfigStore and named in each YAML file's defaults list); each
job then types the values with `compose`, as the Python API does with the same files.
Types, booleans, choices and unknown keys are checked against the schema (by OmegaConf,
and by `_check_given` where OmegaConf would convert too freely), and a bad value becomes
a one-sentence `ConfigError`. Nothing here imports Hydra unless `register_schema` runs.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import importlib.resources
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf import errors as oc_errors

from ._errors import ConfigError, did_you_mean
from ._methods import SOLVERS
from ._metric_registry import METRIC_NAMES
from .initial import INITS
from .initial import InitialCondition as InitConfig  # the schema's name for the base of every init kind
from .weights import KINDS as WEIGHT_KINDS

# The choices come from the components that implement them, read without JAX (the
# solvers' table, the kinds of initial condition and weight matrix, the metrics'
# registry); the noise kinds and the schemes are spelt out here.
NOISE_KINDS = ("projected", "ambient")
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
MatrixKind = _choice("MatrixKind", tuple(WEIGHT_KINDS))  # one file each, attnflow/weights/
Law = _choice("Law", ("gaussian", "product", "goe", "wishart", "orthogonal"))
Activation = _choice("Activation", ("gelu", "gelu_tanh", "relu", "silu", "swiglu"))
DType = _choice("DType", ("float32", "float64"))
Solver = _choice("Solver", tuple(SOLVERS))  # one line each, attnflow/_solvers.py
Spacing = _choice("Spacing", ("linear", "log"))
Metric = _choice("Metric", METRIC_NAMES)
# A metric of the `metrics` list: one of `METRIC_NAMES`, or the import path of a function
# registered with `attnflow.metric` (`module.function`), checked when a study is resolved.
MetricName = str
MatmulPrecision = _choice("MatmulPrecision", ("highest", "high", "default"))
PlotlyJS = _choice("PlotlyJS", ("embed", "directory"))
NoiseKind = _choice("NoiseKind", NOISE_KINDS)
HeadsCombine = _choice("HeadsCombine", ("sum", "mean"))


@dataclass
class TokenNormConfig:
    """The normalization N of the `pre` and `peri` schemes."""

    kind: NormKind = MISSING  # pyright: ignore[reportInvalidTypeForm] a Choice made at run time
    eps: float = MISSING
    gamma: Any = MISSING  # a number or d numbers (rms, layer)
    shift: Any = MISSING  # a number or d numbers (layer)


@dataclass
class MatrixConfig:
    """One of Q, K, V, O: a constant kind, then optional switches and a polynomial factor."""

    kind: MatrixKind = MISSING  # pyright: ignore[reportInvalidTypeForm] a Choice made at run time
    law: Law = MISSING  # pyright: ignore[reportInvalidTypeForm] a Choice made at run time
    scale: float = MISSING
    value: Any = (
        MISSING  # (rows, cols) or (heads, rows, cols) nested lists, for kind=matrix; or one per piece of switch_times
    )
    sign: float = MISSING  # V = sign Q^T K, for kind=tied
    transpose: bool = MISSING  # use W^T: a code that multiplies row vectors, x W, applies W^T to columns
    switch_times: list[float] = MISSING
    factors: list[float] = MISSING
    redraw_every: float | None = MISSING
    poly: list[float] | None = MISSING


@dataclass
class WeightsConfig:
    shared: bool = MISSING
    per_beta: bool = MISSING  # random weights drawn anew for every beta (false: the same draw at every beta)
    q: MatrixConfig = MISSING
    k: MatrixConfig = MISSING
    v: MatrixConfig = MISSING
    o: MatrixConfig = MISSING


@dataclass
class MLPConfig:
    enabled: bool = MISSING
    hidden: int | None = MISSING
    activation: Activation = MISSING  # pyright: ignore[reportInvalidTypeForm] a Choice made at run time
    scale: float = MISSING
    bias: bool = MISSING


@dataclass
class SinkhornConfig:
    """Doubly stochastic attention (`attention_kind: sinkhorn`): a fixed number of Sinkhorn
    alternations in log space, and the column error the run's `marginal_error` metric is
    held to (checked on the saved states, not a stopping rule)."""

    iterations: int = MISSING
    tol: float = MISSING


@dataclass
class HardmaxConfig:
    """The beta -> infinity limit (`attention_kind: hardmax`): ties within `ties` of the row
    maximum are averaged; `self_attention: false` leaves j = i out."""

    ties: float = MISSING
    self_attention: bool = MISSING


@dataclass
class TimeChangeConfig:
    """The flow at constant speed, $dX/ds = c F(X)/|F(X)|$ in a rescaled time s, and the
    collisions of its fixed steps (docs/model.md)."""

    speed: Any = MISSING  # null (real time), a number c > 0, or log_beta (c = log beta)
    collisions: float | None = MISSING  # merge tokens closer than this after every fixed step


@dataclass
class NoiseConfig:
    """The stochastic dynamics $dX = F\\,dt + \\sigma\\,dW$ (fixed steps; docs/model.md)."""

    sigma: float = MISSING  # 0: the deterministic flow
    kind: NoiseKind = MISSING  # projected | ambient  # pyright: ignore[reportInvalidTypeForm] a Choice made at run time
    depth: int | None = MISSING  # the Brownian tree resolves (t1 - t0) / 2^depth (null: the least resolving dt)
    switch_times: list[float] = MISSING  # sigma(t) = sigma * factor of the piece * poly(t) (as weights.*)
    factors: list[float] = MISSING  # one factor per piece of switch_times
    poly: list[float] | None = MISSING  # coefficients c_k of f(t) = sum_k c_k t^k (null: 1)


@dataclass
class ExperimentConfig:
    """Set by `experiment=NAME`: which experiment draws the figures, and its own options
    (checked by the experiment's code, `attnflow.experiments`)."""

    name: str = MISSING
    options: Any = None  # a mapping of the experiment's options
    _target_: str | None = None  # the experiment's class, module.Class (a researcher's own, from their config folder)


@dataclass
class Config:
    """A whole study: the system, the ensemble, the time stepping and the output."""

    n: int = MISSING
    d: Any = MISSING  # a whole number (a list: one panel each, in experiments that take it)
    beta: Any = MISSING  # a number, or a list of them (a `beta` dimension), e.g. ${linspace:0.1,9,90}
    attention_kind: AttentionKind = MISSING  # pyright: ignore[reportInvalidTypeForm] a Choice made at run time
    scheme: Scheme = MISSING  # pyright: ignore[reportInvalidTypeForm] a Choice made at run time
    token_norm: TokenNormConfig = MISSING
    attention: bool = MISSING
    causal: bool = MISSING
    alibi: Any = MISSING  # a slope, or one per head
    heads: int = MISSING
    heads_combine: HeadsCombine = MISSING  # sum the heads (trained models) or average them with 1/H (the H -> oo limit)  # pyright: ignore[reportInvalidTypeForm] a Choice made at run time
    d_k: int | None = MISSING
    d_v: int | None = MISSING
    attention_block: int | None = MISSING  # null: tiles above a size; 0: dense; k > 0: tiles of k tokens
    weights: WeightsConfig = MISSING
    mlp: MLPConfig = MISSING
    sinkhorn: SinkhornConfig = MISSING
    hardmax: HardmaxConfig = MISSING
    terms: dict[str, Any] = MISSING  # more terms of the field by name: {_target_: module.Class, FIELD: value}
    init: InitConfig = MISSING
    members: int = MISSING
    seed: int = MISSING
    dtype: DType = MISSING  # pyright: ignore[reportInvalidTypeForm] a Choice made at run time
    t0: float = MISSING
    t1: float = MISSING
    dt: float | None = MISSING
    solver: Solver = MISSING  # pyright: ignore[reportInvalidTypeForm] a Choice made at run time
    adaptive: bool = MISSING
    rtol: float = MISSING
    atol: float = MISSING
    max_steps: int = MISSING
    time_change: TimeChangeConfig = MISSING
    chunk_size: int | None = MISSING
    noise: NoiseConfig = MISSING
    saves: int = MISSING
    save_spacing: Spacing = MISSING  # pyright: ignore[reportInvalidTypeForm] a Choice made at run time
    exact_times: bool = MISSING
    save_states: bool = MISSING
    metrics: list[MetricName] = MISSING
    cluster_eps: float = MISSING
    rank_rtol: float | None = MISSING
    max_output_gib: float = MISSING
    overwrite: bool = MISSING
    plot: bool = MISSING
    plotly_js: PlotlyJS = MISSING  # where the interactive HTML views find plotly.js: inside each page, or beside them  # pyright: ignore[reportInvalidTypeForm] a Choice made at run time
    compilation_cache: bool = MISSING
    matmul_precision: MatmulPrecision = MISSING  # float32 products on a GPU or TPU (see prepare_jax)  # pyright: ignore[reportInvalidTypeForm] a Choice made at run time
    experiment: ExperimentConfig | None = MISSING
    # experiments on trained models only (checkpoint, sensitivity): the trained model, the sentence, and whether a
    # pickle file may be read
    checkpoint: str | None = MISSING
    text: str | None = MISSING
    trust_pickle: bool = MISSING


# Keys that say what to do with a result, not what the result is.
NOT_RESULT_KEYS = ("overwrite", "plot", "plotly_js", "compilation_cache")


# --- keys renamed ---------------------------------------------------------------------

# The keys of a study renamed in attnflow `RENAMED_IN`, old name -> new: the one table
# that every refusal of an old key (`refuse_renamed`, `renamed_key`) and every reading of
# a config stored before (`current_config`) reads.
RENAMED = {"norm": "scheme", "dynamics": "attention_kind", "eps": "cluster_eps"}
RENAMED_IN = "0.2.0"
# The options of attnflow's experiments that hold a study config of their own (keys over
# the defaults), by experiment: their keys were renamed too.
STUDY_OPTIONS = {"metastability": ("staircase",)}


def renamed_key(key: str, experiment: str | None = None) -> str | None:
    """The new name of a dotted key that names a renamed key of a study config (`norm`,
    or `experiment.options.staircase.eps` in experiment metastability), None for any
    other key (`token_norm.eps` included)."""
    *parent, last = key.split(".")
    studies = [[], *(["experiment", "options", option] for option in STUDY_OPTIONS.get(experiment or "", ()))]
    return ".".join([*parent, RENAMED[last]]) if last in RENAMED and parent in studies else None


def renamed_error(old: str, new: str, setting: str) -> ConfigError:
    """The refusal of the renamed key `old` (dotted) whose name is now `new`, showing the
    user's own setting with the new name (`setting`)."""
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
    their new names; a config of this attnflow, or anything else, as it is."""
    if not isinstance(stored, Mapping):
        return stored
    config = dict(stored)
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
        folder = Path(__file__).resolve().parents[1] / "conf"
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


def _hints(schema: type) -> dict[str, Any]:
    """The types of a schema's keys: its dataclass fields (a class variable, such as an
    initial condition's `data`, is not a key)."""
    names = {field.name for field in dataclasses.fields(schema)}
    return {name: kind for name, kind in typing.get_type_hints(schema).items() if name in names}


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


# The schema of each class made by `_keys_of` (an error names the class it was raised in).
_SCHEMA_OF: dict[type, type] = {}


@functools.cache
def _keys_of(schema: type) -> type:
    """A dataclass with the keys and defaults of `schema` and no types."""
    fields = [
        (f.name, Any, dataclasses.field(default=MISSING if f.default is dataclasses.MISSING else f.default))
        for f in dataclasses.fields(schema)
    ]
    keys = dataclasses.make_dataclass(schema.__name__, fields)
    _SCHEMA_OF[keys] = schema
    return keys


def typed_job_config(cfg: Mapping) -> Config:
    """The config Hydra composed for one job (or one run), typed and checked by the schema."""
    return compose(cfg, complete=True)


def _values(*parts: str):
    """A YAML file of `conf/` without its defaults list (and Hydra's own settings)."""
    text = config_source()[1].joinpath(*parts).read_text()
    node = typing.cast(DictConfig, OmegaConf.create(text))  # each file of conf/ is a mapping
    for key in ("defaults", "hydra"):
        node.pop(key, None)
    return node


@functools.cache
def _root_defaults():
    root_text = config_source()[1].joinpath("config.yaml").read_text()
    entries = typing.cast(DictConfig, OmegaConf.create(root_text)).get("defaults", [])  # config.yaml is a mapping
    init_kind = next(entry["init"] for entry in entries if isinstance(entry, Mapping) and "init" in entry)
    base = OmegaConf.merge(OmegaConf.structured(Config), {k: v for k, v in _values("config.yaml").items()})
    return base, init_kind


@functools.cache
def _init_defaults(kind: str):
    return OmegaConf.merge(OmegaConf.structured(INITS[kind]), _values("init", f"{kind}.yaml"))


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
    """The defaults of `conf/` with `config` on top, checked against the schema.

    `config` is a (nested) mapping with any subset of the keys, as the command line
    would give them; `init` may be the name of an initial condition. `complete=True`
    takes no defaults: every key must be given (what Hydra composed for a job, where a
    missing key was deleted with `~key`). Raises `ConfigError` for a wrong type, an
    unknown choice, an unknown key or a renamed one (`RENAMED`: its sentence names the
    new key). Ranges, shapes and combinations are checked by `validate_config`.
    """
    # A Config instance goes through the schema too: its fields may have been replaced
    # by hand (`dataclasses.replace(cfg, solver="rk4")`) with values of any type.
    try:
        user = _plain(config if config is not None else {})
    except oc_errors.OmegaConfBaseException as error:  # an interpolation that cannot be resolved
        raise ConfigError(explain(error)) from None
    if not isinstance(user, Mapping):
        raise ConfigError(f"a config must be a mapping of keys to values, got {type(config).__name__}.")
    user = dict(user)
    user.pop("hydra", None)
    refuse_renamed(user)
    if complete:
        _check_complete(user, Config, "")
    base, default_init = _root_defaults()
    init = user.pop("init", None)
    if isinstance(init, str):
        init = {"kind": init}
    if init is not None and not isinstance(init, Mapping):
        raise ConfigError(f"init must be a kind ({', '.join(INITS)}) or a mapping with one, got {init!r}.")
    init = dict(init or {})
    kind = init.get("kind", default_init)
    if kind not in INITS:
        raise ConfigError(f"unknown init kind {kind!r}; choose one of {', '.join(INITS)}.")
    _check_given(user, Config, "")
    _check_given(init, INITS[kind], "init.")
    if complete:
        _check_complete(init, INITS[kind], "init.")
    try:
        cfg = OmegaConf.merge(base, user)
    except oc_errors.OmegaConfBaseException as error:
        raise ConfigError(explain(error, init_kind=kind)) from None
    try:
        cfg.init = OmegaConf.merge(_init_defaults(kind), init)
    except oc_errors.OmegaConfBaseException as error:
        # The init node is merged on its own, so its errors name keys without `init.`.
        error.full_key = f"init.{error.full_key}" if getattr(error, "full_key", None) else "init"
        raise ConfigError(explain(error, init_kind=kind)) from None
    try:
        return typing.cast(Config, OmegaConf.to_object(cfg))  # the structured Config as its dataclass
    except oc_errors.OmegaConfBaseException as error:  # an interpolation that cannot be resolved
        raise ConfigError(explain(error, init_kind=kind)) from None


# How a boolean may be spelt (YAML 1.1's words): OmegaConf alone would also read any
# number (2 is true) and "1", "y" or "n".
_BOOLEAN_WORDS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def read_boolean(value: Any) -> bool | None:
    """`value` as a boolean (True, "yes", "Off", ...), or None if it is not one."""
    if isinstance(value, bool):
        return value
    return _BOOLEAN_WORDS.get(value.lower()) if isinstance(value, str) else None


def _check_given(given: Mapping, schema: type, prefix: str) -> None:
    """What OmegaConf would let through: a group (a nested dataclass of the schema) must
    be a mapping, a boolean a boolean or one of its words, and an untyped key no mapping."""
    hints = _hints(schema)
    for key, value in given.items():
        kind = hints.get(key)
        if dataclasses.is_dataclass(kind) and kind is not InitConfig:
            if not isinstance(value, Mapping):
                raise ConfigError(f"{prefix}{key} must be {_describe(kind)}, got {value!r}.")
            _check_given(value, typing.cast(type, kind), f"{prefix}{key}.")  # a schema's hints are classes
        elif kind is bool and read_boolean(value) is None and not (isinstance(value, str) and value.startswith("${")):
            raise ConfigError(f"{prefix}{key} must be {_describe(bool)}, got {value!r}.")
        elif kind is Any and isinstance(value, Mapping):  # numbers or nested lists of them, in every such key
            raise ConfigError(f"{prefix}{key} cannot be a mapping, got {value!r}.")


def typed_options(schema: type, given: Mapping, prefix: str) -> dict:
    """`given` typed by the dataclass `schema` over its defaults, as plain containers
    (choices as their names): the options of an experiment (`prefix` names where they
    sit, `experiment.options.`). A key the schema lacks, a value of the wrong type, a
    name outside a choice, a number that is NaN or infinite and a list that holds an
    entry twice are refused in one sentence (`_check_values`: a field declares in its
    `metadata` that it takes infinity, `{"infinite": True}`, or repeats,
    `{"repeats": True}`); ranges and combinations are the caller's to check."""
    names = [f.name for f in dataclasses.fields(schema)]
    unknown = [key for key in given if key not in names]
    if unknown:
        guess = did_you_mean(unknown[0], names, prefix)
        raise ConfigError(
            f"unknown option {prefix}{unknown[0]}{guess}; {prefix.rstrip('.')} takes {', '.join(names) or 'none'}."
        )
    _check_given(given, schema, prefix)
    try:
        typed = typing.cast(  # a structured config becomes a dict
            dict,
            OmegaConf.to_container(
                OmegaConf.merge(OmegaConf.structured(schema), dict(given)), resolve=True, enum_to_str=True
            ),
        )
    except oc_errors.OmegaConfBaseException as error:
        full_key = str(getattr(error, "full_key", "") or "")
        path = _split(full_key)
        if isinstance(error, (oc_errors.ConfigKeyError, oc_errors.ConfigAttributeError)) and path:
            group = f"{prefix}{'.'.join(path[:-1])}"
            parent = _schema_at(path[:-1], None, root=schema)
            names = [f.name for f in dataclasses.fields(parent)] if dataclasses.is_dataclass(parent) else []
            guess = did_you_mean(path[-1], names, f"{group}.")
            raise ConfigError(
                f"unknown config key {prefix}{full_key}{guess}; {group} takes {', '.join(names) or 'none'}."
            ) from None
        kind = _schema_at(path, None, root=schema) if full_key else None
        if kind is None:
            raise ConfigError(f"invalid {prefix.rstrip('.')}: {explain(error)}") from None
        raise ConfigError(
            f"{prefix}{full_key} must be {_describe(kind)}, got {getattr(error, 'value', None)!r}."
        ) from None
    _check_values(typed, schema, prefix)
    return typed


def _check_values(typed: Mapping, schema: type, prefix: str) -> None:
    """What a type lets through but no option can use: a number that is NaN or infinite
    (a field typed float, or a number inside a list or an untyped field), unless the
    field's `metadata` says `infinite` (then plus and minus infinity pass, NaN never);
    and an entry given twice in a field typed as a list (each entry is a panel, a run or
    a time: a repeat computes or draws the same thing twice, or is silently merged),
    unless its `metadata` says `repeats`. Nested options (a dataclass) are checked key
    by key; a mapping (`dict[str, Any]`) holds the settings of another part of attnflow
    (a training, a study) and is checked by that part's own schema."""
    hints = _hints(schema)
    for option in dataclasses.fields(schema):
        key, value, kind = f"{prefix}{option.name}", typed.get(option.name), hints[option.name]
        if _is_optional(kind):
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
        if dataclasses.is_dataclass(kind) and isinstance(value, Mapping):
            _check_values(value, typing.cast(type, kind), f"{key}.")  # a schema's hints are classes
            continue
        if typing.get_origin(kind) is dict:
            continue
        infinite = option.metadata.get("infinite", False)
        bad = next((x for x in _numbers_in(value) if math.isnan(x) or (math.isinf(x) and not infinite)), None)
        if bad is not None:
            allowed = "a number, inf or -inf" if infinite else "a finite number"
            if bad is value:
                raise ConfigError(f"{key} must be {allowed}, got {value!r}.")
            raise ConfigError(f"{key} must hold {allowed} in each place, got {bad!r} in {value!r}.")
        if typing.get_origin(kind) is list and isinstance(value, list) and not option.metadata.get("repeats", False):
            frozen = [_frozen(entry) for entry in value]
            seen = set()
            for entry, hashable in zip(value, frozen):
                if hashable in seen:
                    count = frozen.count(hashable)
                    shown = entry if isinstance(entry, str) else repr(entry)
                    raise ConfigError(
                        f"{key} holds {shown} {'twice' if count == 2 else f'{count} times'}; give each value once."
                    )
                seen.add(hashable)


def _numbers_in(value: Any):
    """The floats in `value`, a number or nested lists of them (booleans and integers are
    always finite)."""
    if isinstance(value, float):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _numbers_in(item)


def _frozen(value: Any) -> Any:
    """`value` (nested lists and mappings allowed) as something hashable that compares
    as it does."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


def _check_complete(given: Mapping, schema: type, prefix: str) -> None:
    """Every key of `schema` (and of its groups) has a value in `given`."""
    for key, kind in _hints(schema).items():
        value = given.get(key, MISSING)
        if isinstance(value, str) and value == MISSING:
            raise ConfigError(f"{prefix}{key} has no value; give it one.")
        if dataclasses.is_dataclass(kind) and kind is not InitConfig and isinstance(value, Mapping):
            _check_complete(value, typing.cast(type, kind), f"{prefix}{key}.")  # a schema's hints are classes


def to_container(cfg: Any) -> Any:
    """The config as plain nested dicts and lists (choices as their names), in the
    schema's key order."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: to_container(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, Mapping):  # a mapping the schema leaves open (terms): a copy
        return {key: to_container(value) for key, value in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return [to_container(v) for v in cfg]
    if isinstance(cfg, enum.Enum):
        return cfg.name
    return cfg


@functools.cache
def _default_config() -> Config:
    return compose({})


def defaults() -> Config:
    """The default study (what a bare `attnflow` runs)."""
    return copy.deepcopy(_default_config())


# --- one sentence for every way a value can be wrong --------------------------------


def _schema_at(path: list[str], init_kind: str | None, root: type | None = None) -> Any:
    """The schema type at a dotted path (list items by index) from `root` (the study's
    schema by default), or None if unknown."""
    kind: Any = Config if root is None else root
    for part in path:
        if _is_optional(kind):
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
        if typing.get_origin(kind) is list:
            kind = typing.get_args(kind)[0]
            continue
        if kind is InitConfig:
            kind = INITS.get(init_kind or "", InitConfig)
        if not (dataclasses.is_dataclass(kind) and isinstance(kind, type)):
            return None
        hints = _hints(kind)
        if part not in hints:
            return None
        kind = hints[part]
    if _is_optional(kind) and any(dataclasses.is_dataclass(a) for a in typing.get_args(kind)):
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    if kind is InitConfig:
        kind = INITS.get(init_kind or "", InitConfig)
    return kind


def _is_optional(kind: Any) -> bool:
    return typing.get_origin(kind) in (typing.Union, types.UnionType)


def _describe(kind: Any) -> str:
    if _is_optional(kind):
        inner = [a for a in typing.get_args(kind) if a is not type(None)]
        return f"{_describe(inner[0])} or null"
    if typing.get_origin(kind) is list:
        return f"a list of {_plural(typing.get_args(kind)[0])}"
    if typing.get_origin(kind) is dict:
        return "a mapping"
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return "one of " + ", ".join(kind.__members__)
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return "a mapping of " + ", ".join(f.name for f in dataclasses.fields(kind))
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(kind, "valid")


def _plural(kind: Any) -> str:
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return "names among " + ", ".join(kind.__members__)
    return {bool: "booleans", int: "integers", float: "numbers", str: "strings"}.get(kind, "values")


def _split(full_key: str) -> list[str]:
    parts = []
    for piece in str(full_key).replace("]", "").split("."):
        parts.extend(p for p in piece.split("[") if p != "")
    return parts


def explain(error: Exception, init_kind: str | None = None) -> str:
    """One sentence for an OmegaConf error raised while composing or resolving a config."""
    full_key = str(getattr(error, "full_key", "") or "")
    path = _split(full_key)
    if isinstance(error, oc_errors.InterpolationResolutionError):
        reason = str(getattr(error, "msg", None) or error).splitlines()[0].rstrip(".")
        return f"{full_key or 'a value'} holds an interpolation that cannot be resolved ({reason})."
    if isinstance(error, (oc_errors.ConfigKeyError, oc_errors.ConfigAttributeError)) and path:
        parent = _schema_at(path[:-1], init_kind)
        holder: Any = getattr(error, "object_type", None)
        holder = _SCHEMA_OF.get(holder, holder)
        if parent is InitConfig and holder in INITS.values():
            parent, init_kind = holder, holder.kind
        group = ".".join(path[:-1])
        if dataclasses.is_dataclass(parent):
            names = [f.name for f in dataclasses.fields(parent)]
        elif isinstance(getattr(error, "parent_node", None), DictConfig):  # a mapping the schema leaves open
            names = [str(name) for name in error.parent_node.keys()]
            if not names:
                return f"{group} holds no keys by default; add one with +{full_key}=VALUE."
        else:
            return f"unknown config key {full_key}."
        key = full_key + did_you_mean(path[-1], names, f"{group}." if group else "")
        where = f"{group} ({init_kind})" if parent in INITS.values() else group
        allowed = ", ".join(names) or "none"
        if group:
            return f"unknown config key {key}; {where} takes {allowed}."
        return f"unknown config key {key}; known keys are {allowed}."
    if isinstance(error, oc_errors.MissingMandatoryValue) and full_key:
        return f"{full_key} has no value; give it one."
    if full_key:
        value = getattr(error, "value", None)
        if isinstance(error, oc_errors.ConfigTypeError) and getattr(error, "object_type", None) in (list, dict):
            # Hydra merging a mapping where the value is a list, or the other way round
            # (a key the schema leaves untyped, such as beta).
            return f"{full_key} cannot be {'a mapping' if error.object_type is list else 'a list'}."
        kind = _schema_at(path, init_kind)
        if path[:1] == ["metrics"]:  # names: the built-in ones, or a researcher's by its import path
            return (
                f"metrics must be a list of names among {', '.join(METRIC_NAMES)} (or module.function of a "
                f"metric of your own), got {value!r}."
            )
        if kind is not None:
            return f"{full_key} must be {_describe(kind)}, got {value!r}."
    first = str(getattr(error, "msg", None) or error).splitlines()[0].strip().rstrip(".")
    return f"invalid config: {first}."
