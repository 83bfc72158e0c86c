"""The terms of the vector field: self-attention, the MLP, token normalizations.

Each interaction maps `(t, X)` with `X` of shape `(n, d)` to an array of the same
shape. They are written for one system; ensembles come from `jax.vmap`.
"""

from __future__ import annotations

import abc
import math
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, ScalarLike

from ..schema._errors import ConfigError
from ..schema._harmonic_degree import DIMS as HARMONIC_DIMS
from . import _harmonic, _tiled
from ._schedules import AbstractSchedule, identity_factor, identity_multiple


def _contract(a: Array, b: Array) -> Array:
    """`a @ b.T` over the last axis of both, batched (and broadcast) over leading axes."""
    return jnp.einsum("...ik,...jk->...ij", a, b)


def _mix(weights: Array, values: Array) -> Array:
    """`weights @ values`, batched (and broadcast) over leading axes."""
    return jnp.einsum("...ij,...jk->...ik", weights, values)


def sinkhorn_log(scores: Float[Array, "... n n"], iterations: int) -> Float[Array, "... n n"]:
    r"""The logarithm of the doubly stochastic matrix that Sinkhorn's algorithm makes of
    the kernel $e^{S}$, in log space: potentials $f, g$ with
    $$g_j \leftarrow -\log \sum_i e^{S_{ij} + f_i},\qquad f_i \leftarrow -\log \sum_j e^{S_{ij} + g_j},$$
    started from the softmax row normalisation and alternated `iterations` times (a column
    then a row normalisation each), so that the rows of $e^{S_{ij} + f_i + g_j}$ sum to 1
    exactly and the columns to 1 up to the error left after that many iterations
    (Sinkformers, Sander et al. 2022). A fixed count: the same operations for every
    input, vmapped and differentiated through like any other term (`lax.fori_loop` over a
    static count lowers to a scan).
    """
    lse = jax.scipy.special.logsumexp
    f = -lse(scores, axis=-1)

    def alternate(_, fg):
        g = -lse(scores + fg[0][..., :, None], axis=-2)
        return -lse(scores + g[..., None, :], axis=-1), g

    f, g = jax.lax.fori_loop(0, iterations, alternate, (f, jnp.zeros_like(f)))
    return scores + f[..., :, None] + g[..., None, :]


def hardmax_weights(scores: Float[Array, "... m n"], ties: ScalarLike) -> Float[Array, "... m n"]:
    r"""Row i spread evenly over the keys j that maximise $S_{ij}$, within `ties` of the
    row maximum: $a_{ij} = \mathbb{1}[S_{ij} \ge \max_k S_{ik} - \tau] / \#\{\dots\}$,
    the $\beta \to \infty$ limit of the softmax rows (keys at $-\infty$ are never chosen)."""
    top = jnp.max(scores, axis=-1, keepdims=True)
    chosen = ((scores >= top - ties) & jnp.isfinite(scores)).astype(scores.dtype)
    return chosen / jnp.sum(chosen, axis=-1, keepdims=True)


def _apply(schedule: AbstractSchedule, t: ScalarLike, x: Float[Array, "n d"], at: ScalarLike | None) -> Array:
    """Rows of `x` mapped by every head's matrix: `(heads, n, rows of W)`.

    A schedule that is a multiple $c(t) I$ of the identity returns $c(t)\\,x$ (or `x`
    itself), without a head axis: every head sees the same array. (A broadcast head
    axis of size one would be correct too, but XLA on CPU compiles it to code several
    times slower.)
    """
    if identity_multiple(schedule):
        factor = identity_factor(schedule, t, at)
        return x if factor is None else factor.astype(x.dtype) * x
    w = schedule(t, at)
    return jnp.einsum("hed,nd->hne", w, x)


KINDS = ("sa", "usa", "sinkhorn", "hardmax")


class AbstractInteraction(eqx.Module):
    """A term $F(t, X)$ of the vector field, acting on all tokens at once.

    Subclass it and write `__call__(self, t, x)`: the term's value for every token, `x`
    of shape `(n, d)` (one system: ensembles come from `jax.vmap`). A term whose weights
    are piecewise in time takes a third argument, `at`, the time at which their piece is
    chosen (the fixed-step loop pins it to each step's midpoint); the field passes it
    only to a term whose `__call__` takes it. The fields of a subclass are its settings:
    built from a config (`+terms.NAME._target_=module.Class +terms.NAME.FIELD=value`),
    a field named `beta`, `key` or `d` that the config leaves out receives the run's
    beta, the member's random key or the dimension of the tokens.

    `working_bytes(n, itemsize)` says how much memory one call works in, for the
    ensemble planner; a term that does not say is measured (XLA's memory analysis of
    one call, see `attnflow.running._ensemble.member_footprint`).
    """

    @abc.abstractmethod
    def __call__(self, t: ScalarLike, x: Float[Array, "n d"], at: ScalarLike | None = None) -> Float[Array, "n d"]:
        """The term's value for every token; `at` chooses the pieces of piecewise
        weight schedules (default `t`)."""

    def working_bytes(self, n: int, itemsize: int) -> tuple[int, int] | None:
        """The memory of one call beyond its input, in bytes: what grows like the tokens
        (queries, hidden layers) and what grows like their pairs (logits); None when the
        term does not say (it is then measured)."""
        return None


