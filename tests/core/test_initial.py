"""`attnflow.numerics._initial` and the components of `attnflow/schema/initial/`: the laws of the initial
tokens, against what each says it draws."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.numerics import _numerics
from attnflow.numerics._initial import GaussianMixture, Given, Orthonormal, SphericalCaps, UniformCube, UniformSphere
from attnflow.schema.initial import INITS

KEY = jax.random.key(3)


def test_uniform_tokens_are_unit_vectors_with_no_preferred_direction():
    x = UniformSphere()(KEY, 20000, 3, jnp.float64)
    np.testing.assert_allclose(jnp.linalg.norm(x, axis=-1), 1, atol=1e-12)
    np.testing.assert_allclose(x.mean(0), 0, atol=0.03)  # the mean of a uniform law on S^2 is 0; 3 sigma ~ 0.012


def test_caps_hold_each_token_within_its_radius_of_its_centre():
    centres = jnp.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    x = SphericalCaps(2, jnp.asarray(0.2), centres)(KEY, 50, 3, jnp.float64)
    angle = jnp.arccos(jnp.clip(jnp.sum(x * centres[jnp.arange(50) % 2], -1), -1, 1))
    assert float(angle.max()) <= 0.2 + 1e-12 and float(angle.max()) > 0.1


def test_mixtures_cubes_given_tokens_and_the_orthonormal_start():
    centres = jnp.array([[5.0, 0.0], [-5.0, 0.0]])
    x = GaussianMixture(2, jnp.asarray(0.1), jnp.asarray(1.0), centres)(KEY, 4000, 2, jnp.float64)
    np.testing.assert_allclose(x[0::2].mean(0), centres[0], atol=0.02)
    np.testing.assert_allclose(x[0::2].std(0), 0.1, rtol=0.05)
    cube = UniformCube(jnp.asarray(-2.0), jnp.asarray(3.0))(KEY, 1000, 2, jnp.float64)
    assert float(cube.min()) >= -2 and float(cube.max()) <= 3
    value = jnp.arange(6.0).reshape(3, 2)
    assert (Given(value)(None, 3, 2, jnp.float64) == value).all()
    assert (Orthonormal()(None, 2, 3, jnp.float64) == jnp.eye(2, 3)).all()


def test_each_kind_of_the_registry_builds_its_law():
    laws = {"uniform": UniformSphere, "orthonormal": Orthonormal, "caps": SphericalCaps,
            "mixture": GaussianMixture, "cube": UniformCube, "given": Given}
    settings = {"caps": dict(k=2, radius=0.1, centres=None), "mixture": dict(k=2, sigma=0.1, spread=1.0, centres=None),
                "cube": dict(low=-1.0, high=1.0), "given": dict(value=[[1.0, 0.0]])}
    for kind, cls in INITS.items():
        init = cls(**settings.get(kind, {}))
        law = init.build(lambda name, init=init: getattr(init, name), jnp.float32, _numerics)
        assert type(law) is laws[kind], kind
