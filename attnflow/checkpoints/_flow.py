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

Smaller steps ($1/2, 1/4, \\dots$, each layer's weights held over its unit interval, or
interpolated between layers) and adaptive diffrax solvers of the unsplit field give the
continuous-depth limit of the same model.
"""

from __future__ import annotations

from typing import Literal, NamedTuple, cast, overload

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from ..numerics._field import VectorField
from ..numerics._schedules import AbstractSchedule, Constant, Interpolated, PiecewiseConstant
from ..numerics._simulate import simulate
from ..numerics._terms import MLP, SelfAttention, TokenNorm
from ..schema._errors import CheckpointError, ConfigError
from ._canonical import Checkpoint

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
    """A checkpoint's dynamics over depth $t \\in [0, L]$: the field (attention and MLP
    terms, in this order), the post-LN retractions of `post` models, the arrangement.

    It is a `DepthDynamics` (`attnflow.numerics._simulate`): the analyses, which sit below the
    checkpoints, read its field, split, retractions and depth through that protocol."""

    field: VectorField
    retractions: tuple[PostNorm, PostNorm] | None
    arrangement: str = eqx.field(static=True)
    depth: int = eqx.field(static=True)

    @property
    def split(self) -> Literal["lie"] | None:
        return None if self.arrangement == "parallel" else "lie"


def depth_flow(checkpoint: Checkpoint, interpolation: Literal["constant", "linear", "cubic"] = "constant") -> DepthFlow:
    """The vector field of `checkpoint` over depth, its weights held per layer or
    interpolated between layers."""
    if interpolation not in INTERPOLATIONS:
        raise ConfigError(f"interpolation must be one of {', '.join(INTERPOLATIONS)}, got {interpolation!r}.")
    blocks, post = checkpoint.blocks, checkpoint.arrangement == "post"
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
    )
    mlp = MLP(w1=s(w1), w2=s(ff.w2), b1=s(b1), b2=s(ff.b2), gate=s(gate), activation=ff.activation)
    if post:
        field = VectorField(terms=(attention, mlp), scheme="none")
        layers = lambda a: _schedule(a, "constant")
        retractions = cast(
            "tuple[PostNorm, PostNorm]",  # one per norm, the two below
            tuple(
                PostNorm(TokenNorm(n.kind, eps=n.eps), layers(n.gamma), layers(n.shift))  # pyright: ignore[reportArgumentType]  # a LayerNorm of a post-LN checkpoint has gains
                for n in (blocks.attn_norm, blocks.mlp_norm)
            ),
        )
    else:
        if (blocks.attn_norm.kind, blocks.attn_norm.eps) != (blocks.mlp_norm.kind, blocks.mlp_norm.eps):
            raise CheckpointError("attention and MLP normalizations of a pre-LN model must share kind and epsilon.")
        field = VectorField(
            terms=(attention, mlp), scheme="pre", norm=TokenNorm(blocks.attn_norm.kind, eps=blocks.attn_norm.eps)
        )
        retractions = None
    return DepthFlow(field=field, retractions=retractions, arrangement=checkpoint.arrangement, depth=checkpoint.depth)


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
