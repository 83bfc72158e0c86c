"""The clustering metrics of tokens on the unit circle from their sorted angles, in $O(n \\log n)$.

On the circle ($d = 2$) the cosine of two tokens is the cosine of their angular distance, so
$\\cos(x_i, x_j) > 1 - \\epsilon$ says that the circular distance between their angles is below
$r = \\arccos(1 - \\epsilon)$. Sorted by angle:

- the tokens close to token $i$ are those whose angle lies in the open interval
  $(\\theta_i - r, \\theta_i + r)$: two binary searches in the sorted angles extended by
  $\\mp 2\\pi$ (the wrap-around) count them;
- the connected components of the graph $\\cos > 1 - \\epsilon$ (single linkage) are the runs
  of sorted tokens whose consecutive gaps are below $r$, the gap from the last sorted token
  round to the first included: two tokens closer than $r$ have every gap between them on the
  shorter arc below $r$.

Neither forms an $n \\times n$ array (memory $O(n)$). They equal the dense metrics of
`attnflow.numerics._metrics` except for pairs at the threshold itself: the dense path
compares the rounded cosine with $1 - \\epsilon$, these the rounded angles with the rounded
$r$, so a pair whose distance is within rounding of $r$ may be counted by one and not the
other.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jaxtyping import Array, Float, Int, Scalar, ScalarLike


def _radius(x: Float[Array, "n 2"], eps: ScalarLike) -> Float[Array, ""]:
    """The angular distance $r = \\arccos(1 - \\epsilon)$ below which two tokens are close; infinite
    where $1 - \\epsilon < -1$ (every pair is close, antipodal ones included)."""
    threshold = 1 - jnp.asarray(eps, x.dtype)
    return jnp.where(threshold < -1, jnp.inf, jnp.arccos(jnp.clip(threshold, -1, 1)))


def angles(x: Float[Array, "n 2"]) -> Float[Array, " n"]:
    """The angle of each token in $[-\\pi, \\pi]$ (its norm does not matter)."""
    assert x.shape[-1] == 2, f"tokens on the circle have d = 2, not {x.shape[-1]}"
    return jnp.arctan2(x[:, 1], x[:, 0])


def close_pairs_per_token(x: Float[Array, "n 2"], eps: ScalarLike) -> Int[Array, " n"]:
    """For each token $i$, how many tokens $j \\ne i$ have $\\cos(x_i, x_j) > 1 - \\epsilon$
    (int32: at most $n - 1$)."""
    n = x.shape[0]
    theta = angles(x)
    ordered = jnp.sort(theta)
    extended = jnp.concatenate([ordered - 2 * math.pi, ordered, ordered + 2 * math.pi])
    # An open interval no longer than 2 pi holds at most one copy of each token.
    r = jnp.minimum(_radius(x, eps), math.pi)
    inside = jnp.searchsorted(extended, theta + r, side="left") - jnp.searchsorted(extended, theta - r, side="right")
    count = jnp.maximum(inside.astype(jnp.int32) - 1, 0)  # less the token itself (inside once r > 0)
    return jnp.where(jnp.isinf(_radius(x, eps)), n - 1, count)


def close_pair_count(x: Float[Array, "n 2"], eps: ScalarLike) -> Scalar:
    """The number of ordered pairs $i \\ne j$ with $\\cos(x_i, x_j) > 1 - \\epsilon$, in the
    dtype of `x` (counted per token, then summed in floating point: $n(n - 1)$ overflows
    int32 from $n = 46341$ on)."""
    return jnp.sum(close_pairs_per_token(x, eps).astype(x.dtype))


def cluster_labels(x: Float[Array, "n 2"], eps: ScalarLike) -> Int[Array, " n"]:
    """Each token's label, in the tokens' order: the smallest token of its connected component
    in the graph $\\cos > 1 - \\epsilon$, as `attnflow.numerics._metrics.cluster_labels`."""
    n = x.shape[0]
    index = jnp.arange(n)
    theta = angles(x)
    order = jnp.argsort(theta).astype(index.dtype)
    ordered = theta[order]
    r = _radius(x, eps)
    # Sorted token k + 1 starts a new run where its gap to sorted token k is not below r.
    starts = jnp.diff(ordered) >= r
    run = jnp.concatenate([jnp.zeros(1, index.dtype), jnp.cumsum(starts, dtype=index.dtype)])
    # The gap from the last sorted token round to the first joins the last run to the first.
    wraps = ordered[0] + 2 * math.pi - ordered[-1] < r
    run = jnp.where(wraps & (run == run[-1]), 0, run)
    smallest = jnp.full(n, n, index.dtype).at[run].min(order)
    return jnp.zeros(n, index.dtype).at[order].set(smallest[run])
