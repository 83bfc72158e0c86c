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
# pre-asymptotic regime and round-off). Three counts over the range four used to cover
# (each count is one compile): the fitted slopes moved by at most 0.01 (measured).
CASES = [
    ("euler", 1, "random", (32, 64, 256)),
    ("euler_renorm", 1, "random", (32, 64, 256)),
    ("heun", 2, "random", (16, 32, 128)),
    ("midpoint", 2, "random", (16, 32, 128)),
    ("ralston", 2, "random", (16, 32, 128)),
    ("bosh3", 3, "random", (16, 32, 128)),
    ("rk4", 4, "random", (16, 32, 128)),
    ("tsit5", 5, "identity", (16, 24, 48)),
    ("dopri5", 5, "identity", (16, 24, 48)),
    ("dopri8", 8, "identity4", (10, 12, 20)),
]


@pytest.mark.parametrize("solver,order,system,steps", CASES, ids=[c[0] for c in CASES])
def test_measured_order_matches_theory(problems, solver, order, system, steps):
    field, y0, horizon, ref = problems[system]
    # the three step counts in one program (one compile)
    finals = jax.jit(lambda y: [af.simulate(field, y, t1=horizon, dt=horizon / count, solver=solver).xs[-1]
                                for count in steps])(y0)
    errors = np.array([np.abs(np.asarray(x) - ref).max() for x in finals])
    assert errors.min() > 1e-13, errors  # still above round-off
    slope = np.polyfit(np.log(horizon / np.array(steps)), np.log(errors), 1)[0]
    # Pre-asymptotic error terms can only make the fitted slope look steeper.
    assert order - 0.3 < slope < order + 0.6, (slope, errors)


@pytest.mark.parametrize("solver", ["tsit5", "dopri5", "heun"])
def test_adaptive_solvers_meet_their_tolerance(problems, solver):
    field, y0, _, ref = problems["random"]
    sol = af.simulate(field, y0, t1=2.0, dt=0.1, solver=solver, adaptive=True, rtol=1e-8, atol=1e-10,
                      ts=jnp.array([0.0, 2.0]))
    assert int(sol.result) == 0 and bool(np.all(sol.reached))
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


# --- every fixed-step tableau against diffrax's own implementation ---------------------


@pytest.mark.parametrize("solver", list(af.SOLVERS))
def test_fixed_steps_equal_diffrax_constant_step_solves(solver):
    """attnflow steps the Butcher tableau itself (unrolled stages, no FSAL); diffrax's
    solver (its `step`, with its FSAL state carried from step to step, as `diffeqsolve`
    with constant steps takes them) is an independent implementation of the same
    method. Off the sphere (no retraction) they agree to rounding."""
    import diffrax as dfx

    field = random_field(jax.random.key(5), d=3, beta=1.0, mlp=True, scheme="none")
    y0 = jax.random.normal(jax.random.key(6), (4, 3), jnp.float64)
    cls = {"euler": dfx.Euler, "euler_renorm": dfx.Euler, "rk4": af.RK4}.get(solver) or getattr(
        dfx, af.SOLVERS[solver][2])

    def diffrax_steps(y, h=0.1):
        # diffrax's steps in a scan: the method without diffeqsolve's loop and controller
        # (measured: a third of the time to trace and compile, the same numbers to 3e-15)
        term, method = dfx.ODETerm(field), cls()
        state = method.init(term, 0.0, h, y, None)

        def one(carry, k):
            y, state = carry
            y, _, _, state, _ = method.step(term, k * h, (k + 1) * h, y, None, state, made_jump=False)
            return (y, state), None

        return jax.lax.scan(one, (y, state), jnp.arange(10.0))[0][0]

    # both solves in one program (one compile)
    ours, theirs = jax.jit(lambda y: (af.simulate(field, y, t1=1.0, dt=0.1, solver=solver).xs[-1],
                                      diffrax_steps(y)))(y0)
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-13)


# --- differentiation through every fixed-step solver -----------------------------------


# dopri8 (13 stages, the costliest program of the module to compile) is kept for the slow
# run: its derivatives go through the same stage code (`rk_step`, static coefficients) that
# the nine other solvers' cases here differentiate in the default run, and its coefficients
# are checked there by test_fixed_steps_equal_diffrax_constant_step_solves[dopri8] (and its
# order by test_measured_order_matches_theory[dopri8]).
@pytest.mark.parametrize("solver", [pytest.param(s, marks=pytest.mark.slow) if s == "dopri8" else s
                                    for s in af.SOLVERS])
