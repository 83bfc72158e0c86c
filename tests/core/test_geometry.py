"""`attnflow.numerics._geometry`: the sphere's tangent projection, retraction and geodesic
distance, and flat space, against their formulas."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.numerics._geometry import Euclidean, Sphere


def _unit(x):
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def test_the_sphere_projects_onto_the_tangent_space_and_retracts_onto_the_sphere():
    key_x, key_v = jax.random.split(jax.random.key(0))
    x = _unit(jax.random.normal(key_x, (5, 4), jnp.float64))
    v = jax.random.normal(key_v, (5, 4), jnp.float64)
    p = Sphere().project(x, v)
    np.testing.assert_allclose(jnp.sum(p * x, -1), 0, atol=1e-14)  # tangent
    np.testing.assert_allclose(Sphere().project(x, p), p, atol=1e-14)  # a projection
    np.testing.assert_allclose(jnp.linalg.norm(Sphere().retract(3.0 * x + 0.1 * p), axis=-1), 1, atol=1e-14)


def test_the_geodesic_distance_is_the_angle_even_for_nearly_equal_points():
    angle = np.array([1e-9, 0.3, np.pi / 2, 3.0])
    x = jnp.asarray(np.stack([np.ones_like(angle), np.zeros_like(angle)], -1))
    y = jnp.asarray(np.stack([np.cos(angle), np.sin(angle)], -1))
    np.testing.assert_allclose(Sphere().distance(x, y), angle, rtol=1e-12)


def test_flat_space_leaves_vectors_and_points_alone():
    x, v = jnp.arange(6.0).reshape(2, 3), jnp.ones((2, 3))
    assert (Euclidean().project(x, v) == v).all() and (Euclidean().retract(x) == x).all()
    np.testing.assert_allclose(Euclidean().distance(x, x + jnp.array([[3.0, 4.0, 0.0]] * 2)), [5, 5])
