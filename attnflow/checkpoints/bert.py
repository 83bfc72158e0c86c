"""BERT checkpoints (MiniLM included; Hugging Face `model_type` `bert`) in canonical form.

BERT is post-LN (`post`): `x = N1(x + Attn(x)); x = N2(x + MLP(x))`, with `N1` the
`attention.output.LayerNorm` and `N2` the `output.LayerNorm` of each layer. Its
embedding output is `LayerNorm(word + position + token type)` (`embeddings.LayerNorm`);
it is an encoder (attention not causal) with no final normalization, and the masked-LM
head, where saved, is not an unembedding of the residual stream (it has its own
transform), so `unembed` is None. Old TensorFlow conversions name LayerNorm gains and
shifts `gamma` and `beta`; both spellings are read.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..numerics._terms import TokenNorm
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
    heads_in,
    heads_out,
    layer_norm_blocks,
    setting,
)


def _norm(w: WeightTable, at: str, d: int) -> tuple[np.ndarray, np.ndarray]:
    """Gain and shift of the LayerNorm `at`, in either spelling."""
    return w.first((at + ".weight", at + ".gamma"), (d,)), w.first((at + ".bias", at + ".beta"), (d,))


def from_hf(config: Mapping, tensors: Mapping[str, np.ndarray], name: str = "", dtype=None) -> Checkpoint:
    """A BERT checkpoint from its `config.json` and named tensors."""
    d, heads = count(config, "hidden_size"), count(config, "num_attention_heads")
    depth, vocab = count(config, "num_hidden_layers"), count(config, "vocab_size")
    hidden, places = count(config, "intermediate_size"), count(config, "max_position_embeddings")
    types = count(config, "type_vocab_size", default=2)
    eps = epsilon(config, "layer_norm_eps", default=1e-12)
    head_width(d, heads)
    kind = setting(config, "position_embedding_type", default="absolute")
    if kind != "absolute":
        raise CheckpointError(
            f"config.json asks for position_embedding_type {kind!r}; attnflow reads BERT "
            f"models with absolute positions only."
        )
    if flag(config, "is_decoder", default=False):
        raise CheckpointError("config.json makes this BERT a decoder (is_decoder); attnflow reads BERT encoders.")
    w = WeightTable(tensors, "embeddings.word_embeddings.weight", "bert")

    parts = {
        key: [] for key in ("q", "k", "v", "bq", "bk", "bv", "o", "bo", "w1", "b1", "w2", "b2", "g1", "s1", "g2", "s2")
    }
    for l in range(depth):
        at = f"encoder.layer.{l}."
        g1, s1 = _norm(w, at + "attention.output.LayerNorm", d)
        g2, s2 = _norm(w, at + "output.LayerNorm", d)
        values = {
            "q": heads_in(w.get(at + "attention.self.query.weight", (d, d)), heads),
            "k": heads_in(w.get(at + "attention.self.key.weight", (d, d)), heads),
            "v": heads_in(w.get(at + "attention.self.value.weight", (d, d)), heads),
            "bq": w.get(at + "attention.self.query.bias", (d,)).reshape(heads, -1),
            "bk": w.get(at + "attention.self.key.bias", (d,)).reshape(heads, -1),
            "bv": w.get(at + "attention.self.value.bias", (d,)).reshape(heads, -1),
            "o": heads_out(w.get(at + "attention.output.dense.weight", (d, d)), heads),
            "bo": w.get(at + "attention.output.dense.bias", (d,)),
            "w1": w.get(at + "intermediate.dense.weight", (hidden, d)),
            "b1": w.get(at + "intermediate.dense.bias", (hidden,)),
            "w2": w.get(at + "output.dense.weight", (d, hidden)),
            "b2": w.get(at + "output.dense.bias", (d,)),
            "g1": g1,
            "s1": s1,
            "g2": g2,
            "s2": s2,
        }
        for key, value in values.items():
            parts[key].append(value)

    blocks = layer_norm_blocks(parts, heads, activation(setting(config, "hidden_act", default="gelu")), eps, dtype)
    gamma, shift = _norm(w, "embeddings.LayerNorm", d)
    return Checkpoint(
        family="bert",
        arrangement="post",
        causal=False,
        blocks=blocks,
        embed=as_array(w.get("embeddings.word_embeddings.weight", (vocab, d)), dtype),
        positions=as_array(w.get("embeddings.position_embeddings.weight", (places, d)), dtype),
        token_types=as_array(w.get("embeddings.token_type_embeddings.weight", (types, d)), dtype),
        embed_norm=TokenNorm("layer", gamma=as_array(gamma, dtype), shift=as_array(shift, dtype), eps=eps),
        name=name,
    )
