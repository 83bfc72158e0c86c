"""T5 checkpoints (Hugging Face `model_type` `t5`: T5 v1.0, v1.1 and flan-T5) in canonical
form: the decoder, with the encoder as its `encoder`.

Both stacks are pre-RMSNorm (`sequential`): T5's `layer_norm` scales without subtracting
the mean or adding a shift (`layer_norm_epsilon`). The attention has no biases and its
logits are not divided by sqrt(d_kv), so the canonical queries carry that factor.
Positions enter only through a relative-position bias per stack: the table
`relative_attention_bias` of the stack's layer 0 (`relative_attention_num_buckets`
buckets up to `relative_attention_max_distance`), shared by all of its layers,
bidirectional in the encoder and causal in the decoder; the cross-attention has none.
The MLP is `wo relu(wi x)` (v1.0, `feed_forward_proj` "relu") or the gated
`wo (gelu_tanh(wi_0 x) * wi_1 x)` (v1.1 and flan-T5, "gated-gelu"; "gated-silu" is
SwiGLU). Each stack ends in a `final_layer_norm`: the encoder's output after it is the
decoder's source. The token embedding `shared` is both stacks'. The LM head is
`lm_head`, or the embedding where it is tied, scaled by d_model^-1/2 where
transformers scales the decoder's output (`scale_decoder_outputs`, or
`tie_word_embeddings` not false in older configs: v1.0).

Tensor names, per stack `encoder.` and `decoder.`: `block.{l}.layer.0.SelfAttention.
{q,k,v,o}.weight` and `layer.0.layer_norm.weight`; in the decoder `layer.1` is the
cross-attention `EncDecAttention` and `layer.2` the MLP, in the encoder `layer.1` the MLP
(`DenseReluDense.wi`, or `wi_0` and `wi_1`, and `wo`); `final_layer_norm.weight`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..numerics._terms import RelativePositionBias, TokenNorm
from ..schema._errors import CheckpointError
from ._canonical import Blocks, Checkpoint, FeedForward
from ._files import (
    WeightTable,
    activation,
    as_array,
    attention_of,
    count,
    epsilon,
    flag,
    heads_in,
    heads_out,
    setting,
    stacked_norm,
)

# The canonical gated unit of each gate activation of a "gated-ACT" feed_forward_proj.
GATED = {"gelu_tanh": "geglu", "silu": "swiglu"}


def mlp_kind(config: Mapping) -> str:
    """The canonical MLP activation of `feed_forward_proj`: "relu" (v1.0), or the
    gated unit of "gated-gelu" (tanh GELU, as transformers reads it) and "gated-silu"."""
    proj = setting(config, "feed_forward_proj", default="relu")
    if not isinstance(proj, str) or len(proj.split("-")) > 2 or ("-" in proj and not proj.startswith("gated-")):
        raise CheckpointError(
            f"config.json's feed_forward_proj {proj!r} is not ACT or gated-ACT (e.g. relu, gated-gelu)."
        )
    gated, name = proj.startswith("gated-"), proj.split("-")[-1]
    kind = activation("gelu_new" if proj == "gated-gelu" else name)
    if not gated:
        return kind
    if kind not in GATED:
        raise CheckpointError(
            f"config.json's feed_forward_proj {proj!r} gates with {name}; attnflow reads the gated units "
            "gated-gelu (GeGLU) and gated-silu (SwiGLU)."
        )
    return GATED[kind]


def _stack(w: WeightTable, at: str, depth: int, sizes: dict[str, int], decoder: bool, kind: str, eps: float, dtype):
    """The stacked blocks of the stack `at` ("encoder." or "decoder.")."""
    d, heads, inner, hidden = sizes["d"], sizes["heads"], sizes["inner"], sizes["hidden"]
    scale = np.sqrt(sizes["head_dim"])  # T5 does not divide its logits by sqrt(d_kv): the queries carry it
    keys = ("q", "k", "v", "o", "cq", "ck", "cv", "co", "w1", "w2", "gate", "g1", "gc", "g2")
    parts: dict[str, list] = {key: [] for key in keys}
    for l in range(depth):
        block = f"{at}block.{l}.layer."
        mlp = f"{block}{2 if decoder else 1}."
        attention = [("", f"{block}0.SelfAttention.")] + ([("c", f"{block}1.EncDecAttention.")] if decoder else [])
        for key, name in attention:
            parts[key + "q"].append(heads_in(w.get(name + "q.weight", (inner, d)), heads) * scale)
            parts[key + "k"].append(heads_in(w.get(name + "k.weight", (inner, d)), heads))
            parts[key + "v"].append(heads_in(w.get(name + "v.weight", (inner, d)), heads))
            parts[key + "o"].append(heads_out(w.get(name + "o.weight", (d, inner)), heads))
        if kind in GATED.values():
            parts["w1"].append(w.get(mlp + "DenseReluDense.wi_0.weight", (hidden, d)))
            parts["gate"].append(w.get(mlp + "DenseReluDense.wi_1.weight", (hidden, d)))
        else:
            parts["w1"].append(w.get(mlp + "DenseReluDense.wi.weight", (hidden, d)))
        parts["w2"].append(w.get(mlp + "DenseReluDense.wo.weight", (d, hidden)))
        parts["g1"].append(w.get(f"{block}0.layer_norm.weight", (d,)))
        if decoder:
            parts["gc"].append(w.get(f"{block}1.layer_norm.weight", (d,)))
        parts["g2"].append(w.get(mlp + "layer_norm.weight", (d,)))
    a: dict[str, Any] = {  # an array per key, or None where the stack has no such part
        key: as_array(np.stack(value), dtype) if value else None for key, value in parts.items()
    }
    none = dict.fromkeys(("bq", "bk", "bv", "bo"))
    cross = attention_of({key[1:]: a[key] for key in ("cq", "ck", "cv", "co")} | none, heads) if decoder else None
    return Blocks(
        attention=attention_of(a | none, heads),
        mlp=FeedForward(w1=a["w1"], w2=a["w2"], gate=a["gate"], activation=kind),
        attn_norm=stacked_norm("rms", parts["g1"], None, eps, dtype),
        mlp_norm=stacked_norm("rms", parts["g2"], None, eps, dtype),
        cross=cross,
        cross_norm=stacked_norm("rms", parts["gc"], None, eps, dtype) if decoder else None,
    )


def from_hf(config: Mapping, tensors: Mapping[str, np.ndarray], name: str = "", dtype=None) -> Checkpoint:
    """A T5 checkpoint (its decoder, the encoder as its `encoder`) from its `config.json`
    and named tensors."""
    d, heads, head_dim = count(config, "d_model"), count(config, "num_heads"), count(config, "d_kv")
    depth, vocab, hidden = count(config, "num_layers"), count(config, "vocab_size"), count(config, "d_ff")
    decoder_depth = count(config, "num_decoder_layers", default=depth)
    buckets = count(config, "relative_attention_num_buckets", default=32)
    distance = count(config, "relative_attention_max_distance", default=128)
    eps = epsilon(config, "layer_norm_epsilon", default=1e-6)
    start = setting(config, "decoder_start_token_id", "pad_token_id", default=0)
    if not isinstance(start, int) or isinstance(start, bool) or not 0 <= start < vocab:
        raise CheckpointError(f"config.json's decoder_start_token_id must be a token id below {vocab}, got {start!r}.")
    kind = mlp_kind(config)
    sizes = {"d": d, "heads": heads, "head_dim": head_dim, "inner": heads * head_dim, "hidden": hidden}
    w = WeightTable(tensors, "encoder.block.0.layer.0.SelfAttention.q.weight", "t5")
    embed = w.first(("shared.weight", "encoder.embed_tokens.weight"), (vocab, d))
    decoder_embed = w.first(("decoder.embed_tokens.weight", "shared.weight"), (vocab, d))
    if "scale_decoder_outputs" in config:
        scaled = flag(config, "scale_decoder_outputs", default=True)
    else:
        scaled = flag(config, "tie_word_embeddings", default=True)
    head = w.get("lm_head.weight", (vocab, d)) if w.has("lm_head.weight") else decoder_embed

    def bias(at: str, bidirectional: bool) -> RelativePositionBias:
        table = w.get(f"{at}block.0.layer.0.SelfAttention.relative_attention_bias.weight", (buckets, heads))
        return RelativePositionBias(as_array(table, dtype), bidirectional, distance)

    def final_norm(at: str) -> TokenNorm:
        return TokenNorm("rms", gamma=as_array(w.get(f"{at}final_layer_norm.weight", (d,)), dtype), eps=eps)

    shared = as_array(embed, dtype)  # one array where both stacks read the same table
    encoder = Checkpoint(
        family="t5",
        arrangement="sequential",
        causal=False,
        blocks=_stack(w, "encoder.", depth, sizes, False, kind, eps, dtype),
        embed=shared,
        final_norm=final_norm("encoder."),
        position_bias=bias("encoder.", True),
        name=f"the encoder of {name or 't5'}",
    )
    return Checkpoint(
        family="t5",
        arrangement="sequential",
        causal=True,
        blocks=_stack(w, "decoder.", decoder_depth, sizes, True, kind, eps, dtype),
        embed=shared if np.array_equal(embed, decoder_embed) else as_array(decoder_embed, dtype),
        final_norm=final_norm("decoder."),
        unembed=as_array(head, dtype) * d**-0.5 if scaled else as_array(head, dtype),
        position_bias=bias("decoder.", False),
        encoder=encoder,
        decoder_start=start,
        name=name,
    )
