"""Where the tokens live: the unit sphere or flat space.

A geometry is a small object passed to the solver and the metrics. It acts row-wise
on a state of shape `(n, d)` (one row per token).
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float


class AbstractGeometry(eqx.Module):
    """The manifold that each token lives on."""

    @abc.abstractmethod
    def project(self, x: Float[Array, "n d"], v: Float[Array, "n d"]) -> Float[Array, "n d"]:
        """Orthogonal projection of `v[i]` onto the tangent space at `x[i]`."""

    @abc.abstractmethod
    def retract(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        """Map a point near the manifold back onto it."""

    @abc.abstractmethod
    def distance(self, x: Float[Array, "n d"], y: Float[Array, "n d"]) -> Float[Array, " n"]:
        """The distance between `x[i]` and `y[i]` along the manifold."""


class Sphere(AbstractGeometry):
    """The unit sphere $S^{d-1}$: $P_x(v) = v - \\langle x, v\\rangle x$, retraction $x/|x|$."""

    def project(self, x, v):
        return v - jnp.sum(x * v, axis=-1, keepdims=True) * x

    def retract(self, x):
        return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True))

    def distance(self, x, y):
        # arctan2 of |x ^ y| and <x, y> stays accurate for nearly equal points, where
        # arccos(<x, y>) loses half the digits.
        cross = jnp.linalg.norm(x[..., :, None] * y[..., None, :] - y[..., :, None] * x[..., None, :], axis=(-2, -1))
        return jnp.arctan2(cross / jnp.sqrt(2.0), jnp.sum(x * y, axis=-1))


class Euclidean(AbstractGeometry):
    """Flat $\\mathbb{R}^d$: projection and retraction are the identity."""

    def project(self, x, v):
        return v

    def retract(self, x):
        return x

    def distance(self, x, y):
        return jnp.linalg.norm(x - y, axis=-1)
