"""The settings of `attnflow train`, without JAX.

`TrainConfig` is the schema: each setting's type, and its meaning (`metadata["help"]`,
which `attnflow train --help` shows); the default values are in conf/train.yaml. The
command line is composed by Hydra over that file (`train_config`), typed by the schema
and checked (`check`); a run's stored settings are read as data (`read_state`). The
command (`_command`) and the training (`_train`) read them from here.

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
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException, ValidationError

from ..schema._config import _keys_of, config_source, hydra_context, read_boolean
from ..schema._errors import CheckpointError, ConfigError, did_you_mean
from ..schema._methods import SOLVERS
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


def _setting(meaning: str, choices: Sequence[str] = ()) -> Any:
    """A field of `TrainConfig`: its default in conf/train.yaml, its meaning (and the
    names it takes) as the field's metadata, which `attnflow train --help` reads."""
    return dataclasses.field(default=MISSING, metadata={"help": meaning, "choices": tuple(choices)})


@dataclass
class TrainConfig:
    """The settings of `attnflow train`: types and meanings here, values in conf/train.yaml."""

    # --- model
    model: str = _setting("diffeqformer | gpt (pre-LN GPT-2 with `steps` layers)", MODELS)
    vocab: int = _setting("BPE tokens (reference corpora) or symbols (induction)")
    dim: int = _setting("width d of the residual stream")
    heads: int = _setting("attention heads (d_k = dim / heads)")
    hidden: int = _setting("MLP width")
    context: int = _setting("tokens per sequence (learned positions)")
    d_emb: int = _setting("DiffEqFormer: width of each weight's hypernetwork MLP")
    frequencies: int = _setting("DiffEqFormer: sines and cosines of the time embedding")
    time_scale: float = _setting(
        "DiffEqFormer: the embedding is (t, sin(w s t), cos(w s t)) with s = time_scale (the paper's code: 1000)"
    )
    steps: int = _setting("solver steps on [0, horizon] (DiffEqFormer) = layers (GPT)")
    horizon: float = _setting("DiffEqFormer: the ODE runs on t in [0, horizon], in steps of horizon/steps")
    solver: str = _setting(
        "DiffEqFormer: euler is the paper's parallel block; heun, rk4, ... solve the same ODE", tuple(SOLVERS)
    )
    dtype: str = _setting("float32 | float64", DTYPES)
    # --- data
    corpus: str = _setting("reference (= reference-a) | reference-b | induction", (*ALIASES, *CORPORA))
    seed: int = _setting("initial weights and the order of the batches")
    # --- optimization (AdamW, warmup then cosine decay)
    batch: int = _setting("sequences per step")
    train_steps: int = _setting("optimizer steps")
    lr: float = _setting("peak learning rate")
    warmup: float = _setting("share of train_steps spent warming up linearly from 0")
    min_lr: float = _setting("final learning rate, as a share of lr")
    weight_decay: float = _setting("on matrices and embeddings (not on biases, gains, LoRA adapters)")
    b1: float = _setting("AdamW's decay of the first moment")
    b2: float | None = _setting("null: 0.95 for the DiffEqFormer, 0.999 for GPT (the paper's app. C.5)")
    clip: float = _setting("gradients clipped to this global norm")
    # --- evaluation, checkpoints, output
    eval_every: int = _setting("validation loss every this many steps (and at the end)")
    eval_batches: int = _setting("batches of `batch` held-out sequences per validation")
    save_every: int = _setting("latest state (model + optimizer) every this many steps (and at the end)")
    out: str | None = _setting(
        "run folder; null: runs/train/<model>-<corpus>-s<steps>-seed<seed>; with -m the sweep's folder, "
        "job N training in out/N (null: runs/train/multirun/DATE/TIME)"
    )
    init: str | None = _setting("a model folder (or run folder) to start from: fine-tuning")
    lora_rank: int = _setting("> 0: fine-tune the populated layers of `init` with rank-r adapters only")
    compilation_cache: bool = _setting("keep compiled programs between runs (JAX's persistent cache)")

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


def _types() -> dict[str, str]:
    """Each setting's type, as written in `TrainConfig` (`int`, `float | None`, ...)."""
    return {f.name: str(f.type) for f in dataclasses.fields(TrainConfig)}


def _unknown(name: str) -> str:
    names = list(_types())
    hint = did_you_mean(name, names)
    return f"unknown setting {name!r} for attnflow train{hint}; the settings are {', '.join(names)}."


def _check_given(given: Mapping[str, Any]) -> None:
    """Each given setting is one of the schema's, and a boolean is true or false (or
    yes/no, on/off), which OmegaConf alone would take from any number."""
    types = _types()
    for name, value in given.items():
        if name not in types:
            raise ConfigError(_unknown(name))
        if types[name] == "bool" and read_boolean(value.strip() if isinstance(value, str) else value) is None:
            raise ConfigError(f"{name} must be true or false (or yes/no, on/off), got {value!r}.")


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
        if name not in _types():
            raise ConfigError(_unknown(name))
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
    _check_given(given)
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
        _check_given(given)
        base = cast(DictConfig, OmegaConf.load(_defaults_file()))  # conf/train.yaml is a mapping
        base.pop("defaults", None)
        return _typed((base, OmegaConf.create(given)), given)
    composed, given = _command_line(overrides)
    return _typed((OmegaConf.create(composed),), given)


def _typed(layers: Sequence[Any], given: Mapping[str, Any]) -> TrainConfig:
    """The settings `layers` merged onto the schema, typed and checked; with the stored
    settings of the run in `out`, when there is one, for those not `given`."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), *layers)
        cfg = cast(TrainConfig, OmegaConf.to_object(merged))  # merged onto the TrainConfig schema
    except ValidationError as error:
        key = str(getattr(error, "full_key", "") or "")
        value = getattr(error, "value", None)
        raise ConfigError(f"{key} must be {_kind(key)}, got {value!r}.") from None
    except OmegaConfBaseException as error:
        first = str(error).strip().splitlines()[0].rstrip(".")
        raise ConfigError(f"invalid settings for attnflow train ({first}).") from None
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


def _kind(key: str) -> str:
    """What a setting's type accepts, in words."""
    kind = _types().get(key, "")
    words = next(
        (
            w
            for t, w in (
                ("int", "a whole number"),
                ("float", "a number"),
                ("bool", "true or false"),
                ("str", "a word or path"),
            )
            if t in kind
        ),
        "of another type",
    )
    return words + (" or null" if _optional(kind) else "")


def _optional(kind: str) -> bool:
    """Whether a setting's type, as written (`float | None`, `Optional[float]`), takes null."""
    return kind.startswith("Optional") or "None" in (part.strip() for part in kind.split("|"))


def _of_kind(key: str, value: Any) -> bool:
    """Whether `value` (read from JSON) is of the type of the setting `key`."""
    kind = _types()[key]
    if value is None:
        return _optional(kind)
    if isinstance(value, bool) or kind == "bool":
        return isinstance(value, bool) and kind == "bool"
    if "int" in kind:
        return isinstance(value, int)
    if "float" in kind:
        return isinstance(value, (int, float))
    return isinstance(value, str)


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
        if key not in _types() or key in NOT_RESULT_KEYS:
            raise CheckpointError(
                f"{path} holds an unknown setting {key!r}; it was not written by this attnflow train."
            )
        if not _of_kind(key, value):
            raise CheckpointError(f"{path} holds {key}={value!r}, which is not {_kind(key)}.")
        if value is not None and "float" in _types()[key]:
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
