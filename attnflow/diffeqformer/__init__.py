"""The DiffEqFormer (Neural ODE Transformers): a transformer whose depth is the time of
one ODE with time-dependent weights $W(t) = \\mathrm{Proj}(\\mathrm{MLP}(\\mathrm{Sinusoidal}(t)))$,
built from the core's attention, MLP and normalization terms and solved by `simulate`;
its GPT baseline in the canonical checkpoint form; their training (`attnflow train`),
model folders that `load_checkpoint` reads, and fine-tuning at another number of steps,
fully or with LoRA adapters of the populated layers.

- `DiffEqFormer(config, key=)`, `DiffEqFormerConfig`, `TimeWeight`, `Sinusoidal`:
  the model; `model(ids)` are next-token logits, `model.field()` its vector field.
- `populate(model, steps)`: the discrete-layer `Checkpoint` at `steps` Euler steps.
- `gpt(key, config)`: the GPT baseline; `checkpoint_logits(checkpoint, ids)`.
- `lora(checkpoint, rank, key=)`, `LoRA`: low-rank adapters of a checkpoint.
- `save_diffeqformer`, `load_diffeqformer`, `save_model`: model folders.
- `load_corpus`, `Corpus`: the offline corpora (the Python language reference, a
  copying task).
- `TrainConfig`, `train_config`, `train`: training, resumable after an interruption.

Names are imported on first use (`lazy_loader`, from the names in `__init__.pyi`, which
editors and type checkers read), so that `attnflow train` checks its settings before
loading JAX.
"""

from __future__ import annotations

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
