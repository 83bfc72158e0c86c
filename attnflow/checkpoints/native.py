"""attnflow's own checkpoint format: any `Checkpoint` saved as it is held in memory.

A folder with

- `config.json`: `"model_type": "attnflow"`, the format version, and the static facts
  of the canonical form (family, arrangement, causal mask, activation, the kind and
  epsilon of every normalization, rotary settings, the numbers of grouped key/value
  heads), plus whatever `extra` settings the writer adds (e.g. how it was trained);
- `model.safetensors`: every array of the canonical form under its dotted field name
  (`blocks.attention.query`, `blocks.mlp_norm.gamma`, `embed`, ...), the layer axis
  first, in the dtype it had;
- `tokenizer.json`, when a tokenizer is given.

`load_checkpoint(folder)` reads it back into the same `Checkpoint`: models trained by
attnflow (the GPT baseline, a DiffEqFormer populated at a number of steps) then go
through every analysis written for trained transformers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal, overload

import jax.numpy as jnp
import numpy as np

from ..numerics._terms import Rotary, TokenNorm
from ..schema._errors import CheckpointError
from ..storage._store import write_atomically
from ._canonical import ARRANGEMENTS, FAMILIES, Attention, Blocks, Checkpoint, FeedForward, stack_layers
from ._files import whole

if TYPE_CHECKING:
    from jax import Array

MODEL_TYPE = "attnflow"
VERSION = 1

_ATTENTION = ("query", "key", "value", "output", "query_bias", "key_bias", "value_bias", "output_bias")
_MLP = ("w1", "w2", "b1", "b2", "gate")
_TOP = ("embed", "positions", "token_types", "unembed")
_BLOCK_NORMS = ("attn_norm", "mlp_norm")
_OTHER_NORMS = ("embed_norm", "final_norm")


def _norm_settings(norm: TokenNorm | None) -> dict | None:
    return None if norm is None else {"kind": norm.kind, "eps": float(norm.eps)}


def _arrays(checkpoint: Checkpoint) -> dict[str, np.ndarray]:
    """Every array of `checkpoint` by its dotted name (absent ones left out)."""
    out = {}
    blocks = checkpoint.blocks
    for name in _ATTENTION:
        out[f"blocks.attention.{name}"] = getattr(blocks.attention, name)
    for name in _MLP:
        out[f"blocks.mlp.{name}"] = getattr(blocks.mlp, name)
    for name in _BLOCK_NORMS:
        norm = getattr(blocks, name)
        out[f"blocks.{name}.gamma"], out[f"blocks.{name}.shift"] = norm.gamma, norm.shift
    for name in _TOP:
        out[name] = getattr(checkpoint, name)
    for name in _OTHER_NORMS:
        norm = getattr(checkpoint, name)
        if norm is not None:
            out[f"{name}.gamma"], out[f"{name}.shift"] = norm.gamma, norm.shift
    return {name: np.ascontiguousarray(np.asarray(value)) for name, value in out.items() if value is not None}


def save_checkpoint(
    checkpoint: Checkpoint,
    folder: str | os.PathLike,
    *,
    tokenizer_json: str | None = None,
    extra: Mapping | None = None,
) -> Path:
    """Write `checkpoint` into `folder` (created if needed) in attnflow's format; returns
    the folder. `tokenizer_json` is a `tokenizers` JSON string saved beside it; `extra`
    settings are kept in `config.json` under `"extra"`. Each file is written under a
    temporary name and renamed, so a reader never sees a half-written file, and a
    write that fails (a full disk) leaves no temporary file behind."""
    from safetensors.numpy import save_file  # lazy: start-up

    if checkpoint.encoder is not None or checkpoint.position_bias is not None or checkpoint.unembed_bias is not None:
        raise CheckpointError(
            f"attnflow's own format holds encoder-only and decoder-only models without relative position biases "
            f"or an LM head bias; {checkpoint.name or checkpoint.family} (an encoder-decoder or one of its stacks) "
            "cannot be saved in it yet."
        )
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    blocks = checkpoint.blocks
    config = {
        "model_type": MODEL_TYPE,
        "format_version": VERSION,
        "family": checkpoint.family,
        "arrangement": checkpoint.arrangement,
        "causal": bool(checkpoint.causal),
        "name": checkpoint.name,
        "layers": checkpoint.depth,
        "dim": checkpoint.dim,
        "heads": checkpoint.heads,
        "head_dim": checkpoint.head_dim,
        "vocab": int(checkpoint.embed.shape[0]),
        "kv_heads": int(blocks.attention.kv_heads),
        "activation": blocks.mlp.activation,
        "norms": {name: _norm_settings(getattr(blocks, name)) for name in _BLOCK_NORMS}
        | {name: _norm_settings(getattr(checkpoint, name)) for name in _OTHER_NORMS},
        "rotary": None
        if checkpoint.rotary is None
        else {"dims": checkpoint.rotary.dims, "base": float(checkpoint.rotary.base)},
        "extra": dict(extra or {}),
    }
    arrays = _arrays(checkpoint)
    write_atomically(folder / "model.safetensors", lambda p: save_file(arrays, str(p), metadata={"format": "attnflow"}))
    write_atomically(folder / "config.json", lambda p: p.write_text(json.dumps(config, indent=2) + "\n"))  # pyright: ignore[reportArgumentType]  # write_text's count is unused (annotated None)
    if tokenizer_json is not None:
        write_atomically(folder / "tokenizer.json", lambda p: p.write_text(tokenizer_json))  # pyright: ignore[reportArgumentType]  # write_text's count is unused (annotated None)
    return folder


def from_native(config: Mapping, tensors: Mapping[str, np.ndarray], *, name: str = "", dtype=None) -> Checkpoint:
    """The `Checkpoint` stored by `save_checkpoint` (`config` its parsed `config.json`,
    `tensors` its arrays by name)."""
    where = f"attnflow checkpoint {name!r}" if name else "attnflow checkpoint"
    version = config.get("format_version")
    if version != VERSION:
        raise CheckpointError(f"the {where} has format version {version!r}; this attnflow reads version {VERSION}.")
    for key in ("family", "arrangement", "causal", "activation", "norms", "layers", "dim", "heads", "head_dim"):
        if key not in config:
            raise CheckpointError(f"the config.json of the {where} has no {key!r} setting.")
    if config["family"] not in FAMILIES or config["arrangement"] not in ARRANGEMENTS:
        raise CheckpointError(
            f"the {where} names an unknown family {config['family']!r} or arrangement {config['arrangement']!r}."
        )
    L, d, H, k = (whole(config[key], f"config.json's {key}") for key in ("layers", "dim", "heads", "head_dim"))
    if not isinstance(config["causal"], bool):
        raise CheckpointError(f"config.json's causal must be true or false, got {config['causal']!r}.")
    cast = (lambda a: jnp.asarray(a)) if dtype is None else (lambda a: jnp.asarray(a, dtype))

    @overload
    def get(key: str, shape: tuple[int | None, ...] | None, required: Literal[True]) -> Array: ...
    @overload
    def get(key: str, shape: tuple[int | None, ...] | None, required: bool = False) -> Array | None: ...
    def get(key: str, shape: tuple[int | None, ...] | None, required: bool = False) -> Array | None:
        if key not in tensors:
            if required:
                raise CheckpointError(f"the {where} has no tensor {key}.")
            return None
        value = np.asarray(tensors[key])
        if shape is not None and value.shape != shape:
            raise CheckpointError(
                f"tensor {key} of the {where} has shape {value.shape}, but its config.json implies {shape}."
            )
        return cast(value)

    hidden = np.asarray(tensors["blocks.mlp.w1"]).shape[1] if "blocks.mlp.w1" in tensors else None
    v = np.asarray(tensors["blocks.attention.value"]).shape[2] if "blocks.attention.value" in tensors else k
    attention = Attention(
        query=get("blocks.attention.query", (L, H, k, d), True),
        key=get("blocks.attention.key", (L, H, k, d), True),
        value=get("blocks.attention.value", (L, H, v, d), True),
        output=get("blocks.attention.output", (L, H, d, v), True),
        query_bias=get("blocks.attention.query_bias", (L, H, k)),
        key_bias=get("blocks.attention.key_bias", (L, H, k)),
        value_bias=get("blocks.attention.value_bias", (L, H, v)),
        output_bias=get("blocks.attention.output_bias", (L, d)),
        kv_heads=int(config.get("kv_heads", 0)),
    )
    mlp = FeedForward(
        w1=get("blocks.mlp.w1", (L, hidden, d), True),
        w2=get("blocks.mlp.w2", (L, d, hidden), True),
        b1=get("blocks.mlp.b1", (L, hidden)),
        b2=get("blocks.mlp.b2", (L, d)),
        gate=get("blocks.mlp.gate", (L, hidden, d)),
        activation=str(config["activation"]),
    )
    norms = config["norms"]

    def norm(key: str, shape: tuple[int, ...], prefix: str = "") -> TokenNorm | None:
        settings = norms.get(key)
        if settings is None:
            return None
        at = prefix + key
        gamma, shift = get(f"{at}.gamma", shape), get(f"{at}.shift", shape)
        one = lambda g, s: TokenNorm(settings["kind"], g, s, eps=float(settings["eps"]))
        if len(shape) == 1:
            return one(gamma, shift)
        # A stacked norm (one per layer): built layer by layer, then stacked, as the loaders do.
        return stack_layers(
            [one(None if gamma is None else gamma[l], None if shift is None else shift[l]) for l in range(shape[0])]
        )

    blocks = Blocks(
        attention=attention,
        mlp=mlp,
        attn_norm=norm("attn_norm", (L, d), "blocks."),  # pyright: ignore[reportArgumentType]  # None is refused just below
        mlp_norm=norm("mlp_norm", (L, d), "blocks."),  # pyright: ignore[reportArgumentType]  # None is refused just below
    )
    if blocks.attn_norm is None or blocks.mlp_norm is None:
        raise CheckpointError(f"the config.json of the {where} gives no settings for the block normalizations.")
    embed = get("embed", None, True)
    if embed.ndim != 2 or embed.shape[1] != d:
        raise CheckpointError(f"tensor embed of the {where} has shape {embed.shape}, not (vocab, {d}).")
    rotary = config.get("rotary")
    return Checkpoint(
        family=config["family"],
        arrangement=config["arrangement"],
        causal=bool(config["causal"]),
        blocks=blocks,
        embed=embed,
        positions=get("positions", None),
        token_types=get("token_types", None),
        embed_norm=norm("embed_norm", (d,)),
        final_norm=norm("final_norm", (d,)),
        unembed=get("unembed", embed.shape),
        rotary=None if rotary is None else Rotary(int(rotary["dims"]), float(rotary["base"])),
        name=str(config.get("name") or name),
    )
