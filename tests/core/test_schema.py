"""`attnflow.schema._schema`: the one schema mechanism of the study's config and of every
experiment's options. `typed` types given values by a dataclass and refuses, in one
sentence, what the schema does not allow; `explain` says an OmegaConf error in one
sentence; each key's meaning is the `help` of its field's metadata.

The refusals are checked on a small schema of this file's own (every kind of field:
numbers, a choice, a list, a group, a group of kinds, an open mapping, an untyped key),
and on the study's `Config` through `compose`."""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from dataclasses import dataclass
from typing import Any

import pytest
from omegaconf import MISSING, OmegaConf

from attnflow.schema._config import INITS, Config, choice, compose, config_source
from attnflow.schema._errors import ConfigError
from attnflow.schema._schema import _keys_of, explain, setting, to_container, typed

Colour = choice("Colour", ("red", "green"))


@dataclass
class Inner:
    size: int = setting(1, "a size")
    on: bool = setting(False, "a switch")


@dataclass
class Small:
    count: int = setting(2, "how many")
    rate: float = setting(0.5, "a rate")
    horizon: float = setting(1.0, "a horizon", infinite=True)
    colour: Colour = setting(Colour.red, "a colour")  # pyright: ignore[reportInvalidTypeForm, reportAttributeAccessIssue] a Choice
    times: list[float] = setting([0.0, 1.0], "times")
    pair: list[float] = setting([1.0, 1.0], "a pair", repeats=True)
    inner: Inner = setting(Inner(), "a group")
    name: str | None = setting(None, "a name")
    matrix: Any = setting([[1.0, 0.0], [0.0, 1.0]], "numbers")
    extra: dict[str, Any] = setting({}, "an open mapping")
    names: list[str] = setting([], "known names or others", choices=Colour, other="module.function")


@dataclass
class Shape:
    kind: str = MISSING


@dataclass
class Disc(Shape):
    kind: str = "disc"
    radius: float = setting(1.0, "the radius")


@dataclass
class Box(Shape):
    kind: str = "box"
    side: float = setting(2.0, "the side")


@dataclass
class Drawing:
    shape: Shape = setting(MISSING, "the shape", kinds={"disc": Disc, "box": Box})
    scale: float = setting(1.0, "the scale")


def refusal(schema: type, given: dict, prefix: str = "", **kwargs) -> str:
    """The sentence `typed` refuses `given` with (one sentence, one line)."""
    with pytest.raises(ConfigError) as error:
        typed(schema, given, prefix, **kwargs)
    said = str(error.value)
    assert "\n" not in said and said.endswith(".") and said[0].islower(), said
    return said


def test_given_values_are_typed_over_the_defaults_into_an_instance():
    given = {"count": "3", "inner": {"on": "yes"}, "colour": "green", "times": [2, 3]}
    options = typed(Small, given, "p.")
    assert isinstance(options, Small) and isinstance(options.inner, Inner)
    assert (options.count, options.rate, options.inner.on, options.inner.size) == (3, 0.5, True, 1)
    assert options.times == [2.0, 3.0] and options.colour == "green"
    assert given == {"count": "3", "inner": {"on": "yes"}, "colour": "green", "times": [2, 3]}  # not changed
    plain = to_container(options)
    assert plain["colour"] == "green" and type(plain["colour"]) is str and plain["inner"] == {"size": 1, "on": True}
    assert typed(Small, {"inner": {"on": "Off"}}).inner.on is False  # a boolean's words, in any case
    assert typed(Small, {}, defaults={"count": 7}).count == 7  # other defaults than the dataclass's
    assert typed(Small, {"count": 1}, defaults={"count": 7}).count == 1


@pytest.mark.parametrize(
    ("given", "prefix", "owner", "says"),
    [
        ({"cont": 1}, "", None, "unknown config key cont (did you mean count?); known keys are count, rate, "),
        ({"cont": 1}, "p.", None, "unknown config key p.cont (did you mean p.count?); p takes count, rate, "),
        ({"cont": 1}, "p.", "experiment x", "unknown option p.cont of experiment x (did you mean count?); it takes "),
        ({"inner": {"sze": 1}}, "p.", None, "unknown config key p.inner.sze (did you mean p.inner.size?); p.inner "),
        ({"count": "x"}, "p.", None, "p.count must be an integer, got 'x'."),
        ({"count": 1.5}, "", None, "count must be an integer, got 1.5."),
        ({"rate": "fast"}, "", None, "rate must be a number, got 'fast'."),
        ({"colour": "blue"}, "", None, "colour must be one of red, green, got 'blue'."),
        ({"times": "x"}, "", None, "times must be a list of numbers, got 'x'."),
        ({"name": 3.5j}, "", None, "name must be a string or null, got 3.5j."),
        ({"names": "red"}, "", None, "names must be a list of names among red, green (or module.function), got 'red'."),
        ({"inner": {"on": 2}}, "", None, "inner.on must be true or false, got 2."),
        ({"inner": {"on": "1"}}, "", None, "inner.on must be true or false, got '1'."),
        ({"inner": 3}, "", None, "inner must be a mapping of size, on, got 3."),
        ({"matrix": {"a": 1}}, "", None, "matrix cannot be a mapping, got {'a': 1}."),
        ({"rate": math.nan}, "", None, "rate must be a finite number, got nan."),
        ({"rate": -math.inf}, "", None, "rate must be a finite number, got -inf."),
        ({"horizon": math.nan}, "", None, "horizon must be a number, inf or -inf, got nan."),
        ({"times": [0, math.inf]}, "", None, "times must hold a finite number in each place, got inf in [0.0, inf]."),
        ({"matrix": [[1.0, math.nan]]}, "", None, "matrix must hold a finite number in each place, got nan in "),
        ({"times": [1, 1.0]}, "", None, "times holds 1.0 twice; give each value once."),
        ({"times": [2, 2, 2]}, "", None, "times holds 2.0 3 times; give each value once."),
        ({"rate": "${nowhere}"}, "p.", None, "p.rate holds an interpolation that cannot be resolved ("),
    ],
)
def test_each_refusal_is_one_sentence_naming_the_key(given, prefix, owner, says):
    assert refusal(Small, given, prefix, owner=owner).startswith(says)