class Rotary(eqx.Module):
    r"""Rotary position encoding (RoPE), in the "rotate half" layout of Hugging Face
    models: the first `dims` entries of every query and key vector are split into
    halves $(u, v)$, and at position $p$ the pair $(u_k, v_k)$ is rotated by the angle
    $p\,\theta^{-2k/\mathrm{dims}}$ with base $\theta$. The remaining entries are left
    alone (partial rotary, GPT-NeoX's `rotary_pct`). Logits then depend on positions
    only through $i - j$.
    """

    dims: int = eqx.field(static=True)
    base: float = eqx.field(static=True, default=10000.0)

    def __check_init__(self):
        if self.dims <= 0 or self.dims % 2:
            raise ConfigError(
                f"rotary positions rotate pairs of entries: dims must be even and positive, got {self.dims}."
            )

    def __call__(
        self, x: Float[Array, "... n k"], positions: Int[Array, " n"] | None = None
    ) -> Float[Array, "... n k"]:
        """Rotate every row of `x`; row i is at position `positions[i]` (default i)."""
        n, k = x.shape[-2:]
        if self.dims > k:
            raise ConfigError(f"rotary positions rotate {self.dims} entries but the head vectors have only {k}.")
        half = self.dims // 2
        inv = self.base ** (-jnp.arange(half, dtype=x.dtype) * 2 / self.dims)
        positions = jnp.arange(n) if positions is None else positions
        angle = positions.astype(x.dtype)[:, None] * inv[None, :]
        cos, sin = (jax.lax.broadcast_to_rank(f(angle), x.ndim) for f in (jnp.cos, jnp.sin))
        u, v, rest = x[..., :half], x[..., half : self.dims], x[..., self.dims :]
        return jnp.concatenate([u * cos - v * sin, v * cos + u * sin, rest], axis=-1)


