"""Many heads: the time to one cluster and the metastable cluster count as the number of
random heads H grows, for the random laws of the phase diagram.

H heads, each drawing its own Q^T K and V from one law of `phase_diagram_random`
("A mathematical perspective on Transformers", fig. 5), are averaged with 1/H
(`heads_combine=mean`): the field of H heads is then the mean of H independent
one-head fields, and converges to its expectation over the law at the rate H^{-1/2} as
H grows (`tests/core/test_heads.py`), the H -> infinity limit the survey ("A Survey of
Continuous Time Dynamics of Transformers", section 2.2) names as future work. Every member
draws its own heads (`weights.shared=false`); one panel per (law, H), over the grid
`experiment.options.heads` (1, 2, 4, ... by default).

Two statistics per member, from the cluster count (`clusters`: connected components of
<x_i, x_j> > 1 - eps) over the saved times:

- `one_cluster_time`: the first saved time from which the count stays 1 (NaN when the
  member ends in more than one cluster);
- `metastable_clusters`: the count of the longest plateau of the cluster count on a log
  time axis (`attnflow.analysis.plateaus`), leaving out the start, where no token has
  met another yet (count n): the state the tokens spend the longest in. It is 1 when they
  gather into one cluster early and stay there. Where no count below n holds that long
  (no two tokens have met, or they are still meeting at t1) it is the count at t1.

Stored per law and H: both statistics for every member, their member medians (the time
over the members that get there), the median count at t1 and `one_cluster_fraction`, the
fraction of the members in one cluster at t1.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..schema._config import choice
from ..schema._errors import ConfigError
from ..schema._schema import setting
from ._common import caption, config_of, failed_members, subplots
from ._experiment import Counter, Experiment, Keeper
from ._lazy import lazy
from ._random_laws import PANELS

if TYPE_CHECKING:
    import xarray as xr
    from matplotlib.figure import Figure

    from ..analysis import plateaus
else:
    xr = lazy("xarray")
    plateaus = lazy("attnflow.analysis.plateaus")


LawPanel = choice("LawPanel", tuple(PANELS))


@dataclass
class Options:
    laws: list[LawPanel] = setting(  # pyright: ignore[reportInvalidTypeForm]  # a Choice made at run time
        [LawPanel.product_wishart, LawPanel.v_plus_qtk],  # pyright: ignore[reportAttributeAccessIssue]  # a Choice's members are made at run time
        "panels of phase_diagram_random",
    )
    heads: list[int] = setting([1, 2, 4, 8, 16, 32, 64, 128, 256], "the grid of H")


def _label(law: str, heads: int) -> str:
    return f"{law}_h{heads}"


def one_cluster_time(clusters: np.ndarray, times: np.ndarray) -> np.ndarray:
    """The first saved time from which each series (last axis) stays at one cluster; NaN
    where the last count is not 1."""
    clusters = np.asarray(clusters)
    away = clusters != 1
    last_away = np.where(away.any(-1), away.shape[-1] - 1 - np.argmax(away[..., ::-1], -1), -1)
    first = np.minimum(last_away + 1, away.shape[-1] - 1)
    return np.where(away[..., -1], np.nan, np.asarray(times)[first])


def metastable_count(found: xr.Dataset, final: xr.DataArray, n: int) -> xr.DataArray:
    """The cluster count of the longest plateau of the count (on the log axis of the
    detector) whose count is below n; the `final` count where there is none (no two
    tokens have met, or they are still meeting at the end)."""
    start, end = found["clusters_plateau_start"], found["clusters_plateau_end"]
    if found.attrs["axis"] == "log":  # lengths in decades of t - t0, as the detector measures them
        origin = float(found.attrs["origin"])
        start, end = np.log10(start - origin), np.log10(end - origin)
    level = found["clusters_plateau_level"]
    length = (end - start).where(level < n)
    longest = length.fillna(-1).argmax("plateau")
    count = level.isel(plateau=longest).where(length.max("plateau") >= 0).drop_vars("plateau", errors="ignore")
    return count.fillna(final.astype(float))


class ManyHeads(Experiment):
    title = "Many random heads averaged with 1/H: time to one cluster and metastable cluster count against H"
    paper = "A Survey of Continuous Time Dynamics of Transformers, section 2.2 (H -> infinity as future work)"
    coordinates = {
        "law": ("random law of each head's Q^T K and V (a panel of phase_diagram_random)", None),
        "heads": ("number of attention heads H, averaged with 1/H", "1"),
        "law_title": ("the random law of the panel, in words", None),
    }
    Options = Options

    def check(self) -> None:
        laws, heads = self.options.laws, list(self.options.heads)
        if not laws:
            raise ConfigError(f"experiment.options.laws must be a non-empty list of {', '.join(PANELS)}, got {laws!r}.")
        if not heads or any(isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in heads):
            raise ConfigError(
                f"experiment.options.heads must be a non-empty list of whole numbers >= 1, got {heads!r}."
            )
        if heads != sorted(set(heads)):
            raise ConfigError(f"experiment.options.heads must increase, got {heads!r}.")
        if "clusters" not in self.cfg.metrics:
            raise ConfigError("experiment many_heads reads the cluster count: add clusters to metrics.")
        if self.cfg.heads_combine != "mean":
            raise ConfigError("experiment many_heads averages its heads: heads_combine must be mean.")

    def panels(self, base: dict) -> dict[str, dict]:
        configs = {}
        for law in map(str, self.options.laws):
            for heads in self.options.heads:
                config = copy.deepcopy(base)
                for name, spec in PANELS[law][1].items():
                    spec = spec(int(base["d"])) if callable(spec) else spec
                    config["weights"][name] = {**config["weights"][name], **spec}
                config["weights"]["shared"] = False
                config["heads"] = int(heads)
                configs[_label(law, int(heads))] = config
        return configs

    def analyse(self, results: dict[str, xr.Dataset], *, on_piece: Counter, keep: Keeper) -> xr.Dataset:
        cfg = self.cfg
        laws, heads = [str(law) for law in self.options.laws], [int(h) for h in self.options.heads]
        rows = []
        for law in laws:
            parts = []
            for h in heads:
                ds = results[_label(law, h)]
                times = ds["time"].values
                counts = ds["clusters"].transpose("member", "time").values
                found = plateaus.detect_metastability(ds[["clusters"]], ["clusters"], clusters=None, sizes=None)
                part = xr.Dataset(
                    {
                        "one_cluster_time": (
                            ("member",),
                            one_cluster_time(counts, times),
                            {
                                "description": "first saved time from which the member stays in one cluster "
                                "(NaN: it does not)"
                            },
                        ),
                        "metastable_clusters": metastable_count(
                            found, ds["clusters"].isel(time=-1, drop=True), int(cfg.n)
                        ).assign_attrs(
                            description="cluster count of the longest plateau of the count below n (log time)"
                        ),
                        "failed_members": failed_members(ds, "members whose solve failed (left out of the statistics)"),
                    }
                )
                parts.append(part)
            rows.append(xr.concat(parts, dim="heads", coords="minimal", compat="override"))
        out = xr.concat(rows, dim="law", coords="minimal", compat="override").assign_coords(
            law=laws, heads=heads, law_title=("law", [PANELS[law][0] for law in laws])
        )
        final_one = out["one_cluster_time"].notnull()
        out["one_cluster_fraction"] = final_one.mean("member").assign_attrs(
            description=f"fraction of the members in one cluster at t = {cfg.t1:g}"
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an (H, law) where no member gets there: NaN
            out["one_cluster_time_median"] = (
                out["one_cluster_time"]
                .median("member")
                .assign_attrs(description="median time to one cluster over the members that get there (NaN: none does)")
            )
        out["metastable_clusters_median"] = (
            out["metastable_clusters"]
            .median("member")
            .assign_attrs(description="median over members of the metastable cluster count")
        )
        out["final_clusters_median"] = xr.DataArray(
            [
                [float(np.median(results[_label(law, h)]["clusters"].isel(time=-1).values)) for h in heads]
                for law in laws
            ],
            dims=("law", "heads"),
            attrs={"description": f"median over members of the cluster count at t = {cfg.t1:g}"},
        )
        return out

    @staticmethod
    def draw(ds: xr.Dataset) -> dict[str, Figure]:
        cfg = config_of(ds)
        heads = ds["heads"].values
        fig, axes = subplots(1, 3, figsize=(13.5, 4.2), layout="constrained")
        for k, law in enumerate(ds["law"].values):
            title = str(ds["law_title"].values[k])
            color = f"C{k}"
            part = ds.sel(law=law)
            times = part["one_cluster_time"].values  # (heads, member)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # an H where no member gets there: NaN
                q10, q90 = np.nanpercentile(times, [10, 90], axis=-1)
            axes[0].plot(heads, part["one_cluster_time_median"], "o-", color=color, label=title)
            axes[0].fill_between(heads, q10, q90, color=color, alpha=0.15)
            axes[1].plot(heads, part["metastable_clusters_median"], "o-", color=color, label=title)
            axes[1].plot(heads, part["final_clusters_median"], "x--", color=color, alpha=0.6)
            axes[2].plot(heads, part["one_cluster_fraction"], "o-", color=color, label=title)
        for ax in axes:
            ax.set_xscale("log", base=2)
            ax.set_xlabel("heads H (averaged with 1/H)")
        axes[0].set_yscale("log")
        axes[0].set_ylabel("time to one cluster")
        axes[0].set_title("(a) time to one cluster: median, 10-90% (of those that get there)")
        axes[1].set_ylabel("metastable cluster count")
        axes[1].set_title(f"(b) metastable count (o) and count at t = {cfg['t1']:g} (x), medians")
        axes[2].set_ylabel(f"fraction in one cluster at t = {cfg['t1']:g}")
        axes[2].set_title("(c) members in one cluster at the end")
        axes[2].set_ylim(-0.05, 1.05)
        axes[0].legend(fontsize=8, loc="best")
        caption(
            fig,
            (
                f"H heads, each drawing its own $Q^\\top K$ and V from the law named (Q = I, K = B; the laws of "
                f"phase_diagram_random), averaged with 1/H; softmax attention on $S^{{{cfg['d'] - 1}}}$, n = "
                f"{cfg['n']} tokens uniform at t = 0, $\\beta$ = {cfg['beta']}, {cfg['members']} members per (law, H), "
                f"each with its own heads, {cfg['solver']} with dt = {cfg['dt']} to t = {cfg['t1']:g} in "
                f"{cfg['dtype']}. A cluster: $\\langle x_i, x_j\\rangle > 1 - {cfg['cluster_eps']:g}$, connected. "
                "Metastable "
                "count: the count of the longest plateau of the cluster count in log time below n (the count at t = "
                f"{cfg['t1']:g} where none holds)."
            ),
            width=120,
        )
        return {"many_heads": fig}
