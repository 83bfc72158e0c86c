"""Initial token configurations $X(0)$ of shape `(n, d)`.

Each is called as `init(key, n, d, dtype)`. Those meant for the sphere return unit
rows; the others are retracted by `simulate` when the state lives on the sphere.
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray


def _unit_rows(x):
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


class AbstractInitialCondition(eqx.Module):
    """A law (or a fixed choice) of initial token positions."""

    @abc.abstractmethod
    def __call__(self, key: PRNGKeyArray | None, n: int, d: int, dtype=jnp.float32) -> Float[Array, "n d"]:
        """Draw one configuration."""


class UniformSphere(AbstractInitialCondition):
    """I.i.d. uniform on $S^{d-1}$ (normalized standard Gaussians)."""

    def __call__(self, key, n, d, dtype=jnp.float32):
        return _unit_rows(jax.random.normal(key, (n, d), dtype))  # pyright: ignore[reportArgumentType]  (a random law is called with a key)


class Orthonormal(AbstractInitialCondition):
    """$x_i = e_i$: the equiangular start with all inner products 0 (needs $n \\le d$)."""

    def __call__(self, key, n, d, dtype=jnp.float32):
        return jnp.eye(n, d, dtype=dtype)


class SphericalCaps(AbstractInitialCondition):
    """Tokens in `k` spherical caps of geodesic radius `radius` (token i in cap i mod k).

    Centres are given (`centres`, shape `(k, d)`, normalized) or uniform on the sphere.
    Inside a cap the angle to the centre is `radius * U^{1/(d-1)}`, uniform in the
    small-cap (flat) approximation, and the direction is uniform.
    """

    k: int = eqx.field(static=True)
    radius: Float[Array, ""]
    centres: Float[Array, "k d"] | None = None

    def __call__(self, key, n, d, dtype=jnp.float32):
        k_centre, k_dir, k_angle = jax.random.split(key, 3)  # pyright: ignore[reportArgumentType]  (a random law is called with a key)
        if self.centres is None:
            centres = _unit_rows(jax.random.normal(k_centre, (self.k, d), dtype))
        else:
            centres = _unit_rows(jnp.asarray(self.centres, dtype))
        c = centres[jnp.arange(n) % self.k]
        u = jax.random.normal(k_dir, (n, d), dtype)
        u = _unit_rows(u - jnp.sum(u * c, -1, keepdims=True) * c)
        angle = self.radius * jax.random.uniform(k_angle, (n, 1), dtype) ** (1.0 / (d - 1))
        return jnp.cos(angle) * c + jnp.sin(angle) * u


class GaussianMixture(AbstractInitialCondition):
    """Token i drawn from $N(c_{i \\bmod k}, \\sigma^2 I)$; centres given or $N(0, s^2 I)$."""

    k: int = eqx.field(static=True)
    sigma: Float[Array, ""]
    spread: Float[Array, ""]
    centres: Float[Array, "k d"] | None = None

    def __call__(self, key, n, d, dtype=jnp.float32):
        k_centre, k_noise = jax.random.split(key)  # pyright: ignore[reportArgumentType]  (a random law is called with a key)
        if self.centres is None:
            centres = self.spread * jax.random.normal(k_centre, (self.k, d), dtype)
        else:
            centres = jnp.asarray(self.centres, dtype)
        return centres[jnp.arange(n) % self.k] + self.sigma * jax.random.normal(k_noise, (n, d), dtype)


class UniformCube(AbstractInitialCondition):
    """I.i.d. uniform in the cube $[\\mathrm{low}, \\mathrm{high}]^d$."""

    low: Float[Array, ""]
    high: Float[Array, ""]

    def __call__(self, key, n, d, dtype=jnp.float32):
        return jax.random.uniform(key, (n, d), dtype, self.low, self.high)  # pyright: ignore[reportArgumentType]  (a random law is called with a key)


class Given(AbstractInitialCondition):
    """A user array, the same for every member."""

    value: Float[Array, "n d"]

    def __call__(self, key, n, d, dtype=jnp.float32):
        return jnp.asarray(self.value, dtype)
