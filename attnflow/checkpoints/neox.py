"""GPT-NeoX checkpoints (Pythia; Hugging Face `model_type` `gpt_neox`) in canonical form.

With `use_parallel_residual` (Pythia) a block is `parallel`,
`x += Attn(N1(x)) + MLP(N2(x))`; without it, `sequential`. Positions are rotary on the
first `int(d_k * rotary_pct)` entries of each head only (partial RoPE). The fused
`attention.query_key_value` projection (`nn.Linear`, rows = outputs) is laid out
**per head**: its `3 d` rows are `(H, 3, d_k)`, head `h`'s query, key and value rows
next to each other, unlike GPT-2's `(3, H, d_k)`. Token embeddings `embed_in` and the LM
head `embed_out` are separate matrices.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..numerics._terms import Rotary, TokenNorm
from ..schema._errors import CheckpointError
from ._canonical import Checkpoint
from ._files import (
    WeightTable,
    activation,
    as_array,
    count,
    epsilon,
    flag,
    head_width,
    heads_out,
    layer_norm_blocks,
    rope_settings,
    setting,
)


def split_query_key_value(weight: np.ndarray, bias: np.ndarray | None, heads: int):
    """Per-head `(Q, K, V)`, each `(H, d_k, d)`, and their biases `(H, d_k)`, of the fused
    projection: rows `(H, 3, d_k)`, i.e. row `h * 3 d_k + s * d_k + i` is entry `i` of
    part `s` (0 query, 1 key, 2 value) of head `h`."""
    per_head = weight.reshape(heads, 3, -1, weight.shape[-1])
    biases = (None,) * 3 if bias is None else tuple(np.moveaxis(bias.reshape(heads, 3, -1), 1, 0))
    return tuple(np.moveaxis(per_head, 1, 0)), biases


def from_hf(config: Mapping, tensors: Mapping[str, np.ndarray], name: str = "", dtype=None) -> Checkpoint:
    """A GPT-NeoX checkpoint from its `config.json` and named tensors."""
    d, heads = count(config, "hidden_size"), count(config, "num_attention_heads")
    depth, vocab = count(config, "num_hidden_layers"), count(config, "vocab_size")
    hidden = count(config, "intermediate_size")
    eps = epsilon(config, "layer_norm_eps", default=1e-5)
    head_dim = head_width(d, heads)
    bias = flag(config, "attention_bias", default=True)
    w = WeightTable(tensors, "embed_in.weight", "gpt_neox")

    parts = {
        key: [] for key in ("q", "k", "v", "bq", "bk", "bv", "o", "bo", "w1", "b1", "w2", "b2", "g1", "s1", "g2", "s2")
    }
    for l in range(depth):
        at = f"layers.{l}."
        (q, k, v), (bq, bk, bv) = split_query_key_value(
            w.get(at + "attention.query_key_value.weight", (3 * d, d)),
            w.get(at + "attention.query_key_value.bias", (3 * d,)) if bias else None,
            heads,
        )
        values = {
            "q": q,
            "k": k,
            "v": v,
            "bq": bq,
            "bk": bk,
            "bv": bv,
            "o": heads_out(w.get(at + "attention.dense.weight", (d, d)), heads),
            "bo": w.get(at + "attention.dense.bias", (d,)) if bias else None,
            "w1": w.get(at + "mlp.dense_h_to_4h.weight", (hidden, d)),
            "b1": w.get(at + "mlp.dense_h_to_4h.bias", (hidden,)),
            "w2": w.get(at + "mlp.dense_4h_to_h.weight", (d, hidden)),
            "b2": w.get(at + "mlp.dense_4h_to_h.bias", (d,)),
            "g1": w.get(at + "input_layernorm.weight", (d,)),
            "s1": w.get(at + "input_layernorm.bias", (d,)),
            "g2": w.get(at + "post_attention_layernorm.weight", (d,)),
            "s2": w.get(at + "post_attention_layernorm.bias", (d,)),
        }
        for key, value in values.items():
            parts[key].append(value)

    base, fraction = rope_settings(config, fraction=0.25)  # transformers' GPT-NeoX default
    dims = int(head_dim * fraction)
    if dims % 2:
        raise CheckpointError(
            f"config.json rotates {dims} entries of each head (rotary_pct {fraction}), "
            f"an odd number, which rotary positions cannot pair."
        )
    embed = w.get("embed_in.weight", (vocab, d))
    if w.has("embed_out.weight"):
        unembed = w.get("embed_out.weight", (vocab, d))
    elif flag(config, "tie_word_embeddings", default=False):
        unembed = embed
    else:
        unembed = None
    blocks = layer_norm_blocks(parts, heads, activation(setting(config, "hidden_act", default="gelu")), eps, dtype)
    parallel = flag(config, "use_parallel_residual", default=True)
    return Checkpoint(
        family="gpt_neox",
        arrangement="parallel" if parallel else "sequential",
        causal=True,
        blocks=blocks,
        embed=as_array(embed, dtype),
        final_norm=TokenNorm(
            "layer",
            gamma=as_array(w.get("final_layer_norm.weight", (d,)), dtype),
            shift=as_array(w.get("final_layer_norm.bias", (d,)), dtype),
            eps=eps,
        ),
        unembed=as_array(unembed, dtype),
        rotary=Rotary(dims, base) if dims else None,
        name=name,
    )
