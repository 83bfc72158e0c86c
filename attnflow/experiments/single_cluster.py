"""Single cluster on S^2 with a monotone interaction energy.

Three tokens under Q = K = V = I softmax attention on the sphere at beta = 1.1
converge to one point, and the interaction energy E_beta never decreases along the
way ("A Survey of Continuous Time Dynamics of Transformers", fig. 1; its theorem 4.2
and lemma 3.3). The figure draws one member's paths on the sphere and the energy of
every member (PNG and PDF), with the member's paths also as an interactive HTML view
with a time slider and as a GIF; `energy_increase` records, per member, the most
negative increment of E_beta between saved times (zero or above, up to round-off, for
a monotone energy).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..schema._schema import setting
from ._animate import animate_states
from ._common import caption, check_drawn_member, colormap, config_of, figure, wireframe_sphere
from ._experiment import Counter, Experiment, Keeper
from ._lazy import lazy

if TYPE_CHECKING:
    import xarray as xr
    from matplotlib.figure import Figure
else:
    xr = lazy("xarray")


@dataclass
class Options:
    member: int = setting(0, "the member whose paths are drawn")


class SingleCluster(Experiment):
    title = "Single cluster on S^2, monotone interaction energy"
    paper = "A Survey of Continuous Time Dynamics of Transformers, fig. 1 (theorem 4.2, lemma 3.3)"
    Options = Options

    def check(self) -> None:
        check_drawn_member("single_cluster", self.cfg, self.options, "draws a member's paths")

    def analyse(self, results: dict[str, xr.Dataset], *, on_piece: Counter, keep: Keeper) -> xr.Dataset:
        ds = results["main"].copy()
        ds.attrs = {}
        increments = ds["energy"].diff("time")
        ds["energy_increase"] = increments.min("time").assign_attrs(
            description="smallest increment of the interaction energy between saved times (>= 0: monotone)"
        )
        return ds

    @staticmethod
    def draw(ds: xr.Dataset) -> dict[str, Figure]:
        cfg = config_of(ds)
        member = int(cfg["experiment"]["options"]["member"])
        x = ds["x"].isel(member=member).values  # (time, token, dim)
        t = ds["time"].values
        fig = figure(figsize=(9.5, 4.0))
        ax = fig.add_subplot(1, 2, 1, projection="3d")
        wireframe_sphere(ax)
        colors = colormap("tab10")(np.arange(x.shape[1]) % 10)
        for i in range(x.shape[1]):
            ax.plot(*x[:, i].T, color=colors[i], linewidth=1.5)
            ax.scatter(*x[0, i], color=colors[i], marker="o", s=25)
        ax.scatter(*x[-1].mean(0) / np.linalg.norm(x[-1].mean(0)), color="k", marker="*", s=80)
        ax.set_title(f"(a) paths of {x.shape[1]} tokens (member {member}): o start, * end")
        ax2 = fig.add_subplot(1, 2, 2)
        energy = ds["energy"].values
        ax2.plot(t, energy.T, color="0.75", linewidth=0.5)
        ax2.plot(t, energy[member], color="C0", linewidth=2, label=f"member {member}")
        ax2.set_xlabel("time t")
        ax2.set_ylabel(r"$E_\beta = \sum_{ij} e^{\beta\langle x_i, x_j\rangle}/(2\beta n^2)$")
        ax2.set_title(f"(b) interaction energy, {energy.shape[0]} members")
        ax2.legend(loc="lower right")
        worst = float(ds["energy_increase"].min())
        single = int((ds["clusters"].isel(time=-1) == 1).sum())
        caption(
            fig,
            (
                f"Q = K = V = I, softmax attention on $S^{{{cfg['d'] - 1}}}$, n = {cfg['n']}, $\\beta$ = "
                f"{cfg['beta']}, {cfg['solver']} with dt = {cfg['dt']} in {cfg['dtype']}, uniform initial tokens. "
                f"{single} of {energy.shape[0]} members end in one cluster ($\\cos > 1 - {cfg['cluster_eps']:g}$); the "
                f"smallest energy increment between saved times over all members is {worst:.2e} (monotone energy)."
            ),
        )
        return {"single_cluster": fig}

    @staticmethod
    def write_files(ds: xr.Dataset, folder: Path, plotly_js: str = "embed") -> list[Path]:
        """The drawn member's paths as an interactive view and a GIF."""
        cfg = config_of(ds)
        member = int(cfg["experiment"]["options"]["member"])
        title = f"{cfg['n']} tokens on $S^2$, $\\beta$ = {cfg['beta']}, member {member}"
        return animate_states(ds, folder, "single_cluster", member=member, title=title, plotly_js=plotly_js)
