"""Model folders of the DiffEqFormer and its GPT baseline, written atomically.

A DiffEqFormer folder holds

- `diffeqformer.json`: its `DiffEqFormerConfig` (and what the writer adds, e.g. how it
  was trained), `diffeqformer.safetensors`: every array of the model under its
  equinox tree path (`query.proj_weight`, `mlp_in.weight`, ...);
- `config.json` + `model.safetensors`: the model populated at its number of steps in
  attnflow's checkpoint format (`attnflow.checkpoints.save_checkpoint`), so that
  `load_checkpoint(folder)` and every analysis of trained checkpoints read it;
- `tokenizer.json`.

A GPT baseline folder is the checkpoint format and the tokenizer only. Every folder is
written by the store's one writer (`attnflow.storage._store.replacing`): into a temporary
sibling, then renamed into place, so an interruption leaves either the previous folder
or the new one, never a mixture.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file, save_file

from ..checkpoints.native import save_checkpoint
from ..schema._errors import CheckpointError, ConfigError
from ..storage._store import replacing
from ._model import Checkpoint, DiffEqFormer, DiffEqFormerConfig, LoRA, populate
from ._settings import read_json

FORMAT_VERSION = 1
CONFIG_FILE = "diffeqformer.json"
WEIGHTS_FILE = "diffeqformer.safetensors"
TOKENIZER_FILE = "tokenizer.json"


def arrays_by_name(tree) -> dict[str, np.ndarray]:
    """Every array leaf of `tree` by its tree path (`query.proj_weight`, `[0].mu.embed`)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(eqx.filter(tree, eqx.is_array))
    return {_name(path): np.array(leaf, order="C") for path, leaf in flat if leaf is not None}


def _name(path) -> str:
    return jax.tree_util.keystr(path).lstrip(".")


def fill(template, arrays: Mapping[str, np.ndarray], where: str):
    """`template` (a pytree whose array leaves may be `jax.ShapeDtypeStruct`s) with every
    array leaf replaced by the one of the same name in `arrays`, checked for shape and
    dtype; missing or unexpected names raise CheckpointError naming `where`."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(template)
    leaves, used = [], set()
    for path, leaf in flat:
        if not isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct, np.ndarray)):
            leaves.append(leaf)
            continue
        name = _name(path)
        if name not in arrays:
            raise CheckpointError(f"{where} has no array {name}; it was written by another model or version.")
        value = np.asarray(arrays[name])
        if value.shape != tuple(leaf.shape) or value.dtype != leaf.dtype:
            raise CheckpointError(
                f"array {name} in {where} has shape {value.shape} and dtype {value.dtype}, "
                f"but the model needs {tuple(leaf.shape)} and {leaf.dtype}."
            )
        leaves.append(jnp.asarray(value))
        used.add(name)
    unknown = sorted(set(arrays) - used)
    if unknown:
        raise CheckpointError(f"{where} holds an array {unknown[0]} that the model does not have.")
    return jax.tree_util.tree_unflatten(treedef, leaves)


def write_arrays(arrays: Mapping[str, np.ndarray], path: Path) -> None:
    save_file(dict(arrays), str(path), metadata={"format": "attnflow"})


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays of a safetensors file; a missing or damaged file raises CheckpointError."""
    if not Path(path).is_file():
        raise CheckpointError(f"{path} is missing.")
    try:
        return load_file(str(path))
    except Exception as error:  # safetensors raises its own and OS errors for damaged files
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"{path} is not a readable safetensors file ({first}).") from None


def save_diffeqformer(
    model: DiffEqFormer,
    folder: str | os.PathLike,
    *,
    tokenizer_json: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write `model` into `folder` (replaced atomically): its config and arrays, its
    populated canonical form at `model.config.steps` steps, and the tokenizer."""
    folder = Path(folder)
    record = {
        "model_type": "diffeqformer",
        "format_version": FORMAT_VERSION,
        "config": model.config.to_json(),
        "extra": dict(extra or {}),
    }
    with replacing(folder, folder=True) as partial:
        write_arrays(arrays_by_name(model), partial / WEIGHTS_FILE)
        (partial / CONFIG_FILE).write_text(json.dumps(record, indent=2) + "\n")
        save_checkpoint(
            populate(model),
            partial,
            tokenizer_json=tokenizer_json,
            extra={"diffeqformer": model.config.to_json(), **dict(extra or {})},
        )
    return folder


def diffeqformer_config(folder: str | os.PathLike) -> DiffEqFormerConfig:
    """The `DiffEqFormerConfig` of a DiffEqFormer folder."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"DiffEqFormer folder {folder} does not exist.")
    if not (folder / CONFIG_FILE).is_file():
        raise CheckpointError(
            f"{folder} has no {CONFIG_FILE}: it is not a DiffEqFormer folder "
            "(write one with `attnflow train` or save_diffeqformer)."
        )
    record = read_json(folder / CONFIG_FILE)
    if record.get("format_version") != FORMAT_VERSION or not isinstance(record.get("config"), dict):
        raise CheckpointError(
            f"{folder / CONFIG_FILE} is not a DiffEqFormer config of format version {FORMAT_VERSION}."
        )
    try:
        return DiffEqFormerConfig.from_json(record["config"])
    except (ConfigError, TypeError) as error:
        raise CheckpointError(
            f"{folder / CONFIG_FILE} holds an impossible config ({str(error).rstrip('.')})."
        ) from None


def load_diffeqformer(folder: str | os.PathLike) -> DiffEqFormer:
    """The DiffEqFormer saved in `folder` by `save_diffeqformer`, exactly."""
    folder = Path(folder)
    config = diffeqformer_config(folder)
    template = eqx.filter_eval_shape(DiffEqFormer, config, key=jax.random.key(0))
    return fill(template, read_arrays(folder / WEIGHTS_FILE), str(folder / WEIGHTS_FILE))


def tokenizer_text(folder: str | os.PathLike) -> str:
    """The `tokenizer.json` of a model folder, as text."""
    path = Path(folder) / TOKENIZER_FILE
    if not path.is_file():
        raise CheckpointError(f"{Path(folder)} has no {TOKENIZER_FILE}.")
    return path.read_text()


def save_model(
    model, folder: str | os.PathLike, *, tokenizer_json: str | None = None, extra: Mapping[str, Any] | None = None
) -> Path:
    """Write any trained model into a model folder: a DiffEqFormer as above; a
    checkpoint (the GPT baseline, its unembedding tied) or a LoRA-adapted checkpoint
    (merged) in attnflow's checkpoint format, atomically."""
    if isinstance(model, DiffEqFormer):
        return save_diffeqformer(model, folder, tokenizer_json=tokenizer_json, extra=extra)
    if isinstance(model, LoRA):
        model = model.merged()
    if not isinstance(model, Checkpoint):
        raise TypeError(f"cannot save a {type(model).__name__}.")
    if model.unembed is None:
        model = dataclasses.replace(model, unembed=model.embed)
    with replacing(folder, folder=True) as partial:
        save_checkpoint(model, partial, tokenizer_json=tokenizer_json, extra=extra)
    return Path(folder)
