"""What is measured on a token configuration $X$ of shape `(n, d)`.

Every function takes one configuration; `jax.vmap` makes it act on many. `Recorder`
bundles the chosen metrics so the solver computes them at each saved time instead of
keeping every state.

The metrics that read every pair of tokens take `block`, with the rule of the attention
term (`SelfAttention.block`): `None` forms the $n \\times n$ Gram matrix whole up to
`attnflow.numerics._tiled.TILED_ABOVE` tokens and goes through it in tiles above, `0` always whole,
a positive number in tiles of that many tokens (memory $O(n \\cdot \\mathrm{block})$).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Bool, Float, Int, Scalar, ScalarLike

from ..schema._errors import ConfigError
from ..schema._metric_registry import DEFAULT_METRICS, METRICS, UserMetric
from . import _circle_metrics, _harmonic, _tiled
from ._geometry import Sphere
from ._terms import _contract, sinkhorn_log

# Up to this d the Gram matrix of the metrics is a sum of broadcast products (`gram`).
BROADCAST_GRAM_UP_TO = 8


def gram(x: Float[Array, "... n d"]) -> Float[Array, "... n n"]:
    """Inner products $\\langle x_i, x_j\\rangle$.

    Up to d = `BROADCAST_GRAM_UP_TO` they are a sum of d broadcast products rather than a
    matrix product: XLA then computes them inside the kernel that reads them (the
    comparison of the close pairs, a log-sum-exp) instead of writing the matrix out and
    reading it back, and the attention term's matrix product of the same state, no longer
    shared with the metrics, goes into the attention's own fused kernel. On the
    phase-diagram workload (n = 32, 2048 members, a 2-core CPU) the whole run took
    0.76-0.84x the time at d = 3 to 8 and 0.89x at d = 2, and 1.5x and 2.6x at d = 16
    and 32, where the product is the larger part (docs/performance.md).
    """
    d = x.shape[-1]
    if d > BROADCAST_GRAM_UP_TO:
        return _contract(x, x)
    return functools.reduce(operator.add, [x[..., :, None, k] * x[..., None, :, k] for k in range(d)])


def cosines(x: Float[Array, "n d"]) -> Float[Array, "n n"]:
    """$\\langle x_i, x_j\\rangle / (|x_i| |x_j|)$: inner products of the normalized tokens."""
    u = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    return gram(u)


def _log_energy(g: Float[Array, "n n"], beta: ScalarLike) -> Scalar:
    # log(2 beta n^2) as a sum of logs: n^2 overflows int32 from n = 46341 on.
    log_n = jnp.log(jnp.asarray(g.shape[0], g.dtype))
    return jax.nn.logsumexp(beta * g) - jnp.log(2 * beta) - 2 * log_n


def _log_energy_tiled(x: Float[Array, "n d"], beta: ScalarLike, tile: int) -> Scalar:
    log_n = jnp.log(jnp.asarray(x.shape[0], x.dtype))
    return _tiled.log_sum_exp_pairs(x, beta, tile) - jnp.log(2 * beta) - 2 * log_n


def log_interaction_energy(x: Float[Array, "n d"], beta: ScalarLike, block: int | None = None) -> Scalar:
    """$\\log E_\\beta$ with $E_\\beta = \\frac{1}{2\\beta n^2}\\sum_{ij} e^{\\beta\\langle x_i, x_j\\rangle}$
    ("A Survey of Continuous Time Dynamics of Transformers", eq. 29), by a log-sum-exp so that
    $\\beta = 10^4$ does not overflow."""
    tile = _tiled.resolve_block(x.shape[0], block)
    return _log_energy(gram(x), beta) if tile is None else _log_energy_tiled(x, beta, tile)


def interaction_energy(x: Float[Array, "n d"], beta: ScalarLike, block: int | None = None) -> Scalar:
    """$E_\\beta(X) = \\frac{1}{2\\beta n^2}\\sum_{ij} e^{\\beta\\langle x_i, x_j\\rangle}$ (the survey, eq. 29).

    Non-decreasing along the SA and USA flows with $Q = K = V = I$ (the survey, lemma 3.3).
    Overflows to `inf` once $\\beta$ passes the exponent range (about 88 in float32,
    709 in float64); `log_interaction_energy` never does.
    """
    return jnp.exp(log_interaction_energy(x, beta, block))


def sinkhorn_energy(x: Float[Array, "n d"], beta: ScalarLike, iterations: int = 200) -> Scalar:
    r"""$E^{\infty}_\beta(X) = -\tfrac12 \mathrm{OT}_{1/\beta}(\mu_X, \mu_X)$, minus half the
    entropic optimal transport cost of the tokens' empirical measure $\mu_X = \frac1n\sum_i
    \delta_{x_i}$ to itself, with cost $-\langle x, y\rangle$ and entropy weight $1/\beta$.

    At the symmetric Sinkhorn potential $u$ (the doubly stochastic $a_{ij} = e^{\beta\langle
    x_i, x_j\rangle + u_i + u_j}$) it is $-\frac1\beta \cdot \frac1n\sum_i (u_i + \frac12\log n)$,
    and its gradient is $\nabla_{x_i} E^\infty_\beta = \frac1n \sum_j a_{ij} x_j$: the Sinkhorn flow
    with $Q = K = V = I$ is its gradient ascent in $\mathbb{R}^d$, and the tangent-projected
    one on the sphere, so $E^\infty_\beta$ never decreases along either (Sinkformers, Sander et
    al. 2022, section 4: with a symmetric kernel and $W_V = W_Q^\top W_K$ the doubly stochastic
    dynamics is the Wasserstein gradient flow of this functional; softmax attention is not
    one). The potential is that of `iterations` alternations of `sinkhorn_log`.
    """
    scores = beta * gram(x)
    a_log = sinkhorn_log(scores, iterations)  # pyright: ignore[reportArgumentType]  (beta times a jax Array is a jax Array; numpy's stubs say ndarray)
    # The row and column potentials f_i + g_i = a_log_ii - scores_ii are 2 u_i (f - g is constant).
    potentials = jnp.diagonal(a_log) - jnp.diagonal(scores)
    log_n = jnp.log(jnp.asarray(x.shape[0], x.dtype))
    return -jnp.mean(potentials / 2 + log_n / 2) / beta


def _unit(x: Float[Array, "n d"]) -> Float[Array, "n d"]:
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def _normalized_energy_tiled(u: Float[Array, "n d"], tile: int) -> Scalar:
    n = u.shape[0]
    return _tiled.exp_sum_pairs(u, tile) / n / n


def normalized_energy(x: Float[Array, "n d"], block: int | None = None) -> Scalar:
    """$\\frac{1}{n^2}\\sum_{ij} \\exp(\\langle x_i, x_j\\rangle / |x_i||x_j|)$ for states off
    the sphere (the survey, eq. 52); on the sphere it is $2 E_1$."""
    tile = _tiled.resolve_block(x.shape[0], block)
    if tile is None:
        return jnp.mean(jnp.exp(cosines(x)))
    return _normalized_energy_tiled(_unit(x), tile)


def _pair_fraction(close: Bool[Array, "n n"], dtype) -> Scalar:
    """Fraction of the pairs i != j marked in `close` (1 for a single token)."""
    n = close.shape[0]
    if n < 2:
        return jnp.ones((), dtype)
    # Counted in floating point, per row (exact up to n = 2^24) and then over the rows: the
    # total n (n - 1) overflows int32 from n = 46341 on, and XLA's CPU backend sums floats
    # several times faster than integers. The diagonal is masked out by an index comparison,
    # which fuses into the count (a gather of the diagonal does not).
    index = jnp.arange(n)
    others = close & (index[:, None] != index[None, :])
    return jnp.sum(jnp.sum(others.astype(dtype), axis=1)) / (float(n) * float(n - 1))


def _pair_count_fraction(count: Scalar, n: int) -> Scalar:
    """A number of ordered pairs i != j over all n (n - 1) of them (1 for one token)."""
    return jnp.ones_like(count) if n < 2 else count / (float(n) * float(n - 1))


def pair_density(x: Float[Array, "n d"], eps: ScalarLike, block: int | None = None) -> Scalar:
    """Fraction of pairs $i \\ne j$ with $\\cos(x_i, x_j) > 1 - \\epsilon$.

    The quantity of the phase diagrams of "A mathematical perspective on transformers"
    (fig. 3-5). It is 1 once all tokens are in one cluster.
    """
    tile = _tiled.resolve_block(x.shape[0], block)
    if tile is None:
        return _pair_fraction(cosines(x) > 1 - eps, x.dtype)
    return _pair_count_fraction(_tiled.close_pair_count(_unit(x), 1 - eps, tile), x.shape[0])


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


def cluster_labels(x: Float[Array, "n d"], eps: ScalarLike, block: int | None = None) -> Int[Array, " n"]:
    """Connected components of the graph joining tokens with $\\cos > 1 - \\epsilon$: each
    token's label is the smallest token of its component."""
    tile = _tiled.resolve_block(x.shape[0], block)
    if tile is None:
        return _labels(cosines(x) > 1 - eps)
    return _tiled.components(_unit(x), 1 - eps, tile)


