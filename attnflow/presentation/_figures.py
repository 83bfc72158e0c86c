"""The look of every attnflow figure, in one place: the style, figures made without
pyplot, saving a figure as PNG and PDF atomically, and a caption. Used by the
summary, the experiments, the reports (`attnflow report`) and the checkpoint probes.

attnflow leaves matplotlib's global state alone: it never switches the backend and
never changes `matplotlib.rcParams` outside `style()` (a `matplotlib.rc_context`).
Its figures are `matplotlib.figure.Figure` objects with an Agg canvas of their own,
outside pyplot's list of open figures: nothing to close, no backend needed to save,
and a notebook shows them when they are returned. They are drawn, and saved, inside
`style()`; a figure saved elsewhere should pass `bbox_inches="tight"` so that its
caption (drawn under the axes) is kept.

matplotlib is imported inside the functions: importing attnflow must stay fast."""

from __future__ import annotations

import functools
import re
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..storage._store import write_atomically

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from matplotlib.typing import RcKeyType

# One look for every figure: a publication-sized font, light grids, no top/right frame.
STYLE: dict[RcKeyType, Any] = {
    "figure.dpi": 100,
    "savefig.dpi": 150,
    "savefig.bbox": "tight",
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "image.cmap": "viridis",
    "pdf.fonttype": 42,
}


def style():
    """A context in which `STYLE` applies (matplotlib's `rc_context`): the rcParams are
    restored on leaving it."""
    import matplotlib  # lazy: start-up

    return matplotlib.rc_context(STYLE)


def styled(draw):
    """`draw` (a function that builds figures) run inside `style()`."""

    @functools.wraps(draw)
    def wrapper(*args, **kwargs):
        with style():
            return draw(*args, **kwargs)

    return wrapper


def figure(**kwargs) -> Figure:
    """A new figure (`matplotlib.figure.Figure(**kwargs)`) with its own Agg canvas, not
    registered with pyplot."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: start-up
    from matplotlib.figure import Figure  # lazy: start-up

    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def subplots(nrows: int = 1, ncols: int = 1, *, figsize=None, layout=None, **kwargs):
    """`(figure, axes)` as `pyplot.subplots` gives them, on a figure from `figure()`;
    `kwargs` go to `Figure.subplots` (`sharex`, `sharey`, `squeeze`, `gridspec_kw`, ...)."""
    fig = figure(figsize=figsize, layout=layout)
    return fig, fig.subplots(nrows, ncols, **kwargs)


def colormap(name: str):
    """matplotlib's colormap `name` (`matplotlib.colormaps[name]`)."""
    import matplotlib  # lazy: start-up

    return matplotlib.colormaps[name]


def save(fig: Figure, folder: Path, name: str) -> list[Path]:
    """Save `fig` as `name.png` (for the README) and `name.pdf` (vector) in `folder`, in
    the style. Each file is written whole or not at all."""
    paths = []
    with style():
        for suffix in ("png", "pdf"):
            path = Path(folder) / f"{name}.{suffix}"
            write_atomically(path, lambda tmp, suffix=suffix: fig.savefig(tmp, format=suffix))
            paths.append(path)
    return paths


def token_ticks(ax, tokens, most: int = 24, axes: str = "xy") -> None:
    """The token strings as tick labels on the x and/or y axis of `ax` (an attention
    map: rows are queries, columns keys), every k-th token when there are more than
    `most`, so that the labels never overlap."""
    labels = [str(token).replace("$", r"\$") for token in tokens]  # a token is text, never math
    step = max(1, -(-len(labels) // most))
    ticks = np.arange(0, len(labels), step)
    shown = [labels[i] for i in ticks]
    if "x" in axes:
        ax.set_xticks(ticks, shown, rotation=90, fontsize=6)
    if "y" in axes:
        ax.set_yticks(ticks, shown, fontsize=6)
    ax.grid(False)


# A `$...$` math span, kept on one line when a caption is wrapped.
_MATH = re.compile(r"\$[^$]*\$")
_KEEP = "\x00"


def wrap(text: str, width: int) -> list[str]:
    """`text` wrapped to lines of at most about `width` characters, never inside a
    `$...$` span (a span cut in two would not render)."""
    joined = _MATH.sub(lambda span: span.group().replace(" ", _KEEP), text)
    lines = textwrap.wrap(joined, width, break_long_words=False, break_on_hyphens=False)
    return [line.replace(_KEEP, " ") for line in lines]


def caption(fig: Figure, text: str, width: int = 110) -> None:
    """A caption under the axes, wrapped to `width` characters; math in `$...$`."""
    fig.text(0.01, -0.01, "\n".join(wrap(text, width)), ha="left", va="top", fontsize=8)
