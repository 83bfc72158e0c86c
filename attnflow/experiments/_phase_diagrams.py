"""What the two phase diagrams of the pair density (`phase_diagram`, with Q = K = V = I,
and `phase_diagram_random`, with random attention matrices) share: the equiangular
curve's `eps` option, the mean pair density of each panel over (t, beta) with the
equiangular curve and the measures of how closely it follows that curve (described in
`attnflow.experiments.phase_diagram`), and its heatmaps."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..schema._errors import ConfigError
from ._common import config_of, subplots
from ._lazy import lazy

if TYPE_CHECKING:
    import xarray as xr

    from ..analysis import equiangular
else:
    xr = lazy("xarray")
    equiangular = lazy("attnflow.analysis.equiangular")


def check_eps(eps: float) -> None:
    """`experiment.options.eps`, the equiangular curve's 1 - rho, must lie in (0, 1)."""
    if not 0 < eps < 1:
        raise ConfigError(f"experiment.options.eps (the equiangular curve's 1 - rho) must lie in (0, 1), got {eps!r}.")


def first_crossing(values: np.ndarray, times: np.ndarray, level: float) -> np.ndarray:
    """The first time each series (last axis over `times`) reaches `level`, linearly
    interpolated between the saved times; NaN where it never does."""
    above = values >= level
    reached = above.any(-1)
    index = np.argmax(above, -1)
    before = np.maximum(index - 1, 0)
    v0 = np.take_along_axis(values, before[..., None], -1)[..., 0]
    v1 = np.take_along_axis(values, index[..., None], -1)[..., 0]
    t0, t1 = times[before], times[index]
    with np.errstate(divide="ignore", invalid="ignore"):
        fraction = np.where(v1 > v0, (level - v0) / (v1 - v0), 1.0)
    crossing = np.where(index == 0, times[0], t0 + np.clip(fraction, 0, 1) * (t1 - t0))
    return np.where(reached, crossing, np.nan)


def transition_measures(density: xr.DataArray, t_eps: xr.DataArray) -> xr.Dataset:
    """How closely a mean pair density over (..., beta, time) follows the step at
    `t_eps` (over beta): `curve_mismatch`, `crossing_time` and `crossing_log_error`
    (see `attnflow.experiments.phase_diagram`)."""
    times = density["time"].values
    step = (density["time"] >= t_eps).astype(float)
    mismatch = abs(density - step).mean(("beta", "time"))
    crossing = xr.DataArray(
        first_crossing(density.values, times, 0.5),
        dims=density.dims[:-1],
        coords={k: density.coords[k] for k in density.dims[:-1]},
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        log_error = abs(np.log(crossing / t_eps)).mean("beta", skipna=True)
    return xr.Dataset(
        {
            "curve_mismatch": mismatch.assign_attrs(
                description="mean over (t, beta) of |mean pair density - 1{t >= equiangular_time(beta)}|"
            ),
            "crossing_time": crossing.assign_attrs(
                description="first time the mean pair density reaches 1/2 (NaN: not inside the run)"
            ),
            "crossing_log_error": log_error.assign_attrs(
                description="mean over the betas with a crossing_time of |log(crossing_time / equiangular_time)|"
            ),
            "crossing_count": crossing.notnull()
            .sum("beta")
            .assign_attrs(description="number of betas whose mean pair density reaches 1/2 inside the run"),
        }
    )


def summarize(cfg, eps: float, results: dict[str, xr.Dataset], panel: str, labels: list) -> xr.Dataset:
    """The mean pair density of every panel along `panel` (coordinate `labels`), the
    failed members, the equiangular curve (to rho = 1 - `eps`) and the transition
    measures; the members' own series are dropped."""
    densities, failed = [], []
    for ds in results.values():
        densities.append(ds["pair_density"].mean("member", skipna=True))
        failed.append((ds["status"] != 0).sum("member").drop_attrs())  # a count: not the flags of `status`
    density = xr.concat(densities, dim=panel).assign_coords({panel: labels})
    density = density.assign_attrs(
        description=f"mean over members of the fraction of token pairs with <x_i, x_j> > 1 - {cfg.cluster_eps:g}"
    )
    out = xr.Dataset(
        {
            "pair_density_mean": density,
            "failed_members": xr.concat(failed, dim=panel)
            .assign_coords({panel: labels})
            .assign_attrs(description="members whose solve failed (left out of the mean)"),
        }
    )
    beta = out["beta"].values
    out["equiangular_time"] = xr.DataArray(
        np.asarray(equiangular.equiangular_time(np.asarray(beta, np.float64), int(cfg.n), float(eps))),
        dims="beta",
        coords={"beta": beta},
        attrs={
            "description": f"time at which the equiangular model (n = {cfg.n}, rho(0) = 0) reaches rho = 1 - {eps:g}",
            "eps": float(eps),
        },
    )
    return out.merge(transition_measures(out["pair_density_mean"], out["equiangular_time"]))


def heatmaps(ds: xr.Dataset, panel: str, titles: list[str], figure_width: float = 3.2):
    """One heatmap of the mean pair density over (t, beta) per entry of `panel`, with
    the equiangular curve, one colorbar for all; returns the figure."""
    count = ds.sizes[panel]
    columns = min(count, 4)
    rows = -(-count // columns)
    fig, axes = subplots(
        rows,
        columns,
        figsize=(figure_width * columns + 1.0, 3.0 * rows),
        squeeze=False,
        sharex=True,
        sharey=True,
        layout="constrained",
    )
    t = ds["time"].values
    beta = ds["beta"].values
    curve = ds["equiangular_time"].values
    # The curve up to the first beta past the time window; the axes clip the last segment.
    inside = curve <= t[-1]
    inside[np.argmin(inside) if not inside.all() else -1] = True
    image = None
    for k, ax in enumerate(axes.flat):
        if k >= count:
            ax.set_visible(False)
            continue
        density = ds["pair_density_mean"].isel({panel: k}).values  # (beta, time)
        image = ax.pcolormesh(t, beta, density, vmin=0, vmax=1, shading="nearest", cmap="viridis", rasterized=True)
        ax.plot(
            curve[inside],
            beta[inside],
            color="tab:red",
            linewidth=1.6,
            linestyle="--",
            label=r"equiangular $t_\varepsilon(\beta)$",
        )
        ax.set_xlim(t[0], t[-1])
        ax.set_ylim(
            beta[0] - 0.5 * (beta[1] - beta[0]) if beta.size > 1 else beta[0] - 0.5,
            beta[-1] + 0.5 * (beta[1] - beta[0]) if beta.size > 1 else beta[0] + 0.5,
        )
        ax.grid(False)
        ax.set_title(titles[k])
        if k % columns == 0:
            ax.set_ylabel(r"inverse temperature $\beta$")
        if k // columns == rows - 1:
            ax.set_xlabel("time t")
    fig.legend(*axes.flat[0].get_legend_handles_labels(), loc="outside upper right", frameon=False)
    assert image is not None  # count >= 1: the first panel drew it
    bar = fig.colorbar(image, ax=axes, shrink=0.9, pad=0.01)
    eps = config_of(ds)["cluster_eps"]
    bar.set_label(rf"mean pair density $P(\langle x_i, x_j\rangle > 1 - {eps:g})$")
    return fig
