"""Lyapunov spectra by the QR method: the Lorenz system's published spectrum and its
exact sum, linear systems, Q = K = V = I attention at consensus (the analytic spectrum
of tests/README.md, section 11), independence from the re-orthonormalisation interval,
and vmap over initial states equal to a loop."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import attnflow as af
from attnflow.analysis.spectrum import lyapunov_spectrum
from systems import rk4_rate

SIGMA, RHO, BETA = 10.0, 28.0, 8.0 / 3.0
# Viswanath (1998) and Sprott, "Chaos and Time-Series Analysis" (2003), table of exponents.
LORENZ_SPECTRUM = np.array([0.9056, 0.0, -14.5723])


def lorenz(t, y, args):
    x, v, z = y[0], y[1], y[2]
    return jnp.stack([SIGMA * (v - x), x * (RHO - z) - v, x * v - BETA * z])


@pytest.fixture(scope="module")
def on_attractor():
    """A point on the Lorenz attractor: (1, 1, 1) after a transient of 20 time units."""
    sol = solve_ivp(lambda t, y: np.asarray(lorenz(t, y, None)), (0.0, 20.0), [1.0, 1.0, 1.0], method="DOP853",
                    rtol=1e-10, atol=1e-10)
    return jnp.asarray(sol.y[:, -1], jnp.float64)


def test_lorenz_spectrum_matches_the_published_one(on_attractor):
    # The finite-time error falls like 1/T: over T = 400 it is 0.008 for the first
    # exponent and below 0.006 for the other two (measured); the tolerance is 0.05.
    res = lyapunov_spectrum(lorenz, on_attractor, t1=400.0, dt=0.01, reorthonormalize_every=5)
    assert res.exponents.dtype == jnp.float64
    np.testing.assert_allclose(res.exponents, LORENZ_SPECTRUM, atol=0.05)


def test_lorenz_sum_is_the_volume_contraction_at_the_order_of_rk4(on_attractor):
    # The trace of the Lorenz Jacobian is -(sigma + 1 + beta) everywhere, so the exponents
    # of the flow sum to it exactly at every T; those of the RK4 step map differ by the
    # method's error, which must fall like h^4.
    exact = -(SIGMA + 1 + BETA)
    steps = np.array([0.02, 0.01, 0.005])
    errors = np.array([float(lyapunov_spectrum(lorenz, on_attractor, t1=2.0, dt=h).exponents.sum()) - exact
                       for h in steps])
    order = np.polyfit(np.log(steps), np.log(np.abs(errors)), 1)[0]
    assert abs(order - 4) < 0.2, (order, errors)
    assert abs(errors[-1]) < 1e-6 * abs(exact), errors


def test_linear_system_gives_the_real_parts_of_its_eigenvalues():
    # A non-normal A = S B S^{-1} with eigenvalues -0.5 +- 2i, 0.3, -1.2 (tests/README.md, section 11).
    b = np.array([[-0.5, 2.0, 0, 0], [-2.0, -0.5, 0, 0], [0, 0, 0.3, 0], [0, 0, 0, -1.2]])
    s = np.eye(4) + 1.5 * np.triu(np.ones((4, 4)), 1) + np.array(
        [[0, 0, 0, 0], [0.3, 0, 0, 0], [0, -0.4, 0, 0], [0.2, 0, 0.5, 0]])
    a = s @ b @ np.linalg.inv(s)
    assert np.linalg.norm(a @ a.T - a.T @ a) > 1.0  # far from normal
    expected = np.sort(np.linalg.eigvals(a).real)[::-1]
    np.testing.assert_allclose(expected, [0.3, -0.5, -0.5, -1.2], atol=1e-12)
    aj = jnp.asarray(a)
    res = lyapunov_spectrum(lambda t, y, args: aj @ y, jnp.ones(4), t1=200.0, dt=0.01, running=True)
    # The finite-time error is C/T with C of order log cond(S) (measured at most 0.008).
    np.testing.assert_allclose(res.exponents, expected, atol=0.02)
    # The sum is log |det| of the step map over T: the trace of A at every time.
    np.testing.assert_allclose(res.running.sum(axis=1), np.trace(a), rtol=1e-8)
    # The top exponent is simple and real: T (lambda_1(T) - 0.3) tends to a constant, the
    # log of the initial vector's share along the top eigenvector.
    offset = res.times * (res.running[:, 0] - 0.3)
    half = res.times.size // 2
    np.testing.assert_allclose(offset[half:], offset[-1], atol=1e-6)


def consensus_field(beta, d, kind="sa"):
    eye = af.Identity(heads=1, dim=d)
    attention = af.SelfAttention(eye, eye, eye, None, beta=jnp.asarray(beta), alibi=None, heads=1, kind=kind)
    return af.VectorField((attention,), scheme="sphere")


@pytest.mark.parametrize("kind, betas", [("sa", (1.0, 4.0)), ("usa", (0.5,))])
def test_consensus_spectrum_is_the_analytic_one(kind, betas):
    # n tokens at one point x* of S^{d-1}, nudged by 1e-7: exponent 0 with multiplicity
    # d - 1 (the mean mode, moving x*) and -rate with multiplicity (n - 1)(d - 1) (the
    # differential modes), rate = 1 for softmax and e^beta without normalization
    # (tests/README.md, section 11). The estimate over [T/2, T] leaves out the transient
    # of the initial frame (O(1/T) over [0, T]); it then equals the exponent of the RK4
    # step map, log R(-rate h)/h, to round-off.
    n, d, h, t1 = 4, 3, 0.1, 40.0
    centre = np.array([0.3, -0.5, 0.8]) / np.linalg.norm([0.3, -0.5, 0.8])
    y0 = jnp.asarray(np.tile(centre, (n, 1)) + 1e-7 * np.random.default_rng(0).normal(size=(n, d)))

    def spectrum(beta):
        return lyapunov_spectrum(consensus_field(beta, d, kind), y0, t1=t1, dt=h, running=True,
                                 reorthonormalize_every=5)

    res = jax.vmap(spectrum)(jnp.asarray(betas, jnp.float64))
    for beta, times, running in zip(betas, np.asarray(res.times), np.asarray(res.running)):
        rate = 1.0 if kind == "sa" else np.exp(beta)
        half = times.size // 2 - 1
        window = (times[-1] * running[-1] - times[half] * running[half]) / (times[-1] - times[half])
        expected = np.array([0.0] * (d - 1) + [-rate] * ((n - 1) * (d - 1)))
        np.testing.assert_allclose(window, np.where(expected == 0, 0.0, rk4_rate(expected, h)), atol=1e-10)
        # RK4's own error, (rate h)^5 / (120 h) per unit time, is 1.2e-5 at rate e^0.5.
        np.testing.assert_allclose(window, expected, atol=5e-5)
        # Over the whole of [0, T] the same exponents, up to the O(1/T) transient (whose
        # constant, set by the initial frame, is at most 2.1 here).
        np.testing.assert_allclose(running[-1], expected, atol=3.0 / t1)


def test_rotation_orbit_spans_the_directions_the_symmetry_keeps_neutral():
    """Q = K = V = I attention commutes with rotations, so the tangent map carries an
    orbit direction A y to A Phi(y) (tests/README.md, section 11). At consensus the
    transverse spectrum (quotient=rotation_orbit) is -rate every time, the d - 1 zeros of
    the full spectrum being the orbit; for two distinct clusters the full spectrum holds
    d(d - 1)/2 = 3 forced zeros and the transverse one at most the clusters' relative
    angle. Breaking the quotient (no projection) brings the zeros back."""
    d, n, h = 3, 6, 0.1
    y = af.UniformSphere()(jax.random.key(0), n, d, jnp.float64)
    orbit = np.asarray(af.rotation_orbit(y))
    assert orbit.shape == (3, n, d)
    np.testing.assert_allclose(np.sum(orbit * np.asarray(y)[None], axis=-1), 0.0, atol=1e-15)  # tangent
    field = consensus_field(2.0, d)
    step = lambda z: af.simulate(field, z, t1=1.0, dt=h, solver="rk4", save_every=10).xs[-1]
    image, pushed = jax.vmap(lambda v: jax.jvp(step, (y,), (v,)), out_axes=(None, 0))(jnp.asarray(orbit))
    np.testing.assert_allclose(pushed, af.rotation_orbit(image), atol=1e-12)

    @functools.partial(jax.jit, static_argnums=2)
    def late(y0, beta, transverse):
        res = lyapunov_spectrum(consensus_field(beta, d), y0, t1=40.0, dt=h, k=5, running=True,
                                reorthonormalize_every=5, quotient=af.rotation_orbit if transverse else None)
        half = res.times.size // 2 - 1
        return ((res.times[-1] * res.running[-1] - res.times[half] * res.running[half])
                / (res.times[-1] - res.times[half]))

    # Consensus: the tokens at one point, nudged by 1e-7.
    centre = np.array([0.3, -0.5, 0.8]) / np.linalg.norm([0.3, -0.5, 0.8])
    near = jnp.asarray(np.tile(centre, (n, 1)) + 1e-7 * np.random.default_rng(0).normal(size=(n, d)))
    np.testing.assert_allclose(late(near, 1.0, True), rk4_rate(-1.0, h), atol=1e-10)
    full = np.asarray(late(near, 1.0, False))
    np.testing.assert_allclose(full[:2], 0.0, atol=1e-10)
    np.testing.assert_allclose(full[2:], rk4_rate(-1.0, h), atol=1e-10)
    # Two clusters of three tokens, 90 degrees apart, at beta = 9: apart for the whole run.
    rng = np.random.default_rng(1)
    two = np.concatenate([np.eye(3)[0] + 0.05 * rng.normal(size=(3, 3)), np.eye(3)[1] + 0.05 * rng.normal(size=(3, 3))])
    two = jnp.asarray(two / np.linalg.norm(two, axis=1, keepdims=True))
    full = np.asarray(late(two, 9.0, False))
    assert np.all(np.abs(full[:3]) < 1e-3), full  # the three rotations: forced zeros
    transverse = np.asarray(late(two, 9.0, True))
    # The clusters' relative angle alone stays nearly neutral (it drifts: 0.004 here); the
    # rest contract inside the clusters.
    assert abs(transverse[0]) < 0.01 and np.all(transverse[1:] < -0.9), transverse
    with pytest.raises(af.ConfigError, match="k must be a whole number of exponents from 1 to 9"):
        lyapunov_spectrum(consensus_field(1.0, d), near, t1=1.0, dt=h, k=10, quotient=af.rotation_orbit)


def test_exponents_do_not_depend_on_the_reorthonormalisation_interval(on_attractor):
    # The product of the interval factors R is the triangular factor of the whole
    # product, so only round-off tells the intervals apart while the vectors stay well
    # conditioned (20 steps of 0.01 stretch them apart by e^{15.5 * 0.2} ~ 22).
    results = [lyapunov_spectrum(lorenz, on_attractor, t1=20.0, dt=0.01, reorthonormalize_every=m, running=True)
               for m in (1, 5, 20)]
    for every, res in zip((5, 20), results[1:]):
        np.testing.assert_allclose(res.exponents, results[0].exponents, rtol=0, atol=1e-10)
        # and so do the running estimates at the times both have
        np.testing.assert_allclose(res.times, results[0].times[every - 1::every], rtol=1e-14)
        np.testing.assert_allclose(res.running, results[0].running[every - 1::every], rtol=0, atol=1e-10)


def test_vmap_over_initial_states_equals_a_loop_under_jit():
    # Q = K = V = I attention at beta = 1 on S^2, four tokens, three members from
    # uniformly random initial states (away from consensus).
    y0s = jax.random.normal(jax.random.key(2), (3, 4, 3), jnp.float64)
    y0s = y0s / jnp.linalg.norm(y0s, axis=-1, keepdims=True)
    spectrum = jax.jit(functools.partial(lyapunov_spectrum, consensus_field(1.0, 3), t1=5.0, dt=0.05, running=True))
    batched = jax.vmap(spectrum)(y0s)
    assert batched.exponents.shape == (3, 4 * 2) and batched.running.shape == (3, 100, 8)
    assert np.all(np.diff(np.asarray(batched.exponents), axis=1) <= 0)
    for y0, exponents, running in zip(y0s, batched.exponents, batched.running):
        one = spectrum(y0)
        np.testing.assert_allclose(exponents, one.exponents, rtol=0, atol=1e-12)
        np.testing.assert_allclose(running, one.running, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kwargs, message", [
    ({"k": 9}, "k must be a whole number of exponents from 1 to 8 (the tangent space has dimension n(d - 1) = 8)"),
    ({"k": 0}, "from 1 to 8"),
    ({"reorthonormalize_every": 3}, "dividing the 10 steps"),
    ({"solver": "leapfrog"}, "unknown solver 'leapfrog'"),
])
def test_bad_arguments_stop_with_one_sentence(kwargs, message):
    field = consensus_field(1.0, 3)
    with pytest.raises(af.ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        lyapunov_spectrum(field, jnp.ones((4, 3)), t1=1.0, dt=0.1, **kwargs)


@pytest.mark.parametrize("solver", ["euler_renorm", "rk4"])
def test_the_step_map_is_the_step_of_simulate(solver):
    """`step_map` is the one fixed step: iterated, it gives `simulate`'s states (to the
    rounding of a different fusion of the same operations), so the analyses that step
    through it follow `simulate`'s trajectory. The field's tangent projection is its own:
    left to the solver (None), `euler_renorm` steps the unprojected field; said
    explicitly, every solver steps what the field says (the two differ at O(h^2) a step)."""
    from attnflow.numerics._simulate import step_map

    d, n, h, steps = 3, 5, 0.1, 4
    y0 = af.UniformSphere()(jax.random.key(1), n, d, jnp.float64)
    field = consensus_field(2.0, d)
    step = step_map(field, solver, h)
    y = y0
    for k in range(steps):
        y = step(k * h, y)
    np.testing.assert_allclose(y, af.simulate(field, y0, t1=steps * h, dt=h, solver=solver).xs[-1], rtol=0, atol=1e-15)
    convention = af.SOLVERS[solver][0]
    for tangent in (True, False):
        explicit = af.VectorField(field.terms, scheme="sphere", tangent=tangent)
        gap = np.abs(af.simulate(explicit, y0, t1=steps * h, dt=h, solver=solver).xs[-1] - y).max()
        assert (gap < 1e-15) if tangent == convention else (gap > 1e-4), (solver, tangent, gap)
