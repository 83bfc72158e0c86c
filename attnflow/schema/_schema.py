"""One schema mechanism for every setting attnflow reads: a study's config
(`_config.Config`, its groups and the initial conditions of `attnflow.schema.initial`) and each
experiment's `Options`.

A schema is a dataclass. Each field is a key: its annotation is its type (a `Choice`
for one of fixed names, a nested dataclass for a group of keys), its default the value
taken when none is given, and its `metadata` what a type cannot say:

- `help`: what the key means, as `attnflow --help` and the reference page show it
  (`setting(default, "meaning")` declares a field with its meaning);
- `infinite`: the key takes plus and minus infinity (a number is finite otherwise);
- `repeats`: a list that may hold an entry twice (refused otherwise);
- `kinds`: a group that takes one of several schemas, a mapping of names to dataclasses,
  picked by the group's `kind` key (the study's `init`; a key of the schema itself, not
  of a nested group);
- `choices` and `other`: the names an open text key (or list of them) suggests, a
  `Choice`, and what else it takes (the study's `metrics`: a built-in name, or
  module.function).

`typed` types given values by a schema and refuses, in one sentence, what the schema
does not allow; `explain` says an OmegaConf error in one sentence. Ranges and
combinations of values are their owners' to check. Nothing here imports JAX: the help
reads the schemas.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf import errors as oc_errors

from ._errors import ConfigError, did_you_mean

T = TypeVar("T")


def setting(default: Any, meaning: str, **metadata: Any) -> Any:
    """A field of a schema: its `default` (a list, a mapping or another unhashable value
    is copied for each instance) and its `meaning` (`metadata["help"]`), with any other
    `metadata` (`infinite=True`, `repeats=True`, `kinds=...`, `choices=...`)."""
    metadata = {"help": meaning, **metadata}
    if type(default).__hash__ is None:  # what a dataclass refuses as a shared default
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


# How a boolean may be spelt (YAML 1.1's words): OmegaConf alone would also read any
# number (2 is true) and "1", "y" or "n".
_BOOLEAN_WORDS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def read_boolean(value: Any) -> bool | None:
    """`value` as a boolean (True, "yes", "Off", ...), or None if it is not one."""
    if isinstance(value, bool):
        return value
    return _BOOLEAN_WORDS.get(value.lower()) if isinstance(value, str) else None


def hints(schema: type) -> dict[str, Any]:
    """The types of a schema's keys: its dataclass fields (a class variable, such as an
    initial condition's `data`, is not a key)."""
    names = {field.name for field in dataclasses.fields(schema)}
    return {name: kind for name, kind in typing.get_type_hints(schema).items() if name in names}


def is_optional(kind: Any) -> bool:
    """Whether a type is `X | None`."""
    return typing.get_origin(kind) in (typing.Union, types.UnionType)


def _inner(kind: Any) -> Any:
    """`X` for `X | None`, else the type itself."""
    return next(a for a in typing.get_args(kind) if a is not type(None)) if is_optional(kind) else kind


def _is_group(kind: Any) -> bool:
    return isinstance(kind, type) and dataclasses.is_dataclass(kind)


def to_container(cfg: Any) -> Any:
    """A typed config (a schema's instance) as plain nested dicts and lists (choices as
    their names), in the schema's key order."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: to_container(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, Mapping):  # a mapping the schema leaves open (terms): a copy
        return {key: to_container(value) for key, value in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return [to_container(v) for v in cfg]
    if isinstance(cfg, enum.Enum):
        return cfg.name
    return cfg


def kind_of(value: Any, kinds: Mapping[str, type], key: str, default: str | None = None) -> tuple[str, dict]:
    """The kind a group of `kinds` takes, and its settings with `kind` set: `value` is
    a kind's name or a mapping that names one (`default` where it names none)."""
    if isinstance(value, str):
        value = {"kind": value}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key} must be a kind ({', '.join(kinds)}) or a mapping with one, got {value!r}.")
    name = value.get("kind", default)
    if name is None:
        raise ConfigError(f"{key} must be a kind ({', '.join(kinds)}) or a mapping with one, got {dict(value)!r}.")
    if name not in kinds:
        raise ConfigError(f"unknown {key} kind {name!r}; choose one of {', '.join(kinds)}.")
    return name, {**value, "kind": name}


# --- typing given values ------------------------------------------------------------