def test_an_owner_names_its_keys_by_its_noun():
    # attnflow train's settings, beside an experiment's options (the default noun).
    said = refusal(Small, {"cont": 1}, owner="attnflow train", noun="setting")
    assert said.startswith("unknown setting cont of attnflow train (did you mean count?); it takes count, rate, ")


def test_what_the_metadata_allows_passes_and_numbers_false_leaves_them_to_the_caller():
    options = typed(Small, {"horizon": math.inf, "pair": [3.0, 3.0], "matrix": [[1.0, 1.0], [1.0, 1.0]]})
    assert options.horizon == math.inf and options.pair == [3.0, 3.0]
    assert typed(Small, {"horizon": -math.inf}).horizon == -math.inf
    assert math.isnan(typed(Small, {"rate": math.nan}, numbers=False).rate)
    assert typed(Small, {"times": [1.0, 1.0]}, numbers=False).times == [1.0, 1.0]
    assert typed(Small, {"extra": {"anything": {"nested": [1, 1]}}}).extra == {"anything": {"nested": [1, 1]}}


def test_a_complete_config_gives_every_key():
    full = to_container(typed(Small, {}))
    assert to_container(typed(Small, full, complete=True)) == full
    assert refusal(Small, {k: v for k, v in full.items() if k != "rate"}, complete=True) == (
        "rate has no value; give it one."
    )
    assert refusal(Small, {**full, "inner": {"on": True}}, "p.", complete=True) == "p.inner.size has no value; give it one."
    assert refusal(Small, {**full, "count": "???"}, complete=True) == "count has no value; give it one."


def test_a_group_of_kinds_takes_the_schema_its_kind_names():
    assert typed(Drawing, {"shape": "disc"}).shape == Disc(radius=1.0)
    drawn = typed(Drawing, {"shape": {"kind": "box", "side": 3}, "scale": 2})
    assert isinstance(drawn.shape, Box) and drawn.shape.side == 3.0 and drawn.scale == 2.0
    assert refusal(Drawing, {"shape": "star"}) == "unknown shape kind 'star'; choose one of disc, box."
    assert refusal(Drawing, {"shape": {"side": 3}}) == (
        "shape must be a kind (disc, box) or a mapping with one, got {'side': 3}."
    )
    assert refusal(Drawing, {"shape": 3}) == "shape must be a kind (disc, box) or a mapping with one, got 3."
    assert refusal(Drawing, {"shape": {"kind": "box", "sid": 3}}) == (
        "unknown config key shape.sid (did you mean shape.side?); shape (box) takes kind, side."
    )
    assert refusal(Drawing, {"shape": {"kind": "box", "side": "x"}}) == "shape.side must be a number, got 'x'."
    assert refusal(Drawing, {"shape": {"kind": "disc", "radius": math.inf}}) == (
        "shape.radius must be a finite number, got inf."
    )
    assert refusal(Drawing, {"shape": {"kind": "box"}}, complete=True) == "shape.side has no value; give it one."
    assert refusal(Drawing, {"shape": {"side": 1.0}, "scale": 1.0}, complete=True) == (
        "shape.kind has no value; give it one."
    )
    assert refusal(Drawing, {}) == "shape has no value; give it one."


def _error(make) -> Exception:
    try:
        make()
    except Exception as error:  # the OmegaConf error to explain
        return error
    raise AssertionError("no error")