class RelativePositionBias(eqx.Module):
    r"""An additive bias $b^h_{ij}$ on the attention logits that depends on the query and
    key positions through their offset $j - i$ alone: T5's relative-position buckets. The
    offset is sorted into one of `buckets` buckets, exact up to half of them and
    logarithmically wider above, up to `max_distance` (farther offsets share the last
    bucket); `bidirectional` (an encoder) gives keys before and after the query buckets of
    their own, otherwise (a causal decoder) every key after the query falls in bucket 0.
    `table` `(buckets, heads)` holds each head's bias per bucket.

    The bucket of an offset is computed in numpy, in float32, with the operations of
    transformers' `T5Attention._relative_position_bucket`, so that an offset on a bucket's
    edge falls where it does there.
    """

    table: Float[Array, "buckets heads"]
    bidirectional: bool = eqx.field(static=True)
    max_distance: int = eqx.field(static=True, default=128)

    def __check_init__(self):
        if self.table.ndim != 2:
            raise ConfigError(
                f"the relative position bias table must have shape (buckets, heads), got {self.table.shape}."
            )
        exact = (self.table.shape[0] // 2 if self.bidirectional else self.table.shape[0]) // 2
        if exact < 1 or self.max_distance <= exact:
            raise ConfigError(
                f"{self.table.shape[0]} relative position buckets up to distance {self.max_distance} leave no "
                f"exact bucket or no logarithmic ones: give at least {4 if self.bidirectional else 2} buckets "
                "and a max_distance above half of the exact ones' count."
            )

    @property
    def heads(self) -> int:
        return self.table.shape[1]

    def buckets(self, offsets: np.ndarray) -> np.ndarray:
        """The bucket of every key-minus-query offset in `offsets` (whole numbers)."""
        offsets = np.asarray(offsets, np.int64)
        count = self.table.shape[0]
        found = np.zeros_like(offsets)
        if self.bidirectional:
            count //= 2
            found += (offsets > 0) * count
            distance = np.abs(offsets)
        else:
            distance = -np.minimum(offsets, 0)
        exact = count // 2
        # log(0) is never used (those distances are exact): 1 in its place keeps numpy quiet.
        ratio = np.maximum(distance, 1).astype(np.float32) / np.float32(exact)
        scaled = np.log(ratio) / np.float32(math.log(self.max_distance / exact)) * np.float32(count - exact)
        large = np.minimum(exact + scaled.astype(np.int64), count - 1)
        return np.asarray(found + np.where(distance < exact, distance, large))

    def __call__(self, n: int, rows: Int[Array, " m"] | None = None) -> Float[Array, "heads m n"]:
        """The bias of the queries at `rows` (default all n) against the n keys."""
        keys = np.arange(n)
        if rows is None:
            index = jnp.asarray(self.buckets(keys[None, :] - keys[:, None]))
        else:  # rows may be traced: a lookup over every offset, indexed by the rows
            lookup = jnp.asarray(self.buckets(np.arange(-(n - 1), n)), jnp.int32)
            index = lookup[jnp.asarray(keys, jnp.int32)[None, :] - rows.astype(jnp.int32)[:, None] + (n - 1)]
        return jnp.moveaxis(self.table[index], -1, 0)


def _add(values: Array, bias: AbstractSchedule | None, t, at) -> Array:
    """`values` (heads, n, k) plus a per-head bias (heads, k), or unchanged."""
    if bias is None:
        return values
    b = bias(t, at)
    if values.ndim == 2:
        values = jnp.broadcast_to(values, (b.shape[0],) + values.shape)
    return values + b[:, None, :]


# How the heads' terms are combined: summed, or averaged with 1/H.
COMBINES = ("sum", "mean")


def check_outputs(term, dk: int, dv: int, d: int) -> None:
    """An attention term's output matrix and biases checked against its heads: `output`
    `(heads, d, d_v)` (None needs d_v = d), `query_bias` and `key_bias` `(heads, d_k)`,
    `value_bias` `(heads, d_v)`, `output_bias` `(d,)`."""
    if term.output is None:
        if dv != d:
            raise ConfigError(f"an output matrix O is needed when d_v={dv} differs from d={d}.")
    elif term.output.shape != (term.heads, d, dv):
        raise ConfigError(f"the output schedule must return shape {(term.heads, d, dv)}, got {term.output.shape}.")
    for name, want in (
        ("query_bias", (term.heads, dk)),
        ("key_bias", (term.heads, dk)),
        ("value_bias", (term.heads, dv)),
        ("output_bias", (d,)),
    ):
        bias = getattr(term, name)
        if bias is not None and bias.shape != want:
            raise ConfigError(f"the {name} schedule must return shape {want}, got {bias.shape}.")


def combine_heads(term, t, at, mixed: Array) -> Array:
    """An attention term's mixed values `(heads, n, d_v)` (or `(n, d_v)` when every head
    is the same) through its output matrices, combined over heads (summed or averaged,
    `term.combine`) and shifted by its output bias."""
    if term.output is not None:
        spec = "hde,ne->hnd" if mixed.ndim == 2 else "hde,hne->hnd"
        mixed = jnp.einsum(spec, term.output(t, at), mixed)
    if mixed.ndim == 2:
        # No head axis: all heads are identical (identity Q, K, V and O).
        out = mixed if term.heads == 1 or term.combine == "mean" else term.heads * mixed
    else:
        out = jnp.sum(mixed, axis=0) if term.combine == "sum" else jnp.mean(mixed, axis=0)
    return out if term.output_bias is None else out + term.output_bias(t, at)[None]


class SelfAttention(AbstractInteraction):
    """Multi-head self-attention as an interaction between tokens.

    $$a^h_{ij} = \\frac{\\exp(\\beta \\langle Q_h x_i, K_h x_j\\rangle + m_{ij})}{Z^h_i},\\qquad
    \\mathrm{Attn}(t, X)_i = c_H \\sum_h O_h \\sum_j a^h_{ij} V_h x_j,$$

    with $Z^h_i = \\sum_j \\exp(\\dots)$ for softmax attention (`"sa"`) and $Z_i^h = n$ for
    the unnormalized variant (`"usa"`), as in eq. (13)-(15) and (30) of the survey
    ("A Survey of Continuous Time Dynamics of Transformers"). Two more kinds replace the
    row normalisation:

    - `"sinkhorn"`: $a^h$ the doubly stochastic matrix of Sinkhorn's algorithm on the kernel
      $e^{\\text{logits}}$ (rows and columns sum to 1; `sinkhorn_log`, `sinkhorn_iterations`
      alternations), the Sinkformer of Sander et al. 2022;
    - `"hardmax"`: the $\\beta \\to \\infty$ limit, $a^h_{ij}$ uniform over the keys that maximise
      $\\langle Q_h x_i, K_h x_j\\rangle$ within `hardmax_ties` (`hardmax_weights`; beta and ALiBi
      do not enter), over $j \\ne i$ when `hardmax_self` is false.

    Both form the logits whole at any n; a positive `block` is refused for them.

    The mask $m_{ij}$ is $-\\infty$ for $j > i$ when `causal`, plus $-\\lambda_h |i - j|$
    when `alibi` slopes are given, plus $b^h_{ij}$ when a `position_bias` is given (a
    `RelativePositionBias`: T5's relative-position buckets, a bias of the offset $j - i$
    added to the logits as they are, after beta; the logits are then formed whole, and
    hardmax attention refuses it as it refuses ALiBi). `V` multiplies column vectors.

    The heads are summed ($c_H = 1$, `combine="sum"`: the convention of trained models,
    where $O$ carries any scale) or averaged ($c_H = 1/H$, `combine="mean"`: the mean-field
    scaling under which $H$ independent random heads have a limit as $H \\to \\infty$, the
    expectation of one head's term over its law, reached at the rate $H^{-1/2}$ of the law
    of large numbers; see docs/model.md, "Many heads").

    Schedules return per-head stacks: `query`, `key` of shape `(heads, d_k, d)`,
    `value` `(heads, d_v, d)`, `output` `(heads, d, d_v)` or `None` for the identity.

    Trained models add biases, $Q_h x_i + b^Q_h$ and so on (`query_bias`, `key_bias`
    `(heads, d_k)`, `value_bias` `(heads, d_v)`, `output_bias` `(d,)`), and may rotate
    queries and keys by position (`rotary`, a `Rotary`) before their product.

    Long sequences: `block` chooses how the logits are formed. `None` (the default)
    forms them whole up to `attnflow.numerics._tiled.TILED_ABOVE` tokens and in tiles of
    `DEFAULT_BLOCK` above; `0` always whole; a positive number in tiles of that many
    queries and keys, with an online softmax (memory $O(n \\cdot \\mathrm{block})$, see
    `attnflow.numerics._tiled`). Both give the same values to rounding.

    `unit_rows` says that the tokens it sees have unit norm (the sphere, or a sphere
    token norm), `attracting` that $\\beta$ times the factors of Q and K is never negative.
    With both, identity-multiple Q and K and no query or key bias, the row maximum of the
    logits is known in advance: $|\\beta| |q_i| \\max_j |k_j|$ bounds it (Cauchy-Schwarz)
    and equals it, $\\beta s_Q s_K$ at the diagonal, on unit rows. The tiled path then
    needs no running maximum, and without a causal mask it goes through the symmetric
    logits once per pair of tiles (`attnflow.numerics._tiled.symmetric_attention`). With a
    negative scale a row's largest logit can lie $2|\\beta| s_Q s_K$ below that bound
    (tokens in one cluster), past what float32 exponentiates from $|\\beta| s_Q s_K \\approx
    44$ on, so the maximum is then searched for.

    `summation="harmonic"` sums over the keys through an expansion of the kernel in
    harmonics of the key tokens (`attnflow.numerics._harmonic`: cost $O(nL)$ on the circle,
    $O(nL^2)$ on the sphere, instead of $O(n^2)$), truncated at the static `degree` L. It
    serves softmax and unnormalized attention of unit tokens (`unit_rows`) in d = 2 or 3,
    causal or not, with ALiBi, without rotary positions, a position bias or a key bias, and
    ignores `block`; the key tokens enter as $x_j / |x_j|$. `attnflow.harmonic_degree(beta,
    d, tol)` gives the degree a study would take for a tolerance.

    Two options serve a field run at constant speed (`attnflow.VectorField`'s
    `time_change`), which turns any field, however small, into motion at full speed;
    both need the logits formed whole (no tiles):

    - `scale_free` (unnormalized attention only): the logits are shifted by their
      maximum $M$ over all heads and pairs, so the term is $e^{-M}$ times the USA term,
      finite for any beta (the USA term itself overflows float64 once $\\beta > 709$ on
      unit tokens). A positive factor is divided out by the time change, and only by it.
    - `exclude_coincident`: pairs of equal tokens ($x_j = x_i$, every coordinate) are left
      out of the sum. With V a multiple of the identity (no output matrix, no biases)
      their terms $a_{ij} V x_j$ are radial at $x_i$, so the tangent-projected field is
      unchanged in exact arithmetic; in floating point the pull inside a cluster of
      coincident tokens is then exactly zero, where the projection of their sum leaves a
      residual of relative size $10^{-16}$ that can outweigh the pull between clusters
      ($e^{-45}$ at beta = 4000 on the circle) and that a time change would follow.
    """

    query: AbstractSchedule
    key: AbstractSchedule
    value: AbstractSchedule
    output: AbstractSchedule | None
    beta: Float[Array, ""]
    alibi: Float[Array, " heads"] | None
    heads: int = eqx.field(static=True)
    kind: Literal["sa", "usa", "sinkhorn", "hardmax"] = eqx.field(static=True, default="sa")
    causal: bool = eqx.field(static=True, default=False)
    query_bias: AbstractSchedule | None = None
    key_bias: AbstractSchedule | None = None
    value_bias: AbstractSchedule | None = None
    output_bias: AbstractSchedule | None = None
    rotary: Rotary | None = None
    block: int | None = eqx.field(static=True, default=None)
    unit_rows: bool = eqx.field(static=True, default=False)
    attracting: bool = eqx.field(static=True, default=False)
    scale_free: bool = eqx.field(static=True, default=False)
    exclude_coincident: bool = eqx.field(static=True, default=False)
    sinkhorn_iterations: int = eqx.field(static=True, default=50)
    hardmax_ties: float = eqx.field(static=True, default=1e-6)
    hardmax_self: bool = eqx.field(static=True, default=True)
    combine: Literal["sum", "mean"] = eqx.field(static=True, default="sum")
    position_bias: RelativePositionBias | None = None
    summation: Literal["direct", "harmonic"] = eqx.field(static=True, default="direct")
    degree: int = eqx.field(static=True, default=0)

    def __check_init__(self):
        if self.combine not in COMBINES:
            raise ConfigError(f"heads are combined by 'sum' or 'mean', got {self.combine!r}.")
        if self.kind not in KINDS:
            raise ConfigError(
                f"attention kind must be 'sa' (softmax), 'usa' (unnormalized), 'sinkhorn' (doubly "
                f"stochastic) or 'hardmax' (beta -> infinity), got {self.kind!r}."
            )
        whole = self.kind in ("sinkhorn", "hardmax")
        if whole and self.block:
            raise ConfigError(
                f"{self.kind} attention normalises the whole n x n logits and is not tiled: set the "
                f"attention block to null or 0, got {self.block}."
            )
        if self.kind == "sinkhorn" and self.causal:
            raise ConfigError(
                "sinkhorn attention cannot be causal: a lower-triangular doubly stochastic matrix is the identity."
            )
        if self.kind == "sinkhorn" and not (
            isinstance(self.sinkhorn_iterations, int) and self.sinkhorn_iterations >= 1
        ):
            raise ConfigError(f"sinkhorn iterations must be a whole number >= 1, got {self.sinkhorn_iterations!r}.")
        if self.kind == "hardmax" and self.alibi is not None:
            raise ConfigError("hardmax attention takes the argmax of <Q x_i, K x_j> alone: ALiBi does not apply.")
        if self.position_bias is not None:
            if self.kind == "hardmax":
                raise ConfigError(
                    "hardmax attention takes the argmax of <Q x_i, K x_j> alone: a position bias does not apply."
                )
            if self.block:
                raise ConfigError(
                    f"attention with a position bias forms the logits whole and is not tiled: set the attention "
                    f"block to null or 0, got {self.block}."
                )
            if self.position_bias.heads != self.heads:
                raise ConfigError(
                    f"the position bias has {self.position_bias.heads} heads, the attention {self.heads}."
                )
        if self.kind == "hardmax" and not self.hardmax_ties >= 0:
            raise ConfigError(f"the hardmax tie tolerance must be >= 0, got {self.hardmax_ties!r}.")
        if whole and (self.scale_free or self.exclude_coincident):
            raise ConfigError("scale_free and exclude_coincident apply to softmax and unnormalized attention only.")
        if self.scale_free and self.kind != "usa":
            raise ConfigError(
                "scale_free shifts the logits of unnormalized attention (kind 'usa'); softmax "
                "attention is scale-free already."
            )
        if self.exclude_coincident and not (
            identity_multiple(self.value)
            and self.output is None
            and self.value_bias is None
            and self.output_bias is None
        ):
            raise ConfigError(
                "exclude_coincident leaves the tangent field unchanged only with V a multiple of the "
                "identity, no output matrix and no biases."
            )
        if self.block is not None and not (isinstance(self.block, int) and self.block >= 0):
            raise ConfigError(
                f"the attention block must be None (chosen by size), 0 (dense) or a positive number "
                f"of tokens per tile, got {self.block!r}."
            )
        for name in ("query", "key", "value"):
            shape = getattr(self, name).shape
            if len(shape) != 3 or shape[0] != self.heads:
                raise ConfigError(f"the {name} schedule must return shape (heads={self.heads}, rows, d), got {shape}.")
        (_, dk, d), (_, dk2, d2), (_, dv, d3) = self.query.shape, self.key.shape, self.value.shape
        if dk != dk2 or len({d, d2, d3}) != 1:
            raise ConfigError(
                f"query {self.query.shape} and key {self.key.shape} must share (heads, d_k, d) "
                f"and value {self.value.shape} must have the same d."
            )
        if self.alibi is not None and self.alibi.shape != (self.heads,):
            raise ConfigError(f"alibi needs one slope per head, shape ({self.heads},), got {self.alibi.shape}.")
        check_outputs(self, dk, dv, d)
        if self.summation == "harmonic":
            self._check_harmonic(d)

    def _check_harmonic(self, d: int) -> None:
        """Refuse, in one sentence, what harmonic summation cannot serve."""
        cannot = (
            (self.kind not in ("sa", "usa"), f"{self.kind} attention"),
            (not self.unit_rows, "tokens off the unit sphere"),
            (d not in HARMONIC_DIMS, f"d = {d}"),
            (self.rotary is not None, "rotary positions"),
            (self.position_bias is not None, "a position bias"),
            (self.key_bias is not None, "a key bias"),
            (self.scale_free or self.exclude_coincident, "scale_free or exclude_coincident"),
        )
        for bad, what in cannot:
            if bad:
                raise ConfigError(
                    f"harmonic summation serves softmax and unnormalized attention of unit tokens in d = 2 or 3, "
                    f"without rotary positions, a position bias or a key bias; not {what}."
                )
        if not (isinstance(self.degree, int) and self.degree >= 1):
            raise ConfigError(f"harmonic summation needs a degree >= 1, got {self.degree!r}.")

    @property
    def dim(self) -> int:
        return self.query.shape[-1]

    def working_bytes(self, n: int, itemsize: int) -> tuple[int, int]:
        """The queries, keys and values that are not the tokens themselves (identity
        weights skip their products), the mixed values and the term's output, per token;
        the logits and their exponentials ($n \\times n$ per head, one for all heads with
        identity Q and K; $n \\times$ tile on the tiled path), per pair."""
        heads, dk, dv, d = self.heads, self.query.shape[1], self.value.shape[1], self.dim
        identity = [identity_multiple(w) for w in (self.query, self.key, self.value)]
        shared = identity[0] and identity[1]
        rows = heads * n * (dk * (2 - identity[0] - identity[1]) + dv * (1 - identity[2]))
        mixed = n * d if shared and identity[2] else heads * n * dv
        width = self.tile(n) or n
        return itemsize * (rows + mixed + n * d), 2 * itemsize * n * width * (1 if shared else heads)

    def tile(self, n: int) -> int | None:
        """The tile size at `n` tokens (None: the logits are formed whole)."""
        if self.kind in ("sinkhorn", "hardmax") or self.position_bias is not None:
            return None
        return _tiled.resolve_block(n, self.block)

    def _queries_keys(self, t, x, at, rows):
        """Queries of the tokens `rows` (all when None) and keys of all tokens, biased and
        rotated: `(heads, m, d_k)` and `(heads, n, d_k)`, or without the head axis."""
        q = _add(_apply(self.query, t, x if rows is None else x[rows], at), self.query_bias, t, at)
        k = _add(_apply(self.key, t, x, at), self.key_bias, t, at)
        if self.rotary is not None:
            q, k = self.rotary(q, rows), self.rotary(k)
        return q, k

    def _row_max(self, q: Array, k: Array) -> Array | None:
        """$|\\beta|\\,|q_i| \\max_j |k_j|$ where it is the row maximum of unit tokens (see the
        class), else None: the maximum is then searched for."""
        known = (
            self.unit_rows
            and self.attracting
            and self.kind == "sa"
            and identity_multiple(self.query)
            and identity_multiple(self.key)
            and self.query_bias is None
            and self.key_bias is None
        )
        if not known:
            return None
        norm = lambda a: jnp.sqrt(jnp.sum(a * a, axis=-1))
        return jnp.abs(self.beta) * norm(q) * jnp.max(norm(k), axis=-1, keepdims=True)

    def _symmetric(self, rows, top) -> bool:
        """Whether the logits of all tokens are symmetric in i and j with a constant bound
        (see `_tiled.symmetric_attention`): identity-multiple Q and K without biases (both
        rotated alike, if at all), no causal mask, all rows, and for softmax attention the
        known maximum."""
        return (
            rows is None
            and not self.causal
            and identity_multiple(self.query)
            and identity_multiple(self.key)
            and self.query_bias is None
            and self.key_bias is None
            and (self.kind == "usa" or top is not None)
        )

    def _mask(self, scores: Array, n: int, rows: Array | None) -> Array:
        """ALiBi, the position bias and the causal mask added to `scores` `(..., m, n)` of
        queries at `rows`."""
        if self.alibi is None and not self.causal and self.position_bias is None:
            return scores
        index = jnp.arange(n)
        at = index if rows is None else rows
        if self.alibi is not None:
            distance = jnp.abs(at[:, None] - index[None, :]).astype(scores.dtype)
            penalty = self.alibi[:, None, None] * distance[None]  # (heads, m, n)
            rank = max(scores.ndim, penalty.ndim)
            scores = jax.lax.broadcast_to_rank(scores, rank) - jax.lax.broadcast_to_rank(penalty, rank)
        if self.position_bias is not None:
            bias = self.position_bias(n, rows).astype(scores.dtype)  # (heads, m, n)
            rank = max(scores.ndim, bias.ndim)
            scores = jax.lax.broadcast_to_rank(scores, rank) + jax.lax.broadcast_to_rank(bias, rank)
        if self.causal:
            scores = jnp.where(jax.lax.broadcast_to_rank(index[None, :] <= at[:, None], scores.ndim), scores, -jnp.inf)
        return scores

    def logits(
        self, t: ScalarLike, x: Float[Array, "n d"], at: ScalarLike | None = None, rows: Int[Array, " m"] | None = None
    ) -> Array:
        """$\\beta \\langle Q_h x_i, K_h x_j\\rangle + m_{ij}$, with $-\\infty$ where masked, for
        the query tokens `rows` (default all) against all keys.

        Shape `(heads, m, n)`, or `(m, n)` when every head has the same logits.
        """
        q, k = self._queries_keys(t, x, at, rows)
        return self._mask(self.beta * _contract(q, k), x.shape[0], rows)

    def weights(
        self, t: ScalarLike, x: Float[Array, "n d"], at: ScalarLike | None = None, rows: Int[Array, " m"] | None = None
    ) -> Float[Array, "heads m n"]:
        """The attention matrices $a^h_{ij}(t)$ of every head, for the query tokens `rows`
        (default all; formed whole: $m \\times n$ per head)."""
        if self.kind in ("sinkhorn", "hardmax"):
            a = self._normalised(t, x, at, rows)
            return jnp.broadcast_to(a, (self.heads,) + a.shape[-2:])
        scores = self.logits(t, x, at, rows)
        if self.kind == "sa":
            # Subtracting the row maximum keeps exp() finite for any beta.
            a = jax.nn.softmax(scores, axis=-1)
        else:
            a = jnp.exp(scores) / x.shape[0]
        return jnp.broadcast_to(a, (self.heads,) + a.shape[-2:])

    def _normalised(self, t, x, at, rows) -> Array:
        """The sinkhorn or hardmax weights of the query tokens `rows` (default all),
        `(heads, m, n)` or `(m, n)` when every head has the same."""
        n = x.shape[0]
        if self.kind == "sinkhorn":
            # The matrix is doubly stochastic over all n queries: formed whole, then the rows taken.
            a = jnp.exp(sinkhorn_log(self.logits(t, x, at), self.sinkhorn_iterations))
            return a if rows is None else a[..., rows, :]
        q, k = self._queries_keys(t, x, at, rows)
        scores = self._mask(_contract(q, k), n, rows)
        if not self.hardmax_self:
            at_rows = jnp.arange(n) if rows is None else rows
            own = jax.lax.broadcast_to_rank(at_rows[:, None] == jnp.arange(n)[None, :], scores.ndim)
            scores = jnp.where(own, -jnp.inf, scores)
        return hardmax_weights(scores, jnp.asarray(self.hardmax_ties, scores.dtype))

    def marginal_error(self, t: ScalarLike, x: Float[Array, "n d"], at: ScalarLike | None = None) -> Float[Array, ""]:
        r"""$\max_{h, j} |\sum_i a^h_{ij} - 1|$: how far the columns of the attention
        matrices are from summing to 1 (0 for a doubly stochastic matrix; the rows of every
        normalised kind sum to 1)."""
        return jnp.max(jnp.abs(jnp.sum(self.weights(t, x, at), axis=-2) - 1))

    def _kept(self, e: Array, x: Float[Array, "n d"], rows: Int[Array, " m"] | None) -> Array:
        """The weights `e` `(..., m, n)`, with the pairs of equal tokens set to zero when
        `exclude_coincident`."""
        if not self.exclude_coincident:
            return e
        queries = x if rows is None else x[rows]
        return jnp.where(jnp.all(queries[:, None, :] == x[None, :, :], axis=-1), 0, e)

    def __call__(self, t, x, at=None, rows: Int[Array, " m"] | None = None):
        """The term at every token, or at the tokens `rows` only (each still attending to all
        n tokens): shape `(m, d)`."""
        n = x.shape[0]
        q, k = self._queries_keys(t, x, at, rows)
        values = _add(_apply(self.value, t, x, at), self.value_bias, t, at)
        tile = self.tile(n)
        if self.summation == "harmonic":
            key = None if identity_multiple(self.key) else self.key(t, at)
            if key is None and (factor := identity_factor(self.key, t, at)) is not None:
                q = factor.astype(q.dtype) * q  # <q, c x_j> = <c q, x_j>
            u = _harmonic.query_vectors(q, key, self.beta)
            # The expansion is in harmonics of unit key tokens: a Runge-Kutta stage lies off the
            # sphere by O(dt^2), and the field of x/|x| agrees with the direct one on the sphere
            # (the solutions differ by the solver's error, not by O(dt^2) per stage).
            on_sphere = x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True))
            mixed = _harmonic.attention_heads(
                u, on_sphere, values, self.alibi, degree=self.degree, kind=self.kind, causal=self.causal
            )
        elif self.kind in ("sinkhorn", "hardmax"):
            mixed = _mix(self._normalised(t, x, at, rows), values)
        elif tile is not None and (self.scale_free or self.exclude_coincident):
            raise ConfigError(
                f"scale_free and exclude_coincident attention form the logits whole; at n={n} they "
                "would be tiled: set the attention block to 0."
            )
        elif tile is not None:
            top = self._row_max(q, k)
            mixed = _tiled.attention_heads(
                q,
                k,
                values,
                self.beta,
                self.alibi,
                block=tile,
                kind=self.kind,
                causal=self.causal,
                positions=rows,
                row_max=top,
                symmetric=self._symmetric(rows, top),
            )
        else:
            scores = self._mask(self.beta * _contract(q, k), n, rows)
            if self.kind == "sa":
                # Softmax with the row maximum subtracted (finite for any beta), normalized
                # after the mixing: n*d divisions instead of n*n. (The maximum is searched
                # for even when it is known: XLA fuses the search into the product that forms
                # the logits, and the known one measured no faster, benchmarks/tiled.py.)
                top = jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True))
                e = jnp.exp(scores - top)
                mixed = _mix(self._kept(e, x, rows), values)
                mixed = mixed / jax.lax.broadcast_to_rank(jnp.sum(e, axis=-1, keepdims=True), mixed.ndim)
            elif self.scale_free:
                e = jnp.exp(scores - jax.lax.stop_gradient(jnp.max(scores)))
                mixed = _mix(self._kept(e, x, rows), values) / n
            else:
                mixed = _mix(self._kept(jnp.exp(scores), x, rows), values) / n
        return combine_heads(self, t, at, mixed)