def cluster_count(x: Float[Array, "n d"], eps: ScalarLike, block: int | None = None) -> Int[Array, ""]:
    """Number of connected components of the $\\epsilon$-threshold graph."""
    return _count(cluster_labels(x, eps, block))


def cluster_sizes(x: Float[Array, "n d"], eps: ScalarLike, block: int | None = None) -> Int[Array, " n"]:
    """Sizes of the clusters, largest first, padded with zeros to length n."""
    return _sizes(cluster_labels(x, eps, block))


def _order(x: Float[Array, "n d"], inv_norm: Float[Array, " n"]) -> Scalar:
    return jnp.linalg.norm(jnp.mean(x * inv_norm[:, None], axis=0))


def order_parameter(x: Float[Array, "n d"]) -> Scalar:
    """$|\\frac1n \\sum_i x_i / |x_i||$: 1 for a single cluster, about $n^{-1/2}$ when spread."""
    return _order(x, 1 / jnp.linalg.norm(x, axis=-1))


RANK_METHODS = ("pivoted_qr", "svd")


def numerical_rank(
    a: Float[Array, "n n"], rtol: ScalarLike | None = None, *, method: str = "pivoted_qr"
) -> Int[Array, ""]:
    """The numerical rank of `a`: how many of its singular values exceed `rtol * s_max`
    (NumPy's default `rtol = n * eps`).

    `method="svd"` counts the singular values themselves. `"pivoted_qr"` (the default,
    a quarter of the cost on a CPU: benchmarks/layout.py) counts the diagonal entries of
    the QR factorization with column pivoting $A P = Q R$ above `rtol * |R_11|`. Its
    $|R_{11}|$, the largest column norm, lies within a factor $\\sqrt n$ of $s_{\\max}$
    and the pivoting orders $|R_{kk}|$ like the singular values, so the count is the
    SVD's wherever the singular values are either well above the threshold or at
    rounding level: matrices of rank r (up to rounding), such as the near-Boolean
    attention maps of clustered tokens. A singular value within a factor of about
    $\\sqrt n$ of the threshold may be counted differently by the two.
    """
    if rtol is None:
        rtol = max(a.shape) * jnp.finfo(a.dtype).eps
    if method == "svd":
        s = jnp.linalg.svd(a, compute_uv=False)
    elif method == "pivoted_qr":
        from jax.scipy.linalg import qr  # lazy: start-up (jax.scipy loads for this metric only)

        s = jnp.abs(jnp.diagonal(qr(a, mode="r", pivoting=True)[0]))
    else:
        raise ConfigError(f"unknown rank method {method!r}; choose one of {', '.join(RANK_METHODS)}.")
    return jnp.sum(s > rtol * s[0])  # pyright: ignore[reportOptionalOperand]  (a None rtol was replaced above)


