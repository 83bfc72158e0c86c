"""The particle dynamics against theorems, closed forms and independent references."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from systems import equiangular_rho, identity_field, random_field

import attnflow as af


def _uniform(key, n, d, dtype=jnp.float64):
    return af.UniformSphere()(key, n, d, dtype)


# --- the vector field against a direct NumPy transcription of DESIGN.md section 1 ----


def _numpy_attention(x, q, k, v, o, beta, kind, causal, alibi):
    n = x.shape[0]
    out = np.zeros_like(x)
    for h in range(q.shape[0]):
        for i in range(n):
            logits = np.array([beta * (q[h] @ x[i]) @ (k[h] @ x[j]) for j in range(n)])
            if alibi is not None:
                logits = logits - alibi[h] * np.abs(i - np.arange(n))
            allowed = np.arange(n) <= i if causal else np.ones(n, bool)
            w = np.where(allowed, np.exp(logits - logits[allowed].max()), 0.0)
            if kind == "sa":
                w = w / w.sum()
            else:
                w = np.where(allowed, np.exp(logits), 0.0) / n
            out[i] += o[h] @ sum(w[j] * (v[h] @ x[j]) for j in range(n))
    return out


@pytest.mark.parametrize("kind,causal,alibi", [("sa", False, None), ("usa", False, None), ("sa", True, None),
                                               ("usa", True, [0.3, 1.1]), ("sa", False, [0.5, 0.0])])
def test_attention_matches_direct_sum(kind, causal, alibi):
    d, n, heads, dk, dv = 5, 7, 2, 3, 4
    keys = jax.random.split(jax.random.key(0), 5)
    q, k = (jax.random.normal(keys[i], (heads, dk, d)) for i in (0, 1))
    v = jax.random.normal(keys[2], (heads, dv, d))
    o = jax.random.normal(keys[3], (heads, d, dv))
    x = jax.random.normal(keys[4], (n, d))
    beta = 0.7
    term = af.SelfAttention(af.Constant(q), af.Constant(k), af.Constant(v), af.Constant(o), jnp.asarray(beta),
                            None if alibi is None else jnp.asarray(alibi), heads=heads, kind=kind, causal=causal)
    expected = _numpy_attention(*map(np.asarray, (x, q, k, v, o)), beta, kind, causal,
                                None if alibi is None else np.asarray(alibi))
    value, a = jax.jit(lambda x: (term(0.0, x), term.weights(0.0, x)))(x)  # one compile
    np.testing.assert_allclose(value, expected, rtol=1e-11, atol=1e-12)
    if kind == "sa":
        np.testing.assert_allclose(a.sum(-1), 1.0, rtol=1e-12)
    if causal:
        assert np.all(np.asarray(a)[:, np.triu_indices(n, 1)[0], np.triu_indices(n, 1)[1]] == 0)


def test_identity_heads_equal_explicit_identity_matrices():
    """The identity shortcut (no head axis) equals multiplying by explicit identity matrices."""
    d, n, heads = 4, 6, 3
    x = jax.random.normal(jax.random.key(1), (n, d))
    eye = af.Identity(heads, d, "float64")
    explicit = af.Constant(jnp.broadcast_to(jnp.eye(d), (heads, d, d)))
    fast = af.SelfAttention(eye, eye, eye, None, jnp.asarray(2.0), None, heads=heads)
    slow = af.SelfAttention(explicit, explicit, explicit, explicit, jnp.asarray(2.0), None, heads=heads)
    np.testing.assert_allclose(fast(0.0, x), slow(0.0, x), rtol=1e-13)


def test_mlp_and_token_norms_match_formulas():
    d, m, n = 4, 6, 5
    keys = jax.random.split(jax.random.key(2), 6)
    w1, w2, w3 = jax.random.normal(keys[0], (m, d)), jax.random.normal(keys[1], (d, m)), jax.random.normal(keys[2], (m, d))
    b1, b2 = jax.random.normal(keys[3], (m,)), jax.random.normal(keys[4], (d,))
    x = jax.random.normal(keys[5], (n, d))
    X, W1, W2, W3, B1, B2 = map(np.asarray, (x, w1, w2, w3, b1, b2))
    relu = af.MLP(af.Constant(w1), af.Constant(w2), af.Constant(b1), af.Constant(b2), activation="relu")
    np.testing.assert_allclose(relu(0.0, x), np.maximum(X @ W1.T + B1, 0) @ W2.T + B2, rtol=1e-12)
    swiglu = af.MLP(af.Constant(w1), af.Constant(w2), gate=af.Constant(w3), activation="swiglu")
    h = X @ W1.T
    np.testing.assert_allclose(swiglu(0.0, x), (h / (1 + np.exp(-h)) * (X @ W3.T)) @ W2.T, rtol=1e-12)

    gamma, shift, eps = np.linspace(0.5, 2, d), np.linspace(-1, 1, d), 1e-5
    layer = af.TokenNorm("layer", jnp.asarray(gamma), jnp.asarray(shift), eps=eps)
    centred = X - X.mean(-1, keepdims=True)
    torch_style = centred / np.sqrt(centred.var(-1, keepdims=True) + eps) * gamma + shift
    np.testing.assert_allclose(layer(x), torch_style, rtol=1e-12)
    rms = af.TokenNorm("rms", jnp.asarray(gamma), eps=eps)
    np.testing.assert_allclose(rms(x), X / np.sqrt((X**2).mean(-1, keepdims=True) + eps) * gamma, rtol=1e-12)
    geometric = af.TokenNorm("layer")(x)
    np.testing.assert_allclose(np.linalg.norm(geometric, axis=-1), np.sqrt(d), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(geometric).sum(-1), 0, atol=1e-12)


# --- invariants of the flow on the sphere --------------------------------------------


@pytest.mark.parametrize("solver", ["euler", "euler_renorm", "heun", "rk4", "tsit5"])
def test_tokens_stay_on_the_sphere(solver):
    y0 = _uniform(jax.random.key(4), 9, 4)
    kinds = ("sa", "usa")
    fields = [random_field(jax.random.key(3), d=4, beta=1.5, kind=kind, mlp=True) for kind in kinds]
    # both kinds in one program (one compile)
    solves = jax.jit(lambda y: [af.simulate(field, y, t1=3.0, dt=0.05, solver=solver, save_every=6).xs
                                for field in fields])(y0)
    for kind, xs in zip(kinds, solves):
        norms = np.linalg.norm(np.asarray(xs), axis=-1)
        np.testing.assert_allclose(norms, 1.0, atol=1e-13, err_msg=kind)
        assert xs.shape == (11, 9, 4), kind


def test_adaptive_solution_saved_between_steps_is_on_the_sphere():
    field = random_field(jax.random.key(5), d=3, beta=1.0)
    ts = jnp.linspace(0.0, 2.0, 17)
    sol = af.simulate(field, _uniform(jax.random.key(6), 6, 3), t1=2.0, dt=0.1, solver="dopri5", ts=ts,
                      adaptive=True, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(sol.xs), axis=-1), 1.0, atol=1e-13)


@pytest.mark.parametrize("kind,betas", [("sa", (0.5, 2.0, 8.0)), ("usa", (0.5, 2.0, 4.0))])
def test_interaction_energy_never_decreases(kind, betas):
    """Lemma 3.3 of the survey: E_beta is non-decreasing along the flow, Q = K = V = I.

    (USA velocities scale like e^beta / n, so its largest beta is kept where dt = 0.01
    is a stable step.) The betas of a kind are one vmapped program (one compile)."""
    keys = jax.random.split(jax.random.key(7), 4)

    def run(beta, k):
        rec = af.Recorder(beta, jnp.asarray(1e-2), metrics=("log_energy",))
        return af.simulate(identity_field(3, beta, kind=kind), _uniform(k, 16, 3), t1=15.0, dt=0.01, solver="rk4",
                           save_every=5, record=rec).stats["log_energy"]

    runs = jax.jit(jax.vmap(jax.vmap(run, (None, 0)), (0, None)))(jnp.asarray(betas, jnp.float64), keys)
    for beta, log_e in zip(betas, np.asarray(runs)):
        assert np.all(np.diff(log_e, axis=1) >= -1e-12), (beta, np.diff(log_e, axis=1).min())
        assert np.all(log_e[:, -1] > log_e[:, 0] + 1e-3), beta


@pytest.mark.parametrize("d", [3, 5])
def test_single_cluster_for_d_at_least_3(d):
    """Theorem 4.2 (1) of the survey: for d >= 3 and Q = K = V = I the flow collapses to one point."""
    beta = 1.0
    field = identity_field(d, beta)
    rec = af.Recorder(jnp.asarray(beta), jnp.asarray(1e-4), metrics=("clusters", "pair_density", "order_parameter"))
    keys = jax.random.split(jax.random.key(8), 6)
    stats = jax.jit(jax.vmap(lambda k: af.simulate(field, _uniform(k, 20, d), t1=80.0, dt=0.1, solver="euler",
                                           save_every=100, record=rec).stats))(keys)
    assert np.all(np.asarray(stats["clusters"])[:, -1] == 1)
    np.testing.assert_allclose(np.asarray(stats["pair_density"])[:, -1], 1.0)
    np.testing.assert_allclose(np.asarray(stats["order_parameter"])[:, -1], 1.0, atol=1e-6)
    assert np.all(np.asarray(stats["clusters"])[:, 0] > 1)


@pytest.mark.parametrize("weights", ["identity", "random"])
def test_causal_flow_converges_to_the_first_token(weights):
    """Theorem 4.3 of the survey (Karagodin et al.): with V = I and causal masking every x_i(t)
    tends to x_1(0), and x_1 does not move (it attends only to itself)."""
    d, n, beta = 3, 6, 1.0
    if weights == "identity":
        field = identity_field(d, beta, causal=True)
    else:
        k1, k2 = jax.random.split(jax.random.key(9))
        qk = af.Constant(af.draw_matrix("goe", k1, (1, d, d), 0.5, jnp.float64))
        eye = af.Identity(1, d, "float64")
        field = af.VectorField((af.SelfAttention(eye, qk, eye, None, jnp.asarray(beta), None, heads=1,
                                                 causal=True),))
    y0 = _uniform(jax.random.key(10), n, d)
    xs = np.asarray(jax.jit(lambda y: af.simulate(field, y, t1=60.0, dt=0.05, solver="rk4", save_every=60).xs)(y0))
    np.testing.assert_allclose(xs[:, 0], np.broadcast_to(np.asarray(y0)[0], xs[:, 0].shape), atol=1e-13)
    assert np.min(xs[-1] @ np.asarray(y0)[0]) > 1 - 1e-6


@pytest.mark.parametrize("kind", ["sa", "usa"])
@pytest.mark.parametrize("n,d,beta", [(4, 4, 1.0), (6, 8, 3.0)])
def test_orthonormal_start_follows_the_equiangular_ode(kind, n, d, beta):
    """x_i(0) = e_i stays equiangular; the common inner product solves the scalar ODE
    rho' = 2 e^{beta rho}(1 - rho)(1 + (n-1) rho) / Z (README: equiangular model)."""
    field = identity_field(d, beta, kind=kind)
    sol = jax.jit(lambda y: af.simulate(field, y, t1=4.0, dt=0.01, solver="rk4", save_every=40))(
        af.Orthonormal()(None, n, d, jnp.float64))  # one compile (an eager call compiles op by op)
    xs = np.asarray(sol.xs)
    off = np.array([[x[i] @ x[j] for i, j in itertools.combinations(range(n), 2)] for x in xs])
    assert np.ptp(off, axis=1).max() < 1e-12
    rho = equiangular_rho(np.asarray(sol.ts), beta, n, kind)
    np.testing.assert_allclose(off[:, 0], rho, atol=1e-9)
    assert rho[-1] > 0.5


