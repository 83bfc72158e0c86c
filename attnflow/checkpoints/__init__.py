"""Trained transformers: their weights in one canonical form, their forward pass as the
layer map of a vector field over depth, and the analyses that read them.

- `load_checkpoint(path)`: a Hugging Face directory (GPT-2, GPT-NeoX/Pythia,
  BERT/MiniLM, Llama-family; safetensors, sharded or not), a `.gguf` file of the llama
  architecture, or the name of an installed model (`"minilm"`, `"smollm2"`).
  Pickle files are read only with `trust_pickle=True`.
- `save_checkpoint(checkpoint, folder)`: any checkpoint in attnflow's own format
  (safetensors + JSON), which `load_checkpoint` reads back.
- `load_tokenizer(path)`: the tokenizer that ships with the checkpoint.
- `forward(checkpoint, ids)`: the real model's residual stream, block by block.
- `depth_flow(checkpoint, interpolation)` and `run_depth(flow, x0, ...)`: the same
  model as continuous-time dynamics, at any step or with an adaptive solver.

Names are imported on first use, so that `import attnflow.checkpoints` stays cheap.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "_canonical": ("Attention", "Blocks", "Checkpoint", "FeedForward"),
    "_flow": ("DepthFlow", "Forward", "depth_flow", "forward", "run_depth"),
    "_load": ("installed_model", "load_checkpoint"),
    "native": ("save_checkpoint",),
    "_tokenizer": ("Tokenizer", "load_tokenizer"),
    "spectra": ("draw_spectra", "head_spectra"),
    "probes": ("decode_head_vectors", "embedding_distances", "normalized_embeddings", "token_path"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'attnflow.checkpoints' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
