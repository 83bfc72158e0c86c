"""A checkpoint's layers as a vector field over depth, and its layer map.

A trained model with `L` blocks becomes weight schedules over $t \\in [0, L]$ built from
its stacked layers, and one `VectorField` made of the core's terms: a `SelfAttention`
(with the model's biases and rotary positions) and an `MLP`. The gains and shifts of
the pre-normalizations are folded into the matrices that read the normalized token,
$Q\\,(\\gamma \\odot n(x) + s) + b = (Q \\operatorname{diag}\\gamma)\\, n(x) + (Q s + b)$, so
the field's own normalization $n$ is the gain-free one and the same for every layer.

The layer map of a trained transformer (docs: trained transformers) is then a fixed-step `simulate` with step 1:

- `parallel` (GPT-NeoX): one Euler step of attention + MLP;
- `sequential` (GPT-2, Llama): the Lie-Trotter split, an Euler step of attention and
  then one of the MLP;
- `post` (BERT): the same split on the unnormalized field, each sub-step followed by
  its LayerNorm (`retractions`).

The decoder of an encoder-decoder (T5, BART, Marian) has a third term between the two,
a `CrossAttention` to its source, the encoder's output held fixed (`with_source` binds
it; `teacher_forced` binds the encoder's reading of a text and gives the decoder's
input): three Lie-Trotter sub-steps per layer, self-attention, cross-attention and MLP,
each followed by its LayerNorm in a post-LN model (BART, Marian).

Smaller steps ($1/2, 1/4, \\dots$, each layer's weights held over its unit interval, or
interpolated between layers) and adaptive diffrax solvers of the unsplit field give the
continuous-depth limit of the same model.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, NamedTuple, overload

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from ..numerics._cross import CrossAttention
from ..numerics._field import VectorField
from ..numerics._schedules import AbstractSchedule, Constant, Interpolated, PiecewiseConstant
from ..numerics._simulate import simulate
from ..numerics._terms import MLP, SelfAttention, TokenNorm
from ..schema._errors import CheckpointError, ConfigError
from ._canonical import Attention, Checkpoint

INTERPOLATIONS = ("constant", "linear", "cubic")


@overload
def _schedule(stack: Array, interpolation: str) -> AbstractSchedule: ...
@overload
def _schedule(stack: None, interpolation: str) -> None: ...
@overload
def _schedule(stack: Array | None, interpolation: str) -> AbstractSchedule | None: ...
def _schedule(stack: Array | None, interpolation: str) -> AbstractSchedule | None:
    """Layer `l`'s value on $[l, l + 1)$ (`constant`), or interpolated between knots at
    $t = l$ (`linear`, `cubic`): either way layer `l` is in force at the start of its
    unit step, so one Euler step per layer reads exactly its weights."""
    if stack is None:
        return None
    depth = stack.shape[0]
    if depth == 1:
        return Constant(stack[0])
    if interpolation == "constant":
        return PiecewiseConstant(jnp.arange(1, depth, dtype=stack.dtype), stack)
    return Interpolated(jnp.arange(depth, dtype=stack.dtype), stack, kind=interpolation)


def _fold(matrix: Array, bias: Array | None, norm: TokenNorm | None) -> tuple[Array, Array | None]:
    """`(W diag gamma, W s + b)` for a matrix `W` (..., rows, d) that reads `gamma * n(x) + s`."""
    if norm is None:
        return matrix, bias
    if matrix.ndim == 3:  # (L, rows, d): gains (L, d)
        folded = matrix if norm.gamma is None else matrix * norm.gamma[:, None, :]
    if matrix.ndim == 4:  # (L, H, rows, d): gains (L, d)
        folded = matrix if norm.gamma is None else matrix * norm.gamma[:, None, None, :]
        shift = None if norm.shift is None else jnp.einsum("lhrd,ld->lhr", matrix, norm.shift)
    else:  # (L, rows, d)
        shift = None if norm.shift is None else jnp.einsum("lrd,ld->lr", matrix, norm.shift)
    if shift is None:
        return folded, bias
    return folded, shift if bias is None else bias + shift


class PostNorm(eqx.Module):
    """The post-LN retraction of one sub-block: LayerNorm with the gains of the layer in
    force at the step's piece time."""

    norm: TokenNorm
    gamma: AbstractSchedule
    shift: AbstractSchedule | None

    def __call__(self, at, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        y = self.norm(x) * self.gamma(at, at)[None]
        return y if self.shift is None else y + self.shift(at, at)[None]


class DepthFlow(eqx.Module):
    """A checkpoint's dynamics over depth $t \\in [0, L]$: the field (attention, the
    cross-attention of a decoder, and MLP terms, in this order), the post-LN retractions
    of `post` models (one per term), the arrangement.

    It is a `DepthDynamics` (`attnflow.numerics._simulate`): the analyses, which sit below the
    checkpoints, read its field, split, retractions and depth through that protocol."""

    field: VectorField
    retractions: tuple[PostNorm, ...] | None
    arrangement: str = eqx.field(static=True)
    depth: int = eqx.field(static=True)

    @property
    def split(self) -> Literal["lie"] | None:
        return None if self.arrangement == "parallel" else "lie"


def depth_flow(checkpoint: Checkpoint, interpolation: Literal["constant", "linear", "cubic"] = "constant") -> DepthFlow:
    """The vector field of `checkpoint` over depth, its weights held per layer or
    interpolated between layers. The decoder of an encoder-decoder needs its source bound
    first (`with_source`, `teacher_forced`)."""
    if interpolation not in INTERPOLATIONS:
        raise ConfigError(f"interpolation must be one of {', '.join(INTERPOLATIONS)}, got {interpolation!r}.")
    blocks, post = checkpoint.blocks, checkpoint.arrangement == "post"
    if blocks.cross is not None and checkpoint.source is None:
        raise ConfigError(
            f"{checkpoint.name or checkpoint.family} is an encoder-decoder whose decoder attends to the encoder's "
            "output: bind it first with with_source(checkpoint, source_ids) or teacher_forced(checkpoint, ids)."
        )
    att, ff = blocks.attention, blocks.mlp
    attn_norm = None if post else blocks.attn_norm
    mlp_norm = None if post else blocks.mlp_norm
    query, query_bias = _fold(att.query, att.query_bias, attn_norm)
    key, key_bias = _fold(att.key, att.key_bias, attn_norm)
    value, value_bias = _fold(att.value, att.value_bias, attn_norm)
    w1, b1 = _fold(ff.w1, ff.b1, mlp_norm)
    gate, gate_bias = _fold(ff.gate, None, mlp_norm) if ff.gate is not None else (None, None)
    if gate_bias is not None:
        raise CheckpointError("a gated MLP after a normalization with a shift cannot be folded (no gate bias).")
    s = lambda a: _schedule(a, interpolation)
    attention = SelfAttention(
        query=s(query),
        key=s(key),
        value=s(value),
        output=s(att.output),
        beta=jnp.asarray(1 / np.sqrt(checkpoint.head_dim), query.dtype),
        alibi=None,
        heads=checkpoint.heads,
        causal=checkpoint.causal,
        query_bias=s(query_bias),
        key_bias=s(key_bias),
        value_bias=s(value_bias),
        output_bias=s(att.output_bias),
        rotary=checkpoint.rotary,
        position_bias=checkpoint.position_bias,
    )
    mlp = MLP(w1=s(w1), w2=s(ff.w2), b1=s(b1), b2=s(ff.b2), gate=s(gate), activation=ff.activation)
    terms, norms = (attention, mlp), (blocks.attn_norm, blocks.mlp_norm)
    cross, cross_norm, source = blocks.cross, blocks.cross_norm, checkpoint.source
    if cross is not None and cross_norm is not None and source is not None:
        terms = (attention, _cross(cross, None if post else cross_norm, source, s), mlp)
        norms = (blocks.attn_norm, cross_norm, blocks.mlp_norm)
    if post:
        field = VectorField(terms=terms, scheme="none")
        layers = lambda a: _schedule(a, "constant")
        retractions = tuple(
            PostNorm(TokenNorm(n.kind, eps=n.eps), layers(n.gamma), layers(n.shift))  # pyright: ignore[reportArgumentType]  # a LayerNorm of a post-LN checkpoint has gains
            for n in norms
        )
    else:
        if len({(n.kind, n.eps) for n in norms}) > 1:
            raise CheckpointError("the normalizations of a pre-LN model's sub-blocks must share kind and epsilon.")
        field = VectorField(terms=terms, scheme="pre", norm=TokenNorm(blocks.attn_norm.kind, eps=blocks.attn_norm.eps))
        retractions = None
    return DepthFlow(field=field, retractions=retractions, arrangement=checkpoint.arrangement, depth=checkpoint.depth)


def _cross(cross: Attention, norm: TokenNorm | None, source: Array, s) -> CrossAttention:
    """The cross-attention term of a decoder reading `source`, its weights as schedules
    `s`: the query reads the decoder's tokens (normalized, in a pre-LN model, with the
    gains of `norm` folded in); keys and values read the source as it is."""
    query, query_bias = _fold(cross.query, cross.query_bias, norm)
    return CrossAttention(
        source=source,
        query=s(query),
        key=s(cross.key),
        value=s(cross.value),
        output=s(cross.output),
        beta=jnp.asarray(1 / np.sqrt(cross.head_dim), query.dtype),
        heads=cross.heads,
        query_bias=s(query_bias),
        key_bias=s(cross.key_bias),
        value_bias=s(cross.value_bias),
        output_bias=s(cross.output_bias),
    )


@eqx.filter_jit
def _fixed(flow: DepthFlow, x0, steps_per_layer: int, split: str | None, solver: str):
    num_steps = flow.depth * steps_per_layer
    solution = simulate(
        flow.field,
        x0,
        t0=0.0,
        t1=float(flow.depth),
        dt=1.0 / steps_per_layer,
        num_steps=num_steps,
        solver=solver,
        save_steps=np.arange(0, num_steps + 1, steps_per_layer),
        split=split,
        retractions=flow.retractions,
    )
    return solution.xs


@eqx.filter_jit
def _adaptive(flow: DepthFlow, x0, solver: str, rtol: float, atol: float, max_steps: int):
    solution = simulate(
        flow.field,
        x0,
        t0=0.0,
        t1=float(flow.depth),
        dt=0.1,
        solver=solver,
        adaptive=True,
        ts=jnp.arange(flow.depth + 1, dtype=x0.dtype),
        rtol=rtol,
        atol=atol,
        max_steps=max_steps,
    )
    return solution.xs, solution.result, solution.num_steps


def run_depth(
    flow: DepthFlow,
    x0: Float[Array, "n d"],
    *,
    steps_per_layer: int = 1,
    split: Literal["lie", "strang"] | None = None,
    solver: str = "euler",
    adaptive: bool = False,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    max_steps: int = 10_000,
) -> Float[Array, "layers n d"]:
    """The residual stream at depths $t = 0, 1, \\dots, L$ from the embedded tokens `x0`.

    With the defaults (one Euler step per layer, the arrangement's own split) this is
    the real model's forward pass. `steps_per_layer = m` takes steps of $1/m$; `split`
    may ask for Strang instead of Lie-Trotter (sequential and post models); `adaptive`
    solves the unsplit field with a diffrax solver (`solver`, e.g. `"tsit5"`), for
    pre-LN models only.
    """
    if adaptive:
        if flow.arrangement == "post":
            raise ConfigError(
                "a post-LN model's layer map normalizes after every sub-step and has no unsplit "
                "vector field to solve adaptively; refine it with steps_per_layer instead."
            )
        xs, result, _ = _adaptive(flow, x0, "tsit5" if solver == "euler" else solver, rtol, atol, max_steps)
        if int(result) != 0:
            raise ConfigError(f"the adaptive solve stopped before depth {flow.depth}; raise max_steps or loosen rtol.")
        return xs
    if int(steps_per_layer) < 1:
        raise ConfigError(f"steps_per_layer must be a positive integer, got {steps_per_layer}.")
    if split is None:
        split = flow.split
    elif flow.arrangement == "parallel":
        raise ConfigError("a parallel (GPT-NeoX) block is one Euler step of attention + MLP; it is not split.")
    return _fixed(flow, x0, int(steps_per_layer), split, solver)


class Forward(NamedTuple):
    """The real model's residual stream: `hidden[0]` the embedding output, `hidden[k]`
    the output of block k (before any final norm), `final` the final norm's output."""

    hidden: Float[Array, "layers n d"]
    final: Float[Array, "n d"]


def forward(checkpoint: Checkpoint, ids: Int[Array, " n"] | np.ndarray, token_type: int = 0) -> Forward:
    """The reference forward pass: embeddings, then one layer-map step per block. Ids
    outside the embedding, more tokens than the model's positions and an unknown token
    type are refused (`Checkpoint.token_ids`)."""
    x0 = checkpoint.embed_tokens(ids, token_type)
    hidden = run_depth(depth_flow(checkpoint), x0)
    final = hidden[-1] if checkpoint.final_norm is None else checkpoint.final_norm(hidden[-1])
    return Forward(hidden=hidden, final=final)


def with_source(checkpoint: Checkpoint, source_ids: Int[Array, " m"] | np.ndarray, token_type: int = 0) -> Checkpoint:
    """The decoder of an encoder-decoder with its source bound: the encoder's final
    output on `source_ids` (`forward(checkpoint.encoder, source_ids).final`), which its
    cross-attention reads at every layer. `forward`, `depth_flow` and `run_depth` of the
    result run the decoder."""
    if checkpoint.encoder is None:
        raise ConfigError(f"{checkpoint.name or checkpoint.family} is not an encoder-decoder: it reads no source.")
    source = forward(checkpoint.encoder, source_ids, token_type).final
    return dataclasses.replace(checkpoint, source=source)


def teacher_forced(checkpoint: Checkpoint, ids: Int[Array, " n"] | np.ndarray) -> tuple[Checkpoint, np.ndarray]:
    """An encoder-decoder reading one text `ids`: the encoder reads them, and the decoder
    reads the decoder start token followed by the same ids (its input when the text is
    its own target, transformers' `shift_tokens_right` of the text and one more token:
    the decoder's state at token k predicts token k of the text). Returns the decoder
    with its source bound (`with_source`) and the decoder's ids, one more than `ids`.
    A decoder with a vocabulary of its own (a Marian model that does not share its
    embeddings) is refused: the text's ids name other tokens there."""
    if checkpoint.encoder is None:
        raise ConfigError(f"{checkpoint.name or checkpoint.family} is not an encoder-decoder: it reads no source.")
    if checkpoint.decoder_start is None:
        raise CheckpointError(
            f"{checkpoint.name or checkpoint.family} has no decoder start token (config.json's decoder_start_token_id)."
        )
    if checkpoint.embed.shape[0] != checkpoint.encoder.embed.shape[0]:
        raise ConfigError(
            f"the decoder of {checkpoint.name or checkpoint.family} has a vocabulary of its own "
            f"({checkpoint.embed.shape[0]} tokens, the encoder's {checkpoint.encoder.embed.shape[0]}): it cannot read "
            "the text's ids; give it ids of its own with with_source(checkpoint, ids) and forward."
        )
    bound = with_source(checkpoint, ids)
    decoder_ids = np.concatenate([[checkpoint.decoder_start], np.asarray(ids)]).astype(np.int64)
    bound.token_ids(decoder_ids)
    return bound, decoder_ids
