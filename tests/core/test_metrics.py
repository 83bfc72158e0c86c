"""Metrics against closed forms and independent references (SciPy, NumPy)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.sparse.csgraph import connected_components
from systems import identity_field

import attnflow as af
from attnflow.numerics import _metrics


def _clustered(sizes, d, jitter=0.0, seed=0):
    """Clusters of the given sizes at orthonormal points e_1, e_2, ... (plus tiny jitter)."""
    rng = np.random.default_rng(seed)
    rows = []
    for c, m in enumerate(sizes):
        for _ in range(m):
            v = np.eye(d)[c] + jitter * rng.standard_normal(d)
            rows.append(v / np.linalg.norm(v))
    return jnp.asarray(np.array(rows))


@pytest.mark.parametrize("d", [1, 2, 3, 8, 9])
def test_gram_matrix_by_broadcast_products_and_by_matrix_product(d):
    """`gram` sums broadcast products up to d = BROADCAST_GRAM_UP_TO and multiplies matrices
    above: the inner products of every pair either way, batched over leading axes."""
    x = jax.random.normal(jax.random.key(d), (3, 20, d), jnp.float64)
    expected = np.einsum("bik,bjk->bij", np.asarray(x), np.asarray(x))
    np.testing.assert_allclose(_metrics.gram(x), expected, rtol=1e-13, atol=1e-13)
    assert (d <= _metrics.BROADCAST_GRAM_UP_TO) == (d < 9)


def test_energy_closed_forms():
    n, d, beta = 6, 6, 1.7
    single = jnp.ones((n, d)) / np.sqrt(d)
    np.testing.assert_allclose(af.interaction_energy(single, beta), np.exp(beta) / (2 * beta), rtol=1e-12)
    ortho = jnp.eye(n, d)
    expected = (n * np.exp(beta) + n * (n - 1)) / (2 * beta * n**2)
    np.testing.assert_allclose(af.interaction_energy(ortho, beta), expected, rtol=1e-12)
    x = af.UniformSphere()(jax.random.key(0), n, d, jnp.float64)
    g = np.asarray(x) @ np.asarray(x).T
    np.testing.assert_allclose(af.interaction_energy(x, beta), np.exp(beta * g).sum() / (2 * beta * n**2), rtol=1e-12)
    np.testing.assert_allclose(af.normalized_energy(3.0 * x), np.exp(g).mean(), rtol=1e-12)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_log_energy_is_finite_for_huge_beta(dtype):
    """At beta = 1e4, E = e^beta / (2 beta) overflows every float; its log does not."""
    beta = 1e4
    single = jnp.ones((5, 3), dtype) / jnp.sqrt(jnp.asarray(3.0, dtype))
    log_e = af.log_interaction_energy(single, jnp.asarray(beta, dtype))
    assert np.isfinite(log_e)
    np.testing.assert_allclose(log_e, beta - np.log(2 * beta), rtol=1e-6)
    assert not np.isfinite(af.interaction_energy(single, jnp.asarray(beta, dtype)))
    rec = af.Recorder(jnp.asarray(beta, dtype), jnp.asarray(1e-2, dtype), metrics=("log_energy",))
    np.testing.assert_allclose(rec(0.0, single)["log_energy"], beta - np.log(2 * beta), rtol=1e-6)


@pytest.mark.parametrize("sizes", [(5,), (3, 3), (4, 2, 1), (1, 1, 1, 1, 1)])
def test_cluster_metrics_on_constructed_clusters(sizes):
    n, d = sum(sizes), 5
    x = _clustered(sizes, d, jitter=1e-4)
    eps = 1e-3
    # the four metrics in one program (one compile, not one per eager call)
    count, sizes_out, density, order = jax.jit(lambda x: (af.cluster_count(x, eps), af.cluster_sizes(x, eps),
                                                          af.pair_density(x, eps), af.order_parameter(x)))(x)
    assert int(count) == len(sizes)
    sizes_out = np.asarray(sizes_out)
    np.testing.assert_array_equal(sizes_out[: len(sizes)], sorted(sizes, reverse=True))
    assert sizes_out[len(sizes):].sum() == 0
    pairs = sum(m * (m - 1) for m in sizes)
    np.testing.assert_allclose(density, pairs / (n * (n - 1)))
    # Orthogonal cluster centres: |mean| = sqrt(sum m^2) / n.
    np.testing.assert_allclose(order, np.sqrt(sum(m * m for m in sizes)) / n, atol=1e-3)


def test_cluster_count_equals_scipy_connected_components():
    """The threshold graph's components against scipy.sparse.csgraph, on random points and
    on a long chain (diameter n - 1, the worst case for label propagation)."""
    rng = np.random.default_rng(1)
    # compiled once for all trials (eps is data); an eager call compiles its loop each time
    cluster_count, cluster_labels = jax.jit(af.cluster_count), jax.jit(af.cluster_labels)
    for trial in range(20):
        x = jnp.asarray(rng.standard_normal((30, 3)))
        eps = rng.uniform(0.02, 0.5)
        u = np.asarray(x) / np.linalg.norm(np.asarray(x), axis=1, keepdims=True)
        expected, labels = connected_components(u @ u.T > 1 - eps, directed=False)
        assert int(cluster_count(x, eps)) == expected
        ours = np.asarray(cluster_labels(x, eps))
        for a in range(30):
            np.testing.assert_array_equal(ours == ours[a], labels == labels[a])
    angles = np.linspace(0, 3.0, 40)[rng.permutation(40)]
    chain = jnp.asarray(np.stack([np.cos(angles), np.sin(angles)], 1))
    step = 3.0 / 39
    assert int(cluster_count(chain, 1 - np.cos(1.01 * step))) == 1
    assert int(cluster_count(chain, 1 - np.cos(0.99 * step))) == 40


def test_recorder_agrees_with_the_metric_functions():
    x = _clustered((4, 3), 4, jitter=1e-3) * 2.5  # off the sphere: cosines are used
    beta, eps = 2.0, 1e-2
    rec = af.Recorder(jnp.asarray(beta), jnp.asarray(eps),
                      metrics=tuple(m for m, spec in af.numerics._metrics.METRICS.items()
                                   if not (spec.reads_attention or spec.reads_source)))
    out = rec(0.0, x)
    np.testing.assert_allclose(out["log_energy"], af.log_interaction_energy(x, beta), rtol=1e-12)
    np.testing.assert_allclose(out["normalized_energy"], af.normalized_energy(x), rtol=1e-12)
    np.testing.assert_allclose(out["pair_density"], af.pair_density(x, eps))
    assert int(out["clusters"]) == int(af.cluster_count(x, eps)) == 2
    np.testing.assert_array_equal(out["cluster_sizes"], af.cluster_sizes(x, eps))
    np.testing.assert_allclose(out["order_parameter"], af.order_parameter(x), rtol=1e-12)
    assert bool(out["finite"])
    assert not bool(rec(0.0, x.at[0, 0].set(jnp.nan))["finite"])


def test_numerical_rank_and_attention_rank():
    rng = np.random.default_rng(2)
    for r in (1, 3, 6):
        a = rng.standard_normal((8, r)) @ rng.standard_normal((r, 8))
        assert int(af.numerical_rank(jnp.asarray(a))) == r
    # beta = 0: uniform attention 1/n everywhere, rank one; orthonormal tokens at large
    # beta: attention close to the identity, full rank.
    n = 6
    x = jnp.eye(n)
    for beta, rank in ((0.0, 1), (20.0, n)):
        field = identity_field(n, beta)
        rec = af.Recorder(jnp.asarray(beta), jnp.asarray(1e-2), metrics=("attention", "attention_rank"))
        out = rec(0.0, x, field)
        assert out["attention"].shape == (1, n, n)
        assert int(out["attention_rank"][0]) == rank


@pytest.mark.parametrize("tiles", [False, True], ids=["dense", "tiled"])
def test_every_registered_metric_is_recorded_as_its_entry_declares(tiles):
    """The registry is the one place a metric is declared: each entry is a config choice,
    has its function (a method of `Pairs`), and records values of the dims and bytes it
    declares, dense and (where it says it can) through tiles."""
    from attnflow.numerics._metrics import Pairs, attention_rows
    from attnflow.schema import _config
    from attnflow.schema._metric_registry import METRICS, PANELS, Sizes

    assert tuple(_config.Metric.__members__) == tuple(METRICS)
    assert sorted(m.name for m in PANELS) == sorted(METRICS)
    n, d, heads = 70, 3, 2
    block = 16 if tiles else 0
    field = identity_field(d, 1.0, heads=heads)
    m = 5  # source tokens of a cross-attention term, for the metrics against the source
    source = af.UniformSphere()(jax.random.key(1), m, d, jnp.float64)
    eye = af.Identity(1, d, "float64")
    cross = af.CrossAttention(source, eye, eye, eye, None, jnp.asarray(1.0, jnp.float64), heads=1)
    field = eqx.tree_at(lambda f: f.terms, field, field.terms + (cross,))
    x = af.UniformSphere()(jax.random.key(0), n, d, jnp.float64)
    names = tuple(name for name, metric in METRICS.items() if metric.tiled or not tiles)
    rec = af.Recorder(jnp.asarray(1.0), jnp.asarray(0.1), metrics=names, block=block)
    out = jax.jit(lambda x: rec(0.0, x, field))(x)
    rows = len(attention_rows(n, block)) if tiles else None
    for name in names:
        metric = METRICS[name]
        assert callable(getattr(Pairs, name)), name
        value = out[name]
        assert value.ndim == len(metric.dims), name
        assert value.size * value.dtype.itemsize == metric.size(Sizes(n, heads, x.dtype.itemsize, rows, m)), name
    if tiles:
        with pytest.raises(af.ConfigError, match="attention_rank needs the whole"):
            af.Recorder(jnp.asarray(1.0), jnp.asarray(0.1), metrics=("attention_rank",), block=block)(0.0, x, field)


@pytest.mark.parametrize("eps", [1e-9, 0.5, -1.0])
def test_pair_density_counts_the_pairs_of_distinct_tokens_only(eps):
    """The pair density against a NumPy count over i != j, the diagonal left out whatever it
    holds: with eps near 0 only the repeated tokens are close (the diagonal, cos = 1 up to
    rounding, may or may not pass the threshold, and never counts); with eps = -1 nothing is."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((9, 3))
    x = np.concatenate([x, x[:3], 2.0 * x[:1]])  # tokens 9-11 repeat 0-2, token 12 is 2 x_0
    cos = (x @ x.T) / np.outer(np.linalg.norm(x, axis=1), np.linalg.norm(x, axis=1))
    n = len(x)
    close = (cos > 1 - eps) & ~np.eye(n, dtype=bool)
    expected = close.sum() / (n * (n - 1))
    assert close.sum() == {1e-9: 10, -1.0: 0}.get(eps, close.sum())  # (0, 9), (0, 12), (9, 12), (1, 10), (2, 11), both ways
    np.testing.assert_allclose(af.pair_density(jnp.asarray(x), eps), expected, rtol=1e-12)
    rec = af.Recorder(jnp.asarray(1.0), jnp.asarray(eps), metrics=("pair_density",))
    np.testing.assert_allclose(rec(0.0, jnp.asarray(x))["pair_density"], expected, rtol=1e-12)
