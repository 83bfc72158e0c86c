"""Harmonic summation (attnflow/numerics/_harmonic.py) against SelfAttention's direct sum in float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special as sp

import attnflow as af
from attnflow.numerics import _harmonic as h
from attnflow.schema import _harmonic_degree as hd

N = 2048
BETAS = (0.5, 1.0, 4.0, 9.0, 30.0)
TOL = 1e-7
SLOPE = 0.01


@pytest.mark.parametrize("d", [2, 3])
def test_coefficients_are_the_scaled_bessel_functions(d):
    r = np.array([0.0, 1e-3, 0.5, 4.0, 30.0, 100.0])
    degree = hd.degree(float(r.max()), TOL, d)
    got = np.asarray(h.coefficients(jnp.asarray(r), degree, d))
    k = np.arange(degree + 1)
    if d == 2:
        want = sp.ive(k[None], r[:, None])
    else:
        safe = np.where(r > 0, r, 1)[:, None]
        want = np.where(r[:, None] > 0, np.sqrt(np.pi / (2 * safe)) * sp.ive(k[None] + 0.5, r[:, None]), k == 0)
    assert np.all(np.abs(got - want) <= 1e-12 * want + 1e-300)


def test_basis_satisfies_the_addition_theorem():
    x = np.random.default_rng(0).normal(size=(7, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    degree = 12
    b = np.asarray(h.basis(jnp.asarray(x), degree))
    orders = np.repeat(np.arange(degree + 1), 2 * np.arange(degree + 1) + 1)
    for l in range(degree + 1):  # noqa: E741
        block = b[:, orders == l]
        np.testing.assert_allclose(block @ block.T, sp.eval_legendre(l, x @ x.T), atol=1e-13)
    circle = x[:, :2] / np.linalg.norm(x[:, :2], axis=1, keepdims=True)
    phi = np.arctan2(circle[:, 1], circle[:, 0])[:, None]
    waves = np.asarray(h.basis(jnp.asarray(circle), degree))
    k = np.arange(1, degree + 1)
    np.testing.assert_allclose(waves[:, 1::2], np.cos(k * phi), atol=1e-13)
    np.testing.assert_allclose(waves[:, 2::2], np.sin(k * phi), atol=1e-13)


def _weights(d: int):
    """Q, K, V of two weight sets: random Gaussian (scaled 1/sqrt(d)) and the identity, each `(1, d, d)`."""
    rng = np.random.default_rng(d)
    q, k, v = (rng.normal(size=(1, d, d)) / np.sqrt(d) for _ in range(3))
    # |K^T Q|_2 = 1: beta is the largest radius, as for the identity
    q = q / np.linalg.norm(k[0].T @ q[0], ord=2)
    return [[q, k, v], [np.eye(d)[None]] * 3]


MASKS = {
    "none": (False, None),
    "causal": (True, None),
    "alibi_causal": (True, SLOPE),
    "alibi_both": (False, SLOPE),
}


# The default run: no mask, and ALiBi both ways (the causal sums with and without the diagonal,
# decayed) at n = 512; the slow run: every mask at n = 2048 and every beta.
QUICK = (512, (0.5, 4.0, 30.0))
CASES = [pytest.param(d, mask, *QUICK, id=f"{d}-{mask}-quick") for d in (2, 3) for mask in ("none", "alibi_both")] + [
    pytest.param(d, mask, N, BETAS, id=f"{d}-{mask}", marks=pytest.mark.slow) for d in (2, 3) for mask in MASKS
]


@pytest.mark.parametrize("d, mask, n, betas", CASES)
def test_field_against_self_attention(d, mask, n, betas):
    """Every beta and weight set as one head of a batch, softmax and unnormalised; each against
    its own SelfAttention term (dense, float64), within TOL relative to the largest field, at
    the degree of the largest radius."""
    causal, slope = MASKS[mask]
    x = af.UniformSphere()(jax.random.key(d), n, d, jnp.float64)
    u, v, want = [], [], {"sa": [], "usa": []}
    for q, k, value in _weights(d):
        for beta in betas:
            for kind in want:
                term = af.SelfAttention(
                    af.Constant(jnp.asarray(q)), af.Constant(jnp.asarray(k)), af.Constant(jnp.asarray(value)), None,
                    jnp.asarray(beta), None if slope is None else jnp.asarray([slope]), heads=1, kind=kind,
                    causal=causal, block=0,
                )
                want[kind].append(term(0.0, x))
            u.append(h.query_vectors(x @ q[0].T, jnp.asarray(k), beta)[0])
            v.append(x @ value[0].T)
    r_max = max(hd.largest_radius(beta, q, k) for q, k, _ in _weights(d) for beta in betas)
    degree = hd.degree(r_max, TOL, d)
    slopes = None if slope is None else jnp.full(len(u), slope)

    @jax.jit
    def run(u, v, slopes):
        return {kind: h.attention_heads(u, x, v, slopes, degree=degree, kind=kind, causal=causal) for kind in want}

    got = run(jnp.stack(u), jnp.stack(v), slopes)
    for kind in want:
        for field, reference in zip(got[kind], want[kind]):
            error = jnp.max(jnp.abs(field - reference)) / jnp.max(jnp.abs(reference))
            assert error <= TOL, kind
