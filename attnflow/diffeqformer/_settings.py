"""The settings of `attnflow train`, without JAX.

`TrainConfig` is the schema, declared as every schema of attnflow is
(`_schema.setting`): each setting's type, its meaning and the names it takes
(`metadata["help"]` and `["choices"]`, which `attnflow train --help` shows); the default
values are in conf/train.yaml. The command line is composed by Hydra over that file
(`train_config`), typed by the one mechanism (`_schema.typed`: "unknown setting ... of
attnflow train", ...) and checked (`check`); a run's stored settings are read as data
(`read_state`). The command (`_command`) and the training (`_train`) read them from here.

The choices the settings take (the models, corpora and dtypes) live here too, so that
checking them needs no JAX; the modules that build the model and the corpora read them
from here.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from hydra import compose
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import MISSING, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..schema._config import choice, config_source, hydra_context
from ..schema._errors import CheckpointError, ConfigError
from ..schema._methods import SOLVERS
from ..schema._schema import _describe, _inner, _keys_of, _unknown, hints, is_optional, setting, typed
from ..storage._store import recover

MODELS = ("diffeqformer", "gpt")
B2 = {"diffeqformer": 0.95, "gpt": 0.999}  # the paper's app. C.5
DTYPES = ("float32", "float64")
CORPORA = ("reference-a", "reference-b", "induction")
ALIASES = {"reference": "reference-a"}
# Settings added after runs were first written, with the value that reproduces a run
# recorded without them (the DiffEqFormer's embedding read t unscaled).
ADDED = {"time_scale": 1.0}
NOT_RESULT_KEYS = ("out", "save_every", "compilation_cache")
STATE_VERSION = 1


def corpus_name(name: str) -> str:
    """The canonical name of a corpus (`reference` is `reference-a`)."""
    name = ALIASES.get(name, name)
    if name not in CORPORA:
        raise ConfigError(f"unknown corpus {name!r}; choose one of reference (= reference-a), reference-b, induction.")
    return name


def read_json(path: Path) -> dict:
    """A JSON object from `path`; missing or invalid files raise CheckpointError."""
    if not Path(path).is_file():
        raise CheckpointError(f"{path} is missing.")
    try:
        data = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path} is not valid JSON ({getattr(error, 'msg', error)}).") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} holds a JSON {type(data).__name__}, not an object.")
    return data


@dataclass
class TrainConfig:
    """The settings of `attnflow train`: types and meanings here, values in conf/train.yaml."""

    # --- model
    model: str = setting(
        MISSING, "diffeqformer | gpt (pre-LN GPT-2 with `steps` layers)", choices=choice("Model", MODELS)
    )
    vocab: int = setting(MISSING, "BPE tokens (reference corpora) or symbols (induction)")
    dim: int = setting(MISSING, "width d of the residual stream")
    heads: int = setting(MISSING, "attention heads (d_k = dim / heads)")
    hidden: int = setting(MISSING, "MLP width")
    context: int = setting(MISSING, "tokens per sequence (learned positions)")
    d_emb: int = setting(MISSING, "DiffEqFormer: width of each weight's hypernetwork MLP")
    frequencies: int = setting(MISSING, "DiffEqFormer: sines and cosines of the time embedding")
    time_scale: float = setting(
        MISSING,
        "DiffEqFormer: the embedding is (t, sin(w s t), cos(w s t)) with s = time_scale (the paper's code: 1000)",
    )
    steps: int = setting(MISSING, "solver steps on [0, horizon] (DiffEqFormer) = layers (GPT)")
    horizon: float = setting(MISSING, "DiffEqFormer: the ODE runs on t in [0, horizon], in steps of horizon/steps")
    solver: str = setting(
        MISSING,
        "DiffEqFormer: euler is the paper's parallel block; heun, rk4, ... solve the same ODE",
        choices=choice("Solver", tuple(SOLVERS)),
    )
    dtype: str = setting(MISSING, "float32 | float64", choices=choice("DType", DTYPES))
    # --- data
    corpus: str = setting(
        MISSING, "reference (= reference-a) | reference-b | induction", choices=choice("Corpus", (*ALIASES, *CORPORA))
    )
    seed: int = setting(MISSING, "initial weights and the order of the batches")
    # --- optimization (AdamW, warmup then cosine decay)
    batch: int = setting(MISSING, "sequences per step")
    train_steps: int = setting(MISSING, "optimizer steps")
    lr: float = setting(MISSING, "peak learning rate")
    warmup: float = setting(MISSING, "share of train_steps spent warming up linearly from 0")
    min_lr: float = setting(MISSING, "final learning rate, as a share of lr")
    weight_decay: float = setting(MISSING, "on matrices and embeddings (not on biases, gains, LoRA adapters)")
    b1: float = setting(MISSING, "AdamW's decay of the first moment")
    b2: float | None = setting(MISSING, "null: 0.95 for the DiffEqFormer, 0.999 for GPT (the paper's app. C.5)")
    clip: float = setting(MISSING, "gradients clipped to this global norm")
    # --- evaluation, checkpoints, output
    eval_every: int = setting(MISSING, "validation loss every this many steps (and at the end)")
    eval_batches: int = setting(MISSING, "batches of `batch` held-out sequences per validation")
    save_every: int = setting(MISSING, "latest state (model + optimizer) every this many steps (and at the end)")
    out: str | None = setting(
        MISSING,
        "run folder; null: runs/train/<model>-<corpus>-s<steps>-seed<seed>; with -m the sweep's folder, "
        "job N training in out/N (null: runs/train/multirun/DATE/TIME)",
    )
    init: str | None = setting(MISSING, "a model folder (or run folder) to start from: fine-tuning")
    lora_rank: int = setting(MISSING, "> 0: fine-tune the populated layers of `init` with rank-r adapters only")
    compilation_cache: bool = setting(MISSING, "keep compiled programs between runs (JAX's persistent cache)")

    def record(self) -> dict[str, Any]:
        """The settings that determine the result (all but `out`, `save_every`,
        `compilation_cache`)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in NOT_RESULT_KEYS}

    @property
    def adam_b2(self) -> float:
        return B2[self.model] if self.b2 is None else self.b2

    @property
    def folder(self) -> Path:
        """The run folder: `out`, or one named after the model, corpus, steps and seed."""
        if self.out is not None:
            return Path(self.out).expanduser()
        lora = f"-lora{self.lora_rank}" if self.lora_rank else ""
        tuned = "-tuned" if self.init is not None else ""
        return Path("runs") / "train" / f"{self.model}-{self.corpus}-s{self.steps}{tuned}{lora}-seed{self.seed}"


