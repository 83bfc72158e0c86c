"""Many heads: `heads_combine=mean` averages the heads' terms with 1/H, and H independent
random heads then give a field that converges to the head-averaged field (the
expectation of one head's term over its random law) at the law-of-large-numbers rate
H^{-1/2} (docs/model.md, "Many heads"; tests/README.md)."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnflow as af
from attnflow.schema._errors import ConfigError

N, D, HEADS, REPLICAS = 8, 4, 256, 64
# The law of the product_wishart panel of the random phase diagram: Q = I, K = B with
# B = G1 G2 / sqrt(d), V Wishart G G^T / sqrt(d); every head draws its own K and V.
WEIGHTS = {"q": {"kind": "identity"}, "k": {"kind": "random", "law": "product"},
           "v": {"kind": "random", "law": "wishart"}}


def _one_head(x: np.ndarray, k: np.ndarray, v: np.ndarray, beta: float) -> np.ndarray:
    """One softmax head with Q = I, in NumPy: $\\sum_j a_{ij} V x_j$ (the default solver,
    euler_renorm, steps the field unprojected and renormalizes)."""
    logits = beta * x @ k @ x.T  # <x_i, K x_j>
    a = np.exp(logits - logits.max(axis=1, keepdims=True))
    a /= a.sum(axis=1, keepdims=True)
    return a @ x @ v.T


def _programs(combine: str):
    """The drawn fields of REPLICAS seeds (one program) and their values at fixed tokens
    with the heads chosen by `index` (another): `index = arange(256) % H` keeps H distinct
    heads, each repeated 256/H times, so that the mean of the 256-head program is the mean
    of H independent heads, and every H runs in the same compiled programs."""
    cfg = af.validate_config({"n": N, "d": D, "heads": HEADS, "heads_combine": combine, "dtype": "float64",
                              "beta": 1.0, "weights": WEIGHTS})
    x = af.UniformSphere()(jax.random.key(1), N, D, jnp.float64)
    draw = jax.jit(jax.vmap(lambda key: af.build_field(cfg, key, 1.0, jnp.float64)))

    def value(field, index):
        chosen = eqx.tree_at(lambda f: (f.terms[0].key.value, f.terms[0].value.value), field,
                             replace_fn=lambda w: w[index])
        return chosen(0.0, x)

    return x, draw, jax.jit(jax.vmap(value, in_axes=(0, None)))


def test_the_mean_of_h_random_heads_converges_to_the_head_averaged_field_at_rate_h_to_minus_half():
    x, draw, value = _programs("mean")
    every = jnp.arange(HEADS)
    fields = draw(jax.random.split(jax.random.key(0), REPLICAS))
    # The program's field is the mean of its heads: 256 one-head fields written in NumPy.
    att = fields.terms[0]
    k, v = np.asarray(att.key.value[0]), np.asarray(att.value.value[0])
    by_hand = np.mean([_one_head(np.asarray(x), k[h], v[h], 1.0) for h in range(HEADS)], axis=0)
    np.testing.assert_allclose(np.asarray(value(fields, every)[0]), by_hand, rtol=1e-10, atol=1e-12)
    # The head-averaged field E[f_1]: 4 x 64 x 256 = 65536 heads, drawn independently of the
    # samples below (its own error adds 1/65536 to their 1/H, a bias of the slope below 1e-3).
    reference = np.mean([np.asarray(value(draw(jax.random.split(jax.random.key(100 + i), REPLICAS)), every))
                         for i in range(4)], axis=(0, 1))
    sizes = np.array([1, 4, 16, 64, 256])
    rms = []
    for h in sizes:
        samples = np.asarray(value(draw(jax.random.split(jax.random.key(int(h)), REPLICAS)), every % h))
        rms.append(np.sqrt(np.mean(np.sum((samples - reference) ** 2, axis=(1, 2)))))
    slope = np.polyfit(np.log(sizes), np.log(rms), 1)[0]
    # E|F_H - E f|^2 = tr Cov(f_1) / H exactly for independent heads: slope -1/2. Each
    # point is a mean of 64 squared errors (relative spread about 10%), which leaves the
    # fitted slope a standard deviation near 0.011 (measured: -0.501 here, -0.498, -0.488,
    # -0.502, -0.502 with four other seeds); 0.05 is more than 4 of them.
    assert abs(slope + 0.5) < 0.05, (slope, rms)


def test_the_mean_of_heads_is_the_sum_over_h_and_the_sum_stays_the_default():
    d, heads = 3, 3
    rng = np.random.default_rng(2)
    q, k, v = (af.Constant(jnp.asarray(rng.normal(size=(heads, d, d)))) for _ in range(3))
    x = jnp.asarray(rng.normal(size=(5, d)))

    def attention(q, k, v, combine=None):
        options = {} if combine is None else {"combine": combine}
        return af.SelfAttention(q, k, v, None, jnp.asarray(2.0), None, heads=q.shape[0], **options)

    eye, one_eye = af.Identity(heads, d, "float64"), af.Identity(1, d, "float64")

    @jax.jit
    def values(x):
        single = [attention(*(af.Constant(s.value[h : h + 1]) for s in (q, k, v)))(0.0, x) for h in range(heads)]
        return (sum(single), attention(q, k, v, "mean")(0.0, x), attention(q, k, v)(0.0, x),
                attention(one_eye, one_eye, one_eye)(0.0, x), attention(eye, eye, eye, "mean")(0.0, x),
                attention(eye, eye, eye)(0.0, x))

    total, mean, summed, one, identical_mean, identical_sum = values(x)
    np.testing.assert_allclose(mean, total / heads, rtol=1e-12)
    np.testing.assert_allclose(summed, total, rtol=1e-12)
    # Identity Q, K, V (no head axis): H identical heads average to one head.
    np.testing.assert_allclose(identical_mean, one, rtol=1e-12)
    np.testing.assert_allclose(identical_sum, heads * one, rtol=1e-12)
    assert af.validate_config({}).heads_combine == "sum"


def test_a_combine_other_than_sum_or_mean_is_refused():
    with pytest.raises(ConfigError, match="heads_combine"):
        af.validate_config({"heads_combine": "max"})
    with pytest.raises(ConfigError, match="heads_combine"):
        af.validate_config({"attention": False, "mlp": {"enabled": True}, "heads_combine": "mean"})
