"""Random Q and K with V = I still give one cluster.

n = 25 tokens start uniformly on S^3 (d = 4) and follow softmax self-attention on the
sphere with Gaussian (Ginibre) Q and K, drawn per member and redrawn every unit of time,
and V = I ("A Survey of Continuous Time Dynamics of Transformers", sec. 5.2, fig. 3:
"Q and K can be fully random at all times - as long as V is the identity clustering is
always exhibited"). Every member should end in a single cluster (all pairs with
<x_i, x_j> > 1 - eps).

The contrast panel (option `contrast`) runs the same members with V negated (V = -I):
each token then moves away from its attention-weighted mean, and the tokens do not
gather into one point (with fixed random Q, K they settle into two antipodal groups,
with redrawn ones they stay spread), so the single cluster is a property of V = I, not
of Q and K. Stored per panel (`v_sign` = +1 for V, -1 for -V): the member statistics
of the cluster count, pair density and order parameter over time (`member_summary`),
every member's final cluster count, `one_cluster_fraction`, and the drawn member's
states `x_member`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..schema._errors import ConfigError
from ..schema._schema import setting
from ._common import (
    caption,
    check_drawn_member,
    colormap,
    config_of,
    failed_members,
    member_summary,
    stack_panels,
    subplots,
)
from ._experiment import Counter, Experiment, Keeper
from ._lazy import lazy

if TYPE_CHECKING:
    import matplotlib.collections as mcoll
    import matplotlib.colors as mcolors
    import xarray as xr
    from matplotlib import cm
    from matplotlib.figure import Figure
else:
    xr = lazy("xarray")
    cm = lazy("matplotlib.cm")
    mcoll = lazy("matplotlib.collections")
    mcolors = lazy("matplotlib.colors")


@dataclass
class Options:
    member: int = setting(0, "the member whose tokens are drawn")
    contrast: bool = setting(True, "also run V negated")


_SERIES = ("clusters", "pair_density", "order_parameter")


def principal_plane(points: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The centre and the two leading principal directions (rows) of `points` (rows),
    with the share of the variance each one carries."""
    centre = points.mean(0)
    _, s, vt = np.linalg.svd(points - centre, full_matrices=False)
    return centre, vt[:2], (s[:2] ** 2) / np.sum(s**2)


def draw_paths(ax, x: np.ndarray, t: np.ndarray, norm, cmap) -> None:
    """Token paths x(time, token, dim) on the principal plane of all their points,
    coloured by time; o marks the start, * the end."""

    centre, axes, share = principal_plane(x.reshape(-1, x.shape[-1]))
    y = (x - centre) @ axes.T  # (time, token, 2)
    for i in range(y.shape[1]):
        segments = np.stack([y[:-1, i], y[1:, i]], axis=1)
        lines = mcoll.LineCollection(segments, cmap=cmap, norm=norm, linewidth=1.0)  # pyright: ignore[reportArgumentType]  # an (N, 2, 2) array of segments
        lines.set_array(0.5 * (t[:-1] + t[1:]))
        ax.add_collection(lines)
    ax.scatter(y[0, :, 0], y[0, :, 1], s=12, facecolor="white", edgecolor="0.3", linewidth=0.7, zorder=3)
    ax.scatter(y[-1, :, 0], y[-1, :, 1], s=60, marker="*", color="k", zorder=4)
    ax.set_xlabel(f"PC1 ({100 * share[0]:.0f}% of the variance)")
    ax.set_ylabel(f"PC2 ({100 * share[1]:.0f}%)")
    ax.set_aspect("equal", adjustable="datalim")
    ax.autoscale_view()


def _panel_names(cfg: dict) -> dict[float, str]:
    v = cfg["weights"]["v"]
    if v["kind"] == "identity" and v["scale"] == 1:
        return {1.0: "V = I", -1.0: "V = -I"}
    return {1.0: "V", -1.0: "-V"}


