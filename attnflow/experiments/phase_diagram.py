"""The phase diagram of clustering over (t, beta), with the equiangular-model curve.

n = 32 tokens start uniformly on the sphere S^{d-1} and follow softmax self-attention
with Q = K = V = I, discretized as the published code does it: an Euler step along the
unprojected field, then a renormalization of every token ("A mathematical perspective on
Transformers", fig. 3). The pair density, the fraction of token pairs with
<x_i, x_j> > 1 - 1e-3, averaged over the members, is drawn over (t, beta) for each d.

Over it runs the curve beta -> t_eps(beta) of the equiangular model (all pairwise inner
products equal, starting orthogonal; `attnflow.analysis.equiangular`): the time at which every
pair of that model counts as clustered. Random tokens in high dimension are nearly
orthogonal, so the transition of the pair density from 0 to 1 should follow the curve
more closely as d grows. Two measures of that, per d, are stored:

- `curve_mismatch`: the mean over the (t, beta) grid of |P(t, beta) - 1{t >= t_eps(beta)}|,
  the L1 distance between the mean pair density and the step that the equiangular model
  predicts (0 when the diagram is exactly that step);
- `crossing_log_error`: the mean over the betas whose mean pair density reaches 1/2
  inside the run of |log(t_half / t_eps)|, t_half the (interpolated) first time it does.

The members' pair densities themselves are not kept: the figure needs their mean only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..schema._schema import setting
from ._common import caption, config_of
from ._experiment import Counter, Experiment, Keeper
from ._lazy import lazy
from ._phase_diagrams import check_eps, heatmaps, summarize

if TYPE_CHECKING:
    import xarray as xr
    from matplotlib.figure import Figure
else:
    xr = lazy("xarray")


@dataclass
class Options:
    eps: float = setting(1e-3, "the equiangular curve: the time at which rho = 1 - eps")


class PhaseDiagram(Experiment):
    title = "Phase diagram of the pair density over (t, beta), with the equiangular curve"
    paper = "A mathematical perspective on Transformers, fig. 3"
    panel_keys = ("d",)
    Options = Options

    def check(self) -> None:
        check_eps(self.options.eps)

    def analyse(self, results: dict[str, xr.Dataset], *, on_piece: Counter, keep: Keeper) -> xr.Dataset:
        dims = self.cfg.d if isinstance(self.cfg.d, list) else [self.cfg.d]
        return summarize(self.cfg, self.options.eps, results, "d", [int(d) for d in dims])

    @staticmethod
    def draw(ds: xr.Dataset) -> dict[str, Figure]:
        cfg = config_of(ds)
        dims = [int(d) for d in ds["d"].values]
        titles = [f"d = {d}  (mismatch {float(ds['curve_mismatch'].sel(d=d)):.3f})" for d in dims]
        fig = heatmaps(ds, "d", titles)
        members = int(cfg["members"])
        beta = ds["beta"].values
        mismatch = ", ".join(f"d={d}: {float(ds['curve_mismatch'].sel(d=d)):.3f}" for d in dims)
        caption(
            fig,
            (
                f"Q = K = V = I softmax attention on S^(d-1), n = {cfg['n']} tokens uniform at t = 0, "
                f"{members} members per (d, $\\beta$), {beta.size} betas in [{beta[0]:g}, {beta[-1]:g}], "
                f"{cfg['solver']} (Euler along the unprojected field, then renormalize) with dt = {cfg['dt']} in "
                f"{cfg['dtype']}. Colour: fraction of token pairs with $\\langle x_i, x_j \\rangle > 1 - "
                f"{cfg['cluster_eps']:g}$, averaged over members. Dashed: the equiangular model's time to "
                "$\\rho$ = 1 - "
                f"{float(ds['equiangular_time'].attrs['eps']):g} (n = {cfg['n']}, orthogonal start). Mismatch = "
                f"mean |P - 1{{t >= t_eps}}| over the grid ({mismatch})."
            ),
            width=30 * len(dims) + 20,
        )
        return {"phase_diagram": fig}
