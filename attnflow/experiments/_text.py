"""The text of the experiments on trained models: the sentence a checkpoint reads (its
tokenizer's ids, checked against the model; experiments checkpoint and sensitivity),
a sentence drawn with each token's box coloured by a value (sensitivity and
diffeqformer), and the text tables written beside the figures."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..schema._errors import ConfigError
from ..storage._store import write_atomically
from ._lazy import lazy

if TYPE_CHECKING:
    import matplotlib.transforms as mtransforms
    from matplotlib import font_manager

    from ..checkpoints import _flow, _load
else:
    _flow = lazy("attnflow.checkpoints._flow")
    font_manager = lazy("matplotlib.font_manager")
    mtransforms = lazy("matplotlib.transforms")
    _load = lazy("attnflow.checkpoints._load")

FONT = 11.0  # points, the highlighted sentence
_PAD = 0.06  # inches of colour either side of a token


@functools.lru_cache(maxsize=2)
def loaded_checkpoint(path: str, trust_pickle: bool, dtype: str):
    """The checkpoint at `path` and its tokenizer, loaded once for a config's `check`
    and its `analyse` (and for the experiments that read the same model)."""
    checkpoint = _load.load_checkpoint(path, trust_pickle=trust_pickle, dtype=dtype)
    return checkpoint, _load.load_tokenizer(path)


def checkpoint_sentence(cfg):
    """The checkpoint, its tokenizer and the ids of `text`, checked against the model
    (`Checkpoint.token_ids`): a token the embedding has no row for, or more tokens than
    the model has positions, is one sentence naming it. An encoder-decoder reads `text`
    with its encoder, and its decoder flows from its start token followed by the same
    ids (`attnflow.checkpoints.teacher_forced`; docs/checkpoints.md): the checkpoint
    returned is the decoder bound to that source, the ids the decoder's."""
    checkpoint, tokenizer = loaded_checkpoint(str(cfg.checkpoint), bool(cfg.trust_pickle), cfg.dtype)
    ids = np.asarray(tokenizer.encode(str(cfg.text)))
    if ids.size == 0:
        raise ConfigError(f"the text {cfg.text!r} encodes to no tokens.")
    (checkpoint.encoder or checkpoint).token_ids(ids, tokens=tokenizer.tokens)
    if checkpoint.encoder is not None:
        checkpoint, ids = _flow.teacher_forced(checkpoint, ids)
    return checkpoint, tokenizer, ids


def encoder_attrs(checkpoint) -> dict:
    """What a run of an encoder-decoder's decoder (`checkpoint_sentence`) records of its
    source, as results attributes: the encoder's token count `encoder_tokens`, the
    decoder's start token `decoder_start_id` and a sentence `decoder_input`; nothing for
    any other checkpoint."""
    if checkpoint.source is None:
        return {}
    return {
        "encoder_tokens": int(checkpoint.source.shape[0]),
        "decoder_start_id": int(checkpoint.decoder_start),
        "decoder_input": "the decoder reads its start token, then the text's ids; its cross-attention reads the "
        "encoder's output on the text (encoder_tokens tokens), held fixed over depth",
    }


def token_id_variable(checkpoint, ids) -> tuple:
    """The results variable `token_id` (along `token`) of a run of `checkpoint_sentence`,
    its description naming the decoder's input where the checkpoint is a decoder."""
    read = (
        "the decoder's input: its start token, then the sentence's" if checkpoint.source is not None else "the sentence"
    )
    return ("token", ids, {"description": f"token ids of {read}"})


def shown(token: str) -> tuple[str, bool]:
    """A token as drawn (newlines and tabs made visible) and whether a word starts
    there (a leading space: drawn as a gap before its box)."""
    text = token.replace("\n", "\u21b5").replace("\t", "\u21e5")
    starts = text.startswith(" ")
    text = text.strip(" ") or "\u2423"
    return text, starts


def layout(fig, tokens: list[str], width: float) -> tuple[list[tuple[str, float, int]], int]:
    """Each token's text, left edge (inches) and line when the sentence is set in boxes
    on lines of `width` inches; and the number of lines."""

    renderer = fig.canvas.get_renderer()
    prop = font_manager.FontProperties(size=FONT)
    placed, x, line = [], 0.0, 0
    for token in tokens:
        text, starts = shown(token)
        w = renderer.get_text_width_height_descent(text, prop, ismath=False)[0] / fig.dpi + 2 * _PAD
        if x > 0:
            x += 0.09 if starts else 0.015
        if x > 0 and x + w > width:
            x, line = 0.0, line + 1
        placed.append((text, x + _PAD, line))
        x += w
    return placed, line + 1


def highlight(fig, ax, placed, values, cmap, title: str, mark: int) -> None:
    """The sentence with each token's box coloured by `values` in [0, 1] (NaN: grey),
    token `mark` outlined."""

    ax.set_axis_off()
    ax.set_title(title, loc="left")
    step = 1.9 * FONT / 72
    for index, ((text, x, line), value) in enumerate(zip(placed, values)):
        hidden = not np.isfinite(value)
        face = "0.92" if hidden else cmap(value)
        at = ax.transAxes + mtransforms.ScaledTranslation(x, -(line + 0.6) * step, fig.dpi_scale_trans)
        ax.text(
            0,
            1,
            text,
            transform=at,
            fontsize=FONT,
            va="center",
            ha="left",
            parse_math=False,
            color="0.6" if hidden else ("white" if value > 0.6 else "black"),
            bbox={
                "boxstyle": "square,pad=0.25",
                "facecolor": face,
                "edgecolor": "black" if index == mark else "none",
                "linewidth": 1.2,
            },
        )


def scaled(values: np.ndarray, skip: int) -> np.ndarray:
    """Min-max scaled to [0, 1] over the finite entries other than `skip` (the output
    token itself, whose own update dominates), clipped there; NaN stays NaN."""
    finite = np.isfinite(values)
    others = finite & (np.arange(values.size) != skip)
    others = others if others.any() else finite
    low, high = values[others].min(), values[others].max()
    result = np.clip((values - low) / (high - low), 0, 1) if high > low else np.ones_like(values)
    return np.where(finite, result, np.nan)


def write_text(path: Path, text: str) -> Path:
    """`text` written to `path` (a table beside the figures) as one atomic replacement."""
    write_atomically(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))  # pyright: ignore[reportArgumentType]  # write_text's count is unused (annotated None)
    return path
