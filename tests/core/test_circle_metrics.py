"""The pair density and the clusters of tokens on the circle from their sorted angles
(attnflow/numerics/_circle_metrics.py, `Recorder(on_circle=True)`) against the dense metrics, and in
memory linear in n at n = 1e6."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from systems import identity_field

import attnflow as af
from attnflow.numerics import _circle_metrics
from attnflow.schema._errors import ConfigError
from attnflow.schema._metric_registry import METRICS, subquadratic_metrics

# 2.5: 1 - eps < -1, every pair is close (antipodal ones too).
EPS = (1e-3, 1e-2, 0.1, 0.5, 1.5, 2.5)
SIZES = (1, 2, 7, 1500)  # each compiles the dense and the sorted-angle metrics once


def _circle_tokens(theta):
    return jnp.asarray(np.stack([np.cos(theta), np.sin(theta)], axis=-1))


def _state(kind, n, seed=0):
    """Tokens on the circle: uniform; in clusters, two of them straddling the angle 0 and
    the angle pi (where arctan2 wraps); all in one narrow arc across pi; or uniform tokens
    each repeated (duplicated tokens)."""
    rng = np.random.default_rng(seed)
    if kind == "uniform":
        theta = rng.uniform(0, 2 * np.pi, n)
    elif kind == "clusters":
        centres = np.array([0.0, np.pi, 1.0, 2.2, -2.0])
        theta = centres[rng.integers(0, len(centres), n)] + rng.normal(0, 0.03, n)
    elif kind == "one_arc":
        theta = np.pi + rng.uniform(-0.02, 0.02, n)
    else:  # duplicated
        theta = np.repeat(rng.uniform(0, 2 * np.pi, (n + 2) // 3), 3)[:n]
    return _circle_tokens(theta)


@jax.jit
def _both(x, eps):
    """The dense pair density and labels, and the sorted-angle ones."""
    n = x.shape[0]
    fraction = 1.0 if n < 2 else n * (n - 1)
    return (
        af.pair_density(x, eps, block=0),
        af.cluster_labels(x, eps, block=0),
        jnp.ones(()) if n < 2 else _circle_metrics.close_pair_count(x, eps) / fraction,
        _circle_metrics.cluster_labels(x, eps),
    )


@pytest.mark.parametrize("kind", ["uniform", "clusters", "one_arc", "duplicated"])
def test_sorted_angles_match_the_dense_metrics(kind):
    for n in SIZES:
        x = _state(kind, n, seed=n)
        for eps in EPS:
            dense_density, dense_labels, density, labels = _both(x, jnp.asarray(eps))
            assert float(density) == float(dense_density), (kind, n, eps)
            # The same labels (the smallest token of each component), not only the same partition.
            np.testing.assert_array_equal(labels, dense_labels, err_msg=f"{kind} n={n} eps={eps}")
            assert labels.dtype == dense_labels.dtype


def test_wrap_around_and_one_cluster():
    """A cluster across the angle pi (the ends of the sorted angles) is one cluster; so is
    a whole circle of small gaps; tokens farther apart than r are not joined."""
    across = _circle_tokens(np.array([np.pi - 0.01, 0.5, -np.pi + 0.01, 0.0, np.pi]))
    ring = _circle_tokens(np.linspace(0, 2 * np.pi, 100, endpoint=False))  # gaps 0.0628
    # r = 0.0447 at eps = 1e-3, 0.1415 at 1e-2
    labels, joined, apart, per_token = jax.jit(
        lambda: (
            _circle_metrics.cluster_labels(across, 1e-3),
            _circle_metrics.cluster_labels(ring, 1e-2),
            _circle_metrics.cluster_labels(ring, 1e-3),
            _circle_metrics.close_pairs_per_token(ring, 1e-2),
        )
    )()
    np.testing.assert_array_equal(labels, [0, 1, 0, 3, 0])
    np.testing.assert_array_equal(joined, np.zeros(100))
    np.testing.assert_array_equal(apart, np.arange(100))
    np.testing.assert_array_equal(per_token, np.full(100, 4))
    # Antipodal tokens: close once 1 - eps < -1 (cos = -1 > 1 - eps), not at eps = 1.9.
    antipodes = _circle_tokens(np.array([0.0, np.pi]))
    for eps, close in ((2.5, 1), (1.9, 0)):
        np.testing.assert_array_equal(_circle_metrics.close_pairs_per_token(antipodes, eps), [close, close])
        np.testing.assert_array_equal(_circle_metrics.cluster_labels(antipodes, eps), [0, 1 - close])


def _recorders(block, **kwargs):
    metrics = ("energy", "log_energy", "pair_density", "clusters", "cluster_sizes", "order_parameter")
    make = lambda on_circle: af.Recorder(  # noqa: E731
        jnp.asarray(1.5), jnp.asarray(0.05), metrics=metrics, block=block, on_circle=on_circle, **kwargs
    )
    return make(False), make(True)


def test_recorder_on_the_circle_records_what_it_records_without():
    """The same records, dense (block 0) and tiled (block 128)."""
    field = identity_field(2, 1.5)
    dense, dense_circle = _recorders(0)
    tiled, tiled_circle = _recorders(128)
    record = jax.jit(
        lambda x: (dense(0.0, x, field), dense_circle(0.0, x, field), tiled(0.0, x, field), tiled_circle(0.0, x, field))
    )
    for kind in ("uniform", "clusters", "one_arc", "duplicated"):
        x = _state(kind, 300, seed=1)
        for want, got in np.reshape(record(x), (2, 2)):
            assert want.keys() == got.keys()
            for key in want:
                np.testing.assert_array_equal(got[key], want[key], err_msg=f"{kind} {key}")


def test_recorder_on_the_circle_refuses_other_dimensions():
    _, circle = _recorders(0)
    x = af.UniformSphere()(jax.random.key(0), 10, 3, jnp.float64)
    with pytest.raises(ConfigError, match="d = 3"):
        circle(0.0, x, identity_field(3, 1.5))


@pytest.mark.optimized
def test_a_million_tokens_in_linear_memory():
    """At n = 1e6 the recorder on the circle compiles to a program whose temporary memory is
    O(n) (an n x n array would be 8e12 bytes), and records the known clusters: 5 clusters of
    2e5 tokens each, 0.2 rad wide, 1.2 rad apart."""
    n, k = 1_000_000, 5
    m = n // k
    rng = np.random.default_rng(0)
    theta = np.repeat(np.arange(k) * 2 * np.pi / k, m) + rng.uniform(-0.1, 0.1, n)
    x = _circle_tokens(rng.permutation(theta))
    # block=0 (dense): the sorted angles serve whatever block says.
    recorder = af.Recorder(
        jnp.asarray(1.0),
        jnp.asarray(0.05),
        metrics=("pair_density", "clusters", "cluster_sizes"),
        block=0,
        on_circle=True,
    )
    program = jax.jit(lambda x: recorder(0.0, x, identity_field(2, 1.0))).lower(x).compile()
    memory = program.memory_analysis()
    assert memory is not None and memory.temp_size_in_bytes < 200 * n
    out = program(x)
    assert int(out["clusters"]) == k
    sizes = np.asarray(out["cluster_sizes"])
    np.testing.assert_array_equal(sizes[:k], m)
    assert not sizes[k:].any()
    # r = arccos(0.95) = 0.3176 > 0.2: every pair inside a cluster is close, none across.
    np.testing.assert_allclose(out["pair_density"], k * m * (m - 1) / (n * (n - 1)), rtol=1e-12)


def test_registry_says_where_each_metric_is_subquadratic():
    assert {m.subquadratic for m in METRICS.values()} == {"any", "circle", "moments", ""}
    assert subquadratic_metrics(2) == (
        "energy",
        "log_energy",
        "pair_density",
        "clusters",
        "cluster_sizes",
        "order_parameter",
    )
    assert subquadratic_metrics(3) == ("energy", "log_energy", "order_parameter")
    assert subquadratic_metrics(4) == ("order_parameter",)
    # What needs whole attention maps or the source tokens is never below n^2.
    for name, metric in METRICS.items():
        if metric.reads_attention or metric.reads_source or not metric.tiled:
            assert metric.subquadratic == "", name
