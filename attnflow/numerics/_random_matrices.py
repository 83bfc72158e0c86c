"""Random weight matrices, drawn per head, with the scales of the literature they reproduce.

$G$, $G_1$, $G_2$ have i.i.d. standard normal entries; $d$ is the size of the last axis
(the input size). For a matrix $B$ used as the bilinear form $Q^\\top K$ of the logits,
$\\langle Q x, K y\\rangle = x^\\top B y$, the logit of two unit tokens has variance
$\\sum_{ab} \\mathrm{Var}(B_{ab})\\, x_a^2 y_b^2$ when the entries are uncorrelated, which
is what the table of docs/model.md (section 7) lists for every law:

- `gaussian` (Ginibre): entries $N(0, 1/d)$; circular law on the unit disk; as $Q^\\top K$
  with both Ginibre the logits have variance $1/d$.
- `product`: $G_1 G_2 / \\sqrt d$, the bilinear form of "A mathematical perspective on
  Transformers" (fig. 5); entries of variance 1, logits of variance exactly 1.
- `goe`: $(G + G^\\top)/\\sqrt 2$, off-diagonal entries of variance 1 and diagonal of
  variance 2 (the same paper's GOE); semicircle on $[-2\\sqrt d, 2\\sqrt d]$; logits of
  variance $1 + \\langle x, y\\rangle^2$.
- `wishart`: $G G^\\top / \\sqrt d$, positive semi-definite, mean $\\sqrt d\\, I$,
  Marchenko-Pastur spectrum on $[0, 4\\sqrt d]$ (the same paper's random V).
- `orthogonal`: Haar-distributed.

Any other scale is the explicit `scale` factor of a schedule.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray, ScalarLike

LAWS = ("gaussian", "product", "goe", "wishart", "orthogonal")


def gaussian(key: PRNGKeyArray, shape: tuple[int, ...], dtype=jnp.float32) -> Array:
    """Ginibre matrices: i.i.d. $N(0, 1/d)$ entries, $d$ the last axis (the input size)."""
    return jax.random.normal(key, shape, dtype) / jnp.sqrt(jnp.asarray(shape[-1], dtype))


def product(key: PRNGKeyArray, shape: tuple[int, ...], dtype=jnp.float32) -> Array:
    """$G_1 G_2 / \\sqrt d$ (square matrices): entries of variance 1, the law of $Q^\\top K$
    in the phase diagrams of "A mathematical perspective on Transformers" (fig. 5)."""
    k1, k2 = jax.random.split(key)
    g1, g2 = jax.random.normal(k1, shape, dtype), jax.random.normal(k2, shape, dtype)
    return g1 @ g2 / jnp.sqrt(jnp.asarray(shape[-1], dtype))


def goe(key: PRNGKeyArray, shape: tuple[int, ...], dtype=jnp.float32) -> Array:
    """Gaussian orthogonal ensemble $(G + G^\\top)/\\sqrt 2$ (square matrices): off-diagonal
    entries of variance 1, diagonal entries of variance 2."""
    g = jax.random.normal(key, shape, dtype)
    return (g + jnp.swapaxes(g, -1, -2)) / jnp.sqrt(jnp.asarray(2.0, dtype))


def wishart(key: PRNGKeyArray, shape: tuple[int, ...], dtype=jnp.float32) -> Array:
    """Positive semi-definite $G G^\\top / \\sqrt d$ with $G$ of the given (square) shape:
    mean $\\sqrt d\\, I$."""
    g = jax.random.normal(key, shape, dtype)
    return g @ jnp.swapaxes(g, -1, -2) / jnp.sqrt(jnp.asarray(shape[-1], dtype))


def orthogonal(key: PRNGKeyArray, shape: tuple[int, ...], dtype=jnp.float32) -> Array:
    """Haar-distributed orthogonal matrices (QR of a Gaussian with sign correction)."""
    g = jax.random.normal(key, shape, dtype)
    q, r = jnp.linalg.qr(g)
    return q * jnp.sign(jnp.diagonal(r, axis1=-2, axis2=-1))[..., None, :]


_SAMPLERS = {"gaussian": gaussian, "product": product, "goe": goe, "wishart": wishart, "orthogonal": orthogonal}
# Laws defined for square matrices only (the others allow any shape).
SQUARE_LAWS = ("product", "goe", "wishart", "orthogonal")


def draw_matrix(
    law: str, key: PRNGKeyArray, shape: tuple[int, ...], scale: ScalarLike = 1.0, dtype=jnp.float32
) -> Array:
    """Draw one array of `shape` (leading axes are heads) from the named `law`, times `scale`."""
    return jnp.asarray(scale, dtype) * _SAMPLERS[law](key, shape, dtype)
