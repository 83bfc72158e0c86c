"""Bad input to `attnflow.run(config)` / `attnflow.validate_config(config)` stops early.

STYLE.md rule 11: an impossible value raises `ConfigError` before any work starts, with
one sentence that names the offending key and value and says what is allowed; a run
whose state leaves the finite numbers raises `NonFiniteStateError` naming where.
"""

from __future__ import annotations

import copy
import math
import re

import numpy as np
import pytest

import attnflow
from attnflow import ConfigError, NonFiniteStateError

# Tiny, valid settings that every case starts from (t1 / dt / saves keep any accidental
# run to a handful of steps).
TINY = {"n": 4, "d": 3, "members": 2, "t1": 0.5, "dt": 0.1, "saves": 2, "plot": False}


def assert_one_sentence(message: str) -> None:
    """One line, one sentence, ending with a full stop."""
    assert message == message.strip() and "\n" not in message, message
    assert message.endswith("."), message
    # A full stop followed by more text would start a second sentence (numbers like
    # 0.5 have no space after the dot, so they do not count).
    assert re.search(r"[.!?]\s+\S", message) is None, message


# (overrides, regex naming the offending key, the bad value as printed, what is allowed)
IMPOSSIBLE = [
    pytest.param({"n": 0}, r"\bn\b", "0", "at least 1", id="n=0"),
    pytest.param({"members": 0}, r"\bmembers\b", "0", "at least 1", id="members=0"),
    pytest.param({"n": 2.5}, r"\bn\b", "2.5", "integer", id="n-not-integer"),
    pytest.param({"d": 1, "norm": "sphere"}, r"\bd\b", "d=1", "d >= 2", id="d=1-on-sphere"),
    pytest.param({"init": {"kind": "orthonormal"}, "n": 5, "d": 3}, r"orthonormal", "n=5", "n <= d",
                 id="orthonormal-n>d"),
    pytest.param({"dt": -0.1}, r"\bdt\b", "-0.1", "positive", id="dt<0"),
    pytest.param({"dt": 0.0}, r"\bdt\b", "0", "positive", id="dt=0"),
    pytest.param({"t0": 0.0, "t1": 0.0}, r"\bt1\b", "t1=0", "greater than t0", id="t1=t0"),
    pytest.param({"t0": 1.0, "t1": 0.5}, r"\bt1\b", "t1=0.5", "greater than t0", id="t1<t0"),
    pytest.param({"t1": math.inf}, r"\bt1\b", "inf", "finite", id="t1=inf"),
    pytest.param({"beta": -1.0}, r"\bbeta\b", "-1", "positive", id="beta<0"),
    pytest.param({"beta": [0.5, math.nan]}, r"\bbeta\b", "nan", "finite", id="beta-nan-in-list"),
    pytest.param({"beta": []}, r"\bbeta\b", "list", "non-empty", id="beta-empty-list"),
    pytest.param({"solver": "foo"}, r"\bsolver\b", "'foo'", "euler_renorm", id="solver"),
    pytest.param({"dynamics": "foo"}, r"\bdynamics\b", "'foo'", "usa", id="dynamics"),
    pytest.param({"norm": "foo"}, r"\bnorm\b", "'foo'", "sphere", id="norm"),
    pytest.param({"dtype": "float16"}, r"\bdtype\b", "'float16'", "float64", id="dtype"),
    pytest.param({"init": {"kind": "foo"}}, r"\binit\b", "'foo'", "orthonormal", id="init-kind"),
    pytest.param({"metrics": ["energy", "foo"]}, r"\bmetric", "'foo'", "pair_density", id="metric"),
    pytest.param({"mlp": {"enabled": True, "activation": "foo"}}, r"\bmlp\.activation\b", "'foo'", "gelu",
                 id="mlp-activation"),
    pytest.param({"norm": "pre", "token_norm": {"kind": "foo"}}, r"\btoken_norm\.kind\b", "'foo'", "rms",
                 id="token-norm-kind"),
    pytest.param({"weights": {"q": {"kind": "foo"}}}, r"\bweights\.q\.kind\b", "'foo'", "identity",
                 id="weights-kind"),
    pytest.param({"weights": {"v": {"kind": "random", "law": "foo"}}}, r"\bweights\.v\.law\b", "'foo'",
                 "gaussian", id="weights-law"),
    pytest.param({"betta": 2.0}, r"\bbetta\b", "betta", "beta", id="unknown-top-level-key"),
    pytest.param({"weights": {"q": {"kind": "matrix", "value": [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]}}, "d": 3},
                 r"\bweights\.q\.value\b", "(3, 2)", "(3, 3)", id="matrix-wrong-shape"),
    pytest.param({"init": {"kind": "given", "value": [[1.0, 0.0, 0.0]]}, "n": 4, "d": 3},
                 r"\binit\.value\b", "(1, 3)", "(n=4, d=3)", id="given-wrong-shape"),
    pytest.param({"adaptive": True, "solver": "euler"}, r"\badaptive\b", "'euler'", "tsit5",
                 id="adaptive-without-error-estimate"),
    pytest.param({"attention": False}, r"\battention\b", "attention=false", "mlp.enabled", id="no-dynamics"),
]


