"""The terms and metrics a config names beyond attention and the MLP: a researcher's own
(their module's import path) or attnflow's (a short name of `_plugins.BUILTIN_TERMS`),
checked when a study is resolved and built into each member's field and recorder.

A term is `terms.NAME` of the config, `{_target_: module.Class, FIELD: value, ...}`, the
class a subclass of `attnflow.AbstractInteraction` whose fields are its settings:

- a number with a decimal point or a list of numbers is an array of the run's dtype,
  traced data (a sweep over it reuses the compiled program); a whole number, a boolean
  or text is passed as it is, and so is any value of a static field;
- a field named `beta`, `key` or `d` that the config leaves out receives the run's beta,
  the member's own random key (drawn apart from those of its tokens and weights) or the
  dimension of the tokens.

A metric is a name of `metrics` that is the import path of a function registered with
`attnflow.metric` (`metrics=[energy,mymodule.spread]`).
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..numerics._field import takes_piece_time
from ..numerics._terms import AbstractInteraction
from ..schema._config import Config
from ..schema._errors import ConfigError, did_you_mean
from ..schema._metric_registry import user_metrics
from ..schema._plugins import import_target, source_digest

# What a term may receive from the run without being given it in the config.
SUPPLIED = ("beta", "key", "d")


def _is_static(field: dataclasses.Field) -> bool:
    return bool(field.metadata.get("static", False))


def _is_data(value: Any) -> bool:
    """A setting that is an array of the run's dtype: a number with a decimal point, or a
    (nested) list of numbers."""
    if isinstance(value, bool):
        return False
    if isinstance(value, float):
        return True
    if isinstance(value, (list, tuple)) and value:
        return all(_is_data(v) or (isinstance(v, int) and not isinstance(v, bool)) for v in value)
    return False


def term_class(name: str, spec: Any) -> type[AbstractInteraction]:
    """The class `terms.NAME._target_` names, checked to be a term."""
    if not isinstance(spec, dict):
        raise ConfigError(
            f"terms.{name} must be a mapping with _target_ (module.Class) and the term's settings, got {spec!r}."
        )
    if "_target_" not in spec:
        raise ConfigError(
            f"terms.{name} names no class: give +terms.{name}._target_=module.Class (a subclass of "
            "attnflow.AbstractInteraction)."
        )
    kind = import_target(spec["_target_"], f"terms.{name}._target_")
    if not (isinstance(kind, type) and issubclass(kind, AbstractInteraction)):
        raise ConfigError(
            f"terms.{name}._target_={spec['_target_']} is not a subclass of attnflow.AbstractInteraction."
        )
    if getattr(kind, "__abstractmethods__", None):
        raise ConfigError(
            f"terms.{name}._target_={spec['_target_']} is abstract: it lacks "
            f"{', '.join(sorted(kind.__abstractmethods__))}."
        )
    return kind


def _settings(name: str, spec: dict, kind: type) -> dict[str, dataclasses.Field]:
    """The fields of `kind` by name, every setting of `spec` among them."""
    fields = {field.name: field for field in dataclasses.fields(kind) if field.init}
    for key in spec:
        if key != "_target_" and key not in fields:
            guess = did_you_mean(key, fields, f"terms.{name}.")
            raise ConfigError(
                f"unknown setting terms.{name}.{key}{guess}; {spec['_target_']} takes {', '.join(fields) or 'none'}."
            )
    return fields


def term_data(cfg: Config) -> dict[str, np.ndarray]:
    """The settings of the config's terms that are traced data, by dotted path
    (`terms.NAME.FIELD`), as float64 arrays."""
    values = {}
    for name, spec in (cfg.terms or {}).items():
        fields = _settings(name, spec, term_class(name, spec))
        for key, value in spec.items():
            if key != "_target_" and not _is_static(fields[key]) and _is_data(value):
                values[f"terms.{name}.{key}"] = np.asarray(value, dtype=np.float64)
    return values


def build_terms(cfg: Config, get, key, beta, dtype) -> list[AbstractInteraction]:
    """The config's terms for one member: `get(path)` reads a setting (traced where it
    is data), `key` is the member's key for its weights, `beta` the run's."""
    terms = []
    for name, spec in (cfg.terms or {}).items():
        kind = term_class(name, spec)
        fields = _settings(name, spec, kind)
        arguments = {}
        for field in fields.values():
            if field.name in spec:
                path = f"terms.{name}.{field.name}"
                value = spec[field.name]
                arguments[field.name] = (
                    jnp.asarray(get(path), dtype) if not _is_static(field) and _is_data(value) else value
                )
            elif field.name == "beta":
                arguments["beta"] = jnp.asarray(beta, dtype)
            elif field.name == "key":
                # A key of the term's own, by its name: the tokens' and weights' keys are unchanged.
                arguments["key"] = jax.random.fold_in(key, zlib.crc32(f"terms.{name}".encode()) & 0x7FFFFFFF)
            elif field.name == "d":
                arguments["d"] = cfg.d
        terms.append(kind(**arguments))
    return terms


def check_terms(cfg: Config, beta: float) -> None:
    """Every term of the config built once, as a member would build it: a class that is
    not a term, an unknown or missing setting, or a term that refuses its settings is one
    sentence naming `terms.NAME`."""
    dtype = checking_dtype(cfg)
    for name, spec in (cfg.terms or {}).items():
        kind = term_class(name, spec)
        fields = _settings(name, spec, kind)
        missing = [
            f.name
            for f in fields.values()
            if f.name not in spec
            and f.name not in SUPPLIED
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            raise ConfigError(
                f"terms.{name} ({spec['_target_']}) needs {' and '.join(missing)}: give "
                f"+terms.{name}.{missing[0]}=VALUE."
            )
        for key, value in spec.items():
            if key != "_target_" and _is_data(value) and not np.isfinite(np.asarray(value, np.float64)).all():
                raise ConfigError(f"terms.{name}.{key} must hold finite numbers, got {value!r}.")
        single = dataclasses.replace(cfg, terms={name: spec})
        try:
            (term,) = build_terms(single, lambda path, c=single: _get(c, path), jax.random.key(0), beta, dtype)
            tokens = jax.ShapeDtypeStruct((cfg.n, cfg.d), dtype)
            call = (
                (lambda x, f=term: f(jnp.zeros((), dtype), x, None))
                if takes_piece_time(term)
                else (lambda x, f=term: f(jnp.zeros((), dtype), x))
            )
            check = jax.eval_shape(call, tokens)
        except ConfigError as error:
            raise ConfigError(f"terms.{name}: {error}") from None
        except Exception as error:  # the user's class refused its settings, or failed on the tokens
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise ConfigError(
                f"terms.{name} ({spec['_target_']}) raised {type(error).__name__} when built or "
                f"called on {cfg.n} tokens of dimension {cfg.d}{': ' + first if first else ''}."
            ) from None
        if check.shape != (cfg.n, cfg.d):
            raise ConfigError(
                f"terms.{name} ({spec['_target_']}) returns shape {check.shape}; a term returns one "
                f"vector per token, shape (n, d) = ({cfg.n}, {cfg.d})."
            )


def _get(cfg: Config, path: str) -> Any:
    node: Any = cfg
    for part in path.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node


def checking_dtype(cfg: Config):
    """The dtype a config's terms and metrics are checked in: the run's, or float32 for a
    float64 run checked before the process has switched float64 on (shapes and refusals
    do not depend on it)."""
    return jnp.dtype(cfg.dtype.value) if cfg.dtype == "float32" or jax.config.jax_enable_x64 else jnp.float32  # pyright: ignore[reportAttributeAccessIssue]  (jax's Config stub lacks the flag attributes; the DType choice is narrowed to a str literal by `==`)


def code_digest(cfg: Config) -> str | None:
    """A digest of the source of every module of the researcher's that the config names
    (its terms, its metrics, its experiment), None when it names none: part of what
    identifies the run's compiled program and its pieces."""
    named = [term_class(name, spec) for name, spec in (cfg.terms or {}).items()]
    named += [metric.function for metric in user_metrics(cfg)]
    if cfg.experiment is not None and cfg.experiment._target_ is not None:
        named.append(import_target(cfg.experiment._target_, "experiment._target_"))
    return source_digest(named)