class RandomQK(Experiment):
    title = "Random Q, K with V = I still cluster; V = -I does not"
    paper = "A Survey of Continuous Time Dynamics of Transformers, sec. 5.2, fig. 3"
    Options = Options

    def check(self) -> None:
        check_drawn_member("random_qk", self.cfg, self.options, "draws a member's tokens")
        missing = [name for name in _SERIES if name not in self.cfg.metrics]
        if missing:
            raise ConfigError(f"experiment random_qk draws {', '.join(_SERIES)}: add {', '.join(missing)} to metrics.")

    def panels(self, base: dict) -> dict[str, dict]:
        """The study as configured (`V`) and, with `contrast`, the same with V negated (`-V`)."""
        if not self.options.contrast:
            return {"V": base}
        negated = copy.deepcopy(base)
        negated["weights"]["v"]["scale"] = -float(base["weights"]["v"]["scale"])
        return {"V": base, "-V": negated}

    def analyse(self, results: dict[str, xr.Dataset], *, on_piece: Counter, keep: Keeper) -> xr.Dataset:
        member = self.options.member
        parts = {}
        for label, ds in results.items():
            part = xr.merge([member_summary(ds[name]) for name in _SERIES])
            final = ds["clusters"].isel(time=-1)
            part["final_clusters"] = final.drop_vars("time").assign_attrs(
                description=f"number of clusters (cos > 1 - {self.cfg.cluster_eps:g}) of every member at "
                f"t = {self.cfg.t1:g}"
            )
            part["one_cluster_fraction"] = xr.DataArray(float((final == 1).mean())).assign_attrs(
                description="fraction of the members in a single cluster at the final time"
            )
            part["failed_members"] = failed_members(ds, "members whose solve failed (left out of the statistics)")
            part["x_member"] = (
                ds["x"]
                .isel(member=member)
                .drop_vars("member")
                .assign_attrs(description=f"states x(time, token, dim) of member {member}")
            )
            parts[label] = part
        signs = [1.0 if label == "V" else -1.0 for label in parts]
        out = stack_panels(parts, dim="v_sign", coordinate=signs)
        out["v_sign"].attrs["description"] = "+1: V as configured; -1: V negated (the contrast panel)"
        return out

    @staticmethod
    def draw(ds: xr.Dataset) -> dict[str, Figure]:

        cfg = config_of(ds)
        member = int(cfg["experiment"]["options"]["member"])
        t = ds["time"].values
        signs = list(ds["v_sign"].values)
        fig, axes = subplots(2, 2, figsize=(9.5, 7.6), layout="constrained")
        norm = mcolors.Normalize(t[0], t[-1])
        cmap = colormap("viridis")
        names = _panel_names(cfg)
        letters = iter("abcd")
        for k, ax in enumerate(axes[0]):
            if k >= len(signs):
                ax.set_axis_off()
                continue
            part = ds.sel(v_sign=signs[k])
            draw_paths(ax, part["x_member"].values, t, norm, cmap)
            final = int(part["final_clusters"].values[member])
            ax.set_title(
                f"({next(letters)}) {names[signs[k]]}: member {member}, {final} cluster"
                f"{'s' if final != 1 else ''} at t = {t[-1]:g}"
            )
        fig.colorbar(cm.ScalarMappable(norm=norm, cmap=cmap), ax=axes[0], label="time t", shrink=0.8)
        colors = {1.0: "C0", -1.0: "C3"}
        for ax, name, label in (
            (axes[1, 0], "clusters", "number of clusters"),
            (axes[1, 1], "pair_density", "pair density"),
        ):
            for sign in signs:
                part = ds.sel(v_sign=sign)
                ax.fill_between(t, part[f"{name}_q10"], part[f"{name}_q90"], color=colors[sign], alpha=0.2, linewidth=0)
                ax.plot(t, part[f"{name}_median"], color=colors[sign], label=f"{names[sign]}: median, 10-90%")
                if name == "pair_density":
                    ax.plot(
                        t,
                        part[f"{name}_mean"],
                        color=colors[sign],
                        linestyle="--",
                        linewidth=1,
                        label=f"{names[sign]}: mean",
                    )
            ax.set_xlabel("time t")
            ax.set_ylabel(label)
            ax.set_title(f"({next(letters)}) {label} over {int(ds.sizes['member'])} members")
        axes[1, 0].set_yscale("log")
        axes[1, 0].set_ylim(0.8, cfg["n"] * 1.25)
        axes[1, 0].legend(loc="upper right")
        axes[1, 1].set_ylim(-0.02, 1.02)
        axes[1, 1].legend(loc="center right")
        q = cfg["weights"]["q"]
        redraw = f"redrawn every {q['redraw_every']:g} time units" if q.get("redraw_every") else "drawn once"
        fractions = ", ".join(
            f"{names[s]}: {100 * float(ds['one_cluster_fraction'].sel(v_sign=s)):.0f}%" for s in signs
        )
        caption(
            fig,
            (
                f"Softmax attention on $S^{{{cfg['d'] - 1}}}$, n = {cfg['n']}, $\\beta$ = {cfg['beta']}, Q and K "
                f"{q['law']} random ({'per member' if not cfg['weights']['shared'] else 'shared by the members'}, "
                f"{redraw}), {names[1.0]}{' (and its negative)' if len(signs) > 1 else ''}; {cfg['solver']} with dt = "
                f"{cfg['dt']}, uniform initial tokens. (a, b) one member's token paths on the principal plane of all "
                "its states (o start, * end). (c, d) the number of clusters and the fraction of pairs with $\\cos > 1 "
                f"- {cfg['cluster_eps']:g}$. Members in one cluster at t = {t[-1]:g}: {fractions}."
            ),
            width=130,
        )
        return {"random_qk": fig}
