"""The tokenizer that ships with a checkpoint, as token ids for the reference forward pass:
`Tokenizer`, and the tokenizers of Hugging Face files (`load_tokenizer` in `_load`
picks the file; `gguf` builds the one inside a `.gguf` file).

Read with the `tokenizers` package from, in order: `tokenizer.json`; GPT-2 style
`vocab.json` + `merges.txt` (byte-level BPE); BERT style `vocab.txt` (WordPiece, lower
case unless `tokenizer_config.json` says otherwise); or the vocabulary inside a `.gguf`
file (`attnflow.checkpoints.gguf`). Texts are encoded the way the model's own tokenizer
does (its special tokens, e.g. `[CLS] ... [SEP]` for BERT), never padded or truncated:
one text is one sequence of the model's token ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from jaxtyping import Int
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

from ..schema._errors import CheckpointError


class Tokenizer:
    """A checkpoint's tokenizer: `encode` a text into ids, show ids as `tokens`,
    `decode` them back. Wraps a `tokenizers.Tokenizer` (`backend`) with padding and
    truncation switched off."""

    def __init__(self, backend, name: str = ""):
        backend.no_padding()
        backend.no_truncation()
        self.backend, self.name = backend, name

    @classmethod
    def from_backend(cls, backend, name: str = "") -> Tokenizer:
        """A `Tokenizer` around a `tokenizers.Tokenizer` built elsewhere (e.g. from GGUF metadata)."""
        return cls(backend, name=name)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> Int[np.ndarray, " n"]:
        """The ids of `text`, with the special tokens the model's tokenizer adds."""
        return np.asarray(self.backend.encode(text, add_special_tokens=True).ids, dtype=np.int64)

    def tokens(self, ids) -> list[str]:
        """Each id as readable text: byte-level marks decoded (`Ġthe` is `" the"`),
        special tokens kept (`[CLS]`); a piece of a multi-byte character, which has no
        text of its own, is shown as its raw vocabulary entry."""
        shown = []
        for i in np.asarray(ids).reshape(-1).tolist():
            piece = self.backend.decode([i], skip_special_tokens=False)
            raw = self.backend.id_to_token(i)
            shown.append(raw if raw is not None and (piece == "" or "\ufffd" in piece) else piece)
        return shown

    def decode(self, ids) -> str:
        """The text of `ids`, special tokens left out."""
        return self.backend.decode(np.asarray(ids).reshape(-1).tolist(), skip_special_tokens=True)

    def __repr__(self) -> str:
        return f"Tokenizer({self.name or 'unnamed'}, vocab {self.vocab_size})"


def from_file(path: Path):
    try:
        return Backend.from_file(str(path))
    except Exception as error:  # tokenizers raises a bare Exception for bad files
        raise CheckpointError(f"{path} is not a tokenizers file ({str(error).splitlines()[0]}).") from None


def _settings(folder: Path) -> dict:
    """`tokenizer_config.json`, or no settings."""
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{path} is not valid JSON ({error.msg}).") from None


def byte_level_bpe(folder: Path):
    """GPT-2's tokenizer from `vocab.json` and `merges.txt`: byte-level BPE, no special
    tokens added (transformers' `GPT2Tokenizer`)."""
    try:
        model = models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt"))
    except Exception as error:  # tokenizers raises a bare Exception for bad files
        raise CheckpointError(
            f"{folder / 'vocab.json'} with merges.txt is not a BPE vocabulary ({str(error).splitlines()[0]})."
        ) from None
    backend = Backend(model)
    add_prefix_space = bool(_settings(folder).get("add_prefix_space", False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    return backend


def wordpiece(folder: Path):
    """BERT's tokenizer from `vocab.txt`: BERT normalization (lower case unless
    `do_lower_case` is false), WordPiece, and `[CLS] ... [SEP]` around every text."""
    settings = _settings(folder)
    tokens = {
        key: settings.get(f"{key}_token", default)
        for key, default in (("unk", "[UNK]"), ("cls", "[CLS]"), ("sep", "[SEP]"))
    }
    try:
        model = models.WordPiece.from_file(str(folder / "vocab.txt"), unk_token=tokens["unk"])
    except Exception as error:  # tokenizers raises a bare Exception for bad files
        raise CheckpointError(
            f"{folder / 'vocab.txt'} is not a WordPiece vocabulary ({str(error).splitlines()[0]})."
        ) from None
    backend = Backend(model)
    lowercase = bool(settings.get("do_lower_case", True))
    strip = settings.get("strip_accents")
    backend.normalizer = normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=bool(settings.get("tokenize_chinese_chars", True)),
        strip_accents=strip,
        lowercase=lowercase,
    )
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    vocab = backend.get_vocab()
    missing = [tokens[key] for key in ("cls", "sep") if tokens[key] not in vocab]
    if missing:
        raise CheckpointError(f"{folder / 'vocab.txt'} has no {missing[0]} token, which BERT puts around every text.")
    backend.post_processor = processors.BertProcessing(
        (tokens["sep"], vocab[tokens["sep"]]), (tokens["cls"], vocab[tokens["cls"]])
    )
    backend.decoder = decoders.WordPiece(prefix="##")
    for token in {
        tokens["unk"],
        tokens["cls"],
        tokens["sep"],
        settings.get("pad_token", "[PAD]"),
        settings.get("mask_token", "[MASK]"),
    }:
        if token in vocab:
            backend.add_special_tokens([token])
    return backend
