"""Solvers: measured order of convergence, adaptive accuracy, fixed-step bookkeeping."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp
from systems import equiangular_rho, identity_field, random_field

import attnflow as af

N, D = 5, 3


def _reference(field, y0, horizon):
    f = jax.jit(lambda y: field(0.0, y.reshape(N, D)).reshape(-1))
    sol = solve_ivp(lambda t, y: np.asarray(f(jnp.asarray(y))), (0, horizon), np.asarray(y0).ravel(),
                    method="DOP853", rtol=1e-13, atol=1e-15)
    return sol.y[:, -1].reshape(N, D)


@pytest.fixture(scope="module")
def problems():
    """Two systems on S^2 with a tight SciPy (DOP853) solution of the same field (the
    exact flow stays on the sphere, so the reference needs no retraction):
    `random`, two-head Gaussian attention (a stiff-ish test for orders 1-4), and
    `identity`, Q = K = V = I, smooth enough for orders 5 and 8 to show before round-off."""
    y0 = af.UniformSphere()(jax.random.key(1), N, D, jnp.float64)
    out = {}
    for name, field, horizon in (("random", random_field(jax.random.key(0), D, 1.0, heads=2), 2.0),
                                 ("identity", identity_field(D, 1.0), 2.0),
                                 ("identity4", identity_field(D, 1.0), 4.0)):
        out[name] = (field, y0, horizon, _reference(field, y0, horizon))
    return out


# solver, theoretical order, system, step counts (chosen so the errors sit between the
# pre-asymptotic regime and round-off)
CASES = [
    ("euler", 1, "random", (32, 64, 128, 256)),
    ("euler_renorm", 1, "random", (32, 64, 128, 256)),
    ("heun", 2, "random", (16, 32, 64, 128)),
    ("midpoint", 2, "random", (16, 32, 64, 128)),
    ("ralston", 2, "random", (16, 32, 64, 128)),
    ("bosh3", 3, "random", (16, 32, 64, 128)),
    ("rk4", 4, "random", (16, 32, 64, 128)),
    ("tsit5", 5, "identity", (16, 24, 32, 48)),
    ("dopri5", 5, "identity", (16, 24, 32, 48)),
    ("dopri8", 8, "identity4", (10, 12, 16, 20)),
]


@pytest.mark.parametrize("solver,order,system,steps", CASES, ids=[c[0] for c in CASES])
def test_measured_order_matches_theory(problems, solver, order, system, steps):
    field, y0, horizon, ref = problems[system]
    errors = []
    for count in steps:
        x = af.simulate(field, y0, t1=horizon, dt=horizon / count, solver=solver).xs[-1]
        errors.append(np.abs(np.asarray(x) - ref).max())
    errors = np.array(errors)
    assert errors.min() > 1e-13, errors  # still above round-off
    slope = np.polyfit(np.log(horizon / np.array(steps)), np.log(errors), 1)[0]
    # Pre-asymptotic error terms can only make the fitted slope look steeper.
    assert order - 0.3 < slope < order + 0.6, (slope, errors)


@pytest.mark.parametrize("solver", ["tsit5", "dopri5", "heun"])
def test_adaptive_solvers_meet_their_tolerance(problems, solver):
    field, y0, _, ref = problems["random"]
    sol = af.simulate(field, y0, t1=2.0, dt=0.1, solver=solver, adaptive=True, rtol=1e-8, atol=1e-10,
                      ts=jnp.array([0.0, 2.0]))
    assert sol.result == af._simulate.dfx.RESULTS.successful
    np.testing.assert_allclose(sol.xs[-1], ref, atol=1e-6)
    loose = af.simulate(field, y0, t1=2.0, dt=0.1, solver=solver, adaptive=True, rtol=1e-3, atol=1e-5,
                        ts=jnp.array([0.0, 2.0]))
    assert int(loose.num_steps) < int(sol.num_steps)


def test_adaptive_equiangular_solution():
    """The adaptive path (diffrax's dense output at arbitrary times) on the closed-form system."""
    n, beta = 5, 2.0
    ts = jnp.linspace(0.0, 3.0, 13)
    sol = af.simulate(identity_field(n, beta), af.Orthonormal()(None, n, n, jnp.float64), t1=3.0, dt=0.1,
                      solver="tsit5", adaptive=True, rtol=1e-10, atol=1e-12, ts=ts)
    rho = np.array([x[0] @ x[1] for x in np.asarray(sol.xs)])
    np.testing.assert_allclose(rho, equiangular_rho(np.asarray(ts), beta, n), atol=1e-7)


def test_fixed_steps_need_a_dividing_step():
    field = identity_field(3, 1.0)
    y0 = af.UniformSphere()(jax.random.key(2), 4, 3, jnp.float64)
    with pytest.raises(af.ConfigError, match="does not divide"):
        af.simulate(field, y0, t1=1.0, dt=0.3, solver="euler")
    with pytest.raises(af.ConfigError, match="save_every"):
        af.simulate(field, y0, t1=1.0, dt=0.1, solver="euler", save_every=3)
    with pytest.raises(af.ConfigError, match="error estimate"):
        af.simulate(field, y0, t1=1.0, dt=0.1, solver="euler", adaptive=True, ts=jnp.array([0.0, 1.0]))
    # With output times the same step runs through diffrax, which shortens the last step.
    sol = af.simulate(field, y0, t1=1.0, dt=0.3, solver="euler", ts=jnp.array([0.0, 1.0]))
    assert int(sol.num_steps) == 4


def test_saved_times_are_the_step_grid():
    sol = af.simulate(identity_field(3, 1.0), af.UniformSphere()(jax.random.key(3), 4, 3, jnp.float64), t1=3.0,
                      t0=1.0, dt=0.25, solver="rk4", save_every=2)
    np.testing.assert_allclose(sol.ts, np.arange(1.0, 3.01, 0.5))
    assert int(sol.num_steps) == 8
