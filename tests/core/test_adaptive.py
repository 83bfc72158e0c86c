"""`attnflow.numerics._adaptive`: adaptive stepping through diffrax, held to a closed form on the
sphere (a rotation), and the solvers it takes."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from attnflow.numerics._adaptive import RK4, Retracted, diffrax_solver
from attnflow.schema._errors import ConfigError
from attnflow.numerics._field import VectorField
from attnflow.numerics._geometry import Sphere
from attnflow.numerics._simulate import simulate

GENERATOR = np.array([[0.0, -1.0, 0.3], [1.0, 0.0, -0.5], [-0.3, 0.5, 0.0]])


def test_every_adaptive_solver_follows_a_rotation_of_the_sphere_to_its_tolerance():
    from attnflow.terms.external_field import ExternalField  # noqa: F401 (the package's terms load)
    import attnflow

    class Rotation(attnflow.AbstractInteraction):
        def __call__(self, t, x):
            return x @ jnp.asarray(GENERATOR, x.dtype).T

    x0 = jnp.array([[1.0, 0.0, 0.0], [0.0, 0.6, 0.8]])
    exact = x0 @ scipy.linalg.expm(2.0 * GENERATOR).T
    for name in ("tsit5", "dopri5", "rk4", "bosh3"):
        solution = simulate(VectorField((Rotation(),), scheme="sphere"), x0, t1=2.0, dt=0.1, solver=name,
                            adaptive=True, rtol=1e-9, atol=1e-11, ts=jnp.array([2.0]))
        np.testing.assert_allclose(solution.stats["x"][-1], exact, atol=1e-6, err_msg=name)


def test_the_solvers_it_takes():
    assert isinstance(diffrax_solver("rk4"), RK4)
    assert type(diffrax_solver("tsit5")).__name__ == "Tsit5"
    with pytest.raises(ConfigError, match="has no error estimate"):
        diffrax_solver("euler_renorm")
    assert Retracted(RK4(), Sphere()).order(None) == 4
