"""Marian checkpoints (MarianMT, the OPUS-MT translation models; Hugging Face
`model_type` `marian`) in canonical form: read by BART's code (`bart.read`), post-LN
blocks of the same names, with three differences:

- sinusoidal positions (`embed_positions`, rows `p` from 0; the sines in the first half
  of each vector, the cosines in the second), which transformers does not save and makes
  anew when it loads a model: made here as transformers makes them (`sinusoids`), or read
  where a checkpoint has them;
- no `layernorm_embedding`: a stack's embedding output is `scale * token + position`;
- the decoder may have a vocabulary of its own (`share_encoder_decoder_embeddings`
  false: `decoder_vocab_size`, `decoder.embed_tokens`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from . import bart
from ._canonical import Checkpoint
from ._files import WeightTable


def sinusoids(places: int, d: int) -> np.ndarray:
    """The sinusoidal position table `(places, d)` of transformers'
    `MarianSinusoidalPositionalEmbedding.create_weight`, operation for operation (in
    float64, rounded to float32 once), so that it is the table the model reads."""
    angles = np.array([[p / np.power(10000, 2 * (j // 2) / d) for j in range(d)] for p in range(places)])
    table = np.empty((places, d), np.float32)
    half = d // 2 if d % 2 == 0 else d // 2 + 1
    table[:, :half] = np.sin(angles[:, 0::2])
    table[:, half:] = np.cos(angles[:, 1::2])
    return table


def _positions(w: WeightTable, at: str, places: int, d: int) -> np.ndarray:
    name = at + "embed_positions.weight"
    return w.get(name, (places, d)) if w.has(name) else sinusoids(places, d)


def from_hf(config: Mapping, tensors: Mapping[str, np.ndarray], name: str = "", dtype=None) -> Checkpoint:
    """A Marian checkpoint from its `config.json` and named tensors."""
    return bart.read(
        config, tensors, family="marian", name=name, dtype=dtype, positions=_positions, embedding_norm=False
    )
