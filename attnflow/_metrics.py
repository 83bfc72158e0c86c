"""What is measured on a token configuration $X$ of shape `(n, d)`.

Every function takes one configuration; `jax.vmap` makes it act on many. `Recorder`
bundles the chosen metrics so the solver computes them at each saved time instead of
keeping every state.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Bool, Float, Int, Scalar, ScalarLike

from ._errors import ConfigError
from ._geometry import Sphere
from ._terms import _contract


def gram(x: Float[Array, "n d"]) -> Float[Array, "n n"]:
    """Inner products $\\langle x_i, x_j\\rangle$."""
    return _contract(x, x)


def cosines(x: Float[Array, "n d"]) -> Float[Array, "n n"]:
    """$\\langle x_i, x_j\\rangle / (|x_i| |x_j|)$: inner products of the normalized tokens."""
    u = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    return gram(u)


def _log_energy(g: Float[Array, "n n"], beta: ScalarLike) -> Scalar:
    # log(2 beta n^2) as a sum of logs: n^2 overflows int32 from n = 46341 on.
    log_n = jnp.log(jnp.asarray(g.shape[0], g.dtype))
    return jax.nn.logsumexp(beta * g) - jnp.log(2 * beta) - 2 * log_n


def log_interaction_energy(x: Float[Array, "n d"], beta: ScalarLike) -> Scalar:
    """$\\log E_\\beta$ with $E_\\beta = \\frac{1}{2\\beta n^2}\\sum_{ij} e^{\\beta\\langle x_i, x_j\\rangle}$
    ("A Survey of Continuous Time Dynamics of Transformers", eq. 29), by a log-sum-exp so that $\\beta = 10^4$ does not overflow."""
    return _log_energy(gram(x), beta)


def interaction_energy(x: Float[Array, "n d"], beta: ScalarLike) -> Scalar:
    """$E_\\beta(X) = \\frac{1}{2\\beta n^2}\\sum_{ij} e^{\\beta\\langle x_i, x_j\\rangle}$ (the survey, eq. 29).

    Non-decreasing along the SA and USA flows with $Q = K = V = I$ (the survey, lemma 3.3).
    Overflows to `inf` once $\\beta$ passes the exponent range (about 88 in float32,
    709 in float64); `log_interaction_energy` never does.
    """
    return jnp.exp(log_interaction_energy(x, beta))


def normalized_energy(x: Float[Array, "n d"]) -> Scalar:
    """$\\frac{1}{n^2}\\sum_{ij} \\exp(\\langle x_i, x_j\\rangle / |x_i||x_j|)$ for states off
    the sphere (the survey, eq. 52); on the sphere it is $2 E_1$."""
    return jnp.mean(jnp.exp(cosines(x)))


def _pair_fraction(close: Bool[Array, "n n"], dtype) -> Scalar:
    """Fraction of the pairs i != j marked in `close` (1 for a single token)."""
    n = close.shape[0]
    if n < 2:
        return jnp.ones((), dtype)
    # Counted per row (at most n - 1 < 2^31 each), then summed in floating point: the
    # total n (n - 1) overflows int32 from n = 46341 on.
    per_row = jnp.sum(close, axis=1, dtype=jnp.int32) - jnp.diagonal(close).astype(jnp.int32)
    return jnp.sum(per_row.astype(dtype)) / (float(n) * float(n - 1))


def pair_density(x: Float[Array, "n d"], eps: ScalarLike) -> Scalar:
    """Fraction of pairs $i \\ne j$ with $\\cos(x_i, x_j) > 1 - \\epsilon$.

    The quantity of the phase diagrams of "A mathematical perspective on transformers"
    (fig. 3-5). It is 1 once all tokens are in one cluster.
    """
    return _pair_fraction(cosines(x) > 1 - eps, x.dtype)


def _components(adjacency: Bool[Array, "n n"]) -> Int[Array, " n"]:
    """Label of each vertex: the smallest vertex of its connected component.

    Min-label propagation with pointer jumping; converges in $O(\\log n)$ rounds on
    typical graphs and at most $n$ rounds on any.
    """
    n = adjacency.shape[0]

    def step(state):
        labels, _ = state
        new = jnp.min(jnp.where(adjacency, labels[None, :], n), axis=1)
        new = new[new]
        return new, jnp.any(new != labels)

    labels, _ = lax.while_loop(lambda s: s[1], step, (jnp.arange(n), jnp.array(True)))
    return labels


def _labels(close: Bool[Array, "n n"]) -> Int[Array, " n"]:
    return _components(close | jnp.eye(close.shape[0], dtype=bool))


def _count(labels: Int[Array, " n"]) -> Int[Array, ""]:
    return jnp.sum(labels == jnp.arange(labels.shape[0])).astype(jnp.int32)


def _sizes(labels: Int[Array, " n"]) -> Int[Array, " n"]:
    sizes = jnp.zeros(labels.shape[0], jnp.int32).at[labels].add(1)
    return -jnp.sort(-sizes)


def cluster_labels(x: Float[Array, "n d"], eps: ScalarLike) -> Int[Array, " n"]:
    """Connected components of the graph joining tokens with $\\cos > 1 - \\epsilon$."""
    return _labels(cosines(x) > 1 - eps)


def cluster_count(x: Float[Array, "n d"], eps: ScalarLike) -> Int[Array, ""]:
    """Number of connected components of the $\\epsilon$-threshold graph."""
    return _count(cluster_labels(x, eps))


def cluster_sizes(x: Float[Array, "n d"], eps: ScalarLike) -> Int[Array, " n"]:
    """Sizes of the clusters, largest first, padded with zeros to length n."""
    return _sizes(cluster_labels(x, eps))


def _order(x: Float[Array, "n d"], inv_norm: Float[Array, " n"]) -> Scalar:
    return jnp.linalg.norm(jnp.mean(x * inv_norm[:, None], axis=0))


def order_parameter(x: Float[Array, "n d"]) -> Scalar:
    """$|\\frac1n \\sum_i x_i / |x_i||$: 1 for a single cluster, about $n^{-1/2}$ when spread."""
    return _order(x, 1 / jnp.linalg.norm(x, axis=-1))


def numerical_rank(a: Float[Array, "n n"], rtol: ScalarLike | None = None) -> Int[Array, ""]:
    """Number of singular values above `rtol * s_max` (NumPy's default `rtol = n * eps`)."""
    s = jnp.linalg.svd(a, compute_uv=False)
    if rtol is None:
        rtol = max(a.shape) * jnp.finfo(a.dtype).eps
    return jnp.sum(s > rtol * s[0])


METRICS = (
    "energy",
    "log_energy",
    "normalized_energy",
    "pair_density",
    "clusters",
    "cluster_sizes",
    "order_parameter",
    "attention",
    "attention_rank",
)
DEFAULT_METRICS = ("energy", "log_energy", "pair_density", "clusters", "order_parameter")


class Recorder(eqx.Module):
    """The statistics saved at each output time: a function `(t, x, field) -> dict`.

    `beta` enters the interaction energy, `eps` the clustering threshold; both are data.
    The key `finite` (whether the state's squared norm is finite) is always recorded so
    that a run can say when a state first became NaN or infinite.
    """

    beta: Float[Array, ""]
    eps: Float[Array, ""]
    metrics: tuple[str, ...] = eqx.field(static=True, default=DEFAULT_METRICS)
    save_states: bool = eqx.field(static=True, default=False)
    rank_rtol: float | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        unknown = [m for m in self.metrics if m not in METRICS]
        if unknown:
            raise ConfigError(f"unknown metric(s) {', '.join(unknown)}; choose from {', '.join(METRICS)}.")

    def __call__(self, t: ScalarLike, x: Float[Array, "n d"], field=None) -> dict[str, Array]:
        # A NaN or inf anywhere makes the sum of squares non-finite (so does |x|^2
        # overflowing, past which no inner product is meaningful). It shares its pass
        # over the state with the retraction, unlike an elementwise isfinite().
        out: dict[str, Array] = {"finite": jnp.isfinite(jnp.sum(x * x))}
        m = set(self.metrics)
        n = x.shape[0]
        # One Gram matrix serves every metric: cosines are its normalized entries.
        g = gram(x)
        if field is not None and isinstance(field.geometry, Sphere):
            # Unit rows (the solver retracts every saved state): inner products are cosines.
            inv_norm = jnp.ones(n, x.dtype)
            cos = g
        else:
            inv_norm = lax.rsqrt(jnp.diagonal(g))
            cos = g * inv_norm[:, None] * inv_norm[None, :]
        if m & {"energy", "log_energy"}:
            log_e = _log_energy(g, self.beta)
            if "energy" in m:
                out["energy"] = jnp.exp(log_e)
            if "log_energy" in m:
                out["log_energy"] = log_e
        if "normalized_energy" in m:
            out["normalized_energy"] = jnp.mean(jnp.exp(cos))
        if m & {"pair_density", "clusters", "cluster_sizes"}:
            close = cos > 1 - self.eps
            if "pair_density" in m:
                out["pair_density"] = _pair_fraction(close, x.dtype)
            if m & {"clusters", "cluster_sizes"}:
                labels = _labels(close)
                if "clusters" in m:
                    out["clusters"] = _count(labels)
                if "cluster_sizes" in m:
                    out["cluster_sizes"] = _sizes(labels)
        if "order_parameter" in m:
            out["order_parameter"] = _order(x, inv_norm)
        if m & {"attention", "attention_rank"}:
            a = field.attention_weights(t, x)
            if "attention" in m:
                out["attention"] = a
            if "attention_rank" in m:
                out["attention_rank"] = jax.vmap(lambda ah: numerical_rank(ah, self.rank_rtol))(a).astype(jnp.int32)
        if self.save_states:
            out["x"] = x
        return out
