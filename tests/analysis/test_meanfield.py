"""The mean-field continuity equation on the circle (attnflow.analysis.meanfield) against
its closed forms: the uniform density is stationary, a small perturbation's mode k grows
at the derived rate lambda_k (docs/model.md, "The mean-field limit on the circle"), the
mass is conserved to rounding; and the circle's Wasserstein-1 distance against its own
closed forms."""

import numpy as np
import pytest

from attnflow.schema._errors import ConfigError
from attnflow.analysis.meanfield import (
    circle_growth_rate,
    circle_stationary_order,
    circle_wasserstein,
    meanfield_circle,
)

# One grid and two saved times for every solve: one compiled program for the module.
GRID = 96
THETA = np.arange(GRID) * (2 * np.pi / GRID)
UNIFORM = np.full(GRID, 1 / (2 * np.pi))


@pytest.mark.parametrize("kind,beta,sigma", [("sa", 4.0, 0.0), ("usa", 9.0, 0.5)])
def test_the_uniform_density_is_stationary(kind, beta, sigma):
    """rho = 1/2pi has v[rho] = 0 (a_0 = 0) and no curvature: it stays put to rounding."""
    solution = meanfield_circle(UNIFORM, [0.0, 5.0], beta=beta, kind=kind, sigma=sigma)
    np.testing.assert_allclose(np.asarray(solution.density), 1 / (2 * np.pi), rtol=0, atol=1e-15)


@pytest.mark.parametrize("kind", ["sa", "usa"])
@pytest.mark.parametrize("beta", [1.0, 4.0, 9.0])
@pytest.mark.parametrize("sigma", [0.0, 0.5])
def test_a_small_perturbation_grows_at_the_derived_rate(kind, beta, sigma):
    """rho = (1 + eps sum_k cos k theta)/2pi, eps = 1e-7, for k = 1, 2, 3, 5: each mode's
    amplitude grows like exp(lambda_k t), lambda_k = (k/2)(I_{k-1} - I_{k+1})/zeta -
    sigma^2 k^2/2 (zeta = I_0(beta) for SA, 1 for USA), measured up to t = 1/max|lambda|.
    The modes interact only at order eps^2, so the measured rates agree to ~1e-7 of the
    largest rate (the bound below leaves a factor 20)."""
    ks = np.array([1, 2, 3, 5])
    eps = 1e-7
    rho = (1 + eps * np.cos(np.outer(ks, THETA)).sum(axis=0)) / (2 * np.pi)
    predicted = circle_growth_rate(ks, beta, kind, sigma)
    t1 = 1 / np.abs(predicted).max()
    solution = meanfield_circle(rho, [0.0, t1], beta=beta, kind=kind, sigma=sigma, rtol=1e-12, atol=1e-14)
    c = np.asarray(solution.coefficients)
    measured = np.log(np.abs(c[1, ks]) / np.abs(c[0, ks])) / t1
    assert np.max(np.abs(measured - predicted)) <= 2e-6 * np.abs(predicted).max(), (measured, predicted)


def test_the_growth_rate_closed_forms():
    """The two forms of lambda_k agree (I_{k-1} - I_{k+1} = (2k/beta) I_k); at beta = 4
    under SA the most unstable mode is k = 3 (0.664, against 0.568 for k = 2 and 0.501
    for k = 4), which the experiment perturbs; the diffusion subtracts sigma^2 k^2/2."""
    from scipy.special import iv

    k = np.arange(1, 9)
    for beta in (0.5, 4.0, 30.0):
        np.testing.assert_allclose(circle_growth_rate(k, beta, "usa"), k**2 * iv(k, beta) / beta, rtol=1e-12)
        np.testing.assert_allclose(circle_growth_rate(k, beta, "sa"), k**2 * iv(k, beta) / (beta * iv(0, beta)),
                                   rtol=1e-12)
    rates = circle_growth_rate(k, 4.0, "sa")
    assert np.argmax(rates) == 2
    np.testing.assert_allclose(rates[1:4], [0.568, 0.664, 0.501], atol=5e-4)
    np.testing.assert_allclose(circle_growth_rate(k, 4.0, "sa", 0.3) - rates, -0.045 * k**2, rtol=1e-12)


