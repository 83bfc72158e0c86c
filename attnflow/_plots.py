"""Figures drawn from a results Dataset (never from live simulation objects)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import xarray as xr  # noqa: E402

_PANELS = (
    ("pair_density", "pair density  P(cos > 1 - eps)"),
    ("clusters", "clusters"),
    ("log_energy", "log interaction energy"),
    ("order_parameter", "order parameter |mean x|"),
)


def plot_summary(ds: xr.Dataset, path: str | Path, title: str | None = None) -> Path:
    """Ensemble means (and 10-90% bands) of the recorded metrics against time, one line per beta."""
    panels = [(k, label) for k, label in _PANELS if k in ds]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    betas = np.atleast_1d(ds["beta"].values)
    colors = plt.cm.viridis(np.linspace(0.0, 0.9, len(betas)))
    t = ds["time"].values
    for ax, (name, label) in zip(axes[0], panels):
        da = ds[name]
        if "beta" not in da.dims:
            da = da.expand_dims(beta=betas)
        for color, beta in zip(colors, betas):
            v = da.sel(beta=beta).values.astype(float)
            ax.plot(t, v.mean(axis=0), color=color, label=f"beta={beta:g}")
            lo, hi = np.percentile(v, [10, 90], axis=0)
            ax.fill_between(t, lo, hi, color=color, alpha=0.15, linewidth=0)
        ax.set_xlabel("t")
        ax.set_title(label, fontsize=10)
        if float(t[0]) >= 0 and len(t) > 2 and np.allclose(np.diff(np.log(t[1:])), np.log(t[2] / t[1])):
            ax.set_xscale("log")
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
