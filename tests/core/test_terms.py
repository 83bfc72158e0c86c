"""`attnflow.numerics._terms`: the MLP and the token norms against their formulas (attention is
held to a direct double sum in test_dynamics.py and test_heads.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.numerics._schedules import Constant
from attnflow.numerics._terms import MLP, TokenNorm

KEYS = jax.random.split(jax.random.key(1), 6)


def _matrix(key, shape):
    return np.asarray(jax.random.normal(key, shape, jnp.float64))


def test_the_mlp_is_its_formula_token_by_token():
    w1, w2, b1, b2, gate = (_matrix(KEYS[0], (8, 3)), _matrix(KEYS[1], (3, 8)), _matrix(KEYS[2], (8,)),
                            _matrix(KEYS[3], (3,)), _matrix(KEYS[4], (8, 3)))
    x = _matrix(KEYS[5], (5, 3))
    c = lambda a: Constant(jnp.asarray(a))
    relu = MLP(c(w1), c(w2), c(b1), c(b2), activation="relu")(0.0, jnp.asarray(x))
    np.testing.assert_allclose(relu, np.maximum(x @ w1.T + b1, 0) @ w2.T + b2, rtol=1e-12)
    swiglu = MLP(c(w1), c(w2), gate=c(gate), activation="swiglu")(0.0, jnp.asarray(x))
    h = x @ w1.T  # silu(W1 x) * (W3 x), W3 the gate (Llama's gated unit)
    np.testing.assert_allclose(swiglu, (h / (1 + np.exp(-h)) * (x @ gate.T)) @ w2.T, rtol=1e-12)


def test_layer_and_rms_norms_are_their_formulas():
    x = _matrix(KEYS[5], (5, 4))
    gamma, shift = np.arange(1.0, 5.0), np.full((4,), 0.5)
    layer = TokenNorm("layer", jnp.asarray(gamma), jnp.asarray(shift), eps=1e-5)(jnp.asarray(x))
    centred = x - x.mean(-1, keepdims=True)
    expected = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + 1e-5) * gamma + shift
    np.testing.assert_allclose(layer, expected, rtol=1e-10)
    rms = TokenNorm("rms", jnp.asarray(gamma), None, eps=1e-6)(jnp.asarray(x))
    np.testing.assert_allclose(rms, x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6) * gamma, rtol=1e-10)
