"""Llama-architecture GGUF files (llama.cpp's format) read into the canonical form.

A GGUF file holds its hyper-parameters and vocabulary as metadata (`llama.block_count`,
`tokenizer.ggml.tokens`, ...) and its weights as (often quantized) tensors named
`token_embd`, `blk.{l}.attn_q`, ..., `output_norm`, `output`. The metadata becomes the
`config.json` settings of a Hugging Face Llama, the tensors are dequantized with the
`gguf` package under their Hugging Face names, and `llama.from_hf` reads them, so a
GGUF file gives the same canonical form as a Llama folder: `sequential` pre-RMSNorm
blocks, causal attention with rotary positions, grouped key/value heads repeated to one
per query head, a SwiGLU MLP with `w1 = ffn_gate`, `gate = ffn_up`, `w2 = ffn_down`,
and the unembedding tied to the embedding when the file has no `output` tensor.

Two conventions of the format matter:

- a tensor's shape is listed in ggml's `ne` order, fastest axis first, so a matrix
  `(out, in)` is listed `[in, out]`; the arrays `gguf` returns are already `(out, in)`,
  matrices acting on column vectors, and every one is checked against the metadata;
- llama.cpp's converter permutes the rows of every query and key head from Hugging
  Face's "rotate half" layout (pairs `(k, k + d_k/2)`) to interleaved pairs
  `(2k, 2k + 1)`, which its rotary kernel rotates. `unpermute_rotary` undoes it, so the
  core's `Rotary` (rotate half) applies and the logits are those of the original model.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as BackendTokenizer

from ..schema._errors import CheckpointError
from . import llama
from ._canonical import Checkpoint
from ._files import check_dtype, check_memory, whole
from ._tokenizer import Tokenizer

ARCHITECTURE = "llama"

# llama.cpp's pre-tokenizer names (`tokenizer.ggml.pre`) and the regular expression
# each stands for (llama-vocab.cpp). `None` is GPT-2's own regex, applied by the
# byte-level pre-tokenizer; "digits" splits every digit off first, then applies it.
_GPT2_SPLITS = {
    "default": None,
    "gpt-2": None,
    "gpt2": None,
    "mpt": None,
    "olmo": None,
    "jais": None,
    "smollm": "digits",
    "starcoder": "digits",
    "refact": "digits",
    "codeshell": "digits",
    "command-r": "digits",
    "exaone": "digits",
}
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZERS = {
    **_GPT2_SPLITS,
    "llama-bpe": _LLAMA3_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "dbrx": _LLAMA3_SPLIT,
    "falcon3": _LLAMA3_SPLIT,
}
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp's token types


def unpermute_rotary(weight: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of llama.cpp's `permute(w, n_head)` on the rows of a query or key
    projection (or its bias) of `heads` heads.

    The converter reads each head's `d_k` rows as `(2, d_k/2)` (the two halves rotated
    together) and writes them as `(d_k/2, 2)`, so that half-partners become neighbours:
    `w.reshape(heads, 2, d_k/2, ...).swapaxes(1, 2)`. Reading the rows as
    `(d_k/2, 2)` and swapping back restores them.
    """
    rows = weight.shape[0]
    half = rows // heads // 2
    return weight.reshape(heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


class _Reader(GGUFReader):
    """A `GGUFReader` whose byte buffer is a plain ndarray view of the memory map.

    The reader parses every metadata string (50k tokens, 50k merges) with one small
    slice each; on a `np.memmap` each slice pays the memmap subclass's bookkeeping,
    which makes opening SmolLM2 three times slower. The map stays open through the
    view's base."""

    @property
    def data(self) -> np.ndarray:
        return self._data

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._data = value.view(np.ndarray)


@functools.lru_cache(maxsize=2)
def _read(path: str, stamp: tuple[int, int]):
    """The parsed file; cached on (path, modification time and size) so that loading
    the weights and then the tokenizer parses it once."""
    del stamp
    return _Reader(path)


def _open(path: str | os.PathLike):
    """`(path, reader)` of a GGUF file; a missing, foreign, truncated or corrupt file
    is a `CheckpointError`."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such GGUF file.")
    with open(path, "rb") as file:
        if file.read(4) != b"GGUF":
            raise CheckpointError(f"{path} is not a GGUF file (it does not begin with the GGUF magic bytes).")
    stat = path.stat()
    try:
        reader = _read(str(path.resolve()), (stat.st_mtime_ns, stat.st_size))
    except (ValueError, IndexError, KeyError, TypeError, OSError, UnicodeDecodeError) as error:
        detail = str(error).strip().splitlines()[0].rstrip(".") if str(error).strip() else type(error).__name__
        raise CheckpointError(
            f"{path} is a truncated or corrupt GGUF file of {stat.st_size} bytes (reading it failed with: {detail})."
        ) from None
    return path, reader


_REQUIRED = object()


def _meta(path: Path, reader, key: str, default=_REQUIRED) -> Any:
    """The metadata value `key`, or `default`; a missing key without default is an error."""
    field = reader.fields.get(key)
    if field is None:
        if default is _REQUIRED:
            raise CheckpointError(f"{path} has no metadata {key!r}, which a {ARCHITECTURE} GGUF file must state.")
        return default
    try:
        return field.contents()
    except (ValueError, IndexError, UnicodeDecodeError):
        raise CheckpointError(f"{path} has an unreadable metadata value {key!r} (corrupt file).") from None


def _config(path: Path, reader, tensors: dict) -> dict:
    """The hyper-parameters of the `llama.*` metadata as the Hugging Face `config.json`
    settings that `llama.from_hf` reads."""
    arch = _meta(path, reader, "general.architecture")
    if arch != ARCHITECTURE:
        raise CheckpointError(
            f"{path} holds a {arch!r} model; attnflow reads GGUF files of the {ARCHITECTURE!r} architecture only."
        )
    m = lambda key, default=_REQUIRED: _meta(path, reader, f"{ARCHITECTURE}.{key}", default)
    size = lambda key, default=_REQUIRED: whole(m(key, default), f"{path}'s metadata {ARCHITECTURE}.{key}")
    dim, heads = size("embedding_length"), size("attention.head_count")
    kv_heads = size("attention.head_count_kv", heads)
    head_dim = size("attention.key_length", dim // heads)
    if size("attention.value_length", head_dim) != head_dim or heads % kv_heads:
        raise CheckpointError(
            f"{path} states inconsistent attention heads ({heads} query, {kv_heads} key/value heads)."
        )
    # llama.cpp's converter permutes whole heads, which matches rotate-half only when all of it rotates
    rope_dims = size("rope.dimension_count", head_dim)
    if rope_dims != head_dim:
        raise CheckpointError(
            f"{path} rotates {rope_dims} of {head_dim} head entries; attnflow reads llama GGUF "
            f"files with full rotary only."
        )
    scaling = m("rope.scaling.type", "none")
    if scaling != "none" or "rope_freqs.weight" in tensors:
        raise CheckpointError(f"{path} uses rotary frequency scaling ({scaling}), which attnflow does not model.")
    vocab = m("vocab_size", None)
    if vocab is None:
        vocab = len(_meta(path, reader, "tokenizer.ggml.tokens"))
    return dict(
        model_type="llama",
        num_hidden_layers=size("block_count"),
        vocab_size=whole(vocab, f"{path}'s vocabulary size"),
        hidden_size=dim,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=size("feed_forward_length"),
        hidden_act="silu",
        rms_norm_eps=float(m("attention.layer_norm_rms_epsilon")),
        rope_theta=float(m("rope.freq_base", 10000.0)),
        attention_bias="blk.0.attn_q.bias" in tensors,
        tie_word_embeddings="output.weight" not in tensors,
    )


# llama.cpp's tensor names (gguf-py's tensor_mapping) and the Hugging Face Llama names
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def _hf_name(name: str) -> str | None:
    """The Hugging Face name of GGUF tensor `name` (`blk.3.attn_q.weight` is
    `model.layers.3.self_attn.q_proj.weight`), or None for tensors attnflow does not read."""
    stem, _, suffix = name.rpartition(".")
    if stem in _TOP:
        return f"{_TOP[stem]}.{suffix}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _BLOCK:
        return f"model.layers.{parts[1]}.{_BLOCK[parts[2]]}.{suffix}"
    return None


def _shape(name: str, c: dict) -> tuple[int, ...] | None:
    """The shape (rows first) that the metadata implies for GGUF tensor `name`, or None
    for tensors attnflow does not read."""
    stem, _, suffix = name.rpartition(".")
    d, hidden, vocab = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    shape = {
        "token_embd": (vocab, d),
        "output": (vocab, d),
        "output_norm": (d,),
        "attn_norm": (d,),
        "ffn_norm": (d,),
        "attn_q": (q, d),
        "attn_k": (kv, d),
        "attn_v": (kv, d),
        "attn_output": (d, q),
        "ffn_gate": (hidden, d),
        "ffn_up": (hidden, d),
        "ffn_down": (d, hidden),
    }.get(stem.rpartition(".")[2])
    return shape if shape is None or suffix == "weight" else shape[:1]


class _Dequantized(Mapping):
    """The file's tensors under their Hugging Face names, dequantized to float32 when
    read, with the rows of every query and key head (weight or bias) un-permuted."""

    def __init__(self, path: Path, tensors: dict, config: dict):
        self.path, self.config = path, config
        self.tensors = {hf: t for t in tensors.values() if (hf := _hf_name(t.name)) is not None}

    def __getitem__(self, name: str) -> np.ndarray:
        tensor = self.tensors[name]
        try:
            values = dequantize(tensor.data, tensor.tensor_type)
        except (NotImplementedError, ValueError) as error:
            raise CheckpointError(f"{self.path}: tensor {tensor.name!r} cannot be dequantized ({error}).") from None
        values = np.asarray(values, np.float32).reshape(tuple(int(n) for n in reversed(tensor.shape)))
        if ".q_proj." in name:
            return unpermute_rotary(values, self.config["num_attention_heads"])
        if ".k_proj." in name:
            return unpermute_rotary(values, self.config["num_key_value_heads"])
        return values

    def __contains__(self, name: object) -> bool:  # without dequantizing
        return name in self.tensors

    def elements(self) -> int:
        """How many numbers the tensors hold, from the file's tensor list (nothing is read)."""
        return sum(int(np.prod(tensor.shape)) for tensor in self.tensors.values())

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)