# Query rows whose attention is recorded when the map is too large to keep whole.
ATTENTION_ROWS = 64


def attention_rows(n: int, block: int | None) -> np.ndarray | None:
    """The query rows of the `attention` metric at `n` tokens: None (all of them) where the
    pairwise statistics are formed whole, else `ATTENTION_ROWS` rows evenly spaced from the
    first to the last token (where they go through tiles, see `Recorder`)."""
    if _tiled.resolve_block(n, block) is None:
        return None
    return np.unique(np.round(np.linspace(0, n - 1, min(ATTENTION_ROWS, n))).astype(np.int32))


def _attention_weights(field, t: ScalarLike, x: Float[Array, "n d"], rows) -> Array:
    """The attention maps of the field's first attention term for the query `rows`, at the
    tokens it sees (`VectorField.attention_weights`, restricted to some rows)."""
    h = field.norm(x) if field.scheme in ("pre", "peri") else x
    for term in field.terms:
        if hasattr(term, "weights"):  # a term with attention matrices
            return term.weights(t, h, field.piece_time, rows=jnp.asarray(rows))
    raise ConfigError("attention metrics need an attention term in the vector field.")


def source_tokens(field, *, required: bool = True) -> Array | None:
    """The source tokens of the field's cross-attention term (the first term that has
    them), or None when it has none and they are not `required`."""
    for term in () if field is None else field.terms:
        source = getattr(term, "source", None)
        if source is not None:
            return source
    if required:
        raise ConfigError("the metrics of the target against the source need a cross-attention term in the field.")
    return None