_ACTIVATIONS = {
    "gelu": lambda z: jax.nn.gelu(z, approximate=False),
    "gelu_tanh": lambda z: jax.nn.gelu(z, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
}
# The gated units, hidden layer g(W1 x) * (W3 x): their g (geglu: T5 v1.1's gated GELU).
_GATED = {"swiglu": jax.nn.silu, "geglu": _ACTIVATIONS["gelu_tanh"]}
# The activations of the MLP, which a config names (the schema's `Activation` spells the same out).
ACTIVATIONS = (*_ACTIVATIONS, *_GATED)


class MLP(AbstractInteraction):
    """Token-wise feed-forward term $W_2(t)\\,\\sigma(W_1(t) x + b_1(t)) + b_2(t)$.

    With `activation="swiglu"` the hidden layer is $\\mathrm{silu}(W_1 x) \\odot (W_3 x)$
    (the gated unit of Llama-family models), `gate` holding $W_3$; with `"geglu"` it is
    $\\mathrm{gelu}_{\\tanh}(W_1 x) \\odot (W_3 x)$ (T5 v1.1 and flan-T5, `wi_0` and `wi_1`).
    """

    w1: AbstractSchedule
    w2: AbstractSchedule
    b1: AbstractSchedule | None = None
    b2: AbstractSchedule | None = None
    gate: AbstractSchedule | None = None
    activation: str = eqx.field(static=True, default="gelu")

    def __check_init__(self):
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"unknown MLP activation {self.activation!r}; choose one of {', '.join(ACTIVATIONS)}.")
        if (self.activation in _GATED) != (self.gate is not None):
            raise ConfigError(
                "a gate matrix W3 is needed with the activations 'swiglu' and 'geglu' and only with them."
            )
        hidden, d = self.w1.shape
        if self.w2.shape != (d, hidden):
            raise ConfigError(f"W2 must have shape {(d, hidden)} to match W1 {self.w1.shape}, got {self.w2.shape}.")

    def working_bytes(self, n: int, itemsize: int) -> tuple[int, int]:
        """The hidden layer (twice: before and after the activation) and the output."""
        return itemsize * n * (2 * self.w1.shape[0] + self.w2.shape[0]), 0

    def __call__(self, t, x, at=None):
        h = x @ self.w1(t, at).T
        if self.b1 is not None:
            h = h + jax.lax.broadcast_to_rank(self.b1(t, at), h.ndim)
        if self.activation in _GATED:
            h = _GATED[self.activation](h) * (x @ self.gate(t, at).T)  # pyright: ignore[reportOptionalCall]  (__check_init__: a gated unit has a gate)
        else:
            h = _ACTIVATIONS[self.activation](h)
        out = h @ self.w2(t, at).T
        if self.b2 is not None:
            out = out + jax.lax.broadcast_to_rank(self.b2(t, at), out.ndim)
        return out