@pytest.mark.parametrize("kind,sigma", [("sa", 0.0), ("usa", 0.2)])
def test_the_mass_is_conserved_to_rounding(kind, sigma):
    """A far-from-uniform density (two modes, amplitude 0.8) run into its clusters keeps
    its mass 1 to rounding: the k = 0 coefficient has derivative -i 0 (rho v)_0 = 0."""
    rho = (1 + 0.5 * np.cos(3 * THETA) + 0.3 * np.sin(THETA + 1)) / (2 * np.pi)
    t1 = 2.0 if kind == "sa" else 0.05
    solution = meanfield_circle(rho, [0.0, t1], beta=4.0, kind=kind, sigma=sigma)
    assert np.abs(np.asarray(solution.density)[-1] - rho).max() > 0.05  # it moved
    np.testing.assert_allclose(np.asarray(solution.mass), 1.0, rtol=0, atol=1e-14)


def test_a_density_that_goes_negative_says_so():
    """At sigma = 0 the clusters sharpen without bound: once narrower than the grid the
    truncated series dips below zero, and the run warns in one sentence."""
    rho = (1 + 0.5 * np.cos(3 * THETA)) / (2 * np.pi)
    with pytest.warns(RuntimeWarning, match="goes negative from t = 8"):
        solution = meanfield_circle(rho, [0.0, 8.0], beta=4.0)
    assert float(solution.min_density[-1]) < 0 < float(solution.min_density[0])


def test_wasserstein_on_the_circle_closed_forms():
    """n equally spaced points against the uniform density: F - G is a sawtooth of height
    1/n, W1 = pi/(2n), for any rotation of the points; a Dirac against the uniform:
    pi/2 (the median alpha = 1/2 cuts the ramp 1 - theta/2pi in half)."""
    uniform = np.zeros(8, complex)
    uniform[0] = 1 / (2 * np.pi)
    for n in (10, 1000):
        points = 2 * np.pi * (np.arange(n) + 0.5) / n
        for shift in (0.0, 0.3, 2.0):
            np.testing.assert_allclose(circle_wasserstein(points + shift, uniform), np.pi / (2 * n), rtol=1e-6)
    np.testing.assert_allclose(circle_wasserstein(np.full(5, 1.0), uniform), np.pi / 2, rtol=1e-7)


def test_the_stationary_order_tends_to_kuramotos_as_beta_vanishes():
    """As beta -> 0 the kernel e^{beta cos u}/beta is a constant plus cos u plus O(beta), so
    the stationary density is exp((2r/sigma^2) cos theta)/Z and r solves Kuramoto's
    r = I_1(2r/sigma^2)/I_0(2r/sigma^2) (found here by root bracketing): the distance falls
    like beta (measured 5.0e-5 to 7.7e-5 at beta = 1e-3, ten times that at 1e-2)."""
    import scipy.optimize
    import scipy.special

    for sigma in (0.5, 0.8, 0.95):
        gain = 2 / sigma**2
        kuramoto = scipy.optimize.brentq(
            lambda r: r - scipy.special.i1(gain * r) / scipy.special.i0(gain * r), 1e-9, 1.0)
        errors = [abs(circle_stationary_order(beta, sigma) - kuramoto) for beta in (1e-2, 1e-3)]
        assert errors[1] < 1.5e-4 and errors[0] / errors[1] == pytest.approx(10, rel=0.1), errors


def test_the_stationary_order_vanishes_like_a_square_root_at_sigma_c():
    """A supercritical (continuous) transition: r^2 proportional to sigma_c - sigma near
    sigma_c (r(0.99 sigma_c)/r(0.999 sigma_c) = sqrt(10) to 2%; measured 3.12), and r = 0
    from sigma_c on, where the uniform density is linearly stable."""
    import scipy.special

    sigma_c = np.sqrt(2 * scipy.special.i1(1.0))
    near, nearer = (circle_stationary_order(1.0, f * sigma_c) for f in (0.99, 0.999))
    assert near / nearer == pytest.approx(np.sqrt(10), rel=0.02), (near, nearer)
    assert circle_stationary_order(1.0, sigma_c) == 0 and circle_stationary_order(1.0, 1.2 * sigma_c) == 0
    assert circle_stationary_order(1.0, 0.6 * sigma_c) == pytest.approx(0.946061, abs=1e-6)


def test_bad_input_is_refused_in_one_sentence():
    with pytest.raises(ConfigError, match="solver must be one of tsit5"):
        meanfield_circle(UNIFORM, [0.0, 1.0], beta=1.0, solver="rk45")
    with pytest.raises(ConfigError, match="beta and sigma"):
        meanfield_circle(UNIFORM, [0.0, 1.0], beta=1.0, sigma=-1.0)
    with pytest.raises(ConfigError, match="increasing"):
        meanfield_circle(UNIFORM, [1.0, 0.0], beta=1.0)
