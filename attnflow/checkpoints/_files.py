"""Reading a Hugging Face checkpoint folder: `config.json` and its named tensors.

The weights are `model.safetensors`, or shards listed by `model.safetensors.index.json`,
read with the `safetensors` package (lazily: a tensor is read when a family module
asks for it). Pickle-based files (`pytorch_model.bin`, `*.pt`, `*.pth`, `*.ckpt`) can
run arbitrary code when they are opened, so they are refused unless the caller trusts
them (`trust_pickle=True`); trusted ones are read with `torch.load(weights_only=True)`.

Every failure is a `CheckpointError` of one sentence naming the file and what is wrong.
`WeightTable` is what the family modules read through: names under the checkpoint's
prefix, shapes checked against what `config.json` implies.
"""

from __future__ import annotations

import json
import math
import pickle
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, overload

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError, safe_open

from ..numerics._terms import TokenNorm
from ..running import _ensemble
from ..schema._errors import CheckpointError
from ._canonical import Attention, Blocks, FeedForward, stack_layers

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_INDEX = "pytorch_model.bin.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
TRUST_HINT = "pass trust_pickle=True (on the command line trust_pickle=true) if you trust its source"


def read_config(folder: Path) -> dict:
    """The parsed `config.json` of a checkpoint folder."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"checkpoint folder {folder} has no config.json.")
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path} is not valid JSON ({_first_line(error)}).") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} holds a JSON {type(config).__name__}, not an object of settings.")
    return config


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0].rstrip(".") if text else type(error).__name__


class SafetensorsTensors(Mapping):
    """The tensors of one or several `.safetensors` files, read on access as numpy
    arrays (bfloat16 and float16 widened to float32).

    `files` maps each tensor name to the file holding it (from a shard `index`, or the
    files' own headers); every file is opened, its header checked against its length
    and every tensor looked up when the mapping is made."""

    def __init__(self, files: Mapping[str, Path], index: Path | None = None):
        self._where = dict(files)
        self._handles = {}
        for path in sorted(set(self._where.values())):
            try:
                self._handles[path] = safe_open(str(path), framework="numpy")
            except (SafetensorError, OSError, ValueError) as error:
                raise CheckpointError(
                    f"{path} is truncated or not a safetensors file ({_first_line(error)})."
                ) from None
        stored = {path: set(handle.keys()) for path, handle in self._handles.items()}
        for name, path in self._where.items():
            if name not in stored[path]:
                raise CheckpointError(
                    f"tensor {name} listed in {index or 'the shard index'} is missing from {path.name}."
                )

    @classmethod
    def of_files(cls, paths: list[Path]) -> SafetensorsTensors:
        """All tensors of whole files (no index)."""
        where = {}
        for path in paths:
            try:
                names = safe_open(str(path), framework="numpy").keys()
            except (SafetensorError, OSError, ValueError) as error:
                raise CheckpointError(
                    f"{path} is truncated or not a safetensors file ({_first_line(error)})."
                ) from None
            where.update({name: path for name in names})
        return cls(where)

    def where(self, name: str) -> Path:
        """The file that holds tensor `name`."""
        return self._where[name]

    def elements(self) -> int:
        """How many numbers the tensors hold, from the headers (nothing is read)."""
        return sum(math.prod(self._handles[path].get_slice(name).get_shape()) for name, path in self._where.items())

    def __getitem__(self, name: str) -> np.ndarray:
        path = self._where[name]
        handle = self._handles[path]
        try:
            dtype = handle.get_slice(name).get_dtype()
            if dtype == "BF16":
                return _read_bfloat16(path, name)
            array = handle.get_tensor(name)
        except Exception as error:  # safetensors raises several types for corrupt data
            raise CheckpointError(f"{path} could not give tensor {name} ({_first_line(error)}).") from None
        return array.astype(np.float32) if array.dtype == np.float16 else array

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


def _read_bfloat16(path: Path, name: str) -> np.ndarray:
    """A bfloat16 tensor as float32, from its raw bytes (numpy has no bfloat16): the
    file is an 8-byte little-endian header length, a JSON header giving each tensor's
    byte range, then the data; a bfloat16 is the upper half of a float32."""
    with open(path, "rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        entry = json.loads(file.read(length))[name]
    start, stop = entry["data_offsets"]
    raw = np.fromfile(path, dtype="<u2", count=(stop - start) // 2, offset=8 + length + start)
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(entry["shape"])


def _indexed(folder: Path, index_name: str) -> dict[str, Path]:
    """Tensor name -> shard file, from a Hugging Face `*.index.json`, every shard present
    and inside the folder."""
    path = folder / index_name
    try:
        weight_map = json.loads(path.read_text())["weight_map"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as error:
        raise CheckpointError(f"{path} is not a shard index with a weight_map ({_first_line(error)}).") from None
    if not isinstance(weight_map, Mapping):
        raise CheckpointError(f"{path} has a weight_map that is not an object of tensor names and shard files.")
    where = {name: _shard(folder, path, shard) for name, shard in weight_map.items()}
    for shard in sorted(set(where.values())):
        if not shard.is_file():
            raise CheckpointError(f"shard {shard.name} listed in {path} is missing from {folder}.")
    return where


def _shard(folder: Path, index: Path, name) -> Path:
    """The file of shard `name` listed in `index`. An index is data: a name that leads
    out of the folder (`..`, an absolute path, a symbolic link to elsewhere) is refused,
    so that a checkpoint cannot make attnflow open any other file. The Hugging Face
    cache's links from `snapshots/<revision>/` to the model's `blobs/` stay inside the
    model's cache folder and are followed."""
    if not isinstance(name, str) or not name.strip():
        raise CheckpointError(f"{index} lists the shard {name!r}, which is not a file name.")
    home = folder.resolve()
    if home.parent.name == "snapshots":
        home = home.parent.parent
    try:
        inside = not Path(name).is_absolute() and (folder / name).resolve().is_relative_to(home)
    except (OSError, RuntimeError):  # a loop of symbolic links
        inside = False
    if not inside:
        raise CheckpointError(
            f"shard {name} listed in {index} leads outside the checkpoint folder {folder}; shards are files inside it."
        )
    return folder / name


def read_tensors(path: Path, *, trust_pickle: bool = False) -> Mapping[str, np.ndarray]:
    """The named tensors of a checkpoint folder (or of one weights file in it).

    Looks for, in order: the safetensors shard index, `model.safetensors`, any other
    `*.safetensors`, then pickle files (the PyTorch shard index, `pytorch_model.bin`,
    `*.pt`, ...), which need `trust_pickle`."""
    path = Path(path)
    if path.is_file():
        if path.suffix == ".safetensors":
            return SafetensorsTensors.of_files([path])
        if path.suffix in PICKLE_SUFFIXES:
            return _read_pickles([path], trust_pickle)
        raise CheckpointError(
            f"{path} is not a weights file attnflow reads (.safetensors, .gguf, or a trusted pickle)."
        )
    if (path / SAFETENSORS_INDEX).is_file():
        return SafetensorsTensors(_indexed(path, SAFETENSORS_INDEX), index=path / SAFETENSORS_INDEX)
    if (path / SAFETENSORS).is_file():
        return SafetensorsTensors.of_files([path / SAFETENSORS])
    others = sorted(p for p in path.glob("*.safetensors") if p.is_file())
    if others:
        return SafetensorsTensors.of_files(others)
    if (path / PICKLE_INDEX).is_file():
        return _read_pickles(sorted(set(_indexed(path, PICKLE_INDEX).values())), trust_pickle)
    pickles = sorted(p for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES and p.is_file())
    if pickles:
        return _read_pickles(pickles, trust_pickle)
    raise CheckpointError(
        f"checkpoint folder {path} has no weights (model.safetensors, a shard index, or a pickle file)."
    )


def _read_pickles(paths: list[Path], trust: bool) -> dict[str, np.ndarray]:
    """The tensors of PyTorch pickle files, read only when trusted and torch is present."""
    if not trust:
        raise CheckpointError(f"{paths[0]} is a pickle file, which can run code when opened; {TRUST_HINT}.")
    try:
        import torch  # optional: not a dependency of attnflow, and only pickles need it
    except ImportError:
        raise CheckpointError(
            f"{paths[0]} is a pickle file and reading it needs torch, which is not installed."
        ) from None
    tensors = {}
    for path in paths:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            raise CheckpointError(
                f"{path} holds objects other than tensors, which could run code when loaded; "
                f"attnflow reads pickles of tensors only, even when trusted."
            ) from None
        except Exception as error:  # torch raises many types for corrupt pickles
            raise CheckpointError(f"{path} could not be read as a PyTorch state dict ({_first_line(error)}).") from None
        if isinstance(state, Mapping) and "state_dict" in state and isinstance(state["state_dict"], Mapping):
            state = state["state_dict"]
        if not isinstance(state, Mapping):
            raise CheckpointError(f"{path} holds a {type(state).__name__}, not a state dict of named tensors.")
        for name, value in state.items():
            if isinstance(value, torch.Tensor):
                value = value.detach()
                tensors[name] = (
                    value.float() if value.is_floating_point() and value.dtype != torch.float64 else value
                ).numpy()
    if not tensors:
        raise CheckpointError(f"{paths[0]} holds no tensors.")
    return tensors


class WeightTable:
    """A checkpoint's tensors as one family reads them: names relative to the prefix
    the checkpoint was saved under (`transformer.`, `gpt_neox.`, `bert.`, `model.`, or
    none), shapes checked against what `config.json` implies, values as numpy arrays.

    The prefix is found from `anchor`, a tensor every checkpoint of the family has (the
    token embedding): it is whatever precedes the shortest name ending in `anchor`."""

    def __init__(self, tensors: Mapping[str, np.ndarray], anchor: str, family: str):
        self.tensors, self.family = tensors, family
        names = [name for name in tensors if name == anchor or name.endswith("." + anchor)]
        if not names:
            raise CheckpointError(
                f"the {family} checkpoint has no tensor named {anchor} (with any prefix); "
                f"is config.json's model_type right?"
            )
        self.prefix = min(names, key=len)[: -len(anchor)]

    def _source(self, name: str) -> str:
        where = getattr(self.tensors, "where", None)
        return f" in {where(name).name}" if where is not None else ""

    def name(self, name: str) -> str | None:
        """The stored name of `name`: under the prefix, or at the top level (LM heads)."""
        for full in (self.prefix + name, name):
            if full in self.tensors:
                return full
        return None

    def has(self, name: str) -> bool:
        return self.name(name) is not None

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """Tensor `name`, which must have `shape`."""
        full = self.name(name)
        if full is None:
            raise CheckpointError(f"the {self.family} checkpoint has no tensor {self.prefix + name}.")
        array = self.tensors[full]
        if not np.issubdtype(array.dtype, np.floating):
            raise CheckpointError(
                f"tensor {full}{self._source(full)} holds {array.dtype} values, not floating-point "
                f"weights (attnflow does not read quantized safetensors)."
            )
        if tuple(array.shape) != tuple(shape):
            raise CheckpointError(
                f"tensor {full}{self._source(full)} has shape {tuple(array.shape)} but config.json "
                f"implies {tuple(shape)}."
            )
        return array

    def first(self, names: tuple[str, ...], shape: tuple[int, ...]) -> np.ndarray:
        """The first of several alternative names that the checkpoint has."""
        for name in names:
            if self.has(name):
                return self.get(name, shape)
        return self.get(names[0], shape)


def check_dtype(dtype) -> None:
    """A dtype asked for the arrays: None (float32, or as saved) or a floating one
    (integer weights would be the trained ones rounded)."""
    if dtype is None:
        return
    try:
        chosen = jnp.dtype(dtype)
    except TypeError:
        raise CheckpointError(f"dtype {dtype!r} is not a dtype; use float32 or float64.") from None
    if not jnp.issubdtype(chosen, jnp.floating):
        raise CheckpointError(f"dtype {dtype!r} is not a floating dtype; the weights are read as float32 or float64.")


def check_memory(tensors: Mapping, dtype, where: Path) -> None:
    """Refuse weights that do not fit before reading them: their count (from the
    files' headers) times the dtype's size, twice over (the per-layer arrays and their
    stacks exist together while the canonical form is made), against the memory
    available to a run. Mappings that cannot count without reading are let through."""
    elements = getattr(tensors, "elements", None)
    if elements is None:
        return
    dtype = jnp.dtype(jnp.float32 if dtype is None else dtype)
    size = elements() * dtype.itemsize
    free = _ensemble.available_memory()
    if 2 * size > free:
        raise CheckpointError(
            f"the weights of {where} take {_ensemble._gib(size)} as {dtype.name} and "
            f"loading them needs about {_ensemble._gib(2 * size)}, more than the "
            f"{_ensemble._gib(free)} available."
        )


_REQUIRED = object()


def _first_set(config: Mapping, names: tuple[str, ...]) -> str:
    return next((name for name in names if config.get(name) is not None), names[0])


def setting(config: Mapping, *names: str, default=_REQUIRED) -> Any:
    """The first of `names` set (not null) in `config.json`, else `default`; without a
    default the setting is required."""
    for name in names:
        if config.get(name) is not None:
            return config[name]
    if default is _REQUIRED:
        raise CheckpointError(f"config.json has no {names[0]}, which a {config.get('model_type')} model needs.")
    return default


def _is_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def whole(value, what: str) -> int:
    """`value` as a positive whole number (`2`, or `2.0`); anything else (a string, a
    fraction, a boolean, zero or less) is one sentence naming `what`. A plain `int()`
    would read `2.5` as 2 and `true` as 1, and let 0 divide or -1 size an array."""
    if not _is_number(value) or not float(value).is_integer() or value < 1:
        raise CheckpointError(f"{what} must be a positive whole number, got {value!r}.")
    return int(value)


def count(config: Mapping, *names: str, default=_REQUIRED) -> int:
    """A size in `config.json` (layers, heads, widths, vocabulary): a positive whole number."""
    return whole(setting(config, *names, default=default), f"config.json's {_first_set(config, names)}")


def epsilon(config: Mapping, *names: str, default: float) -> float:
    """A normalization's epsilon in `config.json`: a number, zero or more."""
    value = setting(config, *names, default=default)
    if not _is_number(value) or not value >= 0:
        raise CheckpointError(f"config.json's {_first_set(config, names)} must be a number >= 0, got {value!r}.")
    return float(value)


def flag(config: Mapping, *names: str, default: bool) -> bool:
    """A switch in `config.json`: true or false, nothing else (the string "no" is true
    to Python)."""
    value = setting(config, *names, default=default)
    if not isinstance(value, bool):
        raise CheckpointError(f"config.json's {_first_set(config, names)} must be true or false, got {value!r}.")
    return value


def rope_settings(config: Mapping, fraction: float = 1.0) -> tuple[float, float]:
    """`(base, fraction of each head rotated)` of a rotary model, from the places
    transformers has kept them: `rope_parameters` (5.x), `rope_theta` and
    `partial_rotary_factor`, or GPT-NeoX's `rotary_emb_base` and `rotary_pct`. Only the
    plain RoPE (`rope_type` default) is the canonical `Rotary`. `fraction` is the
    family's default when the config names none."""
    key = _first_set(config, ("rope_parameters", "rope_scaling"))
    params = config.get(key) or {}
    if not isinstance(params, Mapping):
        raise CheckpointError(f"config.json's {key} must be an object of rotary settings, got {params!r}.")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise CheckpointError(
            f"config.json asks for rope_type {kind!r}; attnflow's rotary positions are the plain (default) RoPE only."
        )
    base = params.get("rope_theta", config.get("rope_theta", config.get("rotary_emb_base", 10000.0)))
    fraction = params.get(
        "partial_rotary_factor", config.get("partial_rotary_factor", config.get("rotary_pct", fraction))
    )
    if not _is_number(base) or not base > 0:
        raise CheckpointError(f"config.json's rotary base (rope_theta) must be a number > 0, got {base!r}.")
    if not _is_number(fraction) or not 0 <= fraction <= 1:
        raise CheckpointError(
            f"config.json's rotary fraction (partial_rotary_factor) must be a number from 0 to 1, got {fraction!r}."
        )
    return float(base), float(fraction)


ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}