NORMS = ("sphere", "rms", "layer")


class TokenNorm(eqx.Module):
    """A normalization applied to every token separately.

    - `sphere`: $x / |x|$ (no gain, no $\\epsilon$);
    - `rms`: $\\sqrt{d}\\, x / \\sqrt{|x|^2 + d\\epsilon} \\odot \\gamma$ (RMSNorm);
    - `layer`: $\\sqrt{d}\\,(x - \\bar x) / \\sqrt{|x - \\bar x|^2 + d\\epsilon} \\odot \\gamma + b$,
      LayerNorm read geometrically as a projection onto $\\mathbf{1}^\\perp$ followed by a
      scaling to the sphere of radius $\\sqrt{d}$ (Traveling Words, eq. 4).

    With $\\epsilon = 0$ these are the geometric maps; a trained model's $\\epsilon$
    makes them equal to its forward pass.
    """

    kind: str = eqx.field(static=True)
    gamma: Float[Array, " d"] | None = None
    shift: Float[Array, " d"] | None = None
    eps: float = eqx.field(static=True, default=0.0)

    def __check_init__(self):
        if self.kind not in NORMS:
            raise ConfigError(f"unknown token normalization {self.kind!r}; choose one of {', '.join(NORMS)}.")
        if self.kind != "layer" and self.shift is not None:
            raise ConfigError("only the 'layer' normalization has an additive shift (beta).")
        if self.kind == "sphere" and (self.gamma is not None or self.eps != 0):
            raise ConfigError("the 'sphere' normalization x/|x| takes no gamma and no eps; use 'rms' for either.")

    def __call__(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        d = x.shape[-1]
        if self.kind == "layer":
            x = x - jnp.mean(x, axis=-1, keepdims=True)
        squared = jnp.sum(x * x, axis=-1, keepdims=True)
        if self.kind == "sphere":
            return x * jax.lax.rsqrt(squared)
        y = jnp.sqrt(jnp.asarray(d, x.dtype)) * x * jax.lax.rsqrt(squared + d * self.eps)
        if self.gamma is not None:
            y = y * jax.lax.broadcast_to_rank(jnp.asarray(self.gamma), y.ndim)
        if self.shift is not None:
            y = y + jax.lax.broadcast_to_rank(jnp.asarray(self.shift), y.ndim)
        return y
