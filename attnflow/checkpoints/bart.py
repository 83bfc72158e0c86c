"""BART checkpoints (Hugging Face `model_type` `bart`) in canonical form: the decoder,
with the encoder as its `encoder`. Marian (`marian.py`) is read by the same code.

Both stacks are post-LN (`post`): `x = N1(x + Attn(x)); x = N2(x + MLP(x))` in the
encoder (`self_attn_layer_norm`, `final_layer_norm`), with the cross-attention
`encoder_attn` and its `encoder_attn_layer_norm` between the two in the decoder. The
LayerNorms have PyTorch's epsilon 1e-5 (config.json names none). Every projection has a
bias, and the logits are divided by sqrt(d_k) (transformers scales the biased query,
the same thing). The MLP is `fc2 act(fc1 x)` (`activation_function`). A stack's
embedding output is `layernorm_embedding(scale * token + position)`: the token
embedding (`shared`, both stacks') times sqrt(d_model) when `scale_embedding` (folded
into the canonical table), and learned positions whose table `embed_positions` starts
at offset 2 (row p + 2 for position p). No stack has a final norm: the encoder's last
hidden state is the decoder's source. The LM head is `lm_head` or the tied (unscaled)
decoder embedding, plus `final_logits_bias`.

Tensor names, per stack `encoder.` and `decoder.` (under `model.`):
`layers.{l}.self_attn.{q,k,v,out}_proj.{weight,bias}`, `layers.{l}.encoder_attn.*`
(decoder), `layers.{l}.{fc1,fc2}.{weight,bias}`, `layers.{l}.{self_attn,encoder_attn,
final}_layer_norm.{weight,bias}`, `embed_positions.weight`, `layernorm_embedding.*`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..numerics._terms import TokenNorm
from ..schema._errors import CheckpointError
from ._canonical import Blocks, Checkpoint
from ._files import (
    WeightTable,
    activation,
    as_array,
    attention_of,
    count,
    flag,
    head_width,
    heads_in,
    heads_out,
    layer_norm_blocks,
    setting,
    stacked_norm,
)

EPS = 1e-5  # nn.LayerNorm's default, which BART and Marian keep
OFFSET = 2  # BART's learned positions: row p + 2 for position p

_ATTENTION = ("q", "k", "v", "o", "bq", "bk", "bv", "bo")


def _attention(w: WeightTable, at: str, d: int, heads: int) -> dict[str, np.ndarray]:
    """The per-head projections and biases of the attention `at` (ending in a dot)."""
    bias = lambda name: w.get(at + name + "_proj.bias", (d,))
    return {
        "q": heads_in(w.get(at + "q_proj.weight", (d, d)), heads),
        "k": heads_in(w.get(at + "k_proj.weight", (d, d)), heads),
        "v": heads_in(w.get(at + "v_proj.weight", (d, d)), heads),
        "o": heads_out(w.get(at + "out_proj.weight", (d, d)), heads),
        "bq": bias("q").reshape(heads, -1),
        "bk": bias("k").reshape(heads, -1),
        "bv": bias("v").reshape(heads, -1),
        "bo": bias("out"),
    }


def _stack(w: WeightTable, at: str, depth: int, d: int, heads: int, hidden: int, kind: str, dtype) -> Blocks:
    """The stacked blocks of the stack `at` ("encoder." or "decoder."), with the
    cross-attention of the decoder."""
    decoder = at == "decoder."
    head_width(d, heads)
    keys = ("w1", "b1", "w2", "b2", "g1", "s1", "g2", "s2", "gc", "sc")
    parts: dict[str, list] = {key: [] for key in (*_ATTENTION, *keys, *("c" + key for key in _ATTENTION))}
    for l in range(depth):
        layer = f"{at}layers.{l}."
        values = _attention(w, layer + "self_attn.", d, heads) | {
            "w1": w.get(layer + "fc1.weight", (hidden, d)),
            "b1": w.get(layer + "fc1.bias", (hidden,)),
            "w2": w.get(layer + "fc2.weight", (d, hidden)),
            "b2": w.get(layer + "fc2.bias", (d,)),
            "g1": w.get(layer + "self_attn_layer_norm.weight", (d,)),
            "s1": w.get(layer + "self_attn_layer_norm.bias", (d,)),
            "g2": w.get(layer + "final_layer_norm.weight", (d,)),
            "s2": w.get(layer + "final_layer_norm.bias", (d,)),
        }
        if decoder:
            cross = _attention(w, layer + "encoder_attn.", d, heads)
            values |= {"c" + key: value for key, value in cross.items()} | {
                "gc": w.get(layer + "encoder_attn_layer_norm.weight", (d,)),
                "sc": w.get(layer + "encoder_attn_layer_norm.bias", (d,)),
            }
        for key, value in values.items():
            parts[key].append(value)
    blocks = layer_norm_blocks({key: parts[key] for key in (*_ATTENTION, *keys[:8])}, heads, kind, EPS, dtype)
    if not decoder:
        return blocks
    a: dict[str, Any] = {key: as_array(np.stack(parts["c" + key]), dtype) for key in _ATTENTION}
    return Blocks(
        attention=blocks.attention,
        mlp=blocks.mlp,
        attn_norm=blocks.attn_norm,
        mlp_norm=blocks.mlp_norm,
        cross=attention_of(a, heads),
        cross_norm=stacked_norm("layer", parts["gc"], parts["sc"], EPS, dtype),
    )


def _learned(w: WeightTable, at: str, places: int, d: int) -> np.ndarray:
    """BART's learned positions of the stack `at`: its table from row `OFFSET` on."""
    return w.get(at + "embed_positions.weight", (places + OFFSET, d))[OFFSET:]