def activation(name: str) -> str:
    """attnflow's name for a transformers activation (`hidden_act`, `activation_function`)."""
    if name not in ACTIVATIONS:
        raise CheckpointError(
            f"config.json's activation {name!r} is not one attnflow has ({', '.join(sorted(ACTIVATIONS))})."
        )
    return ACTIVATIONS[name]


@overload
def as_array(value: np.ndarray, dtype) -> jax.Array: ...
@overload
def as_array(value: None, dtype) -> None: ...
@overload
def as_array(value: np.ndarray | None, dtype) -> jax.Array | None: ...
def as_array(value: np.ndarray | None, dtype) -> jax.Array | None:
    """A numpy stack as a JAX array of the checkpoint's dtype (float32 by default)."""
    return None if value is None else jnp.asarray(np.asarray(value), dtype=dtype or jnp.float32)


def stacked_norm(kind: str, gammas: list[np.ndarray], shifts: list[np.ndarray] | None, eps: float, dtype) -> TokenNorm:
    """The `TokenNorm`s of all layers (one gain `(d,)` and shift or None per layer),
    stacked: gains `(L, d)`, shifts `(L, d)` or None."""
    return stack_layers(
        [
            TokenNorm(kind, gamma=as_array(gamma, dtype), shift=as_array(shift, dtype), eps=float(eps))
            for gamma, shift in zip(gammas, shifts or [None] * len(gammas))
        ]
    )


