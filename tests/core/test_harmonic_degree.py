"""The degree rule of harmonic summation (attnflow/schema/_harmonic_degree.py, NumPy):
the issue's degrees, the coefficient tail against the truncated kernel's measured error
(SciPy's Bessel functions), the largest radius from Q and K, and the refusals."""

import numpy as np
import pytest
import scipy.special as sp

import attnflow as af
from attnflow.schema import _harmonic_degree as hd

BETAS = (0.5, 1.0, 4.0, 9.0, 30.0)
TOL = 1e-7


def _kernel_error(r: float, degree: int, d: int) -> float:
    """The largest error of the truncated scaled kernel e^{r (t - 1)} over t = cos(angle) in [-1, 1]."""
    t = np.cos(np.linspace(0, np.pi, 2001))
    k = np.arange(degree + 1)
    if d == 2:
        series = sp.ive(k, r)[None] * np.where(k == 0, 1, 2) * np.cos(k[None] * np.arccos(t)[:, None])
    else:
        scaled = np.sqrt(np.pi / (2 * r)) * sp.ive(k + 0.5, r)
        series = scaled[None] * (2 * k + 1) * sp.eval_legendre(k[None], t[:, None])
    return float(np.max(np.abs(series.sum(axis=1) - np.exp(r * (t - 1)))))


def test_degrees_at_the_issue_tolerance():
    # The coefficient tails on the circle at 1e-7 (issue 38): about 7 at beta = 1, 12 at 4, 17 at 9, 30 at 30.
    assert [hd.degree(beta, TOL, 2) for beta in (1.0, 4.0, 9.0, 30.0)] == [7, 12, 17, 30]


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("r", BETAS)
def test_degree_rule_against_the_measured_kernel_error(d, r):
    degree = hd.degree(r, TOL, d)
    bound = hd.error_bound(r, degree, d)
    # the tail is attained (at the antipode on the circle): equal to rounding
    assert _kernel_error(r, degree, d) <= bound * (1 + 1e-6) and bound <= TOL
    # one degree less is above the tolerance (the smallest such degree), half the degree far above it
    assert hd.error_bound(r, degree - 1, d) > TOL
    assert _kernel_error(r, degree // 2, d) > 100 * TOL


def test_bad_dimension_and_tolerance_are_refused():
    with pytest.raises(af.ConfigError, match="d=4"):
        hd.degree(1.0, TOL, 4)
    with pytest.raises(af.ConfigError, match="summation_tol"):
        hd.degree(1.0, 0.0, 2)


def test_the_largest_radius_is_beta_times_the_largest_norm_of_k_transpose_q():
    rng = np.random.default_rng(1)
    q, k = rng.normal(size=(2, 3, 3)), rng.normal(size=(2, 3, 3))
    want = 2.5 * max(np.linalg.norm(k[h].T @ q[h], 2) for h in range(2))
    assert hd.largest_radius(-2.5, q, k) == pytest.approx(want)
    assert hd.largest_radius(2.0, None, None) == 2.0
    assert hd.largest_radius(2.0, 3 * np.eye(2)[None], None) == pytest.approx(6.0)


def test_harmonic_degree_is_the_studys_and_serves_a_field_built_by_hand():
    """`attnflow.harmonic_degree` gives a hand-built SelfAttention the degree a study takes
    (its `summation_degree`), and the field it sums is within the tolerance of the direct
    one (float64, d = 2, beta = 4, Q = 1.5 I; n = 400)."""
    import jax
    import jax.numpy as jnp

    from attnflow.schema._config import compose
    from attnflow.schema.system._summation import summation

    q = 1.5 * np.eye(2)
    cfg = compose(dict(n=4096, d=2, beta=4.0, summation="harmonic", metrics=["order_parameter"],
                       weights={"q": {"kind": "identity", "scale": 1.5}}))
    degree = af.harmonic_degree(4.0, 2, query=q)
    assert degree == summation(cfg).degree == hd.degree(1.01 * 6.0, TOL, 2)
    assert af.harmonic_degree(4.0, 2) == 12 and af.harmonic_degree(4.0, 2, 1e-3) < 12
    x = af.UniformSphere()(jax.random.key(3), 400, 2, jnp.float64)
    eye = af.Constant(jnp.eye(2, dtype=jnp.float64)[None])

    def field(**how):
        term = af.SelfAttention(af.Constant(jnp.asarray(q)[None]), eye, eye, None, jnp.asarray(4.0), None, heads=1,
                                unit_rows=True, **how)
        return term(0.0, x)

    direct, harmonic = field(), field(summation="harmonic", degree=degree)
    error = float(jnp.max(jnp.abs(harmonic - direct)) / jnp.max(jnp.abs(direct)))
    assert 1e-12 < error <= TOL
    coarse = field(summation="harmonic", degree=degree // 2)
    assert float(jnp.max(jnp.abs(coarse - direct)) / jnp.max(jnp.abs(direct))) > 100 * TOL