class Pairs:
    """What the metrics of one state share, each computed on first use: the Gram
    matrix, the cosines, the close pairs, the cluster labels, the attention maps. There
    is one method per metric of `attnflow.schema._metric_registry.METRICS`, of the same name;
    with `tile` set, each goes through tiles of the Gram matrix (no n x n array, see
    `attnflow.numerics._tiled`). With `on_circle` (unit tokens on the circle, d = 2) the
    pair density and the clusters come from the sorted angles instead (`attnflow.numerics._circle_metrics`,
    $O(n \\log n)$). Built while tracing a `Recorder` call: the cache is Python's."""

    def __init__(
        self,
        t,
        x,
        field,
        *,
        beta,
        eps,
        tile: int | None,
        block: int | None,
        rank_rtol,
        on_circle: bool = False,
        energy_degree: int = 0,
    ):
        self.t, self.x, self.field = t, x, field
        self.beta, self.eps, self.tile, self.block, self.rank_rtol = beta, eps, tile, block, rank_rtol
        self.n = x.shape[0]
        self.on_circle, self.energy_degree = on_circle, energy_degree
        if on_circle and x.shape[-1] != 2:
            raise ConfigError(
                f"the metrics from sorted angles need tokens on the circle (d = 2), not d = {x.shape[-1]}."
            )
        # Unit rows on the sphere (the solver retracts every saved state): inner products are cosines.
        self.on_sphere = field is not None and isinstance(field.geometry, Sphere)

    @functools.cached_property
    def gram(self) -> Float[Array, "n n"]:
        return gram(self.x)

    @functools.cached_property
    def inv_norm(self) -> Float[Array, " n"]:
        if self.on_sphere:
            return jnp.ones(self.n, self.x.dtype)
        if self.tile is None:
            return lax.rsqrt(jnp.diagonal(self.gram))
        return lax.rsqrt(jnp.sum(self.x * self.x, axis=-1))

    @functools.cached_property
    def cosines(self) -> Float[Array, "n n"]:
        if self.on_sphere:
            return self.gram
        return self.gram * self.inv_norm[:, None] * self.inv_norm[None, :]

    @functools.cached_property
    def unit(self) -> Float[Array, "n d"]:
        return self.x if self.on_sphere else self.x * self.inv_norm[:, None]

    @functools.cached_property
    def close(self) -> Bool[Array, "n n"]:
        return self.cosines > 1 - self.eps

    @functools.cached_property
    def labels(self) -> Int[Array, " n"]:
        if self.on_circle:
            return _circle_metrics.cluster_labels(self.x, self.eps)
        if self.tile is None:
            return _labels(self.close)
        return _tiled.components(self.unit, 1 - self.eps, self.tile)

    @functools.cached_property
    def maps(self) -> Array:
        if self.tile is None:
            return self.field.attention_weights(self.t, self.x)
        return _attention_weights(self.field, self.t, self.x, attention_rows(self.n, self.block))

    def log_energy(self) -> Scalar:
        if self.energy_degree:  # unit tokens, by harmonic summation (O(n L) or O(n L^2))
            log_n = jnp.log(jnp.asarray(self.n, self.x.dtype))
            return _harmonic.log_pair_sum(self.x, self.beta, self.energy_degree) - jnp.log(2 * self.beta) - 2 * log_n
        if self.tile is None:
            return _log_energy(self.gram, self.beta)
        return _log_energy_tiled(self.x, self.beta, self.tile)

    def energy(self) -> Scalar:
        return jnp.exp(self._log_e)

    @functools.cached_property
    def _log_e(self) -> Scalar:
        return self.log_energy()

    def normalized_energy(self) -> Scalar:
        if self.tile is None:
            return jnp.mean(jnp.exp(self.cosines))
        return _normalized_energy_tiled(self.unit, self.tile)

    def pair_density(self) -> Scalar:
        if self.on_circle:
            return _pair_count_fraction(_circle_metrics.close_pair_count(self.x, self.eps), self.n)
        if self.tile is None:
            return _pair_fraction(self.close, self.x.dtype)
        return _pair_count_fraction(_tiled.close_pair_count(self.unit, 1 - self.eps, self.tile), self.n)

    def clusters(self) -> Int[Array, ""]:
        return _count(self.labels)

    def cluster_sizes(self) -> Int[Array, " n"]:
        return _sizes(self.labels)

    def order_parameter(self) -> Scalar:
        return _order(self.x, self.inv_norm)

    @functools.cached_property
    def source_unit(self) -> Float[Array, "m d"]:
        """The source tokens of the field's cross-attention, as unit vectors."""
        source = source_tokens(self.field)
        assert source is not None  # required: source_tokens raised otherwise
        return source * lax.rsqrt(jnp.sum(source * source, axis=-1, keepdims=True))

    @functools.cached_property
    def source_cosines(self) -> Float[Array, "n m"]:
        """cos(y_i, x_j) of the target tokens against the source tokens."""
        return self.unit @ self.source_unit.T

    def source_capture(self) -> Scalar:
        return jnp.mean((jnp.max(self.source_cosines, axis=-1) > 1 - self.eps).astype(self.x.dtype))

    def nearest_source(self) -> Int[Array, " n"]:
        # A source token's cluster label: the lowest index of the source tokens within eps of it.
        unit = self.source_unit
        label = jnp.argmax(unit @ unit.T > 1 - self.eps, axis=-1)  # the first True: never empty (the diagonal)
        return label[jnp.argmax(self.source_cosines, axis=-1)].astype(jnp.int32)

    def attention(self) -> Array:
        return self.maps

    def marginal_error(self) -> Scalar:
        return jnp.max(jnp.abs(jnp.sum(self.maps, axis=-2) - 1))

    def attention_rank(self) -> Int[Array, " heads"]:
        return jax.vmap(lambda ah: numerical_rank(ah, self.rank_rtol))(self.maps).astype(jnp.int32)


