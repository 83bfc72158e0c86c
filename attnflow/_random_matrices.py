"""Random weight matrices, drawn per head.

Scalings are chosen so that the spectrum stays of order one as d grows:
Gaussian (Ginibre) entries have variance $1/d$, GOE matrices $(G + G^T)/\\sqrt{2d}$
have a semicircle on $[-2, 2]$, Wishart matrices $G G^T / d$ are positive
semi-definite with a Marchenko-Pastur spectrum on $[0, 4]$.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray, ScalarLike

LAWS = ("gaussian", "goe", "wishart", "orthogonal")


def gaussian(key: PRNGKeyArray, shape: tuple[int, ...], dtype=jnp.float32) -> Array:
    """Ginibre matrices: i.i.d. $N(0, 1/d)$ entries, $d$ the last axis (the input size)."""
    return jax.random.normal(key, shape, dtype) / jnp.sqrt(jnp.asarray(shape[-1], dtype))


def goe(key: PRNGKeyArray, shape: tuple[int, ...], dtype=jnp.float32) -> Array:
    """Gaussian orthogonal ensemble $(G + G^T)/\\sqrt{2d}$ (square matrices)."""
    g = jax.random.normal(key, shape, dtype)
    return (g + jnp.swapaxes(g, -1, -2)) / jnp.sqrt(jnp.asarray(2 * shape[-1], dtype))


def wishart(key: PRNGKeyArray, shape: tuple[int, ...], dtype=jnp.float32) -> Array:
    """Positive semi-definite $G G^T / d$ with $G$ of the given (square) shape."""
    g = jax.random.normal(key, shape, dtype)
    return g @ jnp.swapaxes(g, -1, -2) / jnp.asarray(shape[-1], dtype)


def orthogonal(key: PRNGKeyArray, shape: tuple[int, ...], dtype=jnp.float32) -> Array:
    """Haar-distributed orthogonal matrices (QR of a Gaussian with sign correction)."""
    g = jax.random.normal(key, shape, dtype)
    q, r = jnp.linalg.qr(g)
    return q * jnp.sign(jnp.diagonal(r, axis1=-2, axis2=-1))[..., None, :]


def draw_matrix(law: str, key: PRNGKeyArray, shape: tuple[int, ...], scale: ScalarLike = 1.0,
         dtype=jnp.float32) -> Array:
    """Draw one array of `shape` (leading axes are heads) from the named `law`, times `scale`."""
    sampler = {"gaussian": gaussian, "goe": goe, "wishart": wishart, "orthogonal": orthogonal}[law]
    return jnp.asarray(scale, dtype) * sampler(key, shape, dtype)
