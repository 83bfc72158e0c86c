"""The constant-speed time change dX/ds = c F(X)/|F(X)| and the collisions of its fixed
steps: the speed is c, the paths are those of the real-time flow reparametrised, the
unnormalized field is followed at any beta, coincident tokens exert no pull on each other,
a beta sweep compiles once, and tokens that meet are merged."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnflow as af
from attnflow.numerics._field import Collisions, ConstantSpeed


def _circle(angles):
    angles = np.asarray(angles, dtype=np.float64)
    return jnp.asarray(np.stack([np.cos(angles), np.sin(angles)], axis=-1))


def _field(beta, kind="sa", d=2, **attention):
    identity = af.Identity(1, d, "float64")
    return af.SelfAttention(identity, identity, identity, None, jnp.asarray(beta, jnp.float64), None, heads=1,
                            kind=kind, **attention)


def _speed(f):
    return float(jnp.sqrt(jnp.sum(f * f)))


def test_the_time_changed_field_moves_the_state_at_speed_c_and_stops_where_the_field_vanishes():
    x = af.UniformSphere()(jax.random.key(0), 6, 3, jnp.float64)
    for c in (0.3, 1.0, np.log(4000.0)):
        for beta in (0.5, 4.0):
            plain = af.VectorField((_field(beta, d=3),))
            changed = dataclasses.replace(plain, time_change=ConstantSpeed(jnp.asarray(c)))
            f, g = plain(0.0, x), changed(0.0, x)
            assert _speed(g) == pytest.approx(c, rel=1e-14)
            # the direction of the field, tangent to the sphere as stepped
            np.testing.assert_allclose(g, c * f / _speed(f), rtol=1e-13, atol=1e-15)
            np.testing.assert_allclose(jnp.sum(g * x, axis=-1), 0, atol=1e-14)
    # where F = 0 (every token at one point) the time-changed field is 0, not 0/0
    stopped = ConstantSpeed(jnp.asarray(2.0))(jnp.zeros((4, 3)))
    assert not np.any(stopped) and np.isfinite(stopped).all()
    # a field of any size: 1e-300 and 1e300 alike
    for scale in (1e-300, 1e300):
        assert _speed(ConstantSpeed(jnp.asarray(2.0))(scale * jnp.ones((3, 2)))) == pytest.approx(2.0, rel=1e-14)


def test_the_paths_are_the_real_time_paths_reparametrised():
    # X(s) at constant speed c, and t(s) = int_0^s c / |F(X(u))| du, against the real-time
    # solution at t(s): the same point (RK4 in both times, 1000 and 4000 steps; the
    # quadrature is Simpson's rule).
    x0 = af.UniformSphere()(jax.random.key(3), 5, 3, jnp.float64)
    plain = af.VectorField((_field(2.0, d=3),))
    c = 0.7
    changed = dataclasses.replace(plain, time_change=ConstantSpeed(jnp.asarray(c)))
    rescaled = af.simulate(changed, x0, t1=1.0, dt=1e-3, solver="rk4", save_every=1)
    xs, s = rescaled.xs, np.asarray(rescaled.ts)
    speed = np.asarray(jax.vmap(lambda x: jnp.sqrt(jnp.sum(plain(0.0, x) ** 2)))(xs))
    rate = c / speed
    marks = np.arange(0, s.size, 2)
    a = marks[:-1]
    t = np.concatenate([[0.0], np.cumsum((s[a + 2] - s[a]) / 6 * (rate[a] + 4 * rate[a + 1] + rate[a + 2]))])
    real = af.simulate(plain, x0, t1=float(t[-1]), ts=t, num_steps=4000, dt=t[-1] / 4000, solver="rk4")
    np.testing.assert_allclose(real.xs, xs[marks], atol=1e-9)
    assert t[-1] > 2 * s[-1] * c  # the clock runs at another pace: the check is not trivial


def test_the_scale_free_unnormalized_field_is_the_time_change_of_the_usa_field_at_any_beta():
    x = _circle([0.0, 0.3, 0.5, 1.4, 2.0])
    time_change = ConstantSpeed(jnp.asarray(1.5))
    for beta in (2.0, 50.0):
        usa = af.VectorField((_field(beta, "usa"),), time_change=time_change)
        free = af.VectorField((_field(beta, "usa", scale_free=True),), time_change=time_change)
        np.testing.assert_allclose(free(0.0, x), usa(0.0, x), rtol=1e-12, atol=1e-15)
    # beta = 4000 overflows the USA term (e^4000); the scale-free one is finite, at speed c
    huge = af.VectorField((_field(4000.0, "usa", scale_free=True),), time_change=time_change)(0.0, x)
    assert np.isfinite(huge).all() and _speed(huge) == pytest.approx(1.5, rel=1e-14)
    assert not np.isfinite(af.VectorField((_field(4000.0, "usa"),), time_change=time_change)(0.0, x)).all()
    with pytest.raises(af.ConfigError, match="exact only as the one term of a field with a constant-speed"):
        af.VectorField((_field(2.0, "usa", scale_free=True),))


@pytest.mark.parametrize("kind", ["usa", "sa"])
def test_two_point_clusters_at_beta_4000_move_as_the_closed_form_says(kind):
    # Clusters of 3 and 2 coincident tokens at angles 0 and 0.37 on the circle, beta = 4000:
    # their pull, e^{-4000 (1 - cos 0.37)} ~ e^{-271} (times the masses), is all the
    # tangent field. At speed c the 3 tokens of A move towards B at c m_B / sqrt(n_A m_B^2 +
    # n_B m_A^2) = 2c/sqrt(30) and those of B towards A at 3c/sqrt(30) (USA). Softmax divides
    # each row by its own sum, 3 + 2 e^{-271} ~ 3 for A and ~ 2 for B: the pulls are 2/3 and
    # 3/2, at speeds (2/3) c / sqrt(3 (2/3)^2 + 2 (3/2)^2) and (3/2) c / sqrt(35/6).
    x = _circle([0.0, 0.0, 0.0, 0.37, 0.37])
    c = np.log(4000.0)
    attention = _field(4000.0, kind, exclude_coincident=True, scale_free=kind == "usa")
    v = af.VectorField((attention,), time_change=ConstantSpeed(jnp.asarray(c)))(0.0, x)
    tangent = np.asarray(jnp.stack([-x[:, 1], x[:, 0]], axis=-1))
    angular = np.sum(np.asarray(v) * tangent, axis=-1)
    pulls = np.array([2, 2, 2, -3, -3]) if kind == "usa" else np.array([2 / 3] * 3 + [-3 / 2] * 2)
    want = c * pulls / np.sqrt(np.sum(pulls**2))
    np.testing.assert_allclose(angular, want, rtol=1e-12)
    # every token of a cluster moves alike, bit for bit: the cluster stays one point
    assert np.array_equal(v[0], v[1]) and np.array_equal(v[3], v[4])
    # one point cluster: no field at all (F = 0 exactly, so the time change stops)
    one = af.VectorField((attention,), time_change=ConstantSpeed(jnp.asarray(c)))(0.0, _circle([0.37] * 5))
    assert not np.any(one)


def test_leaving_out_coincident_tokens_needs_the_tangent_field_and_v_a_multiple_of_the_identity():
    attention = _field(1.0, exclude_coincident=True)
    x = _circle([0.0, 0.2, 0.2, 1.0])
    field = af.VectorField((attention,), time_change=ConstantSpeed(jnp.asarray(1.0)))
    np.testing.assert_allclose(field(0.0, x), af.VectorField((_field(1.0),), time_change=field.time_change)(0.0, x),
                               atol=1e-15)
    with pytest.raises(af.ConfigError, match="needs the tangent-projected sphere field"):
        af.simulate(field, x, t1=0.1, dt=0.1, solver="euler_renorm")
    with pytest.raises(af.ConfigError, match="only with V a multiple of the identity"):
        identity = af.Identity(1, 2, "float64")
        af.SelfAttention(identity, identity, af.Constant(jnp.ones((1, 2, 2))), None, jnp.asarray(1.0), None, heads=1,
                         exclude_coincident=True)


def test_collisions_merge_the_tokens_closer_than_the_distance_at_their_mean():
    # tokens 0-1-2 form a chain (each within 1e-3 of the next, 0 and 2 not), 3 and 4 are
    # alone: the chain moves to its mean, on the circle; 3 and 4 keep every bit.
    angles = np.array([0.0, 0.0008, 0.0016, 0.5, 0.5011])
    x = _circle(angles)
    merge = jax.jit(lambda x, geometry: Collisions(jnp.asarray(1e-3))(x, geometry), static_argnums=1)
    merged = merge(x, af.Sphere())
    mean = np.asarray(x[:3]).mean(0)
    np.testing.assert_allclose(merged[:3], np.tile(mean / np.linalg.norm(mean), (3, 1)), rtol=1e-15)
    assert np.array_equal(merged[0], merged[1]) and np.array_equal(merged[1], merged[2])
    assert np.array_equal(merged[3:], x[3:])
    # in flat space the mean itself
    flat = jax.jit(lambda x: Collisions(jnp.asarray(0.5))(x, af.Euclidean()))(
        jnp.asarray([[0.0, 0.0], [0.4, 0.0], [3.0, 0.0]]))
    np.testing.assert_allclose(flat, [[0.2, 0.0], [0.2, 0.0], [3.0, 0.0]])


def test_collisions_act_after_every_fixed_step_and_not_in_adaptive_runs():
    # two tokens 0.04 apart at beta = 4000 meet under the time change; with collisions
    # they become one point and stop (F = 0); without, they dither at the step's scale.
    x0 = _circle([0.0, 0.04])
    attention = _field(4000.0, "usa", exclude_coincident=True, scale_free=True)
    base = af.VectorField((attention,), time_change=ConstantSpeed(jnp.asarray(np.log(4000.0))))
    sticky = dataclasses.replace(base, collisions=Collisions(jnp.asarray(1e-3)))
    # the two solves in one program (one compile)
    end, loose = jax.jit(lambda x: [af.simulate(field, x, t1=0.02, dt=1e-5, solver="euler").xs[-1]
                                    for field in (sticky, base)])(x0)
    assert np.array_equal(end[0], end[1])
    np.testing.assert_allclose(np.arctan2(end[0, 1], end[0, 0]), 0.02, atol=1e-6)  # met at the middle
    assert 0 < np.linalg.norm(loose[0] - loose[1]) <= 2 * 1e-5 * np.log(4000.0)
    with pytest.raises(af.ConfigError, match="an adaptive run has no such steps"):
        af.simulate(sticky, x0, t1=0.02, dt=1e-5, adaptive=True)


def _config(**over):
    base = dict(n=5, d=2, beta=[1500.0, 4000.0], attention_kind="usa", members=2, dtype="float64", t1=0.01, dt=1e-4,
                solver="euler", time_change={"speed": "log_beta", "collisions": 1e-3}, metrics=["log_energy"],
                saves=11, plot=False, compilation_cache=False)
    return {**base, **over}


def test_a_configured_beta_sweep_runs_at_speed_log_beta_and_compiles_once():
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kw: compiles.append(event) if event == "/jax/core/compile/backend_compile_duration"
        else None)
    cfg = af.validate_config(_config())
    system = af.build_system(cfg)
    keys = jax.random.split(jax.random.key(0), 2)
    for beta in (1500.0, 4000.0):
        field, y0, _ = system(keys[0], beta)
        assert field.time_change is not None and field.collisions is not None
        assert _speed(field(0.0, y0)) == pytest.approx(np.log(beta), rel=1e-13)
    solve = lambda betas: af.solve_ensemble(system, keys, jnp.asarray(betas), t1=0.01, dt=1e-4, save_every=10,
                                            solver="euler")
    first = solve([1500.0, 4000.0])
    before = len(compiles)
    assert before > 0
    second = solve([600.0, 2500.0])
    assert len(compiles) == before, "a new beta recompiled the time-changed ensemble"
    assert not np.allclose(first.stats["log_energy"], second.stats["log_energy"])
    # a number as the speed is data too
    moving = af.build_system(af.validate_config(_config(time_change={"speed": 0.25, "collisions": None})))
    field, y0, _ = moving(keys[0], 4000.0)
    assert _speed(field(0.0, y0)) == pytest.approx(0.25, rel=1e-13) and field.collisions is None


def test_the_results_say_their_time_is_rescaled_time():
    ds = af.run(_config())
    assert ds.attrs["time_axis"].startswith("rescaled time s, not t") and "log(beta)" in ds.attrs["time_axis"]
    figure = af.summary_figure(ds)
    assert {ax.get_xlabel() for ax in figure.axes if ax.get_xlabel()} == {"s (rescaled time)"}
    assert "time_axis" not in af.run(_config(time_change={"speed": None, "collisions": None}, beta=[1.0],
                                             attention_kind="sa")).attrs


@pytest.mark.parametrize("over, message", [
    ({"time_change": {"speed": "log_beta"}, "beta": [0.5, 2.0]}, "needs every beta above 1"),
    ({"time_change": {"speed": -1.0}}, "time_change.speed must be positive"),
    ({"time_change": {"speed": "fast"}}, "must be null, a positive number or log_beta"),
    ({"time_change": {"collisions": 0.0}}, "time_change.collisions must be positive"),
    ({"adaptive": True, "solver": "tsit5"}, "adaptive runs have no such steps"),
    ({"n": 3000}, "forms all n\\^2 distances"),
])
def test_bad_time_changes_are_one_sentence(over, message):
    with pytest.raises(af.ConfigError, match=message):
        af.validate_config(_config(**over))
