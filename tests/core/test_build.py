"""`attnflow.running._build`: a config checked and resolved once, and the members it builds."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import attnflow as af
from attnflow.running._build import build_system, non_finite_advice, recorded_metrics, resolve_study
from attnflow.numerics._terms import _GATED
from attnflow.schema._errors import ConfigError
from attnflow.schema.system.mlp import GATED


def test_a_study_is_resolved_once_into_its_betas_times_and_output_size():
    study = resolve_study({"beta": [1, 4], "members": 3, "t1": 2.0, "dt": 0.5, "saves": 3, "n": 4, "d": 3})
    np.testing.assert_array_equal(study.betas, [1.0, 4.0])
    assert study.beta_is_list and study.pairs == 6 and study.config.beta == [1.0, 4.0]
    assert study.grid.num_steps == 4 and study.output_bytes > 0
    with pytest.raises(ConfigError, match="t1 must be greater than t0"):
        resolve_study({"t0": 2.0, "t1": 1.0})


def test_a_member_is_its_field_tokens_and_recorder_and_the_same_seed_gives_the_same_member():
    system = build_system({"n": 5, "d": 3, "mlp": {"enabled": True}, "init": {"kind": "caps", "k": 2}})
    field, y0, recorder = system(jax.random.key(0), 1.0)
    assert len(field.terms) == 2 and y0.shape == (5, 3)
    again = build_system({"n": 5, "d": 3, "mlp": {"enabled": True}, "init": {"kind": "caps", "k": 2}})
    np.testing.assert_array_equal(again(jax.random.key(0), 1.0)[1], y0)
    assert recorded_metrics(af.validate_config({"attention_kind": "sinkhorn"}))[-1] == "marginal_error"


@pytest.mark.parametrize("activation", ["geglu", "swiglu"])
def test_a_gated_mlp_of_a_study_is_its_formula(activation):
    """mlp.activation=geglu (T5 v1.1's gated GELU) draws a gate W3 as swiglu does: the
    member's MLP is W2 (g(W1 x + b1) * (W3 x)) + b2 with g = gelu_tanh (silu for swiglu),
    and the schema's gated units are the core's."""
    system = build_system({"n": 5, "d": 3, "dtype": "float64", "mlp": {"enabled": True, "activation": activation}})
    field, x, _ = system(jax.random.key(0), 1.0)
    mlp = field.terms[1]
    w1, w2, b1, b2, w3 = (np.asarray(s(0.0)) for s in (mlp.w1, mlp.w2, mlp.b1, mlp.b2, mlp.gate))
    x = np.asarray(x)
    h = x @ w1.T + b1
    g = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3))) if activation == "geglu" else \
        h / (1 + np.exp(-h))
    np.testing.assert_allclose(mlp(0.0, x), (g * (x @ w3.T)) @ w2.T + b2, rtol=1e-12)
    assert set(GATED) == set(_GATED)


def test_what_a_run_that_blew_up_may_change_is_only_what_its_config_accepts():
    assert non_finite_advice(af.validate_config({})) == "use a smaller dt, an adaptive solver, float64 or a smaller beta"
    noisy = af.validate_config({"noise": {"sigma": 0.1}, "dtype": "float64"})
    assert "adaptive" not in non_finite_advice(noisy) and "noise.sigma" in non_finite_advice(noisy)
