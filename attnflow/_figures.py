"""The look of every attnflow figure, in one place: the style, pyplot on the Agg
backend with it applied, saving a figure as PNG and PDF atomically, and a caption.
Used by the experiments, the reports (`attnflow report`) and the checkpoint probes.

matplotlib is imported inside the functions: importing attnflow must stay fast."""

from __future__ import annotations

import textwrap
from pathlib import Path

from ._store import _write_atomically

# One look for every figure: a publication-sized font, light grids, no top/right frame.
STYLE = {
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


def pyplot():
    """matplotlib's pyplot on the Agg backend with the shared style applied."""
    import matplotlib  # lazy: start-up

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: start-up

    plt.rcParams.update(STYLE)
    return plt


def save(fig, folder: Path, name: str) -> list[Path]:
    """Save `fig` as `name.png` (for the README) and `name.pdf` (vector) in `folder`;
    closes the figure. Each file is written whole or not at all."""
    plt = pyplot()
    paths = []
    for suffix in ("png", "pdf"):
        path = Path(folder) / f"{name}.{suffix}"
        _write_atomically(path, lambda tmp, suffix=suffix: fig.savefig(tmp, format=suffix))
        paths.append(path)
    plt.close(fig)
    return paths


def caption(fig, text: str, width: int = 110) -> None:
    """A caption under the axes, wrapped to `width` characters."""
    fig.text(0.01, -0.01, "\n".join(textwrap.wrap(text, width)), ha="left", va="top", fontsize=8)
