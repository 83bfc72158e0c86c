"""The canonical form of a trained transformer: what every loader returns.

Every family (GPT-2, GPT-NeoX/Pythia, BERT/MiniLM, Llama, GGUF llama, and the
encoder-decoders T5, BART and Marian) is read into the same few modules. Arrays of the
blocks carry a leading **layer axis** of length `L`, so that the layer map is one
`lax.scan` (and one compilation) however deep the model is.
Conventions, those of the docs' model page:

- matrices act on column vectors: `Q_h x` with `query[l, h]` of shape `(d_k, d)`;
- per-head stacks: `query`, `key` `(L, H, d_k, d)`, `value` `(L, H, d_v, d)`,
  `output` `(L, H, d, d_v)`, so that `Attn(X)_i = sum_h O_h sum_j a_ij^h (V_h x_j + b^V_h)
  + b^O`; grouped key/value heads (Llama) are repeated to one per query head, and
  `kv_heads` records how many distinct ones the checkpoint has;
- biases: `query_bias`, `key_bias` `(L, H, d_k)`, `value_bias` `(L, H, d_v)`,
  `output_bias` `(L, d)`, or None where the family has none;
- the MLP is `W2 act(W1 x + b1) + b2`, or `W2 (silu(W1 x) * (W3 x))` for SwiGLU with
  `gate` = W3 (Llama's `up_proj`; W1 is its `gate_proj`), or `W2 (gelu_tanh(W1 x) *
  (W3 x))` for GeGLU (T5 v1.1's `wi_0`, `wi_1`);
- normalizations are the core's `TokenNorm` (kind `layer` or `rms`, with the model's
  epsilon), their gains `(L, d)`;
- the attention logits are `<Q_h x_i, K_h x_j> / sqrt(d_k)` (so beta = 1/sqrt(d_k)),
  rotated first by rotary positions when `rotary` is set, plus a bias of the offset
  `j - i` when `position_bias` is set (T5's relative-position buckets, one table shared
  by the layers of a stack). A family whose logits are scaled otherwise has the scale
  folded into its queries (T5: not divided by sqrt(d_k), so Q is multiplied by it).

How a block combines its parts is `arrangement`:

- `sequential` (GPT-2, Llama, pre-LN): `x += Attn(N1(x)); x += MLP(N2(x))`;
- `parallel` (GPT-NeoX): `x += Attn(N1(x)) + MLP(N2(x))`;
- `post` (BERT, post-LN): `x = N1(x + Attn(x)); x = N2(x + MLP(x))`.

An **encoder-decoder** (T5, BART, Marian) is its decoder: a checkpoint whose blocks also
hold a cross-attention `cross` (per-head weights as `attention`, its keys and values
read from the encoder's output) and its normalization `cross_norm`, and whose `encoder`
is the encoder stack, a checkpoint of its own (not causal, no cross-attention). The
decoder's block attends to itself, then to the source, then applies its MLP:

- `sequential` (T5, pre-LN): `x += Attn(N1(x)); x += Cross(Nc(x), S); x += MLP(N2(x))`;
- `post` (BART, Marian): `x = N1(x + Attn(x)); x = Nc(x + Cross(x, S)); x = N2(x + MLP(x))`;

with `S` the encoder's final output (after its final norm, where it has one), the
`source` that `_flow.with_source` binds to the decoder before its depth flow is run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

from ..numerics._terms import RelativePositionBias, Rotary, TokenNorm
from ..schema._errors import CheckpointError, ConfigError
from ._families import HF_FAMILIES

# The families of the loaders (`_families.py`), and "diffeqformer": a neural-ODE
# transformer populated at a number of steps (attnflow.diffeqformer), saved in attnflow's
# own format.
FAMILIES = (*HF_FAMILIES, "diffeqformer")
ARRANGEMENTS = ("sequential", "parallel", "post")

_Layer = TypeVar("_Layer")  # stack_layers gives back the pytree type it was given


class Attention(eqx.Module):
    """Per-head attention weights of every layer (see the module docstring)."""

    query: Float[Array, "L H dk d"]
    key: Float[Array, "L H dk d"]
    value: Float[Array, "L H dv d"]
    output: Float[Array, "L H d dv"]
    query_bias: Float[Array, "L H dk"] | None = None
    key_bias: Float[Array, "L H dk"] | None = None
    value_bias: Float[Array, "L H dv"] | None = None
    output_bias: Float[Array, "L d"] | None = None
    kv_heads: int = eqx.field(static=True, default=0)

    @property
    def heads(self) -> int:
        return self.query.shape[1]

    @property
    def head_dim(self) -> int:
        return self.query.shape[2]


class FeedForward(eqx.Module):
    """The MLP of every layer: `W2 act(W1 x + b1) + b2` (or SwiGLU with `gate`)."""

    w1: Float[Array, "L hidden d"]
    w2: Float[Array, "L d hidden"]
    b1: Float[Array, "L hidden"] | None = None
    b2: Float[Array, "L d"] | None = None
    gate: Float[Array, "L hidden d"] | None = None
    activation: str = eqx.field(static=True, default="gelu")


class Blocks(eqx.Module):
    """All `L` blocks, stacked: attention, MLP and the two normalizations of each, and
    the cross-attention of a decoder with its normalization (None elsewhere).

    For `sequential` and `parallel` blocks `attn_norm`, `cross_norm` and `mlp_norm` act
    on the input of their sub-block; for `post` blocks they act on its output (after the
    residual addition)."""

    attention: Attention
    mlp: FeedForward
    attn_norm: TokenNorm
    mlp_norm: TokenNorm
    cross: Attention | None = None
    cross_norm: TokenNorm | None = None

    def __check_init__(self):
        if (self.cross is None) != (self.cross_norm is None):
            raise CheckpointError("a decoder's cross-attention and its normalization come together.")

    @property
    def depth(self) -> int:
        return self.attention.query.shape[0]

    def layer(self, index: int) -> Blocks:
        """Layer `index` alone (its arrays without the layer axis)."""
        return jax.tree.map(lambda a: a[index], self)


def rows_of(ids, vocab: int, table: str, tokens=None) -> Int[Array, " n"]:
    """`ids` as int32 once each is a row of a `vocab`-row embedding (`table` names it in
    the sentence). JAX clamps an index past the end of an array to its last row (and
    wraps a negative one): without this check an id the table has no row for reads
    another token's row. Concrete ids raise `ConfigError` naming the first bad one
    (with its text when `tokens`, a function of ids giving their strings, is given);
    traced ids (under `jit`) stop the program when it runs (`equinox.error_if`)."""
    outside = f"outside {table}, which has {vocab} rows (ids 0 to {vocab - 1})"
    array = ids if isinstance(ids, jax.core.Tracer) else np.asarray(ids)  # pyright: ignore[reportAttributeAccessIssue]  # jax's stub leaves out jax.core
    if not jnp.issubdtype(array.dtype, jnp.integer):
        raise ConfigError(f"token ids must be whole numbers, got {array.dtype} values.")
    if isinstance(array, jax.core.Tracer):  # pyright: ignore[reportAttributeAccessIssue]  # jax's stub leaves out jax.core
        return eqx.error_if(array, (array < 0) | (array >= vocab), f"a token id is {outside}.").astype(jnp.int32)
    bad = np.flatnonzero((array < 0) | (array >= vocab))
    if bad.size:
        i = int(array[bad[0]])
        named = f"token id {i}" if tokens is None else f"the token {tokens([i])[0]!r} (id {i})"
        raise ConfigError(f"{named} at position {bad[0]} is {outside}.")
    return jnp.asarray(array, jnp.int32)


class Checkpoint(eqx.Module):
    """A trained transformer in canonical form: embeddings, stacked blocks, final
    normalization and unembedding, with the static facts that shape its layer map.

    An encoder-decoder is its decoder (see the module docstring): `encoder` its encoder
    stack, `decoder_start` the token its decoder's input starts with, `source` the
    encoder's output once bound (`_flow.with_source`); `position_bias` is a stack's
    relative-position bias (T5), `unembed_bias` the LM head's bias (BART, Marian)."""

    family: str = eqx.field(static=True)
    arrangement: Literal["sequential", "parallel", "post"] = eqx.field(static=True)
    causal: bool = eqx.field(static=True)
    blocks: Blocks
    embed: Float[Array, "vocab d"]
    positions: Float[Array, "P d"] | None = None
    token_types: Float[Array, "T d"] | None = None
    embed_norm: TokenNorm | None = None
    final_norm: TokenNorm | None = None
    unembed: Float[Array, "vocab d"] | None = None
    rotary: Rotary | None = None
    name: str = eqx.field(static=True, default="")
    position_bias: RelativePositionBias | None = None
    encoder: Checkpoint | None = None
    source: Float[Array, "m d"] | None = None
    decoder_start: int | None = eqx.field(static=True, default=None)
    unembed_bias: Float[Array, " vocab"] | None = None

    def __check_init__(self):
        if self.family not in FAMILIES:
            raise CheckpointError(f"unknown family {self.family!r}; attnflow reads {', '.join(FAMILIES)}.")
        if self.arrangement not in ARRANGEMENTS:
            raise CheckpointError(f"unknown block arrangement {self.arrangement!r}.")
        if self.blocks.cross is not None and self.arrangement == "parallel":
            raise CheckpointError("a decoder's blocks with cross-attention are sequential or post, not parallel.")
        if (self.encoder is None) != (self.blocks.cross is None):
            raise CheckpointError("an encoder-decoder has an encoder and cross-attention, and only it has either.")
        if self.encoder is not None and self.encoder.encoder is not None:
            raise CheckpointError("the encoder of an encoder-decoder is an encoder, not an encoder-decoder.")
        if self.source is not None:
            if self.encoder is None:
                raise CheckpointError("only the decoder of an encoder-decoder reads a source.")
            if self.source.ndim != 2 or self.source.shape[1] != self.encoder.dim:
                raise CheckpointError(
                    f"the source of a decoder is its encoder's output, of shape (tokens, {self.encoder.dim}); "
                    f"got {self.source.shape}."
                )

    @property
    def depth(self) -> int:
        return self.blocks.depth

    @property
    def dim(self) -> int:
        return self.embed.shape[1]

    @property
    def heads(self) -> int:
        return self.blocks.attention.heads

    @property
    def head_dim(self) -> int:
        return self.blocks.attention.head_dim

    def token_ids(self, ids: ArrayLike | Sequence, token_type: int = 0, tokens=None) -> Int[Array, " n"]:
        """`ids` as int32, checked against the model: a non-empty 1-D sequence of whole
        numbers, each a row of the embedding, no more of them than the learned positions,
        and `token_type` a row of the token-type table. JAX clamps an index past the end
        of an array to its last row (and wraps a negative one), which would give finite
        hidden states of the wrong token instead of an error.

        Concrete ids are checked here, the sentence naming the first bad one (with its
        text when `tokens`, a function of ids giving their strings, is given); traced ids
        (under `jit`) are checked when the program runs."""
        model, vocab, shape = self.name or self.family, self.embed.shape[0], np.shape(ids)
        if len(shape) != 1 or shape[0] == 0:
            raise ConfigError(f"token ids must be a non-empty 1-D sequence, got shape {tuple(shape)}.")
        if self.positions is not None and shape[0] > self.positions.shape[0]:
            raise ConfigError(
                f"{shape[0]} tokens exceed the {self.positions.shape[0]} positions of {model}; shorten the text."
            )
        types = 1 if self.token_types is None else self.token_types.shape[0]
        if not isinstance(token_type, (int, np.integer)) or isinstance(token_type, bool) or not 0 <= token_type < types:
            raise ConfigError(
                f"token type {token_type!r} is not one of the {types} token types of {model} (0 to {types - 1})."
            )
        return rows_of(ids, vocab, f"the embedding of {model}", tokens)

    def embed_tokens(self, ids: Int[ArrayLike, " n"], token_type: int = 0) -> Float[Array, "n d"]:
        """The embedding output (the residual stream before block 1): token embeddings,
        plus absolute positions and token types where the family has them, then the
        embedding normalization (BERT). The ids are checked first (`token_ids`)."""
        ids = self.token_ids(ids, token_type)
        x = self.embed[ids]
        if self.positions is not None:
            x = x + self.positions[: ids.shape[0]]
        if self.token_types is not None:
            x = x + jax.lax.broadcast_to_rank(self.token_types[token_type], x.ndim)
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        return x

    def logits(self, x: Float[Array, "n d"]) -> Float[Array, "n vocab"]:
        """Next-token logits of residual states `x`: the final norm, then the
        unembedding (None for encoders without an LM head) and its bias, where it has one
        (BART's and Marian's `final_logits_bias`)."""
        if self.unembed is None:
            raise CheckpointError(f"{self.name or self.family} has no unembedding (LM head).")
        h = x if self.final_norm is None else self.final_norm(x)
        logits = h @ self.unembed.T
        return (
            logits if self.unembed_bias is None else logits + jax.lax.broadcast_to_rank(self.unembed_bias, logits.ndim)
        )


def stack_layers(per_layer: list[_Layer]) -> _Layer:
    """Stack a list of per-layer pytrees (same structure) along a new leading axis."""
    return jax.tree.map(lambda *a: jnp.stack(a), *per_layer)