def test_forward_and_reverse_mode_match_finite_differences(solver):
    """`jax.jvp` (tangent dynamics, for Lyapunov exponents) and `jax.grad` (training
    through the flow) pass through every fixed-step solver on the sphere, and agree with
    a central finite difference of the flow map."""
    field = random_field(jax.random.key(7), d=3, beta=1.0, heads=2)
    y0 = af.UniformSphere()(jax.random.key(8), 4, 3, jnp.float64)
    w = jax.random.normal(jax.random.key(9), (4, 3), jnp.float64)
    v = af.Sphere().project(y0, jax.random.normal(jax.random.key(10), (4, 3), jnp.float64))
    loss = lambda y: jnp.sum(w * af.simulate(field, y, t1=0.2, dt=0.1, solver=solver).xs[-1])
    h = 1e-6

    @jax.jit
    def derivatives(y):
        # One batched jvp gives the flow map at y + h v and y - h v (its primal values)
        # and the tangent at y: one traced solve for the three, not three.
        values, tangents = jax.vmap(lambda p: jax.jvp(loss, (p,), (v,)))(jnp.stack([y + h * v, y - h * v, y]))
        central = (values[0] - values[1]) / (2 * h)
        return central, tangents[2], jnp.sum(jax.grad(loss)(y) * v)

    central, forward, reverse = derivatives(y0)
    np.testing.assert_allclose(forward, central, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(reverse, central, rtol=1e-6, atol=1e-9)


# --- the fixed-step grid ---------------------------------------------------------------


@pytest.mark.parametrize(
    "t0, t1, dt, message",
    [
        (0.0, 30.0, 100.0, "longer than"),
        (0.0, 1.0, 0.3, "does not divide"),
        (0.0, 1.0, 0.0, "positive"),
        (0.0, 10.0, 0.10001, "does not divide"),
    ],
)
def test_one_grid_rule_for_simulate_and_run(t0, t1, dt, message):
    """`simulate` and `run` refuse the same grids with the same sentence."""
    field = identity_field(3, 1.0)
    y0 = af.UniformSphere()(jax.random.key(2), 4, 3, jnp.float64)
    with pytest.raises(af.ConfigError, match=message) as direct:
        af.simulate(field, y0, t0=t0, t1=t1, dt=dt, solver="euler")
    with pytest.raises(af.ConfigError, match=message) as configured:
        af.run({"n": 4, "members": 1, "t0": t0, "t1": t1, "dt": dt, "saves": 2, "compilation_cache": False})
    assert str(direct.value) == str(configured.value)


def test_steps_are_exactly_the_span_over_their_count():
    # A dt rounded to float32 (0.10000000149) still cuts [0, 10] into 100 steps, and the
    # steps are then exactly 1/10 of the span: the same result as the float64 dt.
    assert af.step_count(0.0, 10.0, np.float32(0.1)) == 100
    assert af.step_count(0.0, 1.0, 0.25) == 4
    field = identity_field(3, 1.0)
    y0 = af.UniformSphere()(jax.random.key(2), 4, 3, jnp.float64)
    a, b = jax.jit(lambda y: [af.simulate(field, y, t1=10.0, dt=dt, solver="rk4", save_every=25)
                              for dt in (np.float32(0.1), 0.1)])(y0)  # one compile
    np.testing.assert_array_equal(a.xs, b.xs)
    np.testing.assert_allclose(a.ts, [0.0, 2.5, 5.0, 7.5, 10.0])
    # The grid times themselves: a short decimal on the grid is its nearest float64.
    assert af.grid_times(0.0, 10.0, 100)[12] == 1.2


def test_output_on_the_grid_with_any_number_of_saves():
    """A stride that does not divide the steps still records on the grid (and at t1);
    linear and log spacing, any `saves`, always ending at t1 and increasing."""
    assert af.save_steps(20, 4).tolist() == [0, 7, 14, 20]
    assert af.save_steps(300, 151).tolist() == list(range(0, 301, 2))
    assert af.save_steps(100, 2).tolist() == [0, 100]
    assert af.save_steps(100, 1).tolist() == [100]
    for steps, saves in ((1, 2), (1, 5), (7, 3), (100, 2), (300, 40), (10, 10)):
        log = af.save_steps(steps, saves, "log")
        assert log[0] == 0 and log[-1] == steps and np.all(np.diff(log) > 0) and len(log) <= saves
    times = af.save_times(0.0, 30.0, 2, "log", 0.1)
    np.testing.assert_allclose(times, [0.0, 30.0])
    field = identity_field(3, 1.0)
    y0 = af.UniformSphere()(jax.random.key(3), 4, 3, jnp.float64)
    marks = af.save_steps(20, 4)
    sol, every = jax.jit(lambda y: (af.simulate(field, y, t1=2.0, dt=0.1, solver="rk4", save_steps=marks),
                                    af.simulate(field, y, t1=2.0, dt=0.1, solver="rk4", save_every=1)))(y0)
    np.testing.assert_allclose(sol.ts, [0.0, 0.7, 1.4, 2.0])
    np.testing.assert_allclose(sol.xs, every.xs[marks], rtol=0, atol=1e-15)


def test_off_grid_output_times_are_interpolated_between_grid_states():
    """`ts` off the grid: cubic Hermite interpolation of the grid states (error O(h^4)
    for RK4), exact on grid points; states stay on the sphere."""
    field = random_field(jax.random.key(11), d=3, beta=1.0, heads=2)
    y0 = af.UniformSphere()(jax.random.key(12), 5, 3, jnp.float64)
    ts = jnp.array([0.0, 0.35, 0.7, 1.234, 2.0])
    steps = (0.1, 0.05)

    @jax.jit  # the five solves in one program: one compile
    def solves(y):
        fine = af.simulate(field, y, t1=2.0, dt=2.0 / 1600, solver="rk4", ts=ts).xs  # interpolation error ~ h^4
        return fine, [(af.simulate(field, y, t1=2.0, dt=dt, solver="rk4", ts=ts).xs,
                       af.simulate(field, y, t1=2.0, dt=dt, solver="rk4", save_every=1).xs) for dt in steps]

    fine_xs, coarse = solves(y0)
    errors = []
    for dt, (sol_xs, grid_xs) in zip(steps, coarse):
        np.testing.assert_allclose(sol_xs[2], grid_xs[round(0.7 / dt)], rtol=0, atol=1e-15)
        np.testing.assert_allclose(np.linalg.norm(sol_xs, axis=-1), 1.0, atol=1e-14)
        errors.append(float(jnp.abs(sol_xs - fine_xs).max()))
    assert errors[1] < errors[0] / 8, errors  # at least third order in h


# --- switch times -----------------------------------------------------------------------


def _flip_field(tau, dtype):
    """n = 1 token, V = +I before tau and -I from tau on: with Euler, |x| is multiplied
    by (1 + h) per step before the switch and by (1 - h) from it on."""
    eye = af.Identity(1, 2, jnp.dtype(dtype).name)
    value = af.PiecewiseSchedule(jnp.asarray([tau], dtype),
                                 (af.Scaled(jnp.ones(1, dtype), eye), af.Scaled(-jnp.ones(1, dtype), eye)))
    attention = af.SelfAttention(eye, eye, value, None, jnp.asarray(1.0, dtype), None, heads=1)
    return af.VectorField((attention,), scheme="none")


@pytest.mark.parametrize("dtype, dt", [("float32", 0.1), ("float64", 0.1), ("float32", 0.01)])
def test_a_switch_on_the_grid_takes_effect_exactly_at_its_step(dtype, dt):
    """For every grid time tau, every output mode and both dtypes, the final norm is
    (1 + h)^k (1 - h)^(N - k) with k = tau / h: the step that starts at tau already uses
    the new piece, whatever the last bits of the floating-point times (a switch applied
    one step late would be off by (1 + h)/(1 - h))."""
    steps = round(10.0 / dt) if dt == 0.1 else 30
    t1 = steps * dt
    taus = np.round(np.arange(1, steps) * dt, 10)
    x0 = jnp.asarray([[0.6, 0.8]], dtype)
    outputs = {"ends": {}, "every step": {"save_every": 1}, "every 7": {"save_steps": af.save_steps(steps, 4)},
               "log": {"save_steps": af.save_steps(steps, 6, "log")},
               "off-grid times": {"ts": np.array([0.0, t1 / 3, t1])}}
    # the four output modes in one program (one compile)
    finals = jax.jit(jax.vmap(lambda tau: {name: af.simulate(_flip_field(tau, dtype), x0, t1=t1, dt=dt, solver="euler",
                                                             num_steps=steps, **output).xs[-1, 0]
                                           for name, output in outputs.items()}))(jnp.asarray(taus, dtype))
    for name, final in finals.items():
        k = np.round(taus / dt)
        want = (1 + dt) ** k * (1 - dt) ** (steps - k)
        got = np.linalg.norm(np.asarray(final, np.float64), axis=-1)
        np.testing.assert_allclose(got, want, rtol=2e-5 if dtype == "float32" else 1e-12, err_msg=name)


def test_switch_times_through_the_config_on_every_output_path():
    """The same through `run`: saves that divide the steps or not, log spacing, exact
    times, float32 and float64, at the switch times the audit found applied late."""
    for dtype, taus in (("float32", (1.2, 3.2)), ("float64", (0.9, 4.7))):
        for tau in taus:
            k = round(10 * tau)
            want = 1.1**k * 0.9 ** (100 - k)
            for output in ({"saves": 11}, {"saves": 4}, {"saves": 6, "save_spacing": "log"},
                           {"saves": 4, "exact_times": True}):
                ds = af.run({"n": 1, "d": 2, "members": 1, "beta": 1.0, "scheme": "none", "solver": "euler", "t1": 10.0,
                             "dt": 0.1, "dtype": dtype, "save_states": True, "metrics": [], "compilation_cache": False,
                             "init": {"kind": "given", "value": [[0.6, 0.8]]},
                             "weights": {"v": {"switch_times": [tau], "factors": [1.0, -1.0]}}, **output})
                norms = np.linalg.norm(ds["x"].values[0, :, 0].astype(np.float64), axis=-1)  # member 0, token 0
                np.testing.assert_allclose(norms[-1] / norms[0], want, rtol=1e-5, err_msg=f"{dtype} {tau} {output}")


def test_adaptive_runs_step_to_the_switch_times():
    """An adaptive solve of the flip field lands on the exact solution
    exp(tau - (t1 - tau)) without straddling the switch."""
    tau, t1 = 1.3, 3.0
    x0 = jnp.asarray([[0.6, 0.8]], jnp.float64)
    sol = af.simulate(_flip_field(tau, "float64"), x0, t1=t1, dt=0.1, solver="tsit5", adaptive=True, rtol=1e-10,
                      atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(sol.xs[-1]), np.exp(tau - (t1 - tau)), rtol=1e-8)


def test_records_taken_by_runs_of_marks_equal_those_taken_by_a_branch(monkeypatch):
    """Equally spaced records are taken by nested scans without a branch per step (what
    an accelerator wants); any grid of marks gives what the branch per step
    gives, to round-off (the two programs are compiled differently). The field switches
    V = I to V = -I at t = 0.75 (and t0 != 0), so a step taken with the wrong time by
    either path changes the records by O(h), not by an ulp. The marks: every step (a
    run of single steps); one step first, then three runs (gaps 1, 2, 3: single steps
    and inner scans, the switch inside a gap); a single mark at the end (one inner scan
    over every step). Three grids, both paths, in one program (one compile)."""
    from attnflow.numerics import _simulate

    eye = af.Identity(1, 3, "float64")
    value = af.PiecewiseSchedule(jnp.asarray([0.75]), (eye, af.Scaled(-jnp.ones(1), eye)))
    attention = af.SelfAttention(eye, eye, value, None, jnp.asarray(2.0), None, heads=1)
    field = af.VectorField((attention,), scheme="sphere")
    y0 = af.UniformSphere()(jax.random.key(0), 8, 3, jnp.float64)
    # the states themselves and one statistic (the default metrics' cluster search
    # tripled the time to compile, and reads nothing the states do not hold)
    record = af.Recorder(jnp.asarray(2.0), jnp.asarray(0.1), metrics=("energy",), save_states=True)
    grids = (list(range(11)), [1, 2, 3, 5, 7, 10], [10])

    def solve(y, marks):
        sol = af.simulate(field, y, t0=0.25, t1=1.25, dt=0.1, solver="rk4", save_steps=marks, record=record)
        return sol.ts, sol.stats

    @jax.jit
    def both(y):
        assert all(len(_simulate._runs(np.asarray(m))) <= _simulate._MOST_RUNS for m in grids)
        runs = [solve(y, marks) for marks in grids]
        with monkeypatch.context() as patch:
            patch.setattr(_simulate, "_MOST_RUNS", -1)
            branch = [solve(y, marks) for marks in grids]
        return runs, branch

    for marks, (runs_ts, runs), (branch_ts, branch) in zip(grids, *both(y0)):
        np.testing.assert_array_equal(runs_ts, branch_ts)
        for name in branch:
            np.testing.assert_allclose(runs[name], branch[name], rtol=1e-13, atol=1e-15, err_msg=f"{marks} {name}")