def load_gguf(path: str | os.PathLike, dtype=None) -> Checkpoint:
    """A llama-architecture GGUF file as a canonical `Checkpoint` (float32 unless `dtype`).

    Every tensor's shape is checked against the metadata before anything is dequantized."""
    path, reader = _open(path)
    tensors = {t.name: t for t in reader.tensors}
    config = _config(path, reader, tensors)
    for name, tensor in tensors.items():
        listed = tuple(int(n) for n in reversed(tensor.shape))  # ggml lists ne, fastest axis first
        expected = _shape(name, config)
        if expected is not None and listed != expected:
            raise CheckpointError(f"{path}: tensor {name!r} has shape {listed}, but the metadata implies {expected}.")
    for name in ("token_embd.weight", "output_norm.weight"):
        if name not in tensors:
            raise CheckpointError(f"{path} has no tensor {name!r}.")
    for l in range(config["num_hidden_layers"]):
        for part in _BLOCK:
            if f"blk.{l}.{part}.weight" not in tensors:
                raise CheckpointError(f"{path} has no tensor 'blk.{l}.{part}.weight'.")
    check_dtype(dtype)
    weights = _Dequantized(path, tensors, config)
    check_memory(weights, dtype, path)
    return llama.from_hf(config, weights, name=path.stem, dtype=dtype)