# --- symmetries ------------------------------------------------------------------------


def test_permutation_equivariance_without_a_mask():
    field = random_field(jax.random.key(11), d=4, beta=1.3, heads=2, mlp=True)
    y0 = _uniform(jax.random.key(12), 8, 4)
    perm = np.random.default_rng(0).permutation(8)
    run = jax.jit(lambda y: af.simulate(field, y, t1=2.0, dt=0.02, solver="heun").xs[-1])  # one compile
    np.testing.assert_allclose(run(y0[perm]), np.asarray(run(y0))[perm], atol=1e-12)


def test_causal_mask_breaks_permutation_equivariance_exactly_as_it_should():
    """With a causal mask token i sees only tokens j <= i: the first m tokens evolve as the
    m-token system (prefix invariance), while permuting the tokens changes the flow."""
    field = random_field(jax.random.key(13), d=4, beta=1.3, heads=2, causal=True)
    y0 = _uniform(jax.random.key(14), 8, 4)
    run = jax.jit(lambda y: af.simulate(field, y, t1=2.0, dt=0.02, solver="heun").xs[-1])  # one compile a size
    full = np.asarray(run(y0))
    for m in (1, 3, 5):
        np.testing.assert_allclose(run(y0[:m]), full[:m], atol=1e-12)
    perm = np.array([1, 0, 2, 3, 4, 5, 6, 7])
    assert np.abs(run(y0[perm]) - full[perm]).max() > 1e-3
    # Changing the last token leaves every earlier trajectory untouched.
    y1 = y0.at[-1].set(-y0[-1])
    np.testing.assert_allclose(run(y1)[:-1], full[:-1], atol=1e-12)


