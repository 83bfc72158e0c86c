"""The phase diagram of clustering with random attention matrices, at d = 128.

The pair-density diagram of `phase_diagram` (n = 32 tokens uniform on the sphere, Euler
along the unprojected field then renormalize, pair density with the threshold
<x_i, x_j> > 1 - 1e-3, averaged over members), now with random weights drawn afresh
for every member ("A mathematical perspective on Transformers", fig. 5). Four panels:

- `ginibre`: Q, K and V Ginibre, i.i.d. N(0, 1/d) entries;
- `goe_wishart`: Q = I and K from the GOE, (G + G^T)/sqrt(2d), so that Q^T K is a GOE
  matrix (semicircle on [-2, 2]), and V Wishart, G G^T / d (positive semi-definite,
  Marchenko-Pastur on [0, 4]);
- `v_plus_qtk`: Q, K Ginibre and V = Q^T K;
- `v_minus_qtk`: Q, K Ginibre and V = -Q^T K.

These are the laws of `attnflow._random_matrices`, scaled so that every spectrum stays
of order one as d grows (G has i.i.d. N(0, 1) entries). The equiangular curve of the
Q = K = V = I model is drawn over every panel for comparison; the same transition
measures as in `phase_diagram` are stored, per panel.

`experiment.options.panels` picks a subset of the four.
"""

from __future__ import annotations

import copy
from pathlib import Path

import xarray as xr

from .._errors import ConfigError
from ._common import caption, config_of, save
from .phase_diagram import check as check_eps
from .phase_diagram import heatmaps, summarize

TITLE = "Phase diagram of the pair density with random Q, K, V (d = 128)"
PAPER = "A mathematical perspective on Transformers, fig. 5"
# eps: the equiangular curve is the time at which rho = 1 - eps; panels: which of PANELS to solve.
OPTIONS = {"eps": 1e-3, "panels": ["ginibre", "goe_wishart", "v_plus_qtk", "v_minus_qtk"]}

_RANDOM = {"kind": "random", "law": "gaussian"}
# label -> (the title of its panel, the weights it sets)
PANELS = {
    "ginibre": ("Ginibre Q, K, V", {"q": _RANDOM, "k": _RANDOM, "v": _RANDOM}),
    "goe_wishart": (r"GOE $Q^\top K$, Wishart V", {"q": {"kind": "identity"}, "k": {"kind": "random", "law": "goe"},
                                                   "v": {"kind": "random", "law": "wishart"}}),
    "v_plus_qtk": (r"Ginibre Q, K;  $V = Q^\top K$", {"q": _RANDOM, "k": _RANDOM, "v": {"kind": "tied", "sign": 1.0}}),
    "v_minus_qtk": (r"Ginibre Q, K;  $V = -Q^\top K$", {"q": _RANDOM, "k": _RANDOM,
                                                        "v": {"kind": "tied", "sign": -1.0}}),
}


def check(cfg, options) -> None:
    check_eps(cfg, options)
    chosen = options["panels"]
    if not isinstance(chosen, list) or not chosen or any(p not in PANELS for p in chosen):
        raise ConfigError(f"experiment.options.panels must be a non-empty list of {', '.join(PANELS)}, "
                          f"got {chosen!r}.")


def panels(base: dict, options: dict) -> dict[str, dict]:
    configs = {}
    for label in options["panels"]:
        config = copy.deepcopy(base)
        for name, spec in PANELS[label][1].items():
            config["weights"][name] = {**config["weights"][name], **spec}
        config["weights"]["shared"] = False
        configs[label] = config
    return configs


def analyse(cfg, options, results: dict[str, xr.Dataset]) -> xr.Dataset:
    labels = list(results)
    ds = summarize(cfg, options, results, "panel", labels)
    return ds.assign_coords(panel_title=("panel", [PANELS[label][0] for label in labels]))


def draw(ds: xr.Dataset, folder: Path) -> list[Path]:
    cfg = config_of(ds)
    labels = [str(p) for p in ds["panel"].values]
    titles = [f"{ds['panel_title'].values[k]}\n(mismatch {float(ds['curve_mismatch'].values[k]):.3f})"
              for k in range(len(labels))]
    fig = heatmaps(ds, "panel", titles)
    beta = ds["beta"].values
    caption(fig, (
        f"Random weights drawn per member: Ginibre entries N(0, 1/d), GOE (G + G^T)/sqrt(2d), Wishart G G^T/d; "
        f"softmax attention on S^{cfg['d'] - 1}, n = {cfg['n']} tokens uniform at t = 0, {cfg['members']} members "
        f"per (panel, beta), {beta.size} betas in [{beta[0]:g}, {beta[-1]:g}], {cfg['solver']} with "
        f"dt = {cfg['dt']} in {cfg['dtype']}. Colour: fraction of token pairs with <x_i, x_j> > 1 - "
        f"{cfg['eps']:g}, averaged over members. Dashed: the equiangular curve of the Q = K = V = I model "
        f"(n = {cfg['n']}, eps = {float(ds['equiangular_time'].attrs['eps']):g}). Mismatch = mean "
        f"|P - 1{{t >= t_eps}}| over the grid."), width=30 * len(labels) + 20)
    return save(fig, folder, "phase_diagram_random")
