"""Noise: dX = F dt + sigma dW on the sphere, with F = 0 (one particle per sample, the
samples independent). The mean E[<x(t), x(0)>] of Brownian motion on S^{d-1} decays as
exp(-sigma^2 (d-1) t / 2) (the first spherical harmonic, eigenvalue -(d-1)); the scheme
(tangent increment, then retraction) has weak order 1, measured from a log-log fit of
that mean's error; the Brownian tree gives the same path at every step size, so the
endpoints at dt and dt/2 converge (strong order 1/2); a seed gives the same result."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import attnflow as af
from attnflow.numerics._simulate import step_map

SIGMA, T, DEPTH = 1.0, 1.0, 5
STEPS = (4, 8, 16, 32)  # steps over [0, T]: every grid time is on the tree's dyadic grid
MEMBERS, PARTICLES = 4, 6_250


@functools.cache
def _program(d: int, kind: str = "projected", path: str = "tree"):
    """One compiled program per dimension: (keys, steps) -> (x0, x(T)) per member, the step
    count traced (the same tree, whatever the step; fresh increments at every step with
    path="increments")."""

    def member(key, steps):
        k_init, k_noise = jax.random.split(key)
        x0 = af.UniformSphere()(k_init, PARTICLES, d, jnp.float64)
        h = jnp.asarray(T, jnp.float64) / steps.astype(jnp.float64)
        noise = af.brownian_noise(k_noise, SIGMA, (PARTICLES, d), t0=0.0, t1=T, kind=kind, depth=DEPTH,
                                  dtype=jnp.float64, path=path, step=h)
        field = af.VectorField((), noise=noise)
        step = step_map(field, "euler", h)
        x = lax.fori_loop(0, steps, lambda k, x: step(k.astype(jnp.float64) * h, x), x0)
        return x0, x

    return jax.jit(jax.vmap(member, in_axes=(0, None)))


@functools.cache
def _runs(d: int, kind: str = "projected", steps_run=STEPS, path: str = "tree"):
    """{steps: (x0, x(T))} for every step count of `steps_run`, flattened over members."""
    keys = jax.random.split(jax.random.key(7), MEMBERS)
    program = _program(d, kind, path)
    out = {}
    for steps in steps_run:
        x0, x = program(keys, jnp.asarray(steps, jnp.int32))
        out[steps] = (np.asarray(x0).reshape(-1, d), np.asarray(x).reshape(-1, d))
    return out


def _exact(d: int) -> float:
    return float(np.exp(-(SIGMA**2) * (d - 1) * T / 2))


@pytest.mark.optimized
@pytest.mark.parametrize("d, kind, path", [(2, "projected", "tree"), (3, "projected", "tree"),
                                           (3, "ambient", "tree"), (3, "projected", "increments")])
def test_the_mean_of_one_particle_decays_at_the_rate_of_the_first_spherical_harmonic(d, kind, path):
    # (the ambient increment, retracted, has the projected one's drift to first order; the
    # increments of path="increments" are another path at each step, so the two steps'
    # samples of the Richardson combination are independent: a larger Monte Carlo error)
    runs = _runs(d) if (kind, path) == ("projected", "tree") else _runs(d, kind, STEPS[-2:], path)
    # Weak order 1: the Richardson combination 2 m(h/2) - m(h) of the two finest steps
    # leaves an O(h^2) bias (4e-3 at d = 3, 3e-3 at d = 2 from the exact per-step factor).
    fine, coarse = (np.sum(x0 * x, axis=-1) for x0, x in (runs[STEPS[-1]], runs[STEPS[-2]]))
    np.testing.assert_array_equal(runs[STEPS[-1]][0], runs[STEPS[-2]][0])  # the same initial points
    samples = 2 * fine - coarse
    mean, error = samples.mean(), samples.std() / np.sqrt(samples.size)
    assert abs(mean - _exact(d)) < 4 * error + 5e-3, (d, mean, _exact(d), error)


@pytest.mark.parametrize("d", [2, 3])
def test_the_scheme_has_weak_order_one(d):
    runs = _runs(d)
    h = T / np.asarray(STEPS, np.float64)
    errors = np.asarray([np.sum(x0 * x, axis=-1).mean() - _exact(d) for x0, x in runs.values()])
    assert (errors > 0).all(), errors  # the retraction's drift lags the exact decay at every step
    slope = np.polyfit(np.log(h), np.log(errors), 1)[0]
    # The exact per-step factor E[(1 + sigma^2 h chi^2_{d-1})^{-1/2}] gives slope 0.79 (d = 2)
    # and 0.80 (d = 3) over these steps (pre-asymptotic: it tends to 1 as h -> 0); the Monte
    # Carlo error (3.5e-3 with 25 000 samples, on errors of 1.7e-2 and more; the same points and
    # paths at every step, so the errors move together) moves it by up to about 0.1; sigma 10%
    # too large fails both this test and the decay test (checked).
    assert 0.6 < slope < 1.05, (d, slope, errors)


@pytest.mark.optimized  # (the programs of the decay test: the same seed, the same program, the same bits)
def test_one_brownian_tree_gives_the_same_path_at_every_step_size():
    runs = _runs(3)
    gaps = np.asarray([np.linalg.norm(runs[n][1] - runs[2 * n][1], axis=-1).mean() for n in STEPS[:-1]])
    slope = np.polyfit(np.log(T / np.asarray(STEPS[:-1], np.float64)), np.log(gaps), 1)[0]
    # Strong order 1/2 (the noise P_x dW is multiplicative); independent paths at the two
    # steps would leave gaps of order 1 (the mean distance of two independent points).
    assert (np.diff(gaps) < 0).all() and gaps[-1] < 0.15 and 0.3 < slope < 0.75, (gaps, slope)
    # the same seed, the same result, to the bit
    x0, x = _program(3)(jax.random.split(jax.random.key(7), MEMBERS), jnp.asarray(STEPS[0], jnp.int32))
    np.testing.assert_array_equal(np.asarray(x).reshape(-1, 3), runs[STEPS[0]][1])


@pytest.mark.parametrize("given, says", [
    ({"noise": {"sigma": -0.5}}, "noise.sigma must be at least 0"),
    ({"noise": {"sigma": 0.5}, "adaptive": True, "solver": "tsit5"}, "set adaptive=false"),
    ({"noise": {"sigma": 0.5}, "time_change": {"speed": 1.0}}, "time_change.speed=null"),
    ({"noise": {"sigma": 0.5}, "exact_times": True}, "exact_times=false"),
    ({"noise": {"kind": "ambient"}}, "noise.kind does not apply with noise.sigma=0"),
    ({"noise": {"path": "increments"}}, "noise.path does not apply with noise.sigma=0"),
    ({"noise": {"sigma": 0.5, "depth": 0}}, "noise.depth must be at least 1"),
])
def test_impossible_noise_settings_are_refused_in_one_sentence(given, says):
    with pytest.raises(af.ConfigError, match=says):
        af.validate_config({"n": 4, "d": 3, "members": 2, **given})


def test_step_increments_are_the_increments_of_a_brownian_path_on_the_grid():
    """noise.path=increments: per component, the steps' increments have variance h, sum to
    a quadratic variation of 1 over [0, 1], are uncorrelated from step to step, and are the
    same bits for the same key (64 steps x 8192 components: the standard deviations of
    these estimates are 0.0022, 0.0014 and 0.016)."""
    tokens, steps = 4096, 64
    h = 1.0 / steps

    def increments(key):
        noise = af.brownian_noise(key, 1.0, (tokens, 2), t0=0.0, t1=1.0, kind="ambient", dtype=jnp.float64,
                                  path="increments", step=h)
        x = jnp.zeros((tokens, 2), jnp.float64)
        return np.stack([np.asarray(noise.increment(af.Euclidean(), k * h, h, x)) for k in range(steps)])

    dw = increments(jax.random.key(3))
    assert np.sum(dw**2) / (tokens * 2) == pytest.approx(1.0, abs=0.01)
    np.testing.assert_allclose((dw**2).mean(axis=(1, 2)) / h, 1.0, atol=0.08)
    lag = np.mean(dw[1:] * dw[:-1]) / h
    assert abs(lag) < 0.008, lag
    np.testing.assert_array_equal(dw, increments(jax.random.key(3)))
    assert np.abs(dw - increments(jax.random.key(4))).max() > 0.1


def test_a_run_with_step_increments_is_reproducible_and_refuses_a_tree_depth():
    config = {"n": 64, "d": 3, "members": 2, "t1": 1.0, "dt": 1 / 16, "saves": 3, "dtype": "float64",
              "metrics": ["order_parameter"], "noise": {"sigma": 0.5, "path": "increments"},
              "compilation_cache": False}
    one, two = af.run(config), af.run(config)
    np.testing.assert_array_equal(one["order_parameter"].values, two["order_parameter"].values)
    tree = af.run({**config, "noise": {"sigma": 0.5}})
    assert not np.allclose(one["order_parameter"].values[..., -1], tree["order_parameter"].values[..., -1])
    with pytest.raises(af.ConfigError, match="noise.depth=8 resolves a Brownian tree.*noise.depth=null"):
        af.validate_config({**config, "noise": {"sigma": 0.5, "path": "increments", "depth": 8}})
    with pytest.raises(af.ConfigError, match="noise.path"):
        af.validate_config({**config, "noise": {"sigma": 0.5, "path": "bridge"}})


def test_a_noisy_field_refuses_split_steps_and_interpolated_times():
    noise = af.brownian_noise(jax.random.key(0), 0.5, (3, 2), t0=0.0, t1=1.0, dtype=jnp.float64)
    field = af.VectorField((), noise=noise)
    x0 = af.UniformSphere()(jax.random.key(1), 3, 2, jnp.float64)
    with pytest.raises(af.ConfigError, match="leave out split"):
        step_map(field, "euler", 0.1, split="lie")
    with pytest.raises(af.ConfigError, match="leave out adaptive and ts"):
        af.simulate(field, x0, t1=1.0, dt=0.1, ts=[0.0, 0.55, 1.0])


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("beta", [0.5, 1.0, 4.0])
def test_the_critical_sigma_matches_a_direct_quadrature_of_the_mean_field_velocity(d, beta):
    """The field v[rho](x) = P_x int e^{beta <x,y>} y rho(dy) of rho = 1 + eps <a, y> (density
    against the uniform law), by quadrature over the sphere, equals eps A(beta) P_x a; the
    first mode then grows at (d-1)(A - sigma^2/2), zero at sigma_c = sqrt(2 A)."""
    from scipy import integrate

    x, a = np.eye(d)[0], np.linspace(0.3, -0.8, d)
    if d == 2:
        def point(theta):
            return np.array([np.cos(theta), np.sin(theta)])

        def mean(g):  # the mean over the circle, per component
            return np.array([integrate.quad(lambda th: g(point(th))[k], 0, 2 * np.pi, epsabs=1e-12)[0]
                             for k in range(d)]) / (2 * np.pi)
    else:
        def mean(g):
            def at(theta, phi, k):
                y = np.array([np.cos(theta), np.sin(theta) * np.cos(phi), np.sin(theta) * np.sin(phi)])
                return g(y)[k] * np.sin(theta)
            return np.array([integrate.dblquad(lambda ph, th: at(th, ph, k), 0, np.pi, 0, 2 * np.pi,
                                               epsabs=1e-11)[0] for k in range(d)]) / (4 * np.pi)

    def velocity(y):  # the integrand of v at x for the first-mode part of rho (its eps coefficient)
        v = np.exp(beta * (x @ y)) * y * (a @ y)
        return v - (x @ v) * x

    tangent_a = a - (x @ a) * x
    np.testing.assert_allclose(mean(velocity), af.attention_mode(beta, d) * tangent_a, rtol=1e-8, atol=1e-12)
    from scipy import special

    closed = {2: (special.iv(0, beta) - special.iv(2, beta)) / 2,  # = I_1(beta)/beta
              3: (beta * np.cosh(beta) - np.sinh(beta)) / beta**3}[d]
    assert af.attention_mode(beta, d) == pytest.approx(closed, rel=1e-12)
    assert af.attention_mode(0.0, d) == 1 / d == pytest.approx(af.attention_mode(1e-6, d), rel=1e-6)
    sigma_c = af.critical_sigma(beta, d)
    assert abs(af.first_mode_rate(beta, d, sigma_c)) < 1e-12
    assert af.first_mode_rate(beta, d, 0.9 * sigma_c) > 0 > af.first_mode_rate(beta, d, 1.1 * sigma_c)


def _retracted_step_mean(d, s, drift, nodes=60):
    """E[x'] for x = e_1 and x' = (x + drift e_2 + s zeta)/|...|, zeta standard normal in the
    tangent plane e_2..e_d: a tensor Gauss-Hermite quadrature of the step itself."""
    z, w = np.polynomial.hermite_e.hermegauss(nodes)
    grids = np.meshgrid(*([z] * (d - 1)), indexing="ij")
    weights = np.prod(np.meshgrid(*([w / w.sum()] * (d - 1)), indexing="ij"), axis=0)
    y = np.zeros((d, *grids[0].shape))
    y[0], y[1] = 1.0, drift
    for k in range(d - 1):
        y[k + 1] += s * grids[k]
    y /= np.linalg.norm(y, axis=0)
    return np.array([(weights * y[k]).sum() for k in range(2)])


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("beta, sigma, h", [(1.0, 1.3, 0.1), (3.0, 1.9, 0.125)])
def test_the_euler_first_mode_factor_is_that_of_the_retracted_step(d, beta, sigma, h):
    """a = c + (d-1) A h g: c is the mean of one token's retracted noise step along x, g the
    derivative of its tangent mean in a tangent drift, both by a quadrature of the step
    itself (x + h v + sigma P_x dW, retracted), not of the closed forms."""
    s, eps = sigma * np.sqrt(h), 1e-6
    c = _retracted_step_mean(d, s, 0.0)[0]
    g = (_retracted_step_mean(d, s, eps)[1] - _retracted_step_mean(d, s, -eps)[1]) / (2 * eps)
    a, closed = af.euler_first_mode_factor(beta, d, sigma, h)
    assert closed == pytest.approx(c, rel=1e-9)
    assert a == pytest.approx(c + (d - 1) * af.attention_mode(beta, d) * h * g, rel=1e-9)


def test_the_euler_steps_threshold_lies_above_sigma_c_by_its_first_order_bias():
    """The step's threshold on the circle at beta = 1: 1.0867 at dt = 60/1024 (the gallery's)
    and 1.1065 at dt = 30/256, 2.2% and 4.1% above sigma_c = 1.0632; as dt -> 0 it tends to
    sigma_c as sigma_c (1 + (d+1) A h/4) (the ratio of the bias to that term: 0.975 to 0.985
    at h = 1e-2, 0.997 to 0.999 at 1e-3). A threshold 5% off, or A with a wrong power of
    beta (beta = 0.5 and 3), fails."""
    assert af.euler_critical_sigma(1.0, 2, 60 / 1024) == pytest.approx(1.0867, abs=1e-4)
    assert af.euler_critical_sigma(1.0, 2, 30 / 256) == pytest.approx(1.1065, abs=1e-4)
    assert af.euler_critical_sigma(3.0, 2, 1 / 8) == pytest.approx(1.7632, abs=1e-4)
    for d in (2, 3):
        for beta in (0.5, 1.0, 3.0):
            sigma_c, mode = af.critical_sigma(beta, d), af.attention_mode(beta, d)
            for h, within in ((1e-3, 1e-2), (1e-4, 1e-3)):
                bias = af.euler_critical_sigma(beta, d, h) / sigma_c - 1
                assert abs(bias / ((d + 1) * mode * h / 4) - 1) < within, (d, beta, h, bias)
    for dt in (0.0, -0.1, float("nan"), True, 1j):
        with pytest.raises(af.ConfigError, match=r"^dt must be a positive number, got dt="):
            af.euler_critical_sigma(1.0, 2, dt)


def test_a_configured_sigma_sweep_compiles_once_and_sigma_zero_is_the_deterministic_program():
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kw: compiles.append(event) if event == "/jax/core/compile/backend_compile_duration"
        else None)
    config = {"n": 5, "d": 3, "members": 2, "dtype": "float64", "t1": 0.5, "dt": 0.0625, "solver": "euler",
              "saves": 2, "attention": False, "metrics": ["order_parameter"], "save_states": True}
    keys = jax.random.split(jax.random.key(0), 2)

    def solve(sigma):
        system = af.build_system(af.validate_config({**config, "noise": {"sigma": sigma}}))
        return af.solve_ensemble(system, keys, jnp.asarray([1.0]), t1=0.5, dt=0.0625, solver="euler").stats["x"]

    first = solve(0.5)
    before = len(compiles)
    second = solve(0.9)
    assert len(compiles) == before, "a new sigma recompiled the noisy ensemble"
    # the same path, scaled: the tokens moved further at the larger sigma
    moved = [np.linalg.norm(np.asarray(x[..., -1, :, :] - x[..., 0, :, :])) for x in (first, second)]
    assert moved[1] > moved[0] > 0
    deterministic = af.build_system(af.validate_config({**config, "mlp": {"enabled": True}}))
    assert deterministic(keys[0], 1.0)[0].noise is None


# --- the strength's schedule in t: sigma(t) = sigma * factors[k] * f(t), as weights.* -------------

SCHEDULED = {"n": 2500, "d": 3, "members": 4, "dtype": "float64", "t1": 1.0, "dt": 1 / 32, "solver": "euler",
             "saves": 2, "attention": False, "metrics": ["order_parameter"], "save_states": True}


def _scheduled(noise: dict) -> np.ndarray:
    """<x(T), x(0)> of every particle (F = 0), for a configured noise schedule."""
    system = af.build_system(af.validate_config({**SCHEDULED, "noise": {"sigma": 1.0, **noise}}))
    keys = jax.random.split(jax.random.key(3), SCHEDULED["members"])
    x = np.asarray(af.solve_ensemble(system, keys, jnp.asarray([1.0]), t1=1.0, dt=1 / 32, solver="euler").stats["x"])
    return np.sum(x[..., 0, :, :] * x[..., -1, :, :], axis=-1).ravel()


def _sigma(t, times, factors, poly):
    return np.asarray(factors)[np.searchsorted(times, t, side="right")] * np.polyval(poly[::-1], t)


@pytest.mark.optimized
def test_a_scheduled_sigma_decays_the_mean_by_the_integral_of_sigma_squared():
    """E<x(t), x(0)> = exp(-(d-1)/2 int_0^t sigma(s)^2 ds) for Brownian motion on S^{d-1} with a
    time-dependent strength; the scheme's own mean is the product over steps of
    m(sigma_k^2 h) = E[(1 + sigma_k^2 h chi^2_{d-1})^{-1/2}] (sigma_k: the piece at the step's
    midpoint, the polynomial at its start), which the Monte Carlo mean must match to its error."""
    from scipy import integrate

    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kw: compiles.append(event) if event == "/jax/core/compile/backend_compile_duration"
        else None)
    h, d = 1 / 32, 3
    for times, factors, poly in (([0.5], [0.5, 1.0], [1.0]), ([0.25], [0.75, 0.25], [1.0, 1.0])):
        samples = _scheduled({"switch_times": times, "factors": factors, "poly": poly})
        if not compiles:
            compiles.append("first")
        before = len(compiles)
        mean, error = samples.mean(), samples.std() / np.sqrt(samples.size)
        integral = integrate.quad(lambda t: _sigma(t, times, factors, poly) ** 2, 0, 1, points=times)[0]
        exact = np.exp(-(d - 1) / 2 * integral)
        starts = h * np.arange(32)
        strengths = _sigma(starts + h / 2, times, factors, [1.0]) * np.polyval(poly[::-1], starts)
        # chi^2_2 is 2 Exp(1): m(a) = int_0^inf e^{-u} (1 + 2 a u)^{-1/2} du
        scheme = np.prod([integrate.quad(lambda u: np.exp(-u) / np.sqrt(1 + 2 * s**2 * h * u), 0, np.inf)[0]
                          for s in strengths])
        assert abs(mean - scheme) < 4 * error, (times, factors, poly, mean, scheme, error)
        # The scheme tends to the closed form at order h: log m(a) = -a + 5a^2/2 + O(a^3) (d = 3)
        # and the polynomial is read at each step's start, so |log(scheme/exact)| is at most
        # 3 sum_k a_k^2 (a_k = sigma_k^2 h) plus (d-1)/2 |sum_k a_k - int sigma^2|.
        a = strengths**2 * h
        bias = 3 * np.sum(a**2) + (d - 1) / 2 * abs(a.sum() - integral)
        assert abs(np.log(scheme / exact)) < bias, (np.log(scheme / exact), bias)
        assert abs(np.log(mean / exact)) < bias + 4 * error / mean, (mean, scheme, exact, error)
    assert len(compiles) == before, "a new noise schedule of the same shape recompiled"


def test_a_factor_of_zero_stops_the_noise_at_its_switch_time_exactly():
    config = {**SCHEDULED, "n": 3, "members": 2, "saves": 33, "noise": {
        "sigma": 0.7, "switch_times": [0.5], "factors": [1.0, 0.0]}}
    system = af.build_system(af.validate_config(config))
    keys = jax.random.split(jax.random.key(0), 2)
    solution = af.solve_ensemble(system, keys, jnp.asarray([1.0]), t1=1.0, dt=1 / 32, solver="euler", save_every=1)
    x, ts = np.asarray(solution.stats["x"]), np.asarray(solution.ts)
    moving = np.abs(np.diff(x, axis=-3)).max(axis=(0, 1, 3, 4))  # per step
    # (the retraction of a unit vector moves it by a rounding, 2e-16, at most)
    assert ts.shape == (33,) and (moving[ts[:-1] < 0.5] > 1e-2).all() and (moving[ts[:-1] >= 0.5] < 1e-14).all(), moving


@pytest.mark.parametrize("noise, says", [
    ({"sigma": 0.5, "switch_times": [1.0], "factors": [1.0]}, "needs 2 factors, got 1"),
    ({"sigma": 0.5, "switch_times": [2.0, 1.0], "factors": [1.0, 1.0, 1.0]}, "noise.switch_times must increase"),
    ({"sigma": 0.0, "factors": [2.0]}, "does not apply with noise.sigma=0"),
    ({"sigma": 0.5, "poly": [1.0, float("nan")]}, "must be a finite number"),
])
def test_impossible_noise_schedules_are_refused_in_one_sentence(noise, says):
    with pytest.raises(af.ConfigError, match=says):
        af.validate_config({"n": 4, "d": 3, "members": 2, "noise": noise})


def test_a_config_stored_before_noise_path_existed_reads_as_the_tree():
    from attnflow.schema._config import current_config

    stored = {"solver": "euler", "n": 8, "d": 2, "noise": {"sigma": 0.5, "kind": "projected", "depth": None}}
    config = current_config(stored)
    assert config["noise"] == {**stored["noise"], "path": "tree"} and "path" not in stored["noise"]
    assert current_config(config) == config
