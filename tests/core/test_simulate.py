"""`attnflow.numerics._simulate`: one system solved with fixed steps, against a closed form and the
order of its method."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from attnflow.schema._errors import ConfigError
from attnflow.numerics._field import VectorField
from attnflow.numerics._simulate import simulate
from attnflow.terms.external_field import ExternalField

U = jnp.array([0.0, 0.0, 1.0])
X0 = jnp.array([[1.0, 0.0, 0.0], [0.6, 0.0, 0.8]])


def _angle_error(solution, t):
    theta0 = np.arccos(np.asarray(X0 @ U))
    exact = 2 * np.arctan(np.tan(theta0 / 2) * np.exp(-t))
    return np.abs(np.arccos(np.clip(np.asarray(solution.stats["x"][-1] @ U), -1, 1)) - exact).max()


def test_fixed_steps_converge_at_the_order_of_their_method():
    field = VectorField((ExternalField(U, jnp.asarray(1.0)),), scheme="sphere")
    for solver, order in (("heun", 2), ("rk4", 4)):
        errors = [_angle_error(simulate(field, X0, t1=1.0, dt=dt, solver=solver, save_steps=jnp.array([int(1 / dt)])),
                               1.0) for dt in (0.1, 0.05)]
        assert 2 ** (order - 0.3) < errors[0] / errors[1] < 2 ** (order + 0.3), (solver, errors)


def test_the_records_are_at_the_steps_asked_and_an_unknown_solver_is_refused():
    field = VectorField((ExternalField(U, jnp.asarray(1.0)),), scheme="sphere")
    solution = simulate(field, X0, t1=1.0, dt=0.25, solver="euler", save_steps=jnp.array([0, 2, 4]))
    np.testing.assert_allclose(solution.ts, [0, 0.5, 1.0])
    np.testing.assert_allclose(np.linalg.norm(solution.stats["x"], axis=-1), 1, atol=1e-12)
    with pytest.raises(ConfigError, match="unknown solver"):
        simulate(field, X0, t1=1.0, dt=0.25, solver="rk5")