def test_rotation_equivariance_with_identity_weights():
    field = identity_field(5, 2.0)
    y0 = _uniform(jax.random.key(15), 7, 5)
    rotation = np.linalg.qr(np.random.default_rng(1).standard_normal((5, 5)))[0]
    run = jax.jit(lambda y: af.simulate(field, y, t1=3.0, dt=0.05, solver="rk4").xs[-1])  # one compile
    np.testing.assert_allclose(run(y0 @ rotation), np.asarray(run(y0)) @ rotation, atol=1e-12)


# --- schemes and time-stepping paths ---------------------------------------------------


def test_sphere_schemes_differ_at_first_order_only():
    """Scheme (a) (Euler on the projected field) and (b) (Euler on the raw field), both
    followed by the retraction, agree to O(dt^2) per step: their gap shrinks like dt."""
    field = identity_field(3, 4.0)
    y0 = _uniform(jax.random.key(16), 10, 3)
    # the six solves in one program (one compile)
    gaps = jax.jit(lambda y: [jnp.abs(af.simulate(field, y, t1=1.0, dt=dt, solver="euler").xs[-1]
                                      - af.simulate(field, y, t1=1.0, dt=dt, solver="euler_renorm").xs[-1]).max()
                              for dt in (0.02, 0.01, 0.005)])(y0)
    gaps = [float(g) for g in gaps]
    assert gaps[0] > 1e-6
    rates = np.log2(np.array(gaps[:-1]) / np.array(gaps[1:]))
    np.testing.assert_allclose(rates, 1.0, atol=0.15)


