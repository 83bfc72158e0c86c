"""Training data that is always there, offline: the English text of the Python language
reference that CPython ships, and a synthetic copying task.

- `reference-a` and `reference-b`: the topics of `pydoc_data.topics` (the language
  reference's sections, about 465k characters in CPython 3.11), ordered by the SHA-256
  of their names and cut where 80% of the characters are reached: `reference-a` (the
  first 80%, the pretraining corpus; `reference` names it too) and `reference-b` (the
  remaining topics: another part of the same language, for fine-tuning). Each is the
  text of its topics in name order. Its tokens are cut into chunks of 1024; every
  tenth chunk is held out for validation.
- `induction`: random sequences whose second half repeats the first, so that the
  second half is predictable from the first (a copying task, learnable by a small
  model in a few hundred steps; the first half stays at chance, $\\ln V$).

The tokenizer of the text corpora is a byte-level BPE of `vocab` tokens trained
(deterministically) on `reference-a`. The text depends on the Python version, so every
run records the corpus's name, its size and the SHA-256 of its text (`info`).

Batches are windows of `context + 1` tokens at positions drawn from a key: the key of
step $k$ is derived from the seed and $k$, so the data order is a function of the step
and an interrupted run resumes with the batches it would have seen.
"""

from __future__ import annotations

import hashlib
import platform
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, PRNGKeyArray
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ..schema._errors import ConfigError
from ._settings import corpus_name

PRETRAINING_SHARE = 0.8
CHUNK = 1024
VALIDATION_EVERY = 10  # every tenth chunk of tokens is held out


def reference_topics() -> dict[str, str]:
    """The language reference's topics (name -> text) of this Python."""
    try:
        from pydoc_data.topics import topics  # lazy: a large module, read for the reference corpora only
    except ImportError:  # some distributions ship Python without it
        raise ConfigError(
            "the reference corpora are the language reference in the standard library's pydoc_data, "
            "which this Python lacks; use corpus=induction or a Python that has it."
        ) from None
    return dict(topics)


def reference_parts() -> dict[str, list[str]]:
    """The topic names of `reference-a` and `reference-b`: topics ordered by the SHA-256
    of their names, cut where `PRETRAINING_SHARE` of the characters is reached."""
    topics = reference_topics()
    order = sorted(topics, key=lambda name: hashlib.sha256(name.encode()).hexdigest())
    total = sum(len(text) for text in topics.values())
    parts, seen = {"reference-a": [], "reference-b": []}, 0
    for name in order:
        parts["reference-a" if seen < PRETRAINING_SHARE * total else "reference-b"].append(name)
        seen += len(topics[name])
    return {part: sorted(names) for part, names in parts.items()}


def reference_text(name: str) -> str:
    """The text of `reference-a` or `reference-b`: its topics in name order."""
    topics = reference_topics()
    return "\n\n".join(topics[topic] for topic in reference_parts()[corpus_name(name)])


def reference_tokenizer(vocab: int) -> str:
    """A byte-level BPE of `vocab` tokens trained on `reference-a`, as `tokenizers` JSON."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab < len(alphabet) + 1:
        raise ConfigError(f"a byte-level BPE needs a vocab of at least {len(alphabet) + 1} tokens, got {vocab}.")
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        min_frequency=2,
        initial_alphabet=alphabet,
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    backend.train_from_iterator([reference_text("reference-a")], trainer=trainer)
    return backend.to_str()


def induction_tokenizer(vocab: int) -> str:
    """Symbols `s0, s1, ...` of the copying task, one token each, as `tokenizers` JSON."""
    backend = Tokenizer(models.WordLevel({f"s{i}": i for i in range(vocab)}, unk_token="s0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return backend.to_str()


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class Corpus(eqx.Module):
    """A training corpus on the device: the token streams of its training and
    validation parts (empty for the synthetic `induction` task), and how to draw a
    batch from a key."""

    train: Int[Array, " tokens"]
    validation: Int[Array, " held"]
    name: str = eqx.field(static=True)
    vocab: int = eqx.field(static=True)

    def batch(self, key: PRNGKeyArray, size: int, context: int, split: str = "train"):
        """`(inputs, targets)`, each `(size, context)`: windows of `context + 1` tokens
        (targets are the inputs shifted by one), at positions drawn from `key`."""
        if self.name == "induction":
            return _induction(key, size, context, self.vocab)
        tokens = self.train if split == "train" else self.validation
        starts = jax.random.randint(key, (size,), 0, tokens.shape[0] - context)
        windows = jax.vmap(lambda s: jax.lax.dynamic_slice(tokens, (s,), (context + 1,)))(starts)
        return windows[:, :-1], windows[:, 1:]


def _induction(key, size: int, context: int, vocab: int):
    """Sequences of `context + 1` tokens whose second half copies the first."""
    half = (context + 2) // 2
    first = jax.random.randint(key, (size, half), 0, vocab)
    sequence = jnp.concatenate([first, first], axis=1)[:, : context + 1]
    return sequence[:, :-1], sequence[:, 1:]


def _split(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Training and validation tokens: every `VALIDATION_EVERY`-th chunk is held out."""
    chunks = [tokens[i : i + CHUNK] for i in range(0, tokens.shape[0], CHUNK)]
    held = [c for i, c in enumerate(chunks) if i % VALIDATION_EVERY == VALIDATION_EVERY - 1]
    kept = [c for i, c in enumerate(chunks) if i % VALIDATION_EVERY != VALIDATION_EVERY - 1]
    empty = np.zeros(0, tokens.dtype)
    return np.concatenate(kept) if kept else empty, np.concatenate(held) if held else empty


def load_corpus(
    name: str, *, vocab: int, context: int, tokenizer_json: str | None = None
) -> tuple[Corpus, str, dict[str, Any]]:
    """The corpus `name`, the tokenizer that encodes it (`tokenizers` JSON: the one
    given, or a new one of `vocab` tokens) and a record of what it is (`info`)."""
    name = corpus_name(name)
    if name == "induction":
        tokenizer_json = induction_tokenizer(vocab) if tokenizer_json is None else tokenizer_json
        info = {"corpus": name, "vocab": vocab, "description": "random sequences, second half a copy of the first"}
        empty = jnp.zeros(0, jnp.int32)
        return Corpus(empty, empty, name, vocab), tokenizer_json, info
    text = reference_text(name)
    tokenizer_json = reference_tokenizer(vocab) if tokenizer_json is None else tokenizer_json
    backend = Tokenizer.from_str(tokenizer_json)
    vocab = backend.get_vocab_size(with_added_tokens=True)
    tokens = np.asarray(backend.encode(text).ids, np.int32)
    train, validation = _split(tokens)
    if min(train.shape[0], validation.shape[0]) <= context:
        raise ConfigError(
            f"the {name} corpus has too few tokens ({train.shape[0]} for training, "
            f"{validation.shape[0]} held out) for windows of context={context}."
        )
    info = {
        "corpus": name,
        "source": "pydoc_data.topics (the Python language reference)",
        "python": platform.python_version(),
        "topics": len(reference_parts()[name]),
        "characters": len(text),
        "sha256": _sha256(text),
        "tokens": int(tokens.shape[0]),
        "train_tokens": int(train.shape[0]),
        "validation_tokens": int(validation.shape[0]),
        "vocab": vocab,
        "tokenizer_sha256": _sha256(tokenizer_json),
    }
    return Corpus(jnp.asarray(train), jnp.asarray(validation), name, vocab), tokenizer_json, info