def _pre_tokenizer(split: str | None):
    """The `tokenizers` pre-tokenizer for a `PRE_TOKENIZERS` entry, then byte-level."""
    if split is None:
        return pre_tokenizers.ByteLevel(add_prefix_space=False)  # with GPT-2's regex
    if split == "digits":
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _backend(path: Path, reader) -> BackendTokenizer:
    """The file's vocabulary as a `tokenizers.Tokenizer`: byte-level BPE from
    `tokenizer.ggml.tokens` and `.merges`, the pre-tokenizer that `tokenizer.ggml.pre`
    names in llama.cpp, control tokens kept whole, and BOS/EOS added where the file's
    `add_bos_token` / `add_eos_token` say so."""
    m = lambda key, default=_REQUIRED: _meta(path, reader, f"tokenizer.ggml.{key}", default)
    kind = m("model")
    if kind != "gpt2":
        raise CheckpointError(
            f"{path} has a {kind!r} vocabulary; attnflow builds byte-level BPE ('gpt2') GGUF tokenizers only."
        )
    pre = m("pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise CheckpointError(
            f"{path} names the pre-tokenizer {pre!r}; attnflow knows {', '.join(sorted(PRE_TOKENIZERS))}."
        )
    tokens, merges = list(m("tokens")), [tuple(merge.split(" ", 1)) for merge in m("merges")]
    types = list(m("token_type", [1] * len(tokens)))
    backend = BackendTokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    backend.pre_tokenizer = _pre_tokenizer(PRE_TOKENIZERS[pre])
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(
        [AddedToken(t, normalized=False, special=True) for t, kind in zip(tokens, types) if kind == _CONTROL]
    )
    backend.add_tokens(
        [AddedToken(t, normalized=False, special=False) for t, kind in zip(tokens, types) if kind == _USER_DEFINED]
    )
    bos = int(m("bos_token_id")) if m("add_bos_token", False) else None
    eos = int(m("eos_token_id")) if m("add_eos_token", False) else None
    for key, i in (("bos_token_id", bos), ("eos_token_id", eos)):
        if i is not None and not 0 <= i < len(tokens):
            raise CheckpointError(
                f"{path}'s tokenizer.ggml.{key} is {i}, outside its vocabulary of {len(tokens)} tokens."
            )
    if bos is not None or eos is not None:
        single = ([] if bos is None else [tokens[bos]]) + ["$A"] + ([] if eos is None else [tokens[eos]])
        ends = {(tokens[i], i) for i in (bos, eos) if i is not None}
        backend.post_processor = processors.TemplateProcessing(single=" ".join(single), special_tokens=sorted(ends))
    return backend


def load_gguf_tokenizer(path: str | os.PathLike):
    """The tokenizer of a GGUF file, as attnflow's `Tokenizer`: byte-level BPE built
    from the vocabulary in its metadata (no `tokenizer.json` needed)."""
    path, reader = _open(path)
    return Tokenizer.from_backend(_backend(path, reader), name=path.stem)
