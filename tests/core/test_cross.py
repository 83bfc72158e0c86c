"""`attnflow.numerics._cross`: cross-attention against a NumPy double sum of its
equation, its hardmax limit, and its refusals."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnflow.numerics._cross import CrossAttention
from attnflow.numerics._schedules import Constant, Identity
from attnflow.schema._errors import ConfigError

KEYS = jax.random.split(jax.random.key(7), 10)


def _normal(key, shape):
    return np.asarray(jax.random.normal(key, shape, jnp.float64))


def _reference(y, x, q, k, v, o, beta, kind, biases=None):
    """sum_h O_h sum_j a^h_ij (V_h x_j + b_v) + b_o, as explicit loops."""
    bq, bk, bv, bo = biases or (None,) * 4
    heads, n, m = q.shape[0], y.shape[0], x.shape[0]
    out = np.zeros_like(y)
    for h in range(heads):
        for i in range(n):
            qi = q[h] @ y[i] + (0 if bq is None else bq[h])
            logits = np.array([beta * qi @ (k[h] @ x[j] + (0 if bk is None else bk[h])) for j in range(m)])
            a = (
                np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
                if kind == "sa"
                else np.exp(logits) / m
            )
            mixed = sum(a[j] * (v[h] @ x[j] + (0 if bv is None else bv[h])) for j in range(m))
            out[i] += o[h] @ mixed
    return out if bo is None else out + bo


@pytest.mark.parametrize("kind", ["sa", "usa"])
def test_cross_attention_is_its_double_sum_over_heads_with_biases(kind):
    heads, n, m, d, dk, dv = 2, 5, 7, 3, 4, 2
    y, x = _normal(KEYS[0], (n, d)), _normal(KEYS[1], (m, d))
    q, k = _normal(KEYS[2], (heads, dk, d)), _normal(KEYS[3], (heads, dk, d))
    v, o = _normal(KEYS[4], (heads, dv, d)), _normal(KEYS[5], (heads, d, dv))
    biases = (
        _normal(KEYS[6], (heads, dk)),
        _normal(KEYS[7], (heads, dk)),
        _normal(KEYS[8], (heads, dv)),
        _normal(KEYS[9], (d,)),
    )
    c = lambda a: Constant(jnp.asarray(a))
    term = CrossAttention(
        jnp.asarray(x),
        c(q),
        c(k),
        c(v),
        c(o),
        jnp.asarray(0.7),
        heads=heads,
        kind=kind,
        query_bias=c(biases[0]),
        key_bias=c(biases[1]),
        value_bias=c(biases[2]),
        output_bias=c(biases[3]),
    )
    got = np.asarray(term(0.0, jnp.asarray(y)))
    np.testing.assert_allclose(got, _reference(y, x, q, k, v, o, 0.7, kind, biases), rtol=1e-11)
    weights = np.asarray(term.source_weights(0.0, jnp.asarray(y)))
    assert weights.shape == (heads, n, m)
    if kind == "sa":
        np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-12)


def test_identity_weights_skip_the_products_and_the_mean_of_heads_is_one_head():
    n, m, d = 4, 6, 3
    y, x = _normal(KEYS[0], (n, d)), _normal(KEYS[1], (m, d))
    eye = np.broadcast_to(np.eye(d), (3, d, d))
    one = CrossAttention(
        jnp.asarray(x), Identity(3, d), Identity(3, d), Identity(3, d), None, jnp.asarray(2.0), heads=3, combine="mean"
    )
    np.testing.assert_allclose(
        one(0.0, jnp.asarray(y)), _reference(y, x, eye, eye, eye, eye, 2.0, "sa") / 3, rtol=1e-11
    )


def test_at_large_beta_each_target_token_moves_to_its_argmax_source_token():
    """The hardmax limit: with V = I, as beta_c grows the term at y_i tends to the source
    token maximising <Q y_i, K x_j> (here Q = K = I)."""
    n, m, d = 6, 5, 3
    y, x = _normal(KEYS[2], (n, d)), _normal(KEYS[3], (m, d))
    nearest = x[np.argmax(y @ x.T, axis=1)]
    errors = []
    for beta in (1.0, 30.0, 3000.0):
        term = CrossAttention(
            jnp.asarray(x), Identity(1, d), Identity(1, d), Identity(1, d), None, jnp.asarray(beta), heads=1
        )
        errors.append(np.abs(np.asarray(term(0.0, jnp.asarray(y))) - nearest).max())
    assert errors[0] > 0.1 and errors[2] < 1e-8, errors
    assert errors[0] > errors[1] > errors[2]


def test_bad_shapes_are_refused_in_one_sentence():
    d = 3
    with pytest.raises(ConfigError, match="dimension 3, got 4"):
        CrossAttention(
            jnp.zeros((2, 4)), Identity(1, d), Identity(1, d), Identity(1, d), None, jnp.asarray(1.0), heads=1
        )
    with pytest.raises(ConfigError, match="'sa' \\(softmax\\) or 'usa'"):
        CrossAttention(
            jnp.zeros((2, d)),
            Identity(1, d),
            Identity(1, d),
            Identity(1, d),
            None,
            jnp.asarray(1.0),
            heads=1,
            kind="hardmax",
        )
