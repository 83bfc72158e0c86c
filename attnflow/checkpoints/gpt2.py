"""GPT-2 checkpoints (Hugging Face `model_type` `gpt2`) in canonical form.

GPT-2 is pre-LN (`sequential`): `x += Attn(ln_1(x)); x += MLP(ln_2(x))`, with learned
absolute positions (`wpe`), LayerNorms with `layer_norm_epsilon`, the `gelu_new` (tanh)
activation and a final `ln_f`. Its projections are `Conv1D` layers, `y = x W + b` with
`W` of shape `(in, out)`, so each is transposed to act on column vectors; the fused
`c_attn` holds `[Q; K; V]` (rows of the transposed weight), each `H` heads of `d / H`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..numerics._terms import TokenNorm
from ._canonical import Checkpoint
from ._files import WeightTable, activation, as_array, count, epsilon, flag, head_width, layer_norm_blocks, setting


def split_attention(weight: np.ndarray, bias: np.ndarray | None, heads: int):
    """Per-head `(Q, K, V)` `(H, d/H, d)` and biases `(H, d/H)` of a fused Conv1D
    `c_attn` (weight `(d, 3d)`, bias `(3d,)`)."""
    d = weight.shape[0]
    rows = weight.T.reshape(3, heads, d // heads, d)
    biases = (None,) * 3 if bias is None else tuple(bias.reshape(3, heads, d // heads))
    return tuple(rows), biases


def from_hf(config: Mapping, tensors: Mapping[str, np.ndarray], name: str = "", dtype=None) -> Checkpoint:
    """A GPT-2 checkpoint from its `config.json` and named tensors."""
    d, heads = count(config, "n_embd", "hidden_size"), count(config, "n_head", "num_attention_heads")
    depth = count(config, "n_layer", "num_hidden_layers")
    vocab, places = count(config, "vocab_size"), count(config, "n_positions", "max_position_embeddings")
    hidden = count(config, "n_inner", default=4 * d)
    eps = epsilon(config, "layer_norm_epsilon", default=1e-5)
    head_width(d, heads)
    w = WeightTable(tensors, "wte.weight", "gpt2")

    # The attention logits are <q, k> / sqrt(dk) unless the config says otherwise; other
    # scalings are folded into the queries, which keeps the canonical beta = 1/sqrt(dk).
    scale = np.ones(depth)
    if not flag(config, "scale_attn_weights", default=True):
        scale = scale * np.sqrt(d // heads)
    if flag(config, "scale_attn_by_inverse_layer_idx", default=False):
        scale = scale / np.arange(1, depth + 1)

    parts = {
        key: [] for key in ("q", "k", "v", "bq", "bk", "bv", "o", "bo", "w1", "b1", "w2", "b2", "g1", "s1", "g2", "s2")
    }
    for l in range(depth):
        at = f"h.{l}."
        (q, k, v), (bq, bk, bv) = split_attention(
            w.get(at + "attn.c_attn.weight", (d, 3 * d)), w.get(at + "attn.c_attn.bias", (3 * d,)), heads
        )
        values = {
            "q": q * scale[l],
            "k": k,
            "v": v,
            "bq": bq * scale[l],
            "bk": bk,
            "bv": bv,
            "o": w.get(at + "attn.c_proj.weight", (d, d)).reshape(heads, d // heads, d).transpose(0, 2, 1),
            "bo": w.get(at + "attn.c_proj.bias", (d,)),
            "w1": w.get(at + "mlp.c_fc.weight", (d, hidden)).T,
            "b1": w.get(at + "mlp.c_fc.bias", (hidden,)),
            "w2": w.get(at + "mlp.c_proj.weight", (hidden, d)).T,
            "b2": w.get(at + "mlp.c_proj.bias", (d,)),
            "g1": w.get(at + "ln_1.weight", (d,)),
            "s1": w.get(at + "ln_1.bias", (d,)),
            "g2": w.get(at + "ln_2.weight", (d,)),
            "s2": w.get(at + "ln_2.bias", (d,)),
        }
        for key, value in values.items():
            parts[key].append(value)

    blocks = layer_norm_blocks(
        parts, heads, activation(setting(config, "activation_function", default="gelu_new")), eps, dtype
    )
    embed = w.get("wte.weight", (vocab, d))
    unembed = w.get("lm_head.weight", (vocab, d)) if w.has("lm_head.weight") else embed
    return Checkpoint(
        family="gpt2",
        arrangement="sequential",
        causal=True,
        blocks=blocks,
        embed=as_array(embed, dtype),
        positions=as_array(w.get("wpe.weight", (places, d)), dtype),
        final_norm=TokenNorm(
            "layer",
            gamma=as_array(w.get("ln_f.weight", (d,)), dtype),
            shift=as_array(w.get("ln_f.bias", (d,)), dtype),
            eps=eps,
        ),
        unembed=as_array(unembed, dtype),
        name=name,
    )
