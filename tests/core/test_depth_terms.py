"""The core pieces trained models need: rotary positions, attention biases, weights
interpolated between layers, and Lie-Trotter / Strang splitting of the field."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnflow as af


def _attention(key, heads=2, d=6, dk=4, **extra):
    ks = jax.random.split(key, 8)
    draw = lambda k, shape: jax.random.normal(k, shape, jnp.float64) / np.sqrt(shape[-1])
    return af.SelfAttention(
        query=af.Constant(draw(ks[0], (heads, dk, d))), key=af.Constant(draw(ks[1], (heads, dk, d))),
        value=af.Constant(draw(ks[2], (heads, dk, d))), output=af.Constant(draw(ks[3], (heads, d, dk))),
        beta=jnp.asarray(0.7), alibi=None, heads=heads, **extra,
    )


def test_rotary_logits_depend_on_relative_position_only():
    rotary = af.Rotary(dims=4, base=100.0)
    q, k = np.random.default_rng(0).normal(size=(2, 6))
    n = 7
    qs, ks = rotary(jnp.tile(q, (n, 1))), rotary(jnp.tile(k, (n, 1)))
    logits = np.asarray(qs @ ks.T)
    for shift in range(-n + 1, n):
        diagonal = np.diagonal(logits, offset=shift)
        np.testing.assert_allclose(diagonal, diagonal[0], rtol=1e-12)
    # A rotation: lengths kept, and the entries beyond `dims` untouched.
    np.testing.assert_allclose(np.linalg.norm(qs, axis=1), np.linalg.norm(q), rtol=1e-12)
    np.testing.assert_array_equal(np.asarray(qs)[:, 4:], np.tile(q[4:], (n, 1)))
    assert np.abs(np.asarray(qs)[1, :4] - q[:4]).max() > 1e-3
    with pytest.raises(af.ConfigError, match="even"):
        af.Rotary(dims=3)


def test_attention_biases_and_rotary_against_a_direct_formula():
    heads, d, dk, n = 2, 6, 4, 5
    ks = jax.random.split(jax.random.key(1), 5)
    biases = dict(
        query_bias=af.Constant(jax.random.normal(ks[0], (heads, dk), jnp.float64)),
        key_bias=af.Constant(jax.random.normal(ks[1], (heads, dk), jnp.float64)),
        value_bias=af.Constant(jax.random.normal(ks[2], (heads, dk), jnp.float64)),
        output_bias=af.Constant(jax.random.normal(ks[3], (d,), jnp.float64)),
    )
    term = _attention(jax.random.key(2), heads, d, dk, causal=True, rotary=af.Rotary(dims=2), **biases)
    x = np.asarray(jax.random.normal(ks[4], (n, d), jnp.float64))
    got = np.asarray(term(0.0, jnp.asarray(x)))

    want = np.asarray(biases["output_bias"].value).copy()[None, :].repeat(n, 0)
    angle = np.arange(n)[:, None] * 1.0  # dims = 2: one pair, frequency base^0 = 1
    for h in range(heads):
        q = x @ np.asarray(term.query.value[h]).T + np.asarray(biases["query_bias"].value[h])
        k = x @ np.asarray(term.key.value[h]).T + np.asarray(biases["key_bias"].value[h])
        v = x @ np.asarray(term.value.value[h]).T + np.asarray(biases["value_bias"].value[h])
        for a in (q, k):
            u, w = a[:, 0].copy(), a[:, 1].copy()
            a[:, 0], a[:, 1] = u * np.cos(angle[:, 0]) - w * np.sin(angle[:, 0]), w * np.cos(angle[:, 0]) + u * np.sin(angle[:, 0])
        s = 0.7 * q @ k.T + np.where(np.tril(np.ones((n, n))) > 0, 0, -np.inf)
        a = np.exp(s - s.max(1, keepdims=True))
        a /= a.sum(1, keepdims=True)
        want += (a @ v) @ np.asarray(term.output.value[h]).T
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(af.ConfigError, match="key_bias"):
        _attention(jax.random.key(2), key_bias=af.Constant(jnp.zeros((2, 3))))


def test_interpolated_schedule_is_exact_on_low_degree_knots_and_clamps():
    times = jnp.arange(5.0)
    line = af.Interpolated(times, (2 * times - 1)[:, None], kind="linear")
    square = af.Interpolated(times, (times**2)[:, None], kind="cubic")
    for t in np.linspace(0, 4, 17):
        np.testing.assert_allclose(line(t)[0], 2 * t - 1, rtol=1e-12, atol=1e-12)
        if 1 <= t <= 3:  # centred slopes are exact for a quadratic inside the knots
            np.testing.assert_allclose(square(t)[0], t * t, rtol=1e-12)
    assert float(line(-3.0)[0]) == -1.0 and float(line(9.0)[0]) == 7.0
    # C^1: the one-sided derivatives agree at an interior knot.
    wiggly = af.Interpolated(times, jnp.asarray([0.0, 1.0, -1.0, 2.0, 0.5])[:, None], kind="cubic")
    slope = lambda t: jax.grad(lambda s: wiggly(s)[0])(t)
    np.testing.assert_allclose(slope(2.0 - 1e-9), slope(2.0 + 1e-9), rtol=1e-6)
    with pytest.raises(af.ConfigError, match="linear"):
        af.Interpolated(times, times[:, None], kind="quintic")


def _pair_field():
    """Attention plus a tanh MLP in R^d (no normalization): two terms that do not commute."""
    ks = jax.random.split(jax.random.key(3), 2)
    mlp = af.MLP(w1=af.Constant(jax.random.normal(ks[0], (8, 6), jnp.float64)),
                 w2=af.Constant(jax.random.normal(ks[1], (6, 8), jnp.float64) / 4), activation="gelu")
    return af.VectorField(terms=(_attention(jax.random.key(4)), mlp), scheme="none")


def test_lie_trotter_is_first_order_and_strang_second_order():
    field = _pair_field()
    x0 = jax.random.normal(jax.random.key(5), (5, 6), jnp.float64)
    exact = af.simulate(field, x0, t1=1.0, dt=1 / 2048, solver="rk4").xs[-1]
    errors = {}
    for split, solver in (("lie", "euler"), ("strang", "rk4")):
        errors[split] = [float(jnp.abs(af.simulate(field, x0, t1=1.0, dt=1 / m, solver=solver, split=split).xs[-1] - exact).max())
                         for m in (16, 32, 64)]
    lie, strang = (np.log2(np.asarray(e[:-1]) / np.asarray(e[1:])) for e in errors.values())
    assert np.all(np.abs(lie - 1) < 0.15), lie
    assert np.all(np.abs(strang - 2) < 0.15), strang


def test_split_of_one_term_is_the_plain_solver_and_bad_splits_are_refused():
    field = _pair_field()
    one = af.VectorField(terms=field.terms[:1], scheme="none")
    x0 = jax.random.normal(jax.random.key(6), (5, 6), jnp.float64)
    plain = af.simulate(one, x0, t1=1.0, dt=0.25, solver="euler").xs
    for split in ("lie", "strang"):
        np.testing.assert_allclose(af.simulate(one, x0, t1=1.0, dt=0.25, solver="euler", split=split).xs, plain, rtol=1e-13)
    # Retractions run after each sub-step of their term.
    halve = lambda at, x: x / 2
    got = af.simulate(field, x0, t1=1.0, dt=1.0, solver="euler", split="lie", retractions=(None, halve)).xs[-1]
    y = x0 + field.terms[0](0.0, x0)
    np.testing.assert_allclose(got, (y + field.terms[1](0.0, y)) / 2, rtol=1e-12)
    with pytest.raises(af.ConfigError, match="splitting"):
        af.simulate(field, x0, t1=1.0, dt=0.5, split="yoshida")
    with pytest.raises(af.ConfigError, match="adaptive"):
        af.simulate(field, x0, t1=1.0, dt=0.5, split="lie", adaptive=True)
    with pytest.raises(af.ConfigError, match="one retraction"):
        af.simulate(field, x0, t1=1.0, dt=0.5, split="lie", retractions=(None,))