@pytest.mark.parametrize("entry", [attnflow.validate_config, attnflow.run], ids=["validate_config", "run"])
@pytest.mark.parametrize("overrides, key, value, allowed", IMPOSSIBLE)
def test_impossible_value_is_one_sentence_config_error(entry, overrides, key, value, allowed):
    config = {**TINY, **overrides}
    with pytest.raises(ConfigError, match=key) as info:
        entry(config)
    message = str(info.value)
    assert value in message, f"the message does not show the bad value {value!r}: {message}"
    assert allowed in message, f"the message does not say what is allowed ({allowed!r}): {message}"
    assert_one_sentence(message)


def test_config_error_is_a_value_error():
    # Callers that catch ValueError for bad arguments keep working.
    assert issubclass(ConfigError, ValueError)


def test_missing_keys_take_their_defaults_and_the_input_is_not_changed():
    config = {"n": 5, "mlp": {"enabled": True}, "weights": {"q": {"kind": "random"}}}
    before = copy.deepcopy(config)
    cfg = attnflow.validate_config(config)
    assert config == before
    assert cfg["n"] == 5
    for key, default in attnflow._build.DEFAULTS.items():
        assert key in cfg, key
        if key not in ("n", "mlp", "weights", "init"):
            assert cfg[key] == default, key
    assert cfg["mlp"]["enabled"] is True and cfg["mlp"]["activation"] == "gelu"
    assert cfg["weights"]["q"]["kind"] == "random" and cfg["weights"]["q"]["law"] == "gaussian"
    assert cfg["weights"]["k"]["kind"] == "identity"
    # The completed config is a fixed point: what results.nc stores validates to itself.
    assert attnflow.validate_config(cfg) == cfg


def test_non_finite_state_raises_naming_time_member_and_beta():
    # USA with beta = 200 on the sphere: exp(200 <x_i, x_i>) = exp(200) overflows float32.
    config = {**TINY, "dynamics": "usa", "beta": 200.0, "dtype": "float32", "d": 3}
    with pytest.raises(NonFiniteStateError, match=r"non-finite") as info:
        attnflow.run(config)
    message = str(info.value)
    assert re.search(r"\bt=[-+0-9.e]+", message), message
    assert re.search(r"\bmember \d+\b", message), message
    assert "beta=200" in message, message
    assert_one_sentence(message)
    # What was computed comes with the error: finite at t0, not at the end.
    kept = info.value.dataset
    assert np.isfinite(kept["log_energy"].values[..., 0]).all()
    assert not np.isfinite(kept["log_energy"].values[..., -1]).all()


def test_list_beta_gives_a_beta_dimension_and_a_scalar_does_not():
    listed = attnflow.run({**TINY, "beta": [0.5, 2.0]})
    assert listed.sizes["beta"] == 2
    assert listed["beta"].values.tolist() == [0.5, 2.0]
    for name in ("energy", "pair_density", "clusters"):
        assert listed[name].dims == ("beta", "member", "time"), name

    scalar = attnflow.run({**TINY, "beta": 2.0})
    assert "beta" not in scalar.dims
    for name in ("energy", "pair_density", "clusters"):
        assert scalar[name].dims == ("member", "time"), name
    # The value is still recorded, as a scalar coordinate.
    assert float(scalar["beta"]) == 2.0
    # Member m uses the same key for every beta, so beta=2 matches the list's second row.
    np.testing.assert_allclose(scalar["energy"].values, listed["energy"].sel(beta=2.0).values, rtol=1e-5)


