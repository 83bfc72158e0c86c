"""The phase diagram of clustering with random attention matrices, at d = 128.

The pair-density diagram of `phase_diagram` (n = 32 tokens uniform on the sphere, Euler
along the unprojected field then renormalize, pair density with the threshold
<x_i, x_j> > 1 - 1e-3, averaged over members), now with random weights drawn afresh
for every member and every beta ("A mathematical perspective on Transformers", fig. 5),
with the laws and scales of that paper's own code (`phase-diagrams.py` of its
repository):

- the bilinear form of the logits, $B = Q^\\top K$, is drawn directly ($Q = I$, $K = B$):
  the product law $G_1 G_2 / \\sqrt d$ (logits of variance 1 on unit tokens), or the GOE
  $(G + G^\\top)/\\sqrt 2$ (variance $1 + \\langle x, y\\rangle^2$);
- V is Wishart, $G G^\\top / \\sqrt d$, or tied to the form, $\\pm B / \\sqrt d$
  ($\\pm B / \\sqrt{d + 1}$ for the GOE);
- that code multiplies row vectors by V ($x^\\top V$), so V acts here, on column vectors,
  as its transpose; this matters for the tied panels only ($B$ is not symmetric).

The four panels of the figure (`experiment.options.panels` picks and orders them):

- `product_wishart` (a): $B$ product law, V Wishart. The paper's caption calls this V
  Gaussian; its code's only random V (labelled "Gsn" in its own plots) is the Wishart
  $G G^\\top/\\sqrt d$, so that is the law used;
- `goe_wishart` (b): $B$ GOE, V Wishart;
- `v_plus_qtk` (c): $B$ product law, $V = +B/\\sqrt d$ (as the code applies it);
- `v_minus_qtk` (d): $B$ product law, $V = -B/\\sqrt d$.

Two more panels can be asked for: `product_identity` ($B$ product law, V = I: random
logits alone) and `product_ginibre` ($B$ product law, V Ginibre with entries
$N(0, 1/d)$: a literal reading of the caption, at the Ginibre scale of
`attnflow`, not the paper's).

The equiangular curve of the Q = K = V = I model is drawn over every panel for
comparison; the same transition measures as in `phase_diagram` are stored, per panel,
and for each beta the mean pair density at the last time (`final_pair_density`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..schema._config import choice
from ..schema._errors import ConfigError
from ..schema._schema import setting
from ._common import caption, config_of
from ._experiment import Counter, Experiment, Keeper
from ._lazy import lazy
from ._phase_diagrams import check_eps, heatmaps, summarize
from ._random_laws import PANELS

if TYPE_CHECKING:
    import xarray as xr
    from matplotlib.figure import Figure
else:
    xr = lazy("xarray")


Panel = choice("Panel", tuple(PANELS))


@dataclass
class Options:
    eps: float = setting(1e-3, "the equiangular curve: the time at which rho = 1 - eps")
    panels: list[Panel] = setting(  # pyright: ignore[reportInvalidTypeForm]  # a Choice made at run time
        [Panel.product_wishart, Panel.goe_wishart, Panel.v_plus_qtk, Panel.v_minus_qtk],  # pyright: ignore[reportAttributeAccessIssue]  # a Choice's members are made at run time
        "which of PANELS to solve",
    )


# What the caption says of each law, in words.
LAWS = (
    "Q = I and K = B, the bilinear form Q^T K drawn directly: product law B = G1 G2/sqrt(d) (logits of variance "
    "1 on unit tokens) or GOE (G + G^T)/sqrt(2); V Wishart G G^T/sqrt(d) or tied to B as +-B/sqrt(d) "
    "(+-B/sqrt(d + 1) for the GOE) and applied as its transpose (the published code multiplies row vectors by V); "
    "G, G1, G2 with N(0, 1) entries, drawn anew for every member and every beta"
)


class PhaseDiagramRandom(Experiment):
    title = "Phase diagram of the pair density with random Q^T K and V (d = 128)"
    paper = "A mathematical perspective on Transformers, fig. 5"
    coordinates = {
        "panel_title": ("the random attention matrices of the panel, in words", None),
    }
    Options = Options

    def check(self) -> None:
        check_eps(self.options.eps)
        chosen = self.options.panels
        if not chosen:
            raise ConfigError(
                f"experiment.options.panels must be a non-empty list of {', '.join(PANELS)}, got {chosen!r}."
            )

    def panels(self, base: dict) -> dict[str, dict]:
        configs = {}
        for label in map(str, self.options.panels):
            config = copy.deepcopy(base)
            for name, spec in PANELS[label][1].items():
                spec = spec(int(base["d"])) if callable(spec) else spec
                config["weights"][name] = {**config["weights"][name], **spec}
            config["weights"]["shared"] = False
            config["weights"]["per_beta"] = True
            configs[label] = config
        return configs

    def analyse(self, results: dict[str, xr.Dataset], *, on_piece: Counter, keep: Keeper) -> xr.Dataset:
        labels = list(results)
        ds = summarize(self.cfg, self.options.eps, results, "panel", labels)
        final = (
            ds["pair_density_mean"]
            .isel(time=-1, drop=True)
            .assign_attrs(description=f"mean pair density at t = {float(ds['time'][-1]):g}")
        )
        return ds.assign(final_pair_density=final).assign_coords(
            panel_title=("panel", [PANELS[label][0] for label in labels])
        )

    @staticmethod
    def draw(ds: xr.Dataset) -> dict[str, Figure]:
        cfg = config_of(ds)
        labels = [str(p) for p in ds["panel"].values]
        titles = [f"({chr(97 + k)}) {ds['panel_title'].values[k]}" for k in range(len(labels))]
        fig = heatmaps(ds, "panel", titles)
        beta = ds["beta"].values
        caption(
            fig,
            (
                f"{LAWS}. Softmax attention on $S^{{{cfg['d'] - 1}}}$, n = {cfg['n']} tokens uniform at t = 0, "
                f"{cfg['members']} members per (panel, $\\beta$), {beta.size} betas in [{beta[0]:g}, {beta[-1]:g}], "
                f"{cfg['solver']} (Euler along the unprojected field, then renormalize) with dt = {cfg['dt']} in "
                f"{cfg['dtype']}. Colour: fraction of token pairs with $\\langle x_i, x_j \\rangle > 1 - "
                f"{cfg['cluster_eps']:g}$, averaged over members. Dashed: the equiangular curve of the Q = K = V = I "
                "model (n "
                f"= {cfg['n']}, eps = {float(ds['equiangular_time'].attrs['eps']):g}), for comparison."
            ),
            width=30 * min(len(labels), 4) + 20,
        )
        return {"phase_diagram_random": fig}