def typed(
    schema: type[T],
    given: Mapping,
    prefix: str = "",
    *,
    complete: bool = False,
    defaults: Mapping | None = None,
    owner: str | None = None,
    noun: str = "option",
    numbers: bool = True,
) -> T:
    """`given` typed by the dataclass `schema` over its defaults, as an instance of it
    (`to_container` makes plain containers of it, choices as their names).

    `prefix` names where the keys sit (`experiment.options.`). Refused in one sentence
    (a `ConfigError`): a key the schema lacks (with the nearest name: for the keys of
    `owner`, "unknown `noun` ... of `owner`", an option of an experiment or a setting of
    `attnflow train`), a value of the wrong type, a boolean
    other than a boolean or its words (true/false, yes/no, on/off), a name outside a
    choice, a group that is no mapping, a mapping in an untyped key, and with
    `complete=True` a key without a value (every key must be given). With `numbers`,
    also a number that is NaN or infinite (unless the field's metadata says `infinite`)
    and a list that holds an entry twice (unless it says `repeats`): no option can use
    them. `defaults` (a mapping, such as the values of a YAML file) replaces the
    schema's own defaults. Ranges and combinations are the caller's to check.
    """
    if complete:
        _check_complete(given, schema, prefix)
    _check_given(given, schema, prefix, owner, noun=noun)
    node = _merged(schema, given, prefix, defaults)
    try:
        instance = typing.cast(T, OmegaConf.to_object(node))  # a structured config: the schema's instance
    except oc_errors.OmegaConfBaseException as error:  # an interpolation that cannot be resolved, a missing value
        raise ConfigError(explain(error, schema, prefix)) from None
    if numbers:
        _check_values(to_container(instance), schema, prefix)
    return instance


# The schemas' defaults as typed nodes, made once for each set of defaults.
_BASES: dict[tuple, DictConfig] = {}


def _base(schema: type, defaults: Mapping | None, prefix: str):
    cached = (schema, None if defaults is None else _frozen(defaults))
    if cached not in _BASES:
        base = OmegaConf.structured(schema)
        if defaults is not None:
            try:
                base = typing.cast(DictConfig, OmegaConf.merge(base, defaults))
            except oc_errors.OmegaConfBaseException as error:
                raise ConfigError(explain(error, schema, prefix)) from None
        _BASES[cached] = base
    return _BASES[cached]


def _merged(schema: type, given: Mapping, prefix: str, defaults: Mapping | None):
    """The typed node of `given` over the defaults; a group of `kinds` typed by its
    kind's schema (over that schema's own defaults)."""
    chosen = {f.name: f.metadata["kinds"] for f in dataclasses.fields(schema) if "kinds" in f.metadata}
    chosen = {name: kinds for name, kinds in chosen.items() if name in given}
    # A group holding a group of kinds (the source's `cross.init`) is merged the same way, a level down.
    nested = {
        name: group
        for name, group in hints(schema).items()
        if name in given and isinstance(given[name], Mapping) and _is_group(group) and _holds_kinds(group)
    }
    try:
        node = typing.cast(  # a structured config is a DictConfig
            DictConfig,
            OmegaConf.merge(
                _base(schema, defaults, prefix), {k: v for k, v in given.items() if k not in chosen and k not in nested}
            ),
        )
    except oc_errors.OmegaConfBaseException as error:
        raise ConfigError(explain(error, schema, prefix)) from None
    for name, kinds in chosen.items():
        kind, settings = kind_of(given[name], kinds, f"{prefix}{name}")
        node[name] = _merged(kinds[kind], settings, f"{prefix}{name}.", None)
    for name, group in nested.items():
        below = node[name]
        known = {} if below is None else OmegaConf.to_container(typing.cast(DictConfig, below), resolve=False)
        node[name] = _merged(group, given[name], f"{prefix}{name}.", typing.cast(dict, known))
    return node


def _holds_kinds(schema: type) -> bool:
    """Whether a group's schema has a group of kinds among its keys."""
    return any("kinds" in f.metadata for f in dataclasses.fields(schema))


def _check_given(
    given: Mapping, schema: type, prefix: str, owner: str | None = None, label: str = "", noun: str = "option"
) -> None:
    """What OmegaConf would let through, or say in its own words: a key the schema
    lacks, a group (a nested dataclass of the schema) that is no mapping, a boolean
    other than a boolean or one of its words, and a mapping in an untyped key. A group
    of `kinds` is checked by its kind's schema."""
    fields = {f.name: f for f in dataclasses.fields(schema)}
    unknown = next((name for name in given if name not in fields), None)
    if unknown is not None:
        raise ConfigError(_unknown(prefix, str(unknown), list(fields), owner=owner, label=label, noun=noun))
    kinds_of = hints(schema)
    for name, value in given.items():
        kind, key, kinds = kinds_of[name], f"{prefix}{name}", fields[name].metadata.get("kinds")
        if kinds is not None:
            chosen, settings = kind_of(value, kinds, key)
            _check_given(settings, kinds[chosen], f"{key}.", label=f"{key} ({chosen})")
        elif _is_group(kind):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{key} must be {_describe(kind)}, got {value!r}.")
            _check_given(value, kind, f"{key}.")
        elif kind is bool and read_boolean(value) is None and not (isinstance(value, str) and value.startswith("${")):
            raise ConfigError(f"{key} must be {_describe(bool)}, got {value!r}.")
        elif kind is Any and isinstance(value, Mapping):  # numbers or nested lists of them, in every such key
            raise ConfigError(f"{key} cannot be a mapping, got {value!r}.")


