"""Bad input to `attnflow.run(config)` / `attnflow.validate_config(config)` stops early.

STYLE.md rule 11: an impossible value raises `ConfigError` before any work starts, with
one sentence that names the offending key and value and says what is allowed; a run
whose state leaves the finite numbers raises `NonFiniteStateError` naming where.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from omegaconf import MISSING as MISSING_VALUE

import attnflow
from attnflow import ConfigError, NonFiniteStateError
from attnflow.schema._config import to_container
from attnflow.running._ensemble import EnsemblePlan
from attnflow.running._study import config_yaml

# Tiny, valid settings that every case starts from (t1 / dt / saves keep any accidental
# run to a handful of steps).
TINY = {"n": 4, "d": 3, "members": 2, "t1": 0.5, "dt": 0.1, "saves": 2, "plot": False, "compilation_cache": False}


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
    pytest.param({"d": 1, "scheme": "sphere"}, r"\bd\b", "d=1", "d >= 2", id="d=1-on-sphere"),
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
    pytest.param({"attention_kind": "foo"}, r"\battention_kind\b", "'foo'", "usa", id="attention_kind"),
    pytest.param({"scheme": "foo"}, r"\bscheme\b", "'foo'", "sphere", id="scheme"),
    pytest.param({"dtype": "float16"}, r"\bdtype\b", "'float16'", "float64", id="dtype"),
    pytest.param({"init": {"kind": "foo"}}, r"\binit\b", "'foo'", "orthonormal", id="init-kind"),
    pytest.param({"metrics": ["energy", "foo"]}, r"\bmetric", "'foo'", "pair_density", id="metric"),
    pytest.param({"mlp": {"enabled": True, "activation": "foo"}}, r"\bmlp\.activation\b", "'foo'", "gelu",
                 id="mlp-activation"),
    pytest.param({"scheme": "pre", "token_norm": {"kind": "foo"}}, r"\btoken_norm\.kind\b", "'foo'", "rms",
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
    assert isinstance(cfg, attnflow.Config)
    assert cfg.n == 5
    defaults = attnflow.validate_config({})
    for field in dataclasses.fields(defaults):
        if field.name not in ("n", "mlp", "weights"):
            assert getattr(cfg, field.name) == getattr(defaults, field.name), field.name
    assert cfg.mlp.enabled is True and cfg.mlp.activation == "gelu"
    assert cfg.weights.q.kind == "random" and cfg.weights.q.law == "gaussian"
    assert cfg.weights.k.kind == "identity"
    # The completed config is a fixed point: what results.nc stores validates to itself.
    stored = yaml.safe_load(config_yaml(cfg))
    assert attnflow.validate_config(stored) == dataclasses.replace(cfg, overwrite=False, plot=True)


def test_defaults_live_in_the_yaml_files_and_types_in_the_schema():
    """The YAML files hold every default value and the dataclasses none (but the tag of
    each initial condition): one place for values, one for types."""
    folder = Path(attnflow.__file__).parent.parent / "conf"
    if not folder.exists():
        folder = Path(attnflow.__file__).parent / "conf"
    root = yaml.safe_load((folder / "config.yaml").read_text())
    schema = {f.name for f in dataclasses.fields(attnflow.Config)}
    assert set(root) - {"defaults", "hydra"} == schema - {"init"}
    for f in dataclasses.fields(attnflow.Config):
        assert f.default == MISSING_VALUE, f"{f.name} has a default in the schema"
    cfg = attnflow.validate_config({})
    for key, value in root.items():
        if key not in ("defaults", "hydra", "weights", "mlp", "token_norm"):
            assert to_container(cfg)[key] == value, key


def test_non_finite_state_raises_naming_time_member_and_beta():
    # USA with beta = 200 on the sphere: exp(200 <x_i, x_i>) = exp(200) overflows float32.
    config = {**TINY, "attention_kind": "usa", "beta": 200.0, "dtype": "float32", "d": 3}
    with pytest.raises(NonFiniteStateError, match=r"non-finite") as info:
        attnflow.run(config)
    message = str(info.value)
    assert re.search(r"\bt=[-+0-9.e]+", message), message
    assert re.search(r"\bmember \d+\b", message), message
    assert "beta=200" in message, message
    assert_one_sentence(message)
    # What was computed comes with the error: finite at t0, missing from the first bad
    # state on, for every statistic (no fake "n clusters, pair density 0"), and the
    # file says which solve failed and when.
    kept = info.value.dataset
    config = {**config, "metrics": ["log_energy", "pair_density", "clusters", "cluster_sizes"], "saves": 6}
    with pytest.raises(NonFiniteStateError) as info:
        attnflow.run(config)
    kept = info.value.dataset
    assert np.isfinite(kept["log_energy"].values[..., 0]).all()
    for name in ("log_energy", "pair_density", "clusters", "cluster_sizes"):
        assert np.isnan(kept[name].values[:, 1:]).all(), name
    assert kept["clusters"].values[:, 0].tolist() == [4.0, 4.0]
    assert kept["status"].values.tolist() == [1, 1]
    np.testing.assert_allclose(kept["failure_time"].values, 0.1)
    assert "non-finite" in kept.attrs["error"]


def test_solver_failure_masks_what_was_not_reached():
    # An adaptive solve that runs out of steps: the unreached output times are missing
    # (never diffrax's inf fill or int32's minimum), the times are the requested ones.
    config = {**TINY, "beta": 1.0, "adaptive": True, "solver": "tsit5", "max_steps": 20, "rtol": 1e-10, "atol": 1e-10,
              "t1": 5.0, "saves": 6, "metrics": ["clusters", "pair_density"]}
    with pytest.raises(attnflow.SolverFailure, match="max_steps") as info:
        attnflow.run(config)
    kept = info.value.dataset
    np.testing.assert_allclose(kept["time"].values, np.linspace(0, 5, 6))
    assert np.isnan(kept["clusters"].values[:, -1]).all() and np.isnan(kept["pair_density"].values[:, -1]).all()
    assert kept["clusters"].values[:, 0].tolist() == [4.0, 4.0]
    assert (kept["status"].values == 2).all()
    np.testing.assert_allclose(kept["failure_time"].values, 1.0)


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
            assert cfg.init.kind == kind
        else:
            assert list(cfg.metrics) == [value]


# --- the typed schema: booleans, choices, keys that do not apply ------------------------


@pytest.mark.parametrize("key", ["causal", "attention", "adaptive", "plot", "save_states"])
def test_booleans_take_booleans_only(key):
    with pytest.raises(ConfigError, match=rf"^{key} must be true or false, got 'maybe'\.$"):
        attnflow.validate_config({**TINY, key: "maybe"})
    # YAML's spellings of false are false, not a truthy string.
    config = {**TINY, key: "no"}
    if key == "attention":
        config["mlp"] = {"enabled": True}
    assert getattr(attnflow.validate_config(config), key) is False


@pytest.mark.parametrize(
    "overrides, says",
    [
        pytest.param({"mlp": {"activation": "relu"}}, "mlp.activation does not apply with mlp.enabled=false",
                     id="mlp-off"),
        pytest.param({"weights": {"q": {"law": "goe"}}}, "weights.q.law does not apply to weights.q.kind=identity",
                     id="law-of-identity"),
        pytest.param({"weights": {"v": {"kind": "random", "sign": -1.0}}}, "weights.v.sign does not apply",
                     id="sign-of-random"),
        pytest.param({"max_steps": 10}, "max_steps does not apply with adaptive=false", id="max-steps-fixed"),
        pytest.param({"rtol": 1e-3}, "rtol does not apply with adaptive=false", id="rtol-fixed"),
        pytest.param({"token_norm": {"kind": "rms"}}, "token_norm.kind does not apply with scheme=sphere",
                     id="token-norm-on-sphere"),
        pytest.param({"scheme": "pre", "token_norm": {"kind": "sphere", "eps": 1e-5}},
                     "token_norm.eps does not apply with token_norm.kind=sphere", id="eps-of-sphere-norm"),
        pytest.param({"rank_rtol": 1e-3}, "rank_rtol does not apply", id="rank-rtol-without-rank"),
        pytest.param({"metrics": ["energy"], "cluster_eps": 1e-3}, "cluster_eps does not apply",
                     id="cluster-eps-without-clustering"),
        pytest.param({"weights": {"shared": False}}, "weights.shared does not apply", id="shared-without-random"),
        pytest.param({"attention": False, "mlp": {"enabled": True}, "causal": True},
                     "causal does not apply with attention=false", id="causal-without-attention"),
    ],
)
def test_keys_that_do_not_apply_are_refused(overrides, says):
    with pytest.raises(ConfigError, match=re.escape(says)) as info:
        attnflow.validate_config({**TINY, **overrides})
    assert_one_sentence(str(info.value))


def test_the_command_line_and_the_python_api_compose_the_same_config(tmp_path):
    """`run(mapping)` and `attnflow k=v ...` go through one schema and one set of YAML
    defaults: the stored configs are identical."""
    import subprocess
    import sys

    overrides = {"n": 5, "beta": [1.0, 2.0], "init": {"kind": "caps", "k": 3}, "causal": True, "members": 2,
                 "t1": 0.5, "dt": 0.1, "saves": 2, "plot": False}
    args = ["n=5", "beta=[1,2]", "init=caps", "init.k=3", "causal=yes", "members=2", "t1=0.5", "dt=0.1", "saves=2",
            "plot=no", f"hydra.run.dir={tmp_path}"]
    code = "import sys; from attnflow.cli import main; sys.argv = ['attnflow'] + sys.argv[1:]; main()"
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr
    stored = attnflow.load_results(tmp_path / "results.nc").attrs["config"]
    assert stored == config_yaml(attnflow.validate_config(overrides))
    assert not (tmp_path / "summary.png").exists()  # plot=no means no plot


# --- initial data and weights that no run can start from --------------------------------


@pytest.mark.parametrize(
    "overrides, says",
    [
        pytest.param({"init": {"kind": "given", "value": [[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]]}},
                     "init.value row 0 is zero", id="zero-token"),
        pytest.param({"init": {"kind": "caps", "k": 2, "centres": [[1, 0, 0], [0, 0, 0]]}},
                     "init.centres has a zero row", id="zero-cap-centre"),
        pytest.param({"weights": {"q": {"kind": "matrix", "value": [[1e39, 0, 0], [0, 1, 0], [0, 0, 1]]}}},
                     "beyond the largest float32", id="matrix-overflows-float32"),
        pytest.param({"weights": {"q": {"kind": "matrix", "value": [[1e30, 0, 0], [0, 1, 0], [0, 0, 1]],
                                        "scale": 1e10}}}, "overflows float32", id="scaled-matrix-overflows"),
        pytest.param({"init": {"kind": "given", "value": [[1e39, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]]}},
                     "beyond the largest float32", id="tokens-overflow-float32"),
    ],
)
def test_initial_data_no_run_can_start_from_is_refused_before_the_run(overrides, says):
    with pytest.raises(ConfigError, match=re.escape(says)) as info:
        attnflow.run({**TINY, **overrides})
    assert_one_sentence(str(info.value))


def test_scale_multiplies_every_kind_of_weight():
    d = 3
    config = {**TINY, "heads": 2, "weights": {
        "q": {"kind": "identity", "scale": 2.0},
        "k": {"kind": "matrix", "value": np.arange(9.0).reshape(3, 3).tolist(), "scale": -0.5},
        "v": {"kind": "tied", "sign": -1.0, "scale": 3.0},
        "o": {"kind": "random", "law": "orthogonal", "scale": 0.25},
    }}
    cfg = attnflow.validate_config(config)
    attention = attnflow.build_field(cfg, jax.random.key(0), 1.0, jnp.float64).terms[0]
    q, k, v, o = (np.asarray(s(0.0)) for s in (attention.query, attention.key, attention.value, attention.output))
    np.testing.assert_allclose(q, np.broadcast_to(2.0 * np.eye(d), (2, d, d)))
    np.testing.assert_allclose(k, np.broadcast_to(-0.5 * np.arange(9.0).reshape(3, 3), (2, d, d)))
    for h in range(2):
        np.testing.assert_allclose(v[h], -3.0 * q[h].T @ k[h], rtol=1e-12)
        np.testing.assert_allclose(o[h] @ o[h].T, 0.0625 * np.eye(d), atol=1e-12)  # 0.25 x orthogonal
    x = attnflow.UniformSphere()(jax.random.key(1), 4, d, jnp.float64)
    unscaled = attnflow.build_field(attnflow.validate_config({**TINY, "heads": 2}), jax.random.key(0), 4.0,
                                    jnp.float64).terms[0]
    # Q = 2 I at beta = 1 gives the logits of Q = I at beta = 4 (K = I there too), i.e. the fast
    # identity path with a factor is the product with 2 I.
    identity_q = attnflow.build_field(attnflow.validate_config({**TINY, "heads": 2, "weights": {
        "q": {"kind": "identity", "scale": 4.0}}}), jax.random.key(0), 1.0, jnp.float64).terms[0]
    np.testing.assert_allclose(identity_q(0.0, x), unscaled(0.0, x), rtol=1e-12)


def test_the_sphere_normalization_takes_no_gain_and_no_eps():
    with pytest.raises(ConfigError, match="no gamma and no eps"):
        attnflow.TokenNorm("sphere", gamma=jnp.ones(3))
    with pytest.raises(ConfigError, match="no gamma and no eps"):
        attnflow.TokenNorm("sphere", eps=1e-5)


# --- sizes -------------------------------------------------------------------------------


def test_metrics_trace_past_n_squared_of_two_to_the_31():
    """n = 46341 has n^2 > 2^31: the energy and the pair density used to overflow int32
    while tracing. Traced abstractly here (no n x n memory is allocated)."""
    n = 46341
    x = jax.ShapeDtypeStruct((n, 2), jnp.float32)
    assert jax.eval_shape(lambda y: attnflow.log_interaction_energy(y, 1.0), x).shape == ()
    assert jax.eval_shape(lambda y: attnflow.pair_density(y, 1e-3), x).shape == ()
    # and the rewritten formulas are still exact at small n
    y = attnflow.UniformSphere()(jax.random.key(0), 7, 3, jnp.float64)
    g = np.asarray(y) @ np.asarray(y).T
    np.testing.assert_allclose(attnflow.log_interaction_energy(y, 2.0), np.log(np.exp(2 * g).sum() / (4 * 49)))
    close = g > 1 - 0.5
    np.testing.assert_allclose(attnflow.pair_density(y, 0.5), (close.sum() - 7) / 42)


def test_runs_that_cannot_fit_in_memory_are_refused_with_the_numbers():
    with pytest.raises(ConfigError, match=r"one member needs about [0-9.]+ GiB .* available") as info:
        attnflow.run({**TINY, "n": 200_000, "d": 2, "members": 1, "beta": 1.0, "attention_block": 0})
    assert_one_sentence(str(info.value))


def test_the_chunk_shrinks_to_fit_the_memory():
    cfg = attnflow.validate_config({**TINY, "n": 64, "d": 3, "members": 64, "beta": 1.0})
    system = attnflow.build_system(cfg)
    keys = jax.random.split(jax.random.key(0), 64)
    make = lambda memory: EnsemblePlan(system, keys, jnp.asarray([1.0]), attnflow.time_grid(t1=0.5, dt=0.1), solver="euler",
                                       memory=memory)
    roomy = make(64 * 2**30)
    tight = make(16 * roomy.footprint.total)
    assert roomy.piece_size > tight.piece_size
    assert tight.piece_size * tight.footprint.total <= 8 * roomy.footprint.total
    assert tight.pieces * tight.piece_size >= 64
    with pytest.raises(ConfigError, match="one member needs"):
        make(roomy.footprint.total)


def by_hand(cfg, **changes):
    """A copy of a config with fields set by attribute (no type check on the way)."""
    changed = copy.deepcopy(cfg)
    for key, value in changes.items():
        setattr(changed, key, value)
    return changed


def test_a_config_changed_by_hand_goes_through_the_schema_again():
    cfg = attnflow.validate_config(TINY)
    assert attnflow.validate_config(by_hand(cfg, solver="rk4")).solver == "rk4"
    with pytest.raises(ConfigError, match=r"^solver must be one of .*, got 'rk5'\.$"):
        attnflow.validate_config(by_hand(cfg, solver="rk5"))
    with pytest.raises(ConfigError, match=r"^causal must be true or false, got 'maybe'\.$"):
        attnflow.validate_config(by_hand(cfg, causal="maybe"))


def test_the_schemas_choices_are_the_cores_own():
    """The schema spells its choices out (reading a config must not import JAX); they
    must name exactly what the core implements."""
    from attnflow.schema import _config
    from attnflow.numerics._field import SCHEMES
    from attnflow.numerics._metrics import METRICS
    from attnflow.numerics._random_matrices import LAWS
    from attnflow.numerics._terms import ACTIVATIONS, NORMS

    pairs = [(_config.Solver, attnflow.SOLVERS), (_config.Scheme, SCHEMES), (_config.Metric, METRICS),
             (_config.Law, LAWS), (_config.Activation, ACTIVATIONS), (_config.NormKind, NORMS)]
    for choice, core in pairs:
        assert tuple(choice.__members__) == tuple(core), choice.__name__