# --- values that are not yet checked (see the report; each should be a ConfigError) ------


# Ragged user arrays (NumPy would raise a bare ValueError, a traceback on the command
# line), misspelt nested keys (otherwise silently dropped) and impossible numbers inside
# a group: each must be refused with one sentence naming the nested key.
@pytest.mark.parametrize(
    "overrides, key",
    [
        pytest.param({"weights": {"q": {"kind": "matrix", "value": [[1, 0, 0], [0, 1], [0, 0, 1]]}}},
                     r"\bweights\.q\.value\b", id="ragged-matrix"),
        pytest.param({"init": {"kind": "given", "value": [[1, 0, 0], [0, 1], [0, 0, 1], [1, 1, 1]]}},
                     r"\binit\.value\b", id="ragged-given"),
        pytest.param({"init": {"kind": "caps", "k": 2, "centres": [[1, 0, 0], [0, 1]]}},
                     r"\binit\.centres\b", id="ragged-centres"),
        pytest.param({"init": {"kind": "caps", "centers": [[1, 0, 0], [0, 1, 0]]}}, r"\binit\.centers\b",
                     id="init.centers"),
        pytest.param({"mlp": {"enabeld": True}}, r"\bmlp\.enabeld\b", id="mlp.enabeld"),
        pytest.param({"weights": {"q": {"kind": "random", "scal": 2.0}}}, r"\bweights\.q\.scal\b",
                     id="weights.q.scal"),
        pytest.param({"token_norm": {"kind": "rms", "epsilon": 1e-6}}, r"\btoken_norm\.epsilon\b",
                     id="token_norm.epsilon"),
        pytest.param({"d_k": 0}, r"\bd_k\b", id="d_k=0"),
        pytest.param({"d_v": -1}, r"\bd_v\b", id="d_v<0"),
        pytest.param({"init": {"kind": "caps", "radius": -0.1}}, r"\binit\.radius\b", id="caps-radius<0"),
        pytest.param({"init": {"kind": "mixture", "sigma": -0.1}}, r"\binit\.sigma\b", id="mixture-sigma<0"),
        pytest.param({"init": {"kind": "cube", "low": 1.0, "high": -1.0}}, r"\binit\.(low|high)\b",
                     id="cube-low>high"),
        pytest.param({"weights": {"q": {"kind": "random", "scale": math.inf}}}, r"\bweights\.q\.scale\b",
                     id="weights-scale-inf"),
        pytest.param({"weights": {"q": {"kind": "matrix", "value": [[1, 0, 0], [0, 1, 0], [0, 0, math.nan]]}}},
                     r"\bweights\.q\.value\b", id="weights-value-nan"),
    ],
)
def test_bad_nested_value_is_a_one_sentence_config_error(overrides, key):
    with pytest.raises(ConfigError, match=key) as info:
        attnflow.validate_config({**TINY, **overrides})
    assert_one_sentence(str(info.value))


@pytest.mark.parametrize("key, value, kind", [("init", "orthonormal", "orthonormal"), ("metrics", "energy", None)])
def test_bare_string_for_a_group_or_list_is_shorthand_or_a_config_error(key, value, kind):
    # `init=orthonormal` is how the command line says it, so Python users write it too:
    # either accept the shorthand or refuse it with a sentence that names the key (never
    # an AttributeError, never metrics read letter by letter).
    try:
        cfg = attnflow.validate_config({**TINY, "n": 3, key: value})
    except ConfigError as error:
        assert re.search(rf"\b{key}\b", str(error)), str(error)
        assert_one_sentence(str(error))
    else:
        if key == "init":
            assert cfg["init"]["kind"] == kind
        else:
            assert list(cfg["metrics"]) == [value]
