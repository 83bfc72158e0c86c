"""The tiled path (attnflow/numerics/_tiled.py) against the dense one: the same attention, the same
statistics and derivatives, in memory linear in n (tests/README.md, "Tiled attention")."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.sparse.csgraph import connected_components

import attnflow as af
from attnflow.numerics import _tiled
from attnflow.numerics._metrics import ATTENTION_ROWS, attention_rows

N = 2000  # not a multiple of the tiles below: the last tile is padded
BLOCK = 256


def _sphere(n, d, seed=0):
    return af.UniformSphere()(jax.random.key(seed), n, d, jnp.float64)


def _random(key, shape, scale=1.0):
    return af.Constant(scale * jax.random.normal(key, shape, jnp.float64))


def _term(layout, *, kind, causal, alibi, heads=2, d=3):
    """SelfAttention in one of the head layouts the core has (see SelfAttention)."""
    keys = jax.random.split(jax.random.key(11), 9)
    slopes = None if not alibi else jnp.asarray(np.linspace(0.002, 0.02, heads))
    beta = jnp.asarray(1.7)
    eye = af.Identity(heads, d, "float64")
    if layout == "identity":  # no head axis at all (one array for every head)
        return af.SelfAttention(eye, eye, eye, None, beta, slopes, heads=heads, kind=kind, causal=causal)
    dk = 2 if layout == "d_k" else 4
    q, k = _random(keys[0], (heads, dk, d), 0.7), _random(keys[1], (heads, dk, d), 0.7)
    dv = 5 if layout in ("output", "biases") else d
    v = _random(keys[2], (heads, dv, d))
    o = _random(keys[3], (heads, d, dv)) if layout in ("output", "biases") else None
    extra = {}
    if layout == "biases":
        extra = dict(query_bias=_random(keys[4], (heads, dk), 0.3), key_bias=_random(keys[5], (heads, dk), 0.3),
                     value_bias=_random(keys[6], (heads, dv)), output_bias=_random(keys[7], (d,)))
    if layout == "rotary":
        extra = dict(rotary=af.Rotary(dims=2, base=100.0))
    return af.SelfAttention(q, k, v, o, beta, slopes, heads=heads, kind=kind, causal=causal, **extra)


def _dense_and_tiled(term, x, block=BLOCK, rows=None):
    """Both paths in one compiled program (one compilation per case)."""
    dense = dataclasses.replace(term, block=0)
    tiled = dataclasses.replace(term, block=block)
    return jax.jit(lambda x: (dense(0.0, x, rows=rows), tiled(0.0, x, rows=rows)))(x)


# Every head layout, and every mask (none, causal, ALiBi, both) with sa and with usa.
# "identity" has no head axis (one array for every head, multiplied by the number of
# heads) unless ALiBi gives each head its own slope.
CASES = [
    ("identity", 1, "sa", False, False), ("identity", 3, "usa", True, False), ("identity", 2, "usa", False, True),
    ("random", 3, "sa", False, True), ("d_k", 2, "usa", True, True), ("output", 2, "sa", True, False),
    ("biases", 2, "usa", False, False), ("rotary", 2, "sa", True, True),
]


@pytest.mark.parametrize("layout,heads,kind,causal,alibi", CASES)
def test_tiled_attention_equals_dense(layout, heads, kind, causal, alibi):
    term = _term(layout, kind=kind, causal=causal, alibi=alibi, heads=heads)
    x = _sphere(N, 3) * jnp.linspace(0.8, 1.2, N)[:, None]  # not unit rows: a real maximum search
    dense, tiled = _dense_and_tiled(term, x)
    scale = float(jnp.abs(dense).max())
    np.testing.assert_allclose(tiled, dense, rtol=0, atol=1e-12 * scale)


def test_tiles_that_divide_n_and_one_tile_larger_than_n():
    term = _term("random", kind="sa", causal=True, alibi=True)
    x = _sphere(N, 3, seed=1)
    dense, tiled = _dense_and_tiled(term, x, block=500)
    np.testing.assert_allclose(tiled, dense, rtol=0, atol=1e-12)
    small = x[:300]
    dense, tiled = _dense_and_tiled(term, small, block=4096)
    np.testing.assert_allclose(tiled, dense, rtol=0, atol=1e-12)


def test_some_query_rows_against_all_keys():
    """`rows`: those tokens' values only, each attending to all n tokens, on both paths,
    equal to the same rows of the whole evaluation (positions follow the rows: causal
    mask, ALiBi and rotary all depend on them)."""
    term = _term("rotary", kind="sa", causal=True, alibi=True)
    x = _sphere(N, 3, seed=2)
    rows = jnp.asarray([1999, 0, 7, 1024, 513, 1998, 300])
    dense = dataclasses.replace(term, block=0)
    tiled = dataclasses.replace(term, block=BLOCK)
    out = jax.jit(lambda x: (dense(0.0, x), dense(0.0, x, rows=rows), tiled(0.0, x, rows=rows),
                             dense.weights(0.0, x), dense.weights(0.0, x, rows=rows)))(x)
    whole, some_dense, some_tiled, weights, some_weights = out
    np.testing.assert_allclose(some_dense, whole[rows], rtol=0, atol=1e-12)
    np.testing.assert_allclose(some_tiled, whole[rows], rtol=0, atol=1e-12)
    np.testing.assert_allclose(some_weights, weights[:, rows], atol=1e-15)


@pytest.mark.parametrize("causal,alibi", [(False, False), (True, True)])
def test_the_known_row_maximum_of_unit_tokens(causal, alibi):
    """`unit_rows`: for identity-multiple Q, K on the sphere the logit maximum is beta at the
    diagonal; the tiles using it (no maximum search; the symmetric pairs of tiles without a
    causal mask) give the searched softmax at any beta (beta = 300: e^beta overflows
    float64 without a shift)."""
    eye = af.Identity(2, 3, "float64")
    scaled = af.Scaled(jnp.asarray([1.3]), eye)
    x = _sphere(N, 3, seed=3)
    slopes = jnp.asarray([0.01, 0.03]) if alibi else None
    term = af.SelfAttention(scaled, eye, eye, None, jnp.asarray(1.0), slopes, heads=2, causal=causal)
    known = dataclasses.replace(term, unit_rows=True, attracting=True, block=BLOCK)
    assert known._symmetric(None, jnp.ones(3)) is not causal
    both = jax.jit(lambda beta: (dataclasses.replace(term, beta=beta, block=0)(0.0, x),
                                 dataclasses.replace(known, beta=beta)(0.0, x)))
    for beta in (0.5, 300.0):
        q, k = known._queries_keys(0.0, x, None, None)
        assert term._row_max(q, k) is None
        np.testing.assert_allclose(dataclasses.replace(known, beta=jnp.asarray(beta))._row_max(q, k), 1.3 * beta,
                                   rtol=1e-13)
        searched, tiled = both(jnp.asarray(beta))
        assert np.isfinite(searched).all()
        np.testing.assert_allclose(tiled, searched, rtol=0, atol=1e-12)


def test_a_negative_beta_searches_the_maximum():
    """With beta s_Q s_K < 0 (a negative beta, or through a config a negative scale of Q
    or K) the bound |beta| |q_i| max_j |k_j| is no row maximum: in one cluster every logit
    lies near -|beta|, 2|beta| below it, and float32 exponentiates every one of them to 0
    from |beta| = 44 on (a row of 0/0). The known maximum is used only where the term is
    `attracting`; otherwise the tiles search for it, and a repulsive flow through tiles
    equals the dense one. Through a config, `attracting` follows the signs of the scales
    and factors of Q and K."""
    eye = af.Identity(1, 3, "float32")
    centre = jnp.asarray([1.0, 0.0, 0.0], jnp.float32)
    x = centre[None, :] + 1e-3 * jax.random.normal(jax.random.key(12), (600, 3), jnp.float32)
    x = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    term = af.SelfAttention(eye, eye, eye, None, jnp.asarray(-60.0, jnp.float32), None, heads=1, unit_rows=True)
    dense, tiled = _dense_and_tiled(term, x, block=128)
    assert np.isfinite(dense).all() and np.isfinite(tiled).all()
    np.testing.assert_allclose(tiled, dense, rtol=1e-5, atol=1e-6)
    bounded = dataclasses.replace(term, attracting=True, block=128)  # what the tiles did before
    assert not np.isfinite(np.asarray(bounded(0.0, x))).all()
    attracting = lambda **settings: af.build_system(af.validate_config({"d": 3, **settings}))(
        jax.random.key(0), 1.0)[0].terms[0].attracting
    assert attracting() and attracting(weights={"q": {"kind": "identity", "scale": 2.0}})
    assert not attracting(weights={"k": {"kind": "identity", "scale": -1.0}})
    assert not attracting(weights={"q": {"kind": "random"}})
    assert not attracting(weights={"q": {"kind": "identity", "switch_times": [1.0], "factors": [1.0, -1.0]}})
    # A run of one cluster with Q = -I at beta = 60: through tiles it failed as non-finite.
    run = dict(n=64, d=3, members=2, beta=60.0, t1=0.5, dt=0.1, dtype="float32", compilation_cache=False,
               plot=False, metrics=["pair_density", "order_parameter"], init={"kind": "caps", "k": 1, "radius": 0.01},
               weights={"q": {"kind": "identity", "scale": -1.0}})
    whole, tiles = (af.run({**run, "attention_block": block}) for block in (0, 16))
    np.testing.assert_allclose(tiles["order_parameter"].values, whole["order_parameter"].values, rtol=1e-5)


@pytest.mark.parametrize("symmetric", [False, True])
def test_derivatives_through_the_tiles(symmetric):
    """Reverse (jax.grad) and forward (jax.jvp) derivatives of the tiled term equal the
    dense ones, in the tokens and in beta: through the row tiles, and through the
    symmetric pairs of tiles (identity Q, K on unit tokens; its derivatives are the row
    tiles' own, a custom JVP)."""
    if symmetric:
        term = dataclasses.replace(_term("identity", kind="sa", causal=False, alibi=True), unit_rows=True,
                                   attracting=True)
        assert term._symmetric(None, jnp.ones(3))
    else:
        term = _term("d_k", kind="sa", causal=True, alibi=True)
        assert not term._symmetric(None, None)
    x = _sphere(200, 3, seed=4)
    w = jax.random.normal(jax.random.key(5), x.shape, jnp.float64)

    def loss(block):
        def f(x, beta):
            return jnp.sum(w * dataclasses.replace(term, block=block, beta=beta)(0.0, x))
        return f

    beta = jnp.asarray(1.7)
    grads = jax.jit(lambda x, b: (jax.grad(loss(0), (0, 1))(x, b), jax.grad(loss(64), (0, 1))(x, b)))(x, beta)
    for dense, tiled in zip(*grads):
        np.testing.assert_allclose(tiled, dense, rtol=1e-10, atol=1e-12)
    if not symmetric:
        return  # the row tiles' forward derivatives are those of the symmetric case
    v = jax.random.normal(jax.random.key(6), x.shape, jnp.float64)
    f = lambda block: lambda x: dataclasses.replace(term, block=block)(0.0, x)
    (p0, t0), (p1, t1) = jax.jit(lambda x, v: (jax.jvp(f(0), (x,), (v,)), jax.jvp(f(64), (x,), (v,))))(x, v)
    np.testing.assert_allclose(p1, p0, atol=1e-12)
    np.testing.assert_allclose(t1, t0, atol=1e-11)
    assert float(jnp.abs(t0).max()) > 0.1


@pytest.mark.parametrize("block", [223, 700])
def test_pairs_of_tiles_in_lanes(block):
    """The pairs of tiles I <= J go a few at a time (lanes), the last step padded with
    repeated pairs that add nothing: 9 tiles (45 pairs: 4 lanes, 3 of them padding in the
    last step) and 3 tiles (6 pairs: 3 lanes). The symmetric attention (sa with ALiBi, usa)
    and the pair sums equal NumPy's on the whole matrices."""
    assert [_tiled._lanes(p) for p in (1, 3, 6, 10, 45)] == [1, 3, 3, 2, 4]
    x = _sphere(N, 3, seed=9)
    beta, slope, eps = 2.3, 0.004, 0.03
    u = np.asarray(x)
    logits = beta * u @ u.T - slope * np.abs(np.arange(N)[:, None] - np.arange(N)[None, :])
    e = np.exp(logits - beta)
    sa = (e @ u) / e.sum(axis=1, keepdims=True)
    usa = np.exp(beta * u @ u.T) @ u / N
    ours = jax.jit(lambda x: (
        _tiled.symmetric_attention(x, x, x, beta, block=block, kind="sa", slope=slope, shift=beta),
        _tiled.symmetric_attention(x, x, x, beta, block=block, kind="usa"),
        _tiled.log_sum_exp_pairs(x, beta, block), _tiled.close_pair_count(x, 1 - eps, block)))(x)
    np.testing.assert_allclose(ours[0], sa, rtol=0, atol=1e-12)
    np.testing.assert_allclose(ours[1], usa, rtol=1e-12)
    np.testing.assert_allclose(ours[2], np.log(np.exp(beta * u @ u.T).sum()), rtol=1e-13)
    assert int(ours[3]) == int(np.sum(u @ u.T > 1 - eps)) - N > 0


def _clusters(n, d, k, radius, seed=0):
    return af.SphericalCaps(k, jnp.asarray(radius), None)(jax.random.key(seed), n, d, jnp.float64)


@pytest.mark.parametrize("scheme", ["sphere", "none"])
def test_recorded_statistics_equal_dense(scheme):
    """Every statistic of the Recorder through tiles, on and off the sphere (cosines of
    rows of varying norm), equals the dense one; `attention` keeps `ATTENTION_ROWS` rows."""
    x = _clusters(N, 3, 6, 0.25)
    if scheme == "none":
        x = x * jnp.linspace(0.5, 2.0, N)[:, None]
    field = af.VectorField((_term("identity", kind="sa", causal=False, alibi=False, heads=1),), scheme=scheme)
    metrics = ("energy", "log_energy", "normalized_energy", "pair_density", "clusters", "cluster_sizes",
               "order_parameter", "attention")
    if scheme == "none":  # the cosines of rows of any norm; the rest is the sphere's
        metrics = ("normalized_energy", "pair_density", "cluster_sizes", "order_parameter", "attention")
    record = lambda block: af.Recorder(jnp.asarray(2.5), jnp.asarray(0.02), metrics=metrics, block=block)
    dense, tiled = jax.jit(lambda x: (record(0)(0.0, x, field), record(BLOCK)(0.0, x, field)))(x)
    rows = attention_rows(N, BLOCK)
    assert rows.shape == (ATTENTION_ROWS,) and rows[0] == 0 and rows[-1] == N - 1
    assert tiled["attention"].shape == (1, ATTENTION_ROWS, N)
    np.testing.assert_allclose(tiled["attention"], dense["attention"][:, rows], atol=1e-15)
    for name in metrics[:-1]:
        np.testing.assert_allclose(tiled[name], dense[name], rtol=1e-12, err_msg=name)
    assert 1 < int(np.sum(tiled["cluster_sizes"] > 0)) < N and 0 < float(tiled["pair_density"]) < 1
    with pytest.raises(af.ConfigError, match="attention_rank"):
        af.Recorder(jnp.asarray(1.0), jnp.asarray(0.02), metrics=("attention_rank",), block=BLOCK)(0.0, x, field)


def test_metric_functions_choose_tiles_by_size():
    """The public metrics take `block` with the rule of the attention term; above
    `TILED_ABOVE` tokens they go through tiles by themselves."""
    assert _tiled.resolve_block(_tiled.TILED_ABOVE, None) is None
    assert _tiled.resolve_block(_tiled.TILED_ABOVE + 1, None) == _tiled.DEFAULT_BLOCK
    assert _tiled.resolve_block(10**6, 0) is None and _tiled.resolve_block(10, 7) == 7
    x = _clusters(N, 3, 4, 0.3, seed=7) * 1.5
    both = jax.jit(lambda x: [(f(x, *args, block=None), f(x, *args, block=0)) for f, args in
                              ((af.log_interaction_energy, (4.0,)), (af.pair_density, (0.05,)))])
    for tiled, dense in both(x):
        np.testing.assert_allclose(tiled, dense, rtol=1e-12)


def test_tiled_components_equal_scipy_on_a_chain():
    """Label propagation over tiles on a chain (diameter n - 1, its worst case) and on
    random points, against scipy.sparse.csgraph."""
    rng = np.random.default_rng(8)
    angles = np.linspace(0, 3.0, 150)[rng.permutation(150)]
    chain = jnp.asarray(np.stack([np.cos(angles), np.sin(angles)], 1))
    step = 3.0 / 149
    eps = 1 - np.cos(1.5 * step)  # neighbours on the arc join, the next ones do not
    assert int(af.cluster_count(chain, eps, block=16)) == 1
    x = jnp.asarray(rng.standard_normal((300, 3)))
    u = np.asarray(x) / np.linalg.norm(np.asarray(x), axis=1, keepdims=True)
    expected, labels = connected_components(u @ u.T > 1 - 0.05, directed=False)
    ours = np.asarray(af.cluster_labels(x, 0.05, block=32))
    assert len(np.unique(ours)) == expected
    for a in range(0, 300, 7):
        np.testing.assert_array_equal(ours == ours[a], labels == labels[a])


def _temp_bytes(f, x) -> int:
    return jax.jit(f).lower(x).compile().memory_analysis().temp_size_in_bytes


def test_memory_grows_linearly_in_n():
    """XLA's own count of a program's temporary memory: when n doubles the dense field's
    quadruples; the tiled field's and the tiled statistics' are a constant (the tiles in
    flight) plus a part linear in n: from n = 4096 to 8192 to 16384 their increments double."""
    term = _term("random", kind="sa", causal=True, alibi=True)
    rec = lambda block: af.Recorder(jnp.asarray(1.0), jnp.asarray(0.02), metrics=("log_energy", "pair_density"),
                                    block=block)
    field = lambda block: (lambda x: dataclasses.replace(term, block=block)(0.0, x))
    stats = lambda block: (lambda x: rec(block)(0.0, x))
    dense = [_temp_bytes(field(0), _sphere(n, 3)) for n in (256, 512)]
    assert 3.6 < dense[1] / dense[0] < 4.4, dense
    for make in (field, stats):
        tiled = [_temp_bytes(make(64), _sphere(n, 3)) for n in (4096, 8192, 16384)]
        assert 1.8 < (tiled[2] - tiled[1]) / (tiled[1] - tiled[0]) < 2.2, tiled
        assert tiled[2] < 16384**2 * 8 / 100  # below 1% of one n x n float64 matrix


def test_a_configured_run_with_attention_block():
    """`attention_block` through `attnflow.run` (multi-head random weights, causal, float64):
    the statistics recorded through tiles equal the dense metrics of the saved states, and
    the states stay finite on the sphere; without the key, n above `TILED_ABOVE` is tiled
    by itself. Bad values are refused in one sentence."""
    base = dict(n=300, d=3, members=1, beta=1.0, t1=0.2, dt=0.1, saves=3, dtype="float64", heads=2, causal=True,
                compilation_cache=False, plot=False, metrics=["pair_density"], cluster_eps=0.05,
                save_states=True, weights={"q": {"kind": "random"}, "k": {"kind": "random"}})
    ds = af.run({**base, "attention_block": 64})
    states = ds["x"].values[0]
    np.testing.assert_allclose(np.linalg.norm(states, axis=-1), 1.0, atol=1e-12)
    assert np.abs(states[-1] - states[0]).max() > 1e-3  # the tokens moved
    for t, x in enumerate(states):
        np.testing.assert_allclose(ds["pair_density"].values[0, t], af.pair_density(jnp.asarray(x), 0.05, block=0),
                                   rtol=1e-12)
    system = af.build_system(af.validate_config({**base, "n": _tiled.TILED_ABOVE + 1}))
    field, _, recorder = system(jax.random.key(0), 1.0)
    assert field.terms[0].tile(_tiled.TILED_ABOVE + 1) == _tiled.DEFAULT_BLOCK and recorder.block is None
    with pytest.raises(af.ConfigError, match="attention_block must be at least 0"):
        af.validate_config({"attention_block": -2})
    with pytest.raises(af.ConfigError, match="attention_rank needs the whole"):
        af.validate_config({"n": 2000, "metrics": ["attention_rank"]})
    with pytest.raises(af.ConfigError, match="attention block must be None"):
        dataclasses.replace(_term("identity", kind="sa", causal=False, alibi=False), block=-1)