def _check_complete(given: Mapping, schema: type, prefix: str) -> None:
    """Every key of `schema` (and of its groups) has a value in `given`."""
    kinds_of = hints(schema)
    for field in dataclasses.fields(schema):
        key, value, kinds = f"{prefix}{field.name}", given.get(field.name, MISSING), field.metadata.get("kinds")
        if isinstance(value, str) and value == MISSING:
            raise ConfigError(f"{key} has no value; give it one.")
        if not isinstance(value, Mapping):
            continue
        if kinds is not None:
            if value.get("kind", MISSING) == MISSING:  # its kind first
                raise ConfigError(f"{key}.kind has no value; give it one.")
            if value["kind"] in kinds:
                _check_complete(value, kinds[value["kind"]], f"{key}.")
        elif _is_group(kinds_of[field.name]):
            _check_complete(value, kinds_of[field.name], f"{key}.")


def _check_values(typed: Mapping, schema: type, prefix: str) -> None:
    """What a type lets through but no option can use: a number that is NaN or infinite
    (a field typed float, or a number inside a list or an untyped field), unless the
    field's `metadata` says `infinite` (then plus and minus infinity pass, NaN never);
    and an entry given twice in a field typed as a list (each entry is a panel, a run or
    a time: a repeat computes or draws the same thing twice, or is silently merged),
    unless its `metadata` says `repeats`. Groups (a nested dataclass, a group of
    `kinds`) are checked key by key; a mapping (`dict[str, Any]`) holds the settings of
    another part of attnflow (a training, a study) and is checked by that part's own
    schema."""
    kinds_of = hints(schema)
    for option in dataclasses.fields(schema):
        key, value, kind = f"{prefix}{option.name}", typed.get(option.name), _inner(kinds_of[option.name])
        kinds = option.metadata.get("kinds")
        if kinds is not None and isinstance(value, Mapping) and value.get("kind") in kinds:
            _check_values(value, kinds[value["kind"]], f"{key}.")
            continue
        if _is_group(kind) and isinstance(value, Mapping):
            _check_values(value, kind, f"{key}.")
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


# --- one sentence for every way a value can be wrong --------------------------------


def _unknown(
    prefix: str, name: str, names: list[str], *, owner: str | None = None, label: str = "", noun: str = "option"
) -> str:
    """The sentence for a key `name` that a group (`prefix`, or `label`) lacks: the
    nearest of its `names`, and all of them; for the keys of an `owner`, each a `noun`
    (an experiment's option, a setting of `attnflow train`)."""
    if owner is not None:
        takes = ", ".join(names) or f"no {noun}s"
        return f"unknown {noun} {prefix}{name} of {owner}{did_you_mean(name, names)}; it takes {takes}."
    group, takes = label or prefix.rstrip("."), ", ".join(names) or "none"
    guess = did_you_mean(name, names, prefix)
    if group:
        return f"unknown config key {prefix}{name}{guess}; {group} takes {takes}."
    return f"unknown config key {name}{guess}; known keys are {takes}."


def _describe(kind: Any) -> str:
    if is_optional(kind):
        return f"{_describe(_inner(kind))} or null"
    if typing.get_origin(kind) is list:
        return f"a list of {_plural(typing.get_args(kind)[0])}"
    if typing.get_origin(kind) is dict:
        return "a mapping"
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return "one of " + ", ".join(kind.__members__)
    if _is_group(kind):
        return "a mapping of " + ", ".join(f.name for f in dataclasses.fields(kind))
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(kind, "valid")


def _plural(kind: Any) -> str:
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return "names among " + ", ".join(kind.__members__)
    return {bool: "booleans", int: "integers", float: "numbers", str: "strings"}.get(kind, "values")


def _describe_field(field: dataclasses.Field, kind: Any) -> str:
    """What the field takes: its type in words, with the names its `choices` metadata
    suggests for an open text key and what else it takes (`other`)."""
    names = field.metadata.get("choices")
    if names is None:
        return _describe(kind)
    listed = typing.get_origin(_inner(kind)) is list
    text = _describe(list[names] if listed else names)  # pyright: ignore[reportInvalidTypeForm] a Choice known at run time
    other = field.metadata.get("other")
    return f"{text} (or {other})" if other else text


def _split(full_key: str) -> list[str]:
    parts = []
    for piece in str(full_key).replace("]", "").split("."):
        parts.extend(p for p in piece.split("[") if p != "")
    return parts