@pytest.mark.parametrize("scheme", ["none", "pre", "peri"])
def test_flat_schemes_follow_their_definition(scheme):
    """pre: x' = F(N(x)); peri: x' = N(F(N(x))); none: x' = F(x), checked on the field."""
    field = random_field(jax.random.key(19), d=4, beta=1.0, scheme=scheme, mlp=True)
    x = jax.random.normal(jax.random.key(20), (5, 4)) * 3
    norm = af.TokenNorm("layer")
    raw = lambda y: sum(term(0.0, y) for term in field.terms)
    expected = {"none": raw(x), "pre": raw(norm(x)), "peri": norm(raw(norm(x)))}[scheme]
    np.testing.assert_allclose(field(0.0, x), expected, rtol=1e-12)
    sol = jax.jit(lambda y: af.simulate(field, y, t1=1.0, dt=0.05, solver="rk4"))(x)
    assert np.all(np.isfinite(np.asarray(sol.xs)))
    if scheme == "peri":
        # Every velocity has norm sqrt(d): the displacement over [0, 1] is at most sqrt(d).
        assert np.all(np.linalg.norm(np.asarray(sol.xs[-1] - sol.xs[0]), axis=-1) <= 2 + 1e-9)


def test_sphere_geometry():
    sphere = af.Sphere()
    x = _uniform(jax.random.key(21), 6, 4)
    v = jax.random.normal(jax.random.key(22), (6, 4))
    p = sphere.project(x, v)
    np.testing.assert_allclose(np.sum(np.asarray(x) * np.asarray(p), -1), 0, atol=1e-14)
    np.testing.assert_allclose(sphere.project(x, p), p, atol=1e-14)  # a projection
    np.testing.assert_allclose(np.linalg.norm(sphere.retract(3 * x + 0.1 * v), axis=-1), 1, rtol=1e-14)
    e = jnp.eye(4)
    np.testing.assert_allclose(sphere.distance(e[:2], e[1:3]), np.pi / 2, rtol=1e-14)
    np.testing.assert_allclose(sphere.distance(e[:1], -e[:1]), np.pi, rtol=1e-14)
    # Nearly equal points: the angle is exact where arccos(<x, y>) would give ~1e-8.
    tiny = 1e-9
    y = jnp.array([[np.cos(tiny), np.sin(tiny), 0.0, 0.0]])
    np.testing.assert_allclose(sphere.distance(e[:1], y), tiny, rtol=1e-6)
    np.testing.assert_allclose(af.Euclidean().distance(e[:2], e[1:3]), np.sqrt(2), rtol=1e-14)


def test_tangent_flow_by_jvp_matches_finite_differences():
    """Forward-mode derivatives pass through the solver (the basis of Lyapunov spectra):
    the jvp of the flow map equals a central finite difference."""
    field = random_field(jax.random.key(23), d=3, beta=1.0, mlp=True)
    y0 = _uniform(jax.random.key(24), 5, 3)
    v = af.Sphere().project(y0, jax.random.normal(jax.random.key(25), (5, 3)))
    flow = lambda y: af.simulate(field, y, t1=1.0, dt=0.01, solver="rk4").xs[-1]
    h = 1e-5
    sphere = af.Sphere()
    # One batched jvp (one compile): the flow map at the two retracted neighbours (its
    # primal values) and at y0 with its tangent.
    starts = jnp.stack([sphere.retract(y0 + h * v), sphere.retract(y0 - h * v), y0])
    finals, tangents = jax.jit(jax.vmap(lambda y: jax.jvp(flow, (y,), (v,))))(starts)
    tangent = tangents[2]
    central = (finals[0] - finals[1]) / (2 * h)
    np.testing.assert_allclose(tangent, central, atol=1e-8)
    # The tangent vector stays tangent to the sphere at the final state.
    np.testing.assert_allclose(np.sum(np.asarray(tangent) * np.asarray(finals[2]), -1), 0, atol=1e-12)