class Recorder(eqx.Module):
    r"""The statistics saved at each output time: a function `(t, x, field) -> dict`.

    `beta` enters the interaction energy, `eps` the clustering threshold; both are data.
    The key `finite` (whether the state's squared norm is finite) is always recorded so
    that a run can say when a state first became NaN or infinite.

    `block` follows the rule of the attention term (`SelfAttention.block`). Where it
    means tiles, every pairwise metric goes through tiles (memory $O(n \\cdot
    \\mathrm{block})$), `attention` holds the rows of `attention_rows` only, and
    `attention_rank`, which needs whole maps, is refused.

    `on_circle` says that the tokens lie on the circle (d = 2, on the sphere): the pair
    density, the clusters and the cluster sizes then come from the sorted angles in
    $O(n \\log n)$ time and $O(n)$ memory (`attnflow.numerics._circle_metrics`), whatever `block` says.
    The caller guarantees the sphere; d other than 2 is refused.

    `energy_degree` (0: off) says that the tokens are unit vectors in d = 2 or 3: the
    interaction energy and its log then come from harmonic summation to that degree
    (`attnflow.numerics._harmonic.log_pair_sum`, with `summation=harmonic`).
    """

    beta: Float[Array, ""]
    eps: Float[Array, ""]
    metrics: tuple[str, ...] = eqx.field(static=True, default=DEFAULT_METRICS)
    save_states: bool = eqx.field(static=True, default=False)
    rank_rtol: float | None = eqx.field(static=True, default=None)
    block: int | None = eqx.field(static=True, default=None)
    custom: tuple[UserMetric, ...] = eqx.field(static=True, default=())
    config: Any = eqx.field(static=True, default=None)
    on_circle: bool = eqx.field(static=True, default=False)
    energy_degree: int = eqx.field(static=True, default=0)

    def __check_init__(self):
        unknown = [m for m in self.metrics if m not in METRICS]
        if unknown:
            raise ConfigError(f"unknown metric(s) {', '.join(unknown)}; choose from {', '.join(METRICS)}.")

    def __call__(self, t: ScalarLike, x: Float[Array, "n d"], field=None) -> dict[str, Array]:
        # A NaN or inf anywhere makes the sum of squares non-finite (so does |x|^2
        # overflowing, past which no inner product is meaningful). It shares its pass
        # over the state with the retraction, unlike an elementwise isfinite().
        out: dict[str, Array] = {"finite": jnp.isfinite(jnp.sum(x * x))}
        n = x.shape[0]
        tile = _tiled.resolve_block(n, self.block)
        pairs = Pairs(
            t,
            x,
            field,
            beta=self.beta,
            eps=self.eps,
            tile=tile,
            block=self.block,
            rank_rtol=self.rank_rtol,
            on_circle=self.on_circle,
            energy_degree=self.energy_degree,
        )
        for name in METRICS:  # the registry's order, whatever the config's
            if name not in self.metrics:
                continue
            if tile is not None and not METRICS[name].tiled:
                raise ConfigError(
                    f"{name} needs the whole {n} x {n} attention maps, which are not formed at "
                    f"n = {n} (tiles of {tile}); drop the metric or set attention_block=0 (dense)."
                )
            out[name] = getattr(pairs, name)()
        for metric in self.custom:  # a researcher's own (`attnflow.metric`), by its name
            if metric.takes_context:
                context = MetricContext(t=t, beta=self.beta, eps=self.eps, field=field, config=self.config)
                out[metric.name] = jnp.asarray(metric.function(x, context))
            else:
                out[metric.name] = jnp.asarray(metric.function(x))
        if self.save_states:
            out["x"] = x
            source = source_tokens(field, required=False)
            if source is not None:
                out["source_x"] = source
        return out


@dataclasses.dataclass(frozen=True)
class MetricContext:
    """What a researcher's metric `f(x, context)` may read besides the tokens (see
    `attnflow.metric`): the time `t` of the record, `beta`, the clustering threshold
    `eps` (the config's `cluster_eps`), the member's vector field `field` (its terms, `field.attention_weights(t, x)`)
    and the run's config `config` (an `attnflow.Config`; None outside a configured run)."""

    t: Any
    beta: Any
    eps: Any
    field: Any
    config: Any