def _at(path: list[str], schema: type, holder: Any = None) -> tuple[dataclasses.Field | None, int, Any, str]:
    """Where a dotted path (list items by index) of `schema` leads: the last field on it,
    how many parts lead to that field, the type at the path (None if unknown), and the
    kind's name where the path ends in a group of `kinds` (`holder`, the class an error
    was raised in, tells which kind)."""
    kind: Any = schema
    field: dataclasses.Field | None = None
    depth = 0
    for i, part in enumerate(path):
        kind = _inner(kind)
        if typing.get_origin(kind) is list:
            kind = typing.get_args(kind)[0]
            continue
        kind = _chosen(field, kind, holder)[0]
        if not _is_group(kind):
            return None, 0, None, ""
        fields = {f.name: f for f in dataclasses.fields(kind)}
        if part not in fields:
            return None, 0, None, ""
        field, depth, kind = fields[part], i + 1, hints(kind)[part]
    if is_optional(kind) and _is_group(_inner(kind)):
        kind = _inner(kind)
    kind, name = _chosen(field, kind, holder)
    return field, depth, kind, name


def _chosen(field: dataclasses.Field | None, kind: Any, holder: Any) -> tuple[Any, str]:
    """The schema of a group of `kinds` that `holder` is one of, and its name."""
    kinds = field.metadata.get("kinds", {}) if field is not None else {}
    name = next((name for name, cls in kinds.items() if cls is holder), "")
    return (holder, name) if name else (kind, "")


# The schema of each class made by `_keys_of` (an error names the class it was raised in).
_SCHEMA_OF: dict[type, type] = {}


@functools.cache
def _keys_of(schema: type) -> type:
    """A dataclass with the keys and defaults of `schema` and no types (what Hydra
    composes; `explain` names the keys of `schema` in its errors)."""
    fields = [
        (f.name, Any, dataclasses.field(default=MISSING if f.default is dataclasses.MISSING else f.default))
        for f in dataclasses.fields(schema)
    ]
    keys = dataclasses.make_dataclass(schema.__name__, fields)
    _SCHEMA_OF[keys] = schema
    return keys


def explain(error: Exception, schema: type, prefix: str = "") -> str:
    """One sentence for an OmegaConf error raised while composing or resolving a config
    of `schema` (whose keys sit at `prefix`)."""
    full_key = str(getattr(error, "full_key", "") or "")
    path = _split(full_key)
    shown = f"{prefix}{full_key}"
    holder: Any = getattr(error, "object_type", None)
    holder = _SCHEMA_OF.get(holder, holder)
    if isinstance(error, oc_errors.InterpolationResolutionError):
        reason = str(getattr(error, "msg", None) or error).splitlines()[0].rstrip(".")
        return f"{shown or prefix.rstrip('.') or 'a value'} holds an interpolation that cannot be resolved ({reason})."
    if isinstance(error, (oc_errors.ConfigKeyError, oc_errors.ConfigAttributeError)) and path:
        _, _, parent, kind = _at(path[:-1], schema, holder)
        group = prefix + "".join(f"{part}." for part in path[:-1])
        if _is_group(parent):
            names = [f.name for f in dataclasses.fields(parent)]
        elif isinstance(getattr(error, "parent_node", None), DictConfig):  # a mapping the schema leaves open
            names = [str(name) for name in error.parent_node.keys()]  # pyright: ignore[reportAttributeAccessIssue] a DictConfig, checked above
            if not names:
                return f"{group.rstrip('.')} holds no keys by default; add one with +{shown}=VALUE."
        else:
            return f"unknown config key {shown}."
        return _unknown(group, path[-1], names, label=f"{group.rstrip('.')} ({kind})" if kind else "")
    if isinstance(error, oc_errors.MissingMandatoryValue) and full_key:
        return f"{shown} has no value; give it one."
    if full_key:
        value = getattr(error, "value", None)
        if isinstance(error, oc_errors.ConfigTypeError) and getattr(error, "object_type", None) in (list, dict):
            # Hydra merging a mapping where the value is a list, or the other way round
            # (a key the schema leaves untyped, such as beta).
            return f"{shown} cannot be {'a mapping' if error.object_type is list else 'a list'}."
        field, depth, kind, _ = _at(path, schema, holder)
        if field is not None and "choices" in field.metadata:  # the field's own words, for any entry of it
            whole = _at(path[:depth], schema, holder)[2]
            return f"{prefix}{'.'.join(path[:depth])} must be {_describe_field(field, whole)}, got {value!r}."
        if kind is not None:
            return f"{shown} must be {_describe(kind)}, got {value!r}."
    first = str(getattr(error, "msg", None) or error).splitlines()[0].strip().rstrip(".")
    return f"invalid {prefix.rstrip('.') or 'config'}: {first}."
