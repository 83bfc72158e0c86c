"""Clusters on the circle: two at beta = 4, three at beta = 9.

n = 32 tokens start uniformly on the circle (d = 2) and follow Q = K = V = I softmax
attention ("A mathematical perspective on Transformers", fig. 4). Within a few units of
time each token joins a nearby group and the groups contract; by t ~ 20 the tokens sit
in a handful of tight clusters far apart. Those clusters then merge only on time scales
that grow exponentially with beta, so the count holds for a long stretch: two at
beta = 4, three at beta = 9.

Why t1 = 100 and eps = 1e-3 make "the typical count is 2 (beta = 4) and 3 (beta = 9)"
a property of the dynamics and not of a seed. By t = 100 each cluster has contracted
far below the threshold while distinct clusters sit at angles of order one: the counts
at t = 100 are the same for every eps from 1e-2 to 1e-5 (measured over 128 members),
so the threshold only names what the eye sees. Over the 256 members of the full run,
93% have two clusters at beta = 4 and 77% three at beta = 9 at t = 100 (the others
mostly one more or one fewer); the modal counts hold from t ~ 20-40 to t ~ 300, so
t = 100 is well inside the metastable stretch and not at its edge. With 32 members the
median misses 3 at beta = 9 only when at most 16 of them have three clusters, a
binomial tail below 1e-3 (below 1e-10 for 2 at beta = 4).

`analyse` keeps the cluster count of every member and the states of one typical member
per beta (the first whose final count equals the median), which the figure draws.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..schema._errors import ConfigError
from ..schema._schema import setting
from ._animate import animation
from ._common import caption, colormap, config_of, figure
from ._experiment import Counter, Experiment, Keeper
from ._lazy import lazy

if TYPE_CHECKING:
    import jax
    import jax.numpy as jnp
    import xarray as xr
    from matplotlib.figure import Figure

    from ..numerics import _metrics
    from ..running import _build
else:
    jax = lazy("jax")
    jnp = lazy("jax.numpy")
    xr = lazy("xarray")
    _metrics = lazy("attnflow.numerics._metrics")
    _build = lazy("attnflow.running._build")


@dataclass
class Options:
    snapshots: list[float] = setting([0.0, 3.0, 10.0, 100.0], "times drawn on the circle (the nearest saved ones)")


class Circle(Experiment):
    title = "Clusters on the circle: two at beta = 4, three at beta = 9"
    paper = "A mathematical perspective on Transformers, fig. 4"
    Options = Options

    def check(self) -> None:
        cfg, times = self.cfg, self.options.snapshots
        if not times or any(not cfg.t0 <= t <= cfg.t1 for t in times):
            raise ConfigError(
                f"experiment.options.snapshots must be a non-empty list of times in [t0, t1] = "
                f"[{cfg.t0:g}, {cfg.t1:g}], got {times!r}."
            )
        # Each snapshot draws the saved time nearest it: two with the same nearest one would be one drawing.
        saved = _build.resolve_study(dataclasses.replace(cfg, experiment=None)).grid.times
        nearest = [int(np.argmin(abs(saved - t))) for t in times]
        for i, k in enumerate(nearest):
            if k in nearest[:i]:
                raise ConfigError(
                    f"experiment.options.snapshots holds {times[nearest.index(k)]:g} and {times[i]:g}, "
                    f"both nearest the saved time {saved[k]:.4g}: one drawing; give times nearest "
                    f"different saved times (or save more, saves={cfg.saves})."
                )

    def analyse(self, results: dict[str, xr.Dataset], *, on_piece: Counter, keep: Keeper) -> xr.Dataset:
        cfg = self.cfg
        ds = results["main"]
        if "beta" not in ds.dims:
            ds = ds.expand_dims(beta=[float(cfg.beta)])
        clusters = ds["clusters"].transpose("beta", "member", "time")
        final = clusters.isel(time=-1)
        median = final.median("member")
        shown = [int(np.argmax(final.values[b] == np.round(median.values[b]))) for b in range(final.sizes["beta"])]
        states: xr.DataArray = xr.concat([ds["x"].isel(beta=b, member=m) for b, m in enumerate(shown)], dim="beta")  # pyright: ignore[reportAssignmentType]  # DataArrays in, one out (isel reads as Unknown)
        angles = np.arctan2(states.values[..., 1], states.values[..., 0])
        final_states = jnp.asarray(states.values[:, -1])
        labels = np.asarray(jax.vmap(lambda x: _metrics.cluster_labels(x, cfg.cluster_eps))(final_states))
        # Number the clusters 0, 1, ... in order of their first token.
        labels = np.stack([np.unique(row, return_inverse=True)[1].reshape(-1) for row in labels])
        out = xr.Dataset(coords={"beta": ds["beta"], "time": ds["time"], "member": ds["member"]})
        out["clusters"] = clusters.astype(np.int16).assign_attrs(
            description=f"number of clusters (tokens joined when cos > 1 - {cfg.cluster_eps:g}) of every member"
        )
        out["final_clusters_median"] = median.assign_attrs(description="median over members of the final cluster count")
        out["shown_member"] = xr.DataArray(
            shown,
            dims="beta",
            attrs={"description": "the member drawn: the first whose final cluster count equals the median"},
        )
        out["angle"] = xr.DataArray(
            angles,
            dims=("beta", "time", "token"),
            attrs={"description": "angles of the tokens of the member drawn (radians)", "units": "radian"},
        )
        out["final_cluster"] = xr.DataArray(
            labels,
            dims=("beta", "token"),
            attrs={"description": "the cluster each token of the member drawn belongs to at the last time (0, 1, ...)"},
        )
        return out

    @staticmethod
    def draw(ds: xr.Dataset) -> dict[str, Figure]:
        cfg = config_of(ds)
        times = ds["time"].values
        wanted = [float(t) for t in cfg["experiment"]["options"]["snapshots"]]
        picks = sorted({int(np.argmin(abs(times - t))) for t in wanted})
        betas = ds["beta"].values
        rows = len(betas)
        fig = figure(figsize=(2.1 * len(picks) + 4.2, 2.2 * rows + 0.3), layout="constrained")
        grid = fig.add_gridspec(rows, len(picks) + 2)
        circle = np.linspace(0, 2 * np.pi, 200)
        for b, beta in enumerate(betas):
            angle = ds["angle"].isel(beta=b).values
            colours = colormap("tab10")(ds["final_cluster"].isel(beta=b).values % 10)
            for j, k in enumerate(picks):
                ax = fig.add_subplot(grid[b, j])
                ax.plot(np.cos(circle), np.sin(circle), color="0.8", linewidth=0.8)
                ax.scatter(np.cos(angle[k]), np.sin(angle[k]), s=16, color=colours, alpha=0.7, edgecolor="none")
                ax.set_aspect("equal")
                ax.set_xlim(-1.2, 1.2)
                ax.set_ylim(-1.2, 1.2)
                ax.set_xticks([])
                ax.set_yticks([])
                ax.grid(False)
                for side in ("left", "bottom"):
                    ax.spines[side].set_visible(False)
                count = int(ds["clusters"].isel(beta=b, member=int(ds["shown_member"].values[b]), time=k))
                ax.set_title(f"t = {times[k]:.3g}: {count} cluster{'s' if count != 1 else ''}", fontsize=8)
                if j == 0:
                    ax.text(-1.55, 0, rf"$\beta = {beta:g}$", rotation=90, ha="center", va="center", fontsize=10)
        ax = fig.add_subplot(grid[:, len(picks) :])
        for b, beta in enumerate(betas):
            counts = ds["clusters"].isel(beta=b).values.astype(float)  # (member, time)
            counts[counts < 0] = np.nan
            low, median, high = np.nanpercentile(counts, [10, 50, 90], axis=0)
            positive = times > 0
            ax.fill_between(times[positive], low[positive], high[positive], step="mid", alpha=0.25, color=f"C{b}")
            ax.step(
                times[positive],
                median[positive],
                where="mid",
                color=f"C{b}",
                linewidth=1.8,
                label=rf"$\beta = {beta:g}$: median, 10-90%",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_yticks([1, 2, 3, 5, 10, 20, 32])
        ax.set_yticklabels(["1", "2", "3", "5", "10", "20", "32"])
        ax.set_xlabel("time t")
        ax.set_ylabel("number of clusters")
        ax.set_title(f"cluster count over {ds.sizes['member']} members")
        ax.legend(loc="upper right")
        last = ds["clusters"].isel(time=-1).values
        medians = ds["final_clusters_median"].values
        final = ", ".join(
            rf"$\beta$ = {beta:g}: {medians[b]:g} ({np.mean(last[b] == medians[b]):.0%} of the members)"
            for b, beta in enumerate(betas)
        )
        caption(
            fig,
            (
                f"Q = K = V = I softmax attention on the circle, n = {cfg['n']} tokens uniform at t = 0, "
                f"{cfg['solver']} with dt = {cfg['dt']} in {cfg['dtype']}, {ds.sizes['member']} members per $\\beta$. "
                "Left: the tokens of one typical member (the first whose final count is the median) at the saved "
                f"times nearest {', '.join(f'{t:g}' for t in wanted)}, coloured by the cluster they end in. Right: "
                f"clusters (tokens joined when $\\cos > 1 - {cfg['cluster_eps']:g}$) over log time. Median count "
                "at t = "
                f"{times[-1]:g}: {final}."
            ),
            width=150,
        )
        return {"circle": fig}

    @staticmethod
    def write_files(ds: xr.Dataset, folder: Path, plotly_js: str = "embed") -> list[Path]:
        """An animation of the member drawn, one per beta (the saved times are log-spaced,
        so its frames are too)."""
        cfg = config_of(ds)
        times = ds["time"].values
        paths = []
        angle = ds["angle"].values  # (beta, time, token)
        for b, beta in enumerate(ds["beta"].values):
            x = np.stack([np.cos(angle[b]), np.sin(angle[b])], axis=-1)
            paths.append(
                animation(
                    x,
                    times,
                    Path(folder) / f"circle_beta{beta:g}.gif",
                    title=rf"$\beta = {beta:g}$, n = {cfg['n']}, member {int(ds['shown_member'][b])}",
                )
            )
        return paths