# How the refusals of `_schema.typed` name attnflow train and its keys: "unknown
# setting dimm of attnflow train (did you mean dim?); it takes ...".
OWNER = "attnflow train"
NOUN = "setting"


def _names() -> list[str]:
    """The settings, in the order of `TrainConfig`."""
    return [field.name for field in dataclasses.fields(TrainConfig)]


def register_schema() -> None:
    """Put the settings' keys in Hydra's ConfigStore (`attnflow_schema/train`), where
    conf/train.yaml's defaults list finds them, as the study's schema is."""
    ConfigStore.instance().store(group="attnflow_schema", name="train", node=_keys_of(TrainConfig))


def _overrides(args: Sequence[str], sweep: bool = False) -> list[Override]:
    """`attnflow train`'s arguments parsed by Hydra's override grammar (`key=value`,
    quoting, lists, `null`): each a setting of the schema (`+key=` and `++key=` name
    `key`: every setting exists already), given once, not deleted (`~key`), and not
    swept unless `sweep` (`-m`); one sentence for each refusal, before anything is
    composed."""
    bare = next((arg for arg in args if "=" not in arg and not arg.startswith(("-", "~"))), None)
    if bare is not None:
        # Hydra would say only "Error parsing override": a word alone is not a setting.
        raise ConfigError(
            f"attnflow train takes settings as key=value (e.g. steps=200 corpus=induction), got "
            f"{bare!r}; `attnflow train --help` lists them."
        )
    try:
        overrides = OverridesParser.create().parse_overrides(list(args))
    except HydraException as error:
        first = str(error).strip().splitlines()[0].rstrip(".")
        raise ConfigError(f"cannot parse the settings of attnflow train ({first}).") from None
    seen = {}
    for override in overrides:
        name = override.key_or_group
        if name not in _names():
            raise ConfigError(_unknown("", name, _names(), owner=OWNER, noun=NOUN))
        if override.is_delete():
            raise ConfigError(f"attnflow train cannot delete a setting ({override.input_line}); give {name} a value.")
        if override.is_sweep_override() and not sweep:
            raise ConfigError(
                f"attnflow train runs one training, not a sweep ({override.input_line}); give {name} "
                "one value, or sweep it with -m (one training per value)."
            )
        if name in seen:
            raise ConfigError(f"{name} is given twice ({seen[name]}, {override.input_line}); give it once.")
        seen[name] = override.input_line
    return overrides


