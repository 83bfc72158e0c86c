"""`attnflow.numerics._field`: the vector field's schemes and its time change, against their
definitions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnflow.schema._errors import ConfigError
from attnflow.numerics._field import ConstantSpeed, VectorField, takes_piece_time
from attnflow.terms.external_field import ExternalField

PULL = ExternalField(jnp.array([0.0, 0.0, 2.0]), jnp.asarray(1.0))


def test_the_sphere_scheme_projects_the_terms_and_flat_space_does_not():
    x = jax.random.normal(jax.random.key(0), (4, 3), jnp.float64)
    x = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    on_sphere = VectorField((PULL,), scheme="sphere")(0.0, x, None)
    np.testing.assert_allclose(jnp.sum(on_sphere * x, -1), 0, atol=1e-14)
    u = jnp.array([[0.0, 0.0, 2.0]])
    np.testing.assert_allclose(on_sphere, u - jnp.sum(x * u, -1, keepdims=True) * x, atol=1e-14)
    flat = VectorField((PULL,), scheme="none")(0.0, x, None)
    np.testing.assert_allclose(flat, jnp.broadcast_to(u, x.shape))
    assert not takes_piece_time(PULL)


def test_the_constant_speed_time_change_moves_the_whole_state_at_its_speed():
    f = jnp.array([[3.0, 0.0], [0.0, 4.0]]) * 1e-30  # a field far below float32's range of squares
    np.testing.assert_allclose(ConstantSpeed(jnp.asarray(2.0))(f), 2 * f / jnp.linalg.norm(f), rtol=1e-6)
    assert (ConstantSpeed(jnp.asarray(2.0))(jnp.zeros((2, 2))) == 0).all()


def test_a_scheme_it_does_not_know_is_refused():
    # (Under the tests' runtime type checker its annotation refuses it first.)
    with pytest.raises((ConfigError, TypeError, Exception), match="spherical"):
        VectorField((PULL,), scheme="spherical")  # type: ignore[arg-type]