def test_explain_says_an_omegaconf_error_against_any_schema_in_one_sentence():
    node = OmegaConf.structured(Small)
    error = _error(lambda: OmegaConf.merge(node, {"count": "x"}))
    assert explain(error, Small, "p.") == "p.count must be an integer, got 'x'."
    error = _error(lambda: OmegaConf.merge(node, {"cont": 1}))
    assert explain(error, Small).startswith("unknown config key cont (did you mean count?); known keys are count, ")
    error = _error(lambda: OmegaConf.merge(node, {"inner": {"sze": 1}}))
    assert explain(error, Small, "p.") == (
        "unknown config key p.inner.sze (did you mean p.inner.size?); p.inner takes size, on."
    )
    error = _error(lambda: OmegaConf.merge(node, {"names": "red"}))
    assert explain(error, Small) == "names must be a list of names among red, green (or module.function), got 'red'."
    error = _error(lambda: OmegaConf.to_object(OmegaConf.structured(Drawing)))
    assert explain(error, Drawing) == "shape has no value; give it one."
    # What Hydra composes: the keys without their types (`_keys_of`); an error names the
    # keys of the schema, and the kind of a group of kinds.
    keys = OmegaConf.create({"shape": OmegaConf.structured(_keys_of(Box)), "scale": 1.0})
    OmegaConf.set_struct(keys, True)
    error = _error(lambda: OmegaConf.merge(keys, {"shape": {"sid": 1}}))
    assert explain(error, Drawing) == "unknown config key shape.sid (did you mean shape.side?); shape (box) takes kind, side."
    open_mapping = OmegaConf.create({"extra": {}})
    OmegaConf.set_struct(open_mapping, True)
    error = _error(lambda: open_mapping.extra.x)
    assert explain(error, Small) == "extra holds no keys by default; add one with +extra.x=VALUE."
    assert explain(ValueError("Something odd.\nMore."), Small, "p.") == "invalid p: Something odd."
    assert explain(ValueError("Something odd."), Small) == "invalid config: Something odd."


def test_the_study_config_is_refused_in_the_same_sentences():
    def said(config):
        with pytest.raises(ConfigError) as error:
            compose(config)
        return str(error.value)

    assert said({"bta": 1}).startswith("unknown config key bta (did you mean beta?); known keys are n, d, beta, ")
    assert said({"mlp": {"enabld": True}}) == (
        "unknown config key mlp.enabld (did you mean mlp.enabled?); mlp takes enabled, hidden, activation, scale, bias."
    )
    assert said({"init": {"kind": "caps", "kk": 3}}) == (
        "unknown config key init.kk (did you mean init.k?); init (caps) takes kind, k, radius, centres."
    )
    assert said({"init": "capz"}) == f"unknown init kind 'capz'; choose one of {', '.join(INITS)}."
    assert said({"init": {"kind": "caps", "k": "x"}}) == "init.k must be an integer, got 'x'."
    assert said({"causal": 2}) == "causal must be true or false, got 2."
    assert said({"weights": {"q": {"scale": "x"}}}) == "weights.q.scale must be a number, got 'x'."
    assert said({"beta": {"a": 1}}) == "beta cannot be a mapping, got {'a': 1}."
    assert re.fullmatch(
        r"metrics must be a list of names among energy, .*, attention_rank \(or module\.function of a metric of "
        r"your own\), got 'energy'\.",
        said({"metrics": "energy"}),
    )
    # The study's ranges, and its NaN and infinity, are resolve_study's to say.
    assert math.isnan(compose({"t1": math.nan}).t1)
    assert compose({"init": "caps"}).init == INITS["caps"](k=2, radius=0.1, centres=None)


def _fields(schema: type, prefix: str = ""):
    """Every field of a schema and of its groups (and of each kind of its groups of kinds)."""
    for field in dataclasses.fields(schema):
        yield f"{prefix}{field.name}", field
        kind = typing.get_type_hints(schema)[field.name]
        inner = [a for a in typing.get_args(kind) if a is not type(None)] or [kind]
        for group in field.metadata.get("kinds", {}).values():
            yield from ((k, f) for k, f in _fields(group, f"{prefix}{field.name}.") if f.name != "kind")
        if dataclasses.is_dataclass(inner[0]) and "kinds" not in field.metadata:
            yield from _fields(typing.cast(type, inner[0]), f"{prefix}{field.name}.")


def test_the_meanings_are_the_schemas_and_the_yaml_files_hold_the_values():
    """Every key of the study (and of every initial condition) says what it means in its
    field's `help`; conf/config.yaml and conf/init/*.yaml hold the values, not the
    meanings (a comment on a key's line would be a second, unread copy)."""
    assert [key for key, field in _fields(Config) if not field.metadata.get("help")] == []
    assert all(cls.title for cls in INITS.values())
    folder = config_source()[1]
    for path in [folder.joinpath("config.yaml"), *(folder.joinpath("init", f"{kind}.yaml") for kind in INITS)]:
        text = path.read_text().split("\nhydra:")[0]  # Hydra's own settings keep their comments
        keyed = [line for line in text.splitlines() if re.match(r"^\s*[\w.]+:.*\s#", line)]
        assert keyed == [], (path.name, keyed)


def test_a_setting_copies_its_default_for_each_instance():
    one, two = Small(), Small()
    one.times.append(2.0)
    one.inner.size = 5
    assert two.times == [0.0, 1.0] and two.inner.size == 1 and Small().times == [0.0, 1.0]
    field = {f.name: f for f in dataclasses.fields(Small)}["horizon"]
    assert field.metadata == {"help": "a horizon", "infinite": True} and field.default == 1.0
