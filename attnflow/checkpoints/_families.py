"""The checkpoint families attnflow reads from a Hugging Face folder, by the `model_type`
of its `config.json`: one file each in `attnflow/checkpoints/` (its layout in its
docstring, `from_hf(config, tensors, name=, dtype=)` reading it into canonical form) and
one line here. GGUF files and attnflow's own format are read by `gguf.py` and
`native.py`."""

from __future__ import annotations

# model_type -> the module of its family: one line per family.
HF_FAMILIES = {
    "gpt2": "gpt2",
    "gpt_neox": "neox",
    "bert": "bert",
    "llama": "llama",
    "t5": "t5",
    "bart": "bart",
    "marian": "marian",
}
