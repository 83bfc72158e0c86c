"""Trained transformers: their weights in one canonical form, their forward pass as the
layer map of a vector field over depth, and the analyses that read them.

- `load_checkpoint(path)`: a Hugging Face directory (GPT-2, GPT-NeoX/Pythia,
  BERT/MiniLM, Llama-family, and the encoder-decoders T5, BART and Marian; safetensors,
  sharded or not), a `.gguf` file of the llama architecture, or the name of an installed
  model (`"minilm"`, `"smollm2"`).
  Pickle files are read only with `trust_pickle=True`.
- `save_checkpoint(checkpoint, folder)`: any checkpoint in attnflow's own format
  (safetensors + JSON), which `load_checkpoint` reads back.
- `load_tokenizer(path)`: the tokenizer that ships with the checkpoint.
- `forward(checkpoint, ids)`: the real model's residual stream, block by block.
- `depth_flow(checkpoint, interpolation)` and `run_depth(flow, x0, ...)`: the same
  model as continuous-time dynamics, at any step or with an adaptive solver.
- `with_source(checkpoint, source_ids)` and `teacher_forced(checkpoint, ids)`: the
  decoder of an encoder-decoder with the encoder's output on a source bound, which the
  three above then run.

Names are imported on first use (`lazy_loader`, from the names in `__init__.pyi`, which
editors and type checkers read), so that `import attnflow.checkpoints` stays cheap.
"""

from __future__ import annotations

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