def _command_line(args: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`attnflow train`'s arguments (`_overrides`) composed by Hydra over
    conf/train.yaml with the schema's keys. Returns the composed settings and the
    given ones."""
    plain, given, late = [], {}, {}
    # A setting named like a config group of the study's config (`init`, beside
    # train.yaml in the same folder) would be read by Hydra as a choice of that group:
    # it is set after composing instead.
    groups = {path.name for path in Path(str(config_source()[1])).iterdir() if path.is_dir()}
    for override in _overrides(args):
        name = override.key_or_group
        given[name] = override.value()
        if name in groups:
            late[name] = given[name]
        else:
            plain.append(f"{name}={override.get_value_element_as_str()}")
    register_schema()
    if GlobalHydra.instance().is_initialized():  # left by an earlier Hydra app in this process
        GlobalHydra.instance().clear()
    try:
        with hydra_context("train"):
            composed = compose(config_name="train", overrides=plain)
    except (HydraException, OmegaConfBaseException) as error:
        cause = error if isinstance(error, OmegaConfBaseException) else error.__cause__
        first = str(cause or error).strip().splitlines()[0].rstrip(".")
        raise ConfigError(f"invalid settings for attnflow train ({first}).") from None
    # composed is a DictConfig, so its container is a dict
    return {**cast("dict[str, Any]", OmegaConf.to_container(composed, resolve=False)), **late}, given


def train_config(overrides: Mapping[str, Any] | Sequence[str] = ()) -> TrainConfig:
    """The settings of conf/train.yaml with `overrides` on top, typed and checked:
    `overrides` is a mapping (the Python API), or the command line's `KEY=VALUE`
    strings, which Hydra composes as it does a study's. When `out` names a folder
    holding a run, that run's stored settings are the base instead, so that `out=DIR`
    alone resumes it."""
    if isinstance(overrides, Mapping):
        given = {str(key).lstrip("+"): value for key, value in overrides.items()}
        return _typed(given, given, _defaults())
    composed, given = _command_line(overrides)
    return _typed(composed, given)


def _typed(settings: Mapping[str, Any], given: Mapping[str, Any], defaults: Mapping | None = None) -> TrainConfig:
    """`settings` typed by `TrainConfig` over `defaults` (`_schema.typed`: an unknown
    setting, a value of the wrong type, a boolean other than true/false, yes/no, on/off
    are refused in its sentences) and checked (`check`, which also refuses NaN and
    infinities); with the stored settings of the run in `out`, when there is one, for
    those not `given`."""
    cfg = typed(TrainConfig, settings, defaults=defaults, owner=OWNER, noun=NOUN, numbers=False)
    if cfg.out is not None:
        # The stored settings are data: they go in as read, never through OmegaConf's
        # interpolation (`read_state` has checked their types).
        stored = read_state(Path(cfg.out).expanduser() / "state")
        if stored is not None:
            cfg = dataclasses.replace(cfg, **{k: v for k, v in stored["config"].items() if k not in given})
    check(cfg)
    return cfg


def _defaults_file() -> Path:
    return Path(str(config_source()[1])) / "train.yaml"


def _defaults() -> dict[str, Any]:
    """The values of conf/train.yaml (without its defaults list)."""
    values = cast("dict[str, Any]", OmegaConf.to_container(OmegaConf.load(_defaults_file())))  # a mapping
    values.pop("defaults", None)
    return values


def _of_kind(key: str, value: Any) -> bool:
    """Whether `value` (read from JSON, so never converted: `typed` would read "3" as a
    whole number and resolve `${...}`) is of the type of the setting `key`."""
    kind = hints(TrainConfig)[key]
    if value is None:
        return is_optional(kind)
    kind = _inner(kind)
    if isinstance(value, bool) or kind is bool:
        return isinstance(value, bool) and kind is bool
    if kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, kind)


def read_state(folder: Path) -> dict | None:
    """The `state.json` of a run's state folder (None when there is none), read as data:
    nothing in it is interpolated. Its settings must be settings of `TrainConfig`, of
    their types, and pass `check` (on the defaults of the settings a state does not
    store); its step must be a whole number from 0 to `train_steps`. A file that breaks
    any of these raises CheckpointError naming it."""
    recover(folder)
    path = folder / "state.json"
    if not path.is_file():
        return None
    state = read_json(path)
    if state.get("format_version") != STATE_VERSION:
        raise CheckpointError(f"{path} is of another format version; start a new out=.")
    if not isinstance(state.get("config"), dict):
        raise CheckpointError(f"{path} holds no settings (its config is not a mapping); start a new out=.")
    config = dict(ADDED, **state["config"])
    for key, value in config.items():
        if key not in _names() or key in NOT_RESULT_KEYS:
            raise CheckpointError(
                f"{path} holds an unknown setting {key!r}; it was not written by this attnflow train."
            )
        if not _of_kind(key, value):
            raise CheckpointError(f"{path} holds {key}={value!r}, which is not {_describe(hints(TrainConfig)[key])}.")
        if value is not None and _inner(hints(TrainConfig)[key]) is float:
            config[key] = float(value)
    try:
        cfg = dataclasses.replace(train_config(), **config)
        check(cfg)
    except ConfigError as error:
        raise CheckpointError(f"{path} holds settings attnflow train refuses ({str(error).rstrip('.')}).") from None
    step, elapsed = state.get("step"), state.get("elapsed", 0.0)
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= cfg.train_steps:
        raise CheckpointError(
            f"{path} holds step={step!r}, not a whole number from 0 to train_steps={cfg.train_steps}."
        )
    if not isinstance(elapsed, (int, float)) or isinstance(elapsed, bool) or not 0 <= elapsed < math.inf:
        raise CheckpointError(f"{path} holds elapsed={elapsed!r}, not a number of seconds.")
    return dict(state, config=config)


def check(cfg: TrainConfig) -> None:
    """What the types cannot say: ranges, choices and combinations; one sentence each."""
    if cfg.model not in MODELS:
        raise ConfigError(f"model must be one of {', '.join(MODELS)}, got {cfg.model!r}.")
    corpus_name(cfg.corpus)
    if cfg.dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {cfg.dtype!r}.")
    positive = (
        "vocab",
        "dim",
        "heads",
        "hidden",
        "context",
        "d_emb",
        "frequencies",
        "steps",
        "batch",
        "train_steps",
        "eval_every",
        "eval_batches",
        "save_every",
    )
    for name in positive:
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{name} must be a positive integer, got {getattr(cfg, name)}.")
    for name in ("seed", "lora_rank"):
        if getattr(cfg, name) < 0:
            raise ConfigError(f"{name} must be zero or positive, got {getattr(cfg, name)}.")
    if cfg.seed >= 2**63:
        raise ConfigError(f"seed must be less than 2**63 (a random key takes 64 bits), got {cfg.seed}.")
    if cfg.dim % cfg.heads:
        raise ConfigError(f"dim={cfg.dim} must be a multiple of heads={cfg.heads}.")
    if not cfg.horizon > 0 or not math.isfinite(cfg.horizon):
        raise ConfigError(f"horizon must be a positive number, got {cfg.horizon}.")
    if not cfg.time_scale > 0 or not math.isfinite(cfg.time_scale):
        raise ConfigError(f"time_scale must be a positive number, got {cfg.time_scale}.")
    if not cfg.lr > 0 or not math.isfinite(cfg.lr):
        raise ConfigError(f"lr must be a positive number, got {cfg.lr}.")
    if not 0 <= cfg.warmup < 1 or not 0 <= cfg.min_lr <= 1:
        raise ConfigError(f"warmup must be in [0, 1) and min_lr in [0, 1] (shares), got {cfg.warmup} and {cfg.min_lr}.")
    if not 0 <= cfg.weight_decay < math.inf or not 0 < cfg.clip < math.inf:
        raise ConfigError(
            f"weight_decay must be a finite number at least 0 and clip a finite positive number, got "
            f"{cfg.weight_decay} and {cfg.clip}."
        )
    for name in ("b1", "b2"):
        value = getattr(cfg, name)
        if value is not None and not 0 <= value < 1:
            raise ConfigError(f"{name} must be in [0, 1), got {value}.")
    if cfg.solver not in SOLVERS:
        raise ConfigError(f"unknown solver {cfg.solver!r}; choose one of {', '.join(SOLVERS)}.")
    if cfg.model == "gpt" and cfg.solver != "euler":
        raise ConfigError("the GPT baseline is its layer map (solver=euler); other solvers are for the DiffEqFormer.")
    if cfg.lora_rank and cfg.init is None:
        raise ConfigError("lora_rank > 0 fine-tunes a trained model: give it with init=FOLDER.")
    if cfg.corpus == "induction" and cfg.vocab < 2:
        raise ConfigError(f"the induction task needs at least 2 symbols, got vocab={cfg.vocab}.")
