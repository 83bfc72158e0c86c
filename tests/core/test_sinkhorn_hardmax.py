"""Sinkhorn (doubly stochastic) and hardmax (beta -> infinity) attention: the closed forms
of tests/README.md section "Sinkhorn and hardmax attention".

Float64 throughout; each property on a handful of tokens, one compiled program each.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnflow as af
from attnflow import ConfigError
from systems import identity_field


def _attention(kind, q, k, v=None, beta=1.0, **kw):
    const = lambda w: af.Constant(jnp.asarray(w, jnp.float64))
    v = np.broadcast_to(np.eye(q.shape[-1]), q.shape) if v is None else v
    return af.SelfAttention(const(q), const(k), const(v), None, jnp.asarray(beta, jnp.float64), None,
                            heads=q.shape[0], kind=kind, **kw)


def _sphere(key, n, d):
    x = jax.random.normal(key, (n, d), jnp.float64)
    return x / jnp.linalg.norm(x, axis=1, keepdims=True)


def test_sinkhorn_rows_and_columns_sum_to_one_and_match_ott():
    """Rows sum to 1 exactly (the last normalisation is a row's), columns to 1 up to the
    error left after the fixed count, which falls geometrically with the count; the
    matrix is n times the entropic transport plan that ott-jax's Sinkhorn solver finds
    between uniform marginals (cost -logits, epsilon 1), an independent implementation."""
    from ott.geometry.geometry import Geometry
    from ott.solvers.linear import solve

    kq, kk, kx = jax.random.split(jax.random.key(0), 3)
    heads, n, d = 2, 12, 3
    q, k = (np.asarray(jax.random.normal(key, (heads, d, d), jnp.float64)) for key in (kq, kk))
    x = _sphere(kx, n, d)

    @jax.jit
    def weights_and_errors(x):
        a = {m: _attention("sinkhorn", q, k, beta=2.0, sinkhorn_iterations=m).weights(0.0, x) for m in (5, 10, 20, 200)}
        errors = {m: _attention("sinkhorn", q, k, beta=2.0, sinkhorn_iterations=m).marginal_error(0.0, x) for m in a}
        return a, errors

    a, errors = weights_and_errors(x)
    for m in a:
        np.testing.assert_allclose(a[m].sum(-1), 1.0, atol=1e-14)
        assert float(errors[m]) == pytest.approx(float(jnp.max(jnp.abs(a[m].sum(-2) - 1))))
    errors = {m: float(e) for m, e in errors.items()}
    assert errors[200] < 1e-12
    assert errors[20] < errors[10] ** 1.5 and errors[10] < errors[5] ** 1.5, errors  # geometric decay
    logits = _attention("sa", q, k, beta=2.0).logits(0.0, x)

    def plan(cost):
        return solve(Geometry(cost_matrix=cost, epsilon=1.0), threshold=1e-13, max_iterations=5000).matrix

    with jax.numpy_rank_promotion("allow"), jax.numpy_dtype_promotion("standard"):  # ott's own code
        plans = jax.jit(jax.vmap(plan))(-logits)
    np.testing.assert_allclose(n * np.asarray(plans), a[200], atol=1e-10)


def test_sinkhorn_field_is_the_gradient_of_the_entropic_self_transport():
    """Q = K = V = I: the doubly stochastic field is n times the gradient of
    E(X) = -OT_{1/beta}(mu_X, mu_X) / 2 (Sinkformers, section 4), at two betas."""
    x = _sphere(jax.random.key(1), 9, 3)
    eye = np.eye(3)[None]

    def fields(beta):
        term = _attention("sinkhorn", eye, eye, beta=beta, sinkhorn_iterations=300)
        return (jax.grad(af.sinkhorn_energy)(x, beta, 300), term(0.0, x),
                _attention("sa", eye, eye, beta=beta)(0.0, x))

    grads, sinkhorn, softmax = jax.jit(jax.vmap(fields))(jnp.asarray([0.5, 3.0]))
    np.testing.assert_allclose(x.shape[0] * grads, sinkhorn, atol=1e-12)
    # The softmax field is not n times this gradient (Sinkformers: softmax attention is no such flow).
    assert float(jnp.min(jnp.max(jnp.abs(x.shape[0] * grads - softmax), axis=(1, 2)))) > 1e-3


def test_sinkhorn_energy_never_decreases_along_the_flow():
    """Q = K = V = I (a symmetric kernel, V = Q^T K): the Sinkhorn flow is the gradient
    ascent of E = -OT/2, on the sphere (tangent-projected) and in R^d, so E never
    decreases; it rises by the flow's squared speed, E' = |P F|^2 / n, checked against
    the finite differences of the saved values."""
    beta, n, d = 2.0, 10, 3
    x0 = _sphere(jax.random.key(2), n, d)

    def run(scheme):
        field = identity_field(d, beta, kind="sinkhorn", scheme=scheme)
        sol = af.simulate(field, x0, t1=6.0, dt=0.01, solver="rk4", save_every=10)
        energy = jax.vmap(lambda x: af.sinkhorn_energy(x, beta, 200))(sol.xs)
        speed = jax.vmap(lambda x: jnp.sum(field(0.0, x) ** 2) / n)(sol.xs)
        return energy, speed

    for scheme in ("sphere", "none"):
        energy, speed = (np.asarray(a) for a in jax.jit(run, static_argnums=0)(scheme))
        rise = np.diff(energy)
        assert np.all(rise >= -1e-13), (scheme, rise.min())
        assert energy[-1] > energy[0] + 1e-2, scheme
        # E' = |PF|^2/n: the trapezoid of the speed over each saved interval of 0.1.
        np.testing.assert_allclose(rise, 0.1 * (speed[1:] + speed[:-1]) / 2, rtol=2e-2, atol=1e-9)


def test_hardmax_is_the_large_beta_limit_at_rate_exp_minus_beta_gap():
    """On a generic configuration (random Q, K on the sphere, no ties) the softmax field
    tends to the hardmax field, with error ~ C exp(-beta * gap), gap the smallest margin
    over the rows between the best and second-best unscaled logit <Q x_i, K x_j>: the
    log-error slope in beta is -gap to 2 %."""
    kq, kk, kx = jax.random.split(jax.random.key(3), 3)
    n, d = 8, 3
    q, k = (np.asarray(jax.random.normal(key, (1, d, d), jnp.float64)) for key in (kq, kk))
    x = _sphere(kx, n, d)
    hard = _attention("hardmax", q, k)(0.0, x)
    scores = np.sort(np.asarray(_attention("sa", q, k).logits(0.0, x)), axis=-1)
    gap = float(np.min(scores[..., -1] - scores[..., -2]))
    betas = np.linspace(8.0, 26.0, 7) / gap

    def error(beta):
        return jnp.max(jnp.abs(_attention("sa", q, k, beta=beta)(0.0, x) - hard))

    errors = np.asarray(jax.jit(jax.vmap(error))(jnp.asarray(betas)))
    slope = np.polyfit(betas, np.log(errors), 1)[0]
    assert slope == pytest.approx(-gap, rel=2e-2), (slope, gap)
    assert errors[-1] < 1e-10


def test_hardmax_averages_ties_and_can_leave_itself_out():
    """A regular k-gon on the circle without self-attention: each vertex's two neighbours
    tie, each gets weight 1/2, the field (x_{i-1} + x_{i+1})/2 = cos(2 pi/k) x_i is radial
    and the polygon stationary; with self-attention every token attends to itself alone."""
    k = 5
    angles = 2 * np.pi * np.arange(k) / k
    x = jnp.asarray(np.stack([np.cos(angles), np.sin(angles)], 1))
    eye = np.eye(2)[None]
    a = _attention("hardmax", eye, eye, hardmax_self=False).weights(0.0, x)[0]
    expected = (np.roll(np.eye(k), 1, 1) + np.roll(np.eye(k), -1, 1)) / 2
    np.testing.assert_allclose(a, expected, atol=1e-15)
    field = af.VectorField((_attention("hardmax", eye, eye, hardmax_self=False),), scheme="sphere")
    np.testing.assert_allclose(field(0.0, x), 0.0, atol=1e-14)
    np.testing.assert_allclose(_attention("hardmax", eye, eye).weights(0.0, x)[0], np.eye(k), atol=0)
    # Outside the tolerance there is no tie: a neighbour moved by 1e-3 takes the whole row.
    y = x.at[1].set(jnp.asarray([np.cos(angles[1] - 1e-3), np.sin(angles[1] - 1e-3)]))
    row = _attention("hardmax", eye, eye, hardmax_self=False).weights(0.0, y)[0, 0]
    np.testing.assert_allclose(row, np.eye(k)[1], atol=0)


def _cells(tokens, probes, q=None, k=None):
    """The token each probe point's hardmax row picks: the probe appended to the tokens as
    query, without self-attention."""
    d = tokens.shape[1]
    q = np.eye(d)[None] if q is None else q
    k = np.eye(d)[None] if k is None else k
    term = _attention("hardmax", q, k, hardmax_self=False)
    m = tokens.shape[0]

    def pick(p):
        row = term.weights(0.0, jnp.concatenate([tokens, p[None]]), rows=jnp.asarray([m]))[0, 0]
        return jnp.argmax(row[:m])

    return np.asarray(jax.jit(jax.vmap(pick))(probes))


def test_hardmax_dominance_cells_on_the_circle_are_the_voronoi_arcs():
    """Q = K = I on the circle: the cell of token j, the points whose largest <y, x_j> is at
    j, is its Voronoi arc, bounded by the angular midpoints to its neighbours; the
    hardmax term's pick on a grid of 2000 angles equals the direct argmax and the arcs;
    with random Q, K it equals the direct argmax of <Q y, K x_j>."""
    rng = np.random.default_rng(4)
    theta = np.sort(rng.uniform(0, 2 * np.pi, 7))
    tokens = jnp.asarray(np.stack([np.cos(theta), np.sin(theta)], 1))
    grid = np.linspace(0, 2 * np.pi, 2000, endpoint=False)
    probes = np.stack([np.cos(grid), np.sin(grid)], 1)
    picked = _cells(tokens, jnp.asarray(probes))
    np.testing.assert_array_equal(picked, np.argmax(probes @ np.asarray(tokens).T, axis=1))
    nearest = np.argmin(np.abs(np.angle(np.exp(1j * (grid[:, None] - theta[None, :])))), axis=1)
    np.testing.assert_array_equal(picked, nearest)
    q, k = rng.normal(size=(1, 2, 2)), rng.normal(size=(1, 2, 2))
    direct = np.argmax((probes @ q[0].T) @ (np.asarray(tokens) @ k[0].T).T, axis=1)
    np.testing.assert_array_equal(_cells(tokens, jnp.asarray(probes), q, k), direct)


def test_hardmax_dominance_cells_in_the_plane_are_the_normal_cones_of_the_hull():
    """Q = K = I in the plane: the direction y picks the token maximising <y, x_j>, a
    vertex of the convex hull (Frank-Wolfe's linear oracle on conv X); a token inside the
    hull has the cell {0} (no direction picks it), and the cell of vertex j is the cone between the outward
    normals of its two edges, of angle pi minus the interior angle at j. On a grid of
    directions (and of points of the plane, which pick by direction alone)."""
    from scipy.spatial import ConvexHull

    rng = np.random.default_rng(5)
    tokens = rng.normal(size=(12, 2))
    hull = ConvexHull(tokens).vertices  # counter-clockwise
    grid = np.linspace(0, 2 * np.pi, 4000, endpoint=False)
    directions = np.stack([np.cos(grid), np.sin(grid)], 1)
    picked = _cells(jnp.asarray(tokens), jnp.asarray(directions))
    np.testing.assert_array_equal(picked, np.argmax(directions @ tokens.T, axis=1))
    assert set(picked) == set(hull)
    for i, j in enumerate(hull):
        before, after = tokens[hull[i - 1]], tokens[hull[(i + 1) % len(hull)]]
        e1, e2 = tokens[j] - before, after - tokens[j]
        exterior = np.arccos(np.dot(e1, e2) / np.linalg.norm(e1) / np.linalg.norm(e2))
        assert np.mean(picked == j) * 2 * np.pi == pytest.approx(exterior, abs=2 * 2 * np.pi / len(grid))
    points = rng.normal(size=(500, 2)) * 3
    np.testing.assert_array_equal(_cells(jnp.asarray(tokens), jnp.asarray(points)),
                                  np.argmax(points @ tokens.T, axis=1))


@pytest.mark.parametrize("overrides, key", [
    ({"attention_kind": "sinkhorn", "causal": True}, "causal"),
    ({"attention_kind": "sinkhorn", "sinkhorn": {"iterations": 0}}, "sinkhorn.iterations"),
    ({"attention_kind": "hardmax", "alibi": 0.5}, "alibi"),
    ({"attention_kind": "hardmax", "attention_block": 8}, "attention_block"),
    ({"attention_kind": "sa", "hardmax": {"ties": 0.1}}, "hardmax.ties"),
])
def test_impossible_sinkhorn_and_hardmax_settings_are_refused(overrides, key):
    with pytest.raises(ConfigError, match=key):
        af.validate_config({"n": 8, "members": 2, "t1": 1.0, **overrides})


def test_the_marginal_error_metric_is_the_terms():
    """The recorded `marginal_error` is the attention term's column error: Sinkhorn's
    shrinks with the count, softmax's is that of its (row-stochastic) matrix."""
    x = _sphere(jax.random.key(6), 10, 3)

    def recorded(kind, iterations):
        eye = af.Identity(1, 3, "float64")
        term = af.SelfAttention(eye, eye, eye, None, jnp.asarray(4.0), None, heads=1, kind=kind,
                                sinkhorn_iterations=iterations)
        rec = af.Recorder(jnp.asarray(4.0), jnp.asarray(1e-2), metrics=("marginal_error",))
        return rec(0.0, x, af.VectorField((term,), scheme="sphere"))["marginal_error"], term.marginal_error(0.0, x)

    (few, few_term), (many, many_term), (soft, soft_term) = jax.jit(
        lambda: (recorded("sinkhorn", 3), recorded("sinkhorn", 100), recorded("sa", 1)))()
    np.testing.assert_allclose([few, many, soft], [few_term, many_term, soft_term], rtol=1e-12)
    assert float(many) < 1e-6 < float(few) < float(soft)