def read(
    config: Mapping,
    tensors: Mapping[str, np.ndarray],
    *,
    family: str,
    name: str = "",
    dtype=None,
    positions: Callable[[WeightTable, str, int, int], np.ndarray] = _learned,
    embedding_norm: bool = True,
) -> Checkpoint:
    """A BART-layout encoder-decoder (its decoder, the encoder as its `encoder`):
    `positions(w, stack, places, d)` gives a stack's position table `(places, d)` and
    `embedding_norm` says whether the embedding output is normalized
    (`layernorm_embedding`); `family` is the canonical family's name."""
    d, vocab = count(config, "d_model"), count(config, "vocab_size")
    decoder_vocab = count(config, "decoder_vocab_size", default=vocab)
    places = count(config, "max_position_embeddings")
    kind = activation(setting(config, "activation_function", default="gelu"))
    start = setting(config, "decoder_start_token_id")
    if not isinstance(start, int) or isinstance(start, bool) or not 0 <= start < decoder_vocab:
        raise CheckpointError(
            f"config.json's decoder_start_token_id must be a token id below {decoder_vocab}, got {start!r}."
        )
    scale = float(np.sqrt(d)) if flag(config, "scale_embedding", default=False) else 1.0
    w = WeightTable(tensors, "encoder.layers.0.self_attn.q_proj.weight", family)
    embed = w.first(("shared.weight", "encoder.embed_tokens.weight"), (vocab, d))
    decoder_embed = w.first(("decoder.embed_tokens.weight", "shared.weight"), (decoder_vocab, d))
    head = w.get("lm_head.weight", (decoder_vocab, d)) if w.has("lm_head.weight") else decoder_embed
    head_bias = w.get("final_logits_bias", (1, decoder_vocab))[0] if w.has("final_logits_bias") else None

    def stack(at: str, table: np.ndarray, **rest) -> Checkpoint:
        depth, heads = count(config, f"{at}_layers"), count(config, f"{at}_attention_heads")
        norm = None
        if embedding_norm:
            norm = TokenNorm(
                "layer",
                gamma=as_array(w.get(f"{at}.layernorm_embedding.weight", (d,)), dtype),
                shift=as_array(w.get(f"{at}.layernorm_embedding.bias", (d,)), dtype),
                eps=EPS,
            )
        return Checkpoint(
            family=family,
            arrangement="post",
            causal=at == "decoder",
            blocks=_stack(w, at + ".", depth, d, heads, count(config, f"{at}_ffn_dim"), kind, dtype),
            embed=as_array(table, dtype) * scale if scale != 1.0 else as_array(table, dtype),
            positions=as_array(positions(w, at + ".", places, d), dtype),
            embed_norm=norm,
            **rest,
        )

    encoder = stack("encoder", embed, name=f"the encoder of {name or family}")
    return stack(
        "decoder",
        decoder_embed,
        unembed=as_array(head, dtype),
        unembed_bias=as_array(head_bias, dtype),
        encoder=encoder,
        decoder_start=start,
        name=name,
    )


def from_hf(config: Mapping, tensors: Mapping[str, np.ndarray], name: str = "", dtype=None) -> Checkpoint:
    """A BART checkpoint from its `config.json` and named tensors."""
    return read(config, tensors, family="bart", name=name, dtype=dtype)