def attention_of(a: Mapping[str, Any], kv_heads: int) -> Attention:
    """The stacked attention of a family's layers from its arrays by key (`q k v o` and
    the biases `bq bk bv bo`, None where the family has none)."""
    return Attention(
        query=a["q"],
        key=a["k"],
        value=a["v"],
        output=a["o"],
        query_bias=a["bq"],
        key_bias=a["bk"],
        value_bias=a["bv"],
        output_bias=a["bo"],
        kv_heads=kv_heads,
    )


def layer_norm_blocks(parts: Mapping[str, list], heads: int, mlp_activation: str, eps: float, dtype) -> Blocks:
    """The stacked blocks of a LayerNorm family (GPT-2, GPT-NeoX, BERT) from per-layer
    lists keyed `q k v o bq bk bv bo w1 b1 w2 b2` (weights, a list of Nones where the
    family has no such bias) and `g1 s1 g2 s2` (the two norms' gains and shifts)."""
    a: dict[str, Any] = {  # an array per key, or None where the family has no such bias
        key: None if value[0] is None else as_array(np.stack(value), dtype) for key, value in parts.items()
    }
    return Blocks(
        attention=attention_of(a, heads),
        mlp=FeedForward(w1=a["w1"], w2=a["w2"], b1=a["b1"], b2=a["b2"], activation=mlp_activation),
        attn_norm=stacked_norm("layer", parts["g1"], parts["s1"], eps, dtype),
        mlp_norm=stacked_norm("layer", parts["g2"], parts["s2"], eps, dtype),
    )


def head_width(d: int, heads: int) -> int:
    """The width of each head when `heads` heads split the model width `d`."""
    if d % heads:
        raise CheckpointError(f"config.json's hidden size {d} is not a multiple of its {heads} attention heads.")
    return d // heads


def heads_in(matrix: np.ndarray, heads: int) -> np.ndarray:
    """Rows `(H * k, d)` of a projection as per-head blocks `(H, k, d)`."""
    return matrix.reshape(heads, -1, matrix.shape[-1])


def heads_out(matrix: np.ndarray, heads: int) -> np.ndarray:
    """An output projection `(d, H * k)` (reading concatenated heads) as `(H, d, k)`."""
    d = matrix.shape[0]
    return matrix.reshape(d, heads, -1).transpose(1, 0, 2)
