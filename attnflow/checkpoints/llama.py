"""Llama-family checkpoints (Hugging Face `model_type` `llama`, SmolLM2 included) in
canonical form.

Llama is pre-RMSNorm (`sequential`): `x += Attn(N1(x)); x += MLP(N2(x))` with RMSNorms
(`rms_norm_eps`), a SwiGLU MLP `down(silu(gate_proj x) * up_proj x)`, rotary positions
on whole heads (`rope_theta`), a final `norm`, and usually no biases. Grouped-query
attention shares each of `num_key_value_heads` key/value heads among
`H / num_key_value_heads` consecutive query heads; the canonical form repeats them to
one per query head (transformers' `repeat_kv`). `tie_word_embeddings` makes the LM head
the token embedding.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..numerics._terms import Rotary, TokenNorm
from ..schema._errors import CheckpointError
from ._canonical import Blocks, Checkpoint, FeedForward
from ._files import (
    WeightTable,
    as_array,
    attention_of,
    count,
    epsilon,
    flag,
    heads_in,
    heads_out,
    rope_settings,
    setting,
    stacked_norm,
)


def repeat_kv(stack: np.ndarray, groups: int) -> np.ndarray:
    """Key/value heads `(H_kv, ...)` repeated to one per query head `(H_kv * groups, ...)`:
    query head `h` reads key/value head `h // groups`."""
    return np.repeat(stack, groups, axis=0)


def from_hf(config: Mapping, tensors: Mapping[str, np.ndarray], name: str = "", dtype=None) -> Checkpoint:
    """A Llama checkpoint from its `config.json` and named tensors."""
    d, heads = count(config, "hidden_size"), count(config, "num_attention_heads")
    depth, vocab = count(config, "num_hidden_layers"), count(config, "vocab_size")
    hidden = count(config, "intermediate_size")
    kv_heads = count(config, "num_key_value_heads", default=heads)
    head_dim = count(config, "head_dim", default=d // heads)
    eps = epsilon(config, "rms_norm_eps", default=1e-6)
    if heads % kv_heads:
        raise CheckpointError(f"config.json has {heads} query heads, not a multiple of its {kv_heads} key/value heads.")
    if setting(config, "hidden_act", default="silu") != "silu":
        raise CheckpointError(
            f"config.json's hidden_act {config['hidden_act']!r} is not silu, the SwiGLU attnflow reads."
        )
    if flag(config, "mlp_bias", default=False):
        raise CheckpointError(
            "config.json sets mlp_bias, a bias on the SwiGLU gate that the canonical MLP does not have."
        )
    bias = flag(config, "attention_bias", default=False)
    groups = heads // kv_heads
    w = WeightTable(tensors, "embed_tokens.weight", "llama")

    parts = {key: [] for key in ("q", "k", "v", "bq", "bk", "bv", "o", "bo", "w1", "w2", "gate", "g1", "g2")}
    for l in range(depth):
        at = f"layers.{l}."
        q_rows, kv_rows = heads * head_dim, kv_heads * head_dim
        values = {
            "q": heads_in(w.get(at + "self_attn.q_proj.weight", (q_rows, d)), heads),
            "k": repeat_kv(heads_in(w.get(at + "self_attn.k_proj.weight", (kv_rows, d)), kv_heads), groups),
            "v": repeat_kv(heads_in(w.get(at + "self_attn.v_proj.weight", (kv_rows, d)), kv_heads), groups),
            "o": heads_out(w.get(at + "self_attn.o_proj.weight", (d, q_rows)), heads),
            "w1": w.get(at + "mlp.gate_proj.weight", (hidden, d)),
            "gate": w.get(at + "mlp.up_proj.weight", (hidden, d)),
            "w2": w.get(at + "mlp.down_proj.weight", (d, hidden)),
            "g1": w.get(at + "input_layernorm.weight", (d,)),
            "g2": w.get(at + "post_attention_layernorm.weight", (d,)),
        }
        if bias:
            values |= {
                "bq": w.get(at + "self_attn.q_proj.bias", (q_rows,)).reshape(heads, head_dim),
                "bk": repeat_kv(w.get(at + "self_attn.k_proj.bias", (kv_rows,)).reshape(kv_heads, head_dim), groups),
                "bv": repeat_kv(w.get(at + "self_attn.v_proj.bias", (kv_rows,)).reshape(kv_heads, head_dim), groups),
                "bo": w.get(at + "self_attn.o_proj.bias", (d,)),
            }
        for key, value in values.items():
            parts[key].append(value)
    a: dict[str, Any] = {  # an array per key, or None where the checkpoint has no such bias
        key: as_array(np.stack(value), dtype) if value else None for key, value in parts.items()
    }

    base, fraction = rope_settings(config)
    dims = int(head_dim * fraction)
    embed = w.get("embed_tokens.weight", (vocab, d))
    if w.has("lm_head.weight"):
        unembed = w.get("lm_head.weight", (vocab, d))
    elif flag(config, "tie_word_embeddings", default=False):
        unembed = embed
    else:  # a bare LlamaModel, saved without its LM head
        unembed = None
    blocks = Blocks(
        attention=attention_of(a, kv_heads),
        mlp=FeedForward(w1=a["w1"], w2=a["w2"], gate=a["gate"], activation="swiglu"),
        attn_norm=stacked_norm("rms", parts["g1"], None, eps, dtype),
        mlp_norm=stacked_norm("rms", parts["g2"], None, eps, dtype),
    )
    return Checkpoint(
        family="llama",
        arrangement="sequential",
        causal=True,
        blocks=blocks,
        embed=as_array(embed, dtype),
        final_norm=TokenNorm("rms", gamma=as_array(w.get("norm.weight", (d,)), dtype), eps=eps),
        unembed=as_array(unembed, dtype),
        rotary=Rotary(dims, base) if dims else None,
        name=name,
    )
