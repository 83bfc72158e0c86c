r"""Cross-attention: target tokens choosing among the clusters of a source, and the phase
diagram of the competition between the target's own clustering (beta) and the pull of
the source (beta_c).

The study's n target tokens start uniformly on the sphere and follow their own softmax
self-attention at beta plus cross-attention at beta_c to m source tokens held fixed
(`cross.*`, docs/model.md section 15), Q = K = V = I for both. The source stands for an
encoder's output with k clusters: k caps of small radius around given centres
(`cross.init.kind=caps`), so that every member has the same k source clusters and the
label `nearest_source` names them. One panel per beta_c of `experiment.options.cross_betas`
(the rows of the diagram), each over the config's list of betas (its columns): the panels
share one compiled program, beta_c being traced data. Every panel draws the same members:
the same target and source tokens at t = 0 in every cell of the diagram.

Per member and cell, at t1 (the `nearest_source` label of each target token read at t = 0
and at t1):

- `largest_share`, the order parameter: the fraction of the target tokens whose nearest
  source cluster at t1 is the most chosen one. It is 1 when the target stays together,
  and equals the largest initial share, `initial_largest_share` (the largest fraction of
  target tokens nearest one source cluster at t = 0, about 0.42 for 32 tokens and three
  equal cells), when the target splits by where each token starts;
- `final_capture`: `source_capture` at t1, the fraction of target tokens within
  `cluster_eps` of a source token (captured by a source cluster);
- `start_agreement`: the fraction of target tokens whose source cluster at t1 is the
  one nearest them at t = 0 (1: each chose by where it started);
- `chosen_clusters`: how many source clusters hold a target token at t1;
- `source_offset`: the mean angle between a target token at t1 and its nearest source
  token (radians);
- `source_mean_angle`: the largest angle between a target token at t1 and the direction
  of the mean of the source tokens.

Their means over the members (`*_mean`) make the diagram. Where `cross.init.centres`
are k orthonormal directions, the direction u of the source's mean is a critical point of
the source's potential $f(y) = \beta_c^{-1}\log\sum_j e^{\beta_c\langle y, x_j\rangle}$, and
a maximum of it on the sphere exactly when $\beta_c < \sqrt k$ (caps of radius 0): the
Riemannian Hessian there is $(\beta_c^2/k - \beta_c/\sqrt k)\,I$ on the tangent space.
Below that value every target token ends at u, whatever beta; `mean_direction_threshold`
stores $\sqrt k$ (NaN for other centres).

`experiment.options.cases` lists (beta, beta_c) cells of the grid whose member
`experiment.options.member` is drawn on the sphere: its target tokens at t = 0 and at t1,
coloured by the source cluster each chose, and the source tokens.
"""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..schema._errors import ConfigError
from ..schema._schema import setting
from ._common import caption, check_member_option, colormap, config_of, figure, finite_number, wireframe_sphere
from ._experiment import Counter, Experiment, Keeper
from ._lazy import lazy

if TYPE_CHECKING:
    import xarray as xr
    from matplotlib.figure import Figure
else:
    xr = lazy("xarray")


@dataclass
class Options:
    cross_betas: list[float] = setting(
        [1.0, 1.58, 2.51, 3.98, 6.31, 10.0, 15.8, 25.1, 39.8, 63.1, 100.0],
        "the grid of beta_c, the cross-attention's inverse temperature: one panel each (the diagram's rows)",
    )
    cases: list[list[float]] = setting(
        [[0.316, 1.0], [0.316, 3.98], [0.316, 39.8], [10.0, 39.8]],
        "the cells [beta, beta_c] of the grid whose drawn member is shown on the sphere",
    )
    member: int = setting(0, "the member drawn on the sphere")


# What each member's statistics at t1 say (their means over members are the diagram).
DESCRIPTIONS = {
    "largest_share": "order parameter: fraction of the target tokens at the most chosen source cluster at t1 (1: the "
    "target stays together; the initial largest share: it splits by where each token starts)",
    "initial_largest_share": "largest fraction of the target tokens nearest one source cluster at t = 0 (the "
    "order parameter of a target that splits by where each token starts)",
    "final_capture": "fraction of the target tokens within cluster_eps of a source token at t1 (source_capture)",
    "start_agreement": "fraction of the target tokens whose source cluster at t1 is the one nearest them at t = 0",
    "chosen_clusters": "number of source clusters nearest some target token at t1",
    "source_offset": "mean over the target tokens of the angle (radians) to the nearest source token at t1",
    "source_mean_angle": "largest angle (radians) between a target token at t1 and the direction of the source's mean",
}


def _label(cross_beta: float) -> str:
    return f"cross_beta={cross_beta:g}"


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _angle(cosine: np.ndarray) -> np.ndarray:
    return np.arccos(np.clip(cosine, -1.0, 1.0))


def shares(labels: np.ndarray, m: int) -> np.ndarray:
    """The fraction of the tokens (last axis) carrying each label 0, ..., m - 1: `(..., m)`."""
    return (labels[..., None] == np.arange(m)).mean(-2)


def member_statistics(ds: xr.Dataset, m: int) -> xr.Dataset:
    """The statistics of every member of one panel (a study over a list of betas, its
    states, `nearest_source` and `source_capture` saved) at t1, by `DESCRIPTIONS`; NaN
    for a member whose solve failed."""
    if "beta" not in ds.dims:
        ds = ds.expand_dims(beta=[float(ds["beta"])])
    ds = ds.transpose("beta", "member", ...)
    first = ds["nearest_source"].isel(time=0).values  # (beta, member, token)
    last = ds["nearest_source"].isel(time=-1).values
    final = shares(last, m)
    y = _unit(ds["x"].isel(time=-1).transpose("beta", "member", "token", "dim").values)
    source = _unit(ds["source_x"].transpose("beta", "member", "source_token", "dim").values)
    mean_direction = _unit(source.mean(-2))
    values = {
        "largest_share": final.max(-1),
        "initial_largest_share": shares(first, m).max(-1),
        "final_capture": ds["source_capture"].isel(time=-1).values,
        "start_agreement": (first == last).mean(-1),
        "chosen_clusters": (final > 0).sum(-1),
        "source_offset": _angle(np.einsum("bmid,bmjd->bmij", y, source).max(-1)).mean(-1),
        "source_mean_angle": _angle(np.einsum("bmid,bmd->bmi", y, mean_direction)).max(-1),
    }
    ok = ds["status"].transpose("beta", "member").values == 0
    coords = {"beta": ds["beta"].values, "member": ds["member"].values}
    return xr.Dataset(
        {
            name: xr.DataArray(
                np.where(ok, value.astype(np.float64), np.nan),
                dims=("beta", "member"),
                coords=coords,
                attrs={"description": DESCRIPTIONS[name]},
            )
            for name, value in values.items()
        }
    )


def orthonormal_threshold(centres) -> float:
    """sqrt(k) where the caps' `centres` are k orthonormal directions (below that beta_c
    the direction of the source's mean is a maximum of the source's potential); NaN
    for any other centres, or none."""
    if centres is None:
        return float("nan")
    c = np.asarray(centres, np.float64)
    if c.ndim != 2 or c.shape[0] > c.shape[1]:
        return float("nan")
    c = _unit(c)
    return float(np.sqrt(c.shape[0])) if np.allclose(c @ c.T, np.eye(c.shape[0]), atol=1e-6) else float("nan")


class CrossAttention(Experiment):
    title = "Cross-attention: target tokens choosing among the source's clusters, the phase diagram over (beta, beta_c)"
    paper = (
        "A mathematical perspective on Transformers (the sphere model), extended to cross-attention to a fixed "
        "source (docs/model.md section 15)"
    )
    coordinates = {
        "cross_beta": ("inverse temperature beta_c of the cross-attention", "1"),
        "case": ("a cell (beta, beta_c) of the grid drawn on the sphere", None),
        "case_beta": ("inverse temperature beta of the target's self-attention in the drawn cell", "1"),
        "case_cross_beta": ("inverse temperature beta_c of the cross-attention in the drawn cell", "1"),
    }
    Options = Options

    def _betas(self) -> list[float]:
        beta = self.cfg.beta
        return [float(b) for b in beta] if isinstance(beta, list) else [float(beta)]

    def check(self) -> None:
        cfg, options = self.cfg, self.options
        if not cfg.cross.enabled:
            raise ConfigError("experiment cross_attention is a study of cross-attention: keep cross.enabled=true.")
        if cfg.cross.beta is not None:
            raise ConfigError(
                f"experiment cross_attention sets cross.beta in each panel from experiment.options.cross_betas: "
                f"leave cross.beta null, got {cfg.cross.beta!r}."
            )
        missing = [name for name in ("source_capture", "nearest_source") if name not in cfg.metrics]
        if missing:
            raise ConfigError(f"experiment cross_attention reads {' and '.join(missing)}: add it to metrics.")
        if not cfg.save_states:
            raise ConfigError(
                "experiment cross_attention reads the tokens at t1 and the source: keep save_states=true."
            )
        if cfg.d != 3:
            raise ConfigError(f"experiment cross_attention draws the tokens on S^2: d must be 3, got {cfg.d}.")
        grid = list(options.cross_betas)
        if not grid or not all(finite_number(b) and b > 0 for b in grid) or grid != sorted(grid):
            raise ConfigError(
                f"experiment.options.cross_betas must be a non-empty increasing list of positive numbers, got {grid!r}."
            )
        if not 1 <= len(options.cases) <= 6:
            raise ConfigError(
                f"experiment.options.cases must hold 1 to 6 cells [beta, beta_c] to draw, got {len(options.cases)}."
            )
        betas = self._betas()
        for case in options.cases:
            if len(case) != 2 or not any(np.isclose(case[0], betas)) or not any(np.isclose(case[1], grid)):
                raise ConfigError(
                    f"experiment.options.cases must hold pairs [beta, beta_c] of the grid (beta from {betas}, "
                    f"beta_c from experiment.options.cross_betas), got {list(case)!r}."
                )
        check_member_option(options, cfg.members)

    def panels(self, base: dict) -> dict[str, dict]:
        """One study per beta_c, over the config's betas."""
        configs = {}
        for cross_beta in self.options.cross_betas:
            config = copy.deepcopy(base)
            config["cross"]["beta"] = float(cross_beta)
            configs[_label(float(cross_beta))] = config
        return configs

    def analyse(self, results: dict[str, xr.Dataset], *, on_piece: Counter, keep: Keeper) -> xr.Dataset:
        cfg, options = self.cfg, self.options
        grid = [float(b) for b in options.cross_betas]
        m = int(cfg.cross.m)
        out = xr.concat(
            [member_statistics(results[_label(b)], m) for b in grid], dim="cross_beta", coords="minimal"
        ).assign_coords(cross_beta=grid)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a cell whose members all failed: NaN
            for name in DESCRIPTIONS:
                out[f"{name}_mean"] = (
                    out[name].mean("member").assign_attrs(description=f"{DESCRIPTIONS[name]}; the mean over members")
                )
        out["failed_members"] = (
            out["largest_share"]
            .isnull()
            .sum("member")
            .assign_attrs(description="members whose solve failed (NaN in their statistics, left out of the means)")
        )
        out["mean_direction_threshold"] = xr.DataArray(
            orthonormal_threshold(getattr(cfg.cross.init, "centres", None) if cfg.cross.init.kind == "caps" else None),
            attrs={
                "description": "beta_c below which the direction of the source's mean is a maximum of its potential "
                "(sqrt(k) for k orthonormal cap centres; NaN for other sources)"
            },
        )
        return out.merge(self._cases(results))

    def _cases(self, results: dict[str, xr.Dataset]) -> xr.Dataset:
        """The drawn member of each case: its target tokens at t = 0 and t1, their source
        clusters, and the source tokens."""
        member = int(self.options.member)
        parts = {"x0": [], "x1": [], "label0": [], "label1": [], "source": []}
        names, betas, cross_betas = [], [], []
        for beta, cross_beta in self.options.cases:
            cross_beta = next(float(b) for b in self.options.cross_betas if np.isclose(b, cross_beta))
            ds = results[_label(cross_beta)]
            if "beta" not in ds.dims:
                ds = ds.expand_dims(beta=[float(ds["beta"])])
            one = ds.isel(beta=int(np.argmin(np.abs(ds["beta"].values - beta))), member=member)
            parts["x0"].append(one["x"].isel(time=0).transpose("token", "dim").values)
            parts["x1"].append(one["x"].isel(time=-1).transpose("token", "dim").values)
            parts["label0"].append(one["nearest_source"].isel(time=0).values)
            parts["label1"].append(one["nearest_source"].isel(time=-1).values)
            parts["source"].append(one["source_x"].transpose("source_token", "dim").values)
            names.append(f"beta={float(one['beta']):g},beta_c={cross_beta:g}")
            betas.append(float(one["beta"]))
            cross_betas.append(cross_beta)
        what = f"of member {member} of the drawn cell"
        return xr.Dataset(
            {
                "case_x0": (
                    ("case", "token", "dim"),
                    np.stack(parts["x0"]),
                    {"description": f"target tokens at t = 0 {what}"},
                ),
                "case_x1": (
                    ("case", "token", "dim"),
                    np.stack(parts["x1"]),
                    {"description": f"target tokens at t1 {what}"},
                ),
                "case_cluster0": (
                    ("case", "token"),
                    np.stack(parts["label0"]).astype(np.int32),
                    {"description": f"source cluster nearest each target token at t = 0 {what}"},
                ),
                "case_cluster1": (
                    ("case", "token"),
                    np.stack(parts["label1"]).astype(np.int32),
                    {"description": f"source cluster nearest each target token at t1 {what}"},
                ),
                "case_source": (
                    ("case", "source_token", "dim"),
                    np.stack(parts["source"]),
                    {"description": f"source tokens {what}"},
                ),
            },
            coords={"case": names, "case_beta": ("case", betas), "case_cross_beta": ("case", cross_betas)},
        )

    @staticmethod
    def draw(ds: xr.Dataset) -> dict[str, Figure]:
        cfg = config_of(ds)
        cases = ds.sizes["case"]
        columns = math.lcm(cases, len(HEATMAPS))
        fig = figure(figsize=(13.5, 8.0), layout="constrained")
        grid = fig.add_gridspec(2, columns, height_ratios=(0.9, 1.0))
        letters = "abcdef"
        width = columns // cases
        for k in range(cases):
            ax = fig.add_subplot(grid[0, k * width : (k + 1) * width], projection="3d")
            _draw_case(ax, ds.isel(case=k), letters[k], float(cfg["cluster_eps"]))
        width = columns // len(HEATMAPS)
        for j, (name, title, low) in enumerate(HEATMAPS):
            ax = fig.add_subplot(grid[1, j * width : (j + 1) * width])
            _draw_heatmap(ax, fig, ds, name, title, low, letters[:cases])
        threshold = float(ds["mean_direction_threshold"])
        cross = cfg["cross"]
        init = cross["init"]
        where = (
            f"{init['k']} caps of radius {init['radius']:g} around the orthonormal directions"
            if np.isfinite(threshold)
            else f"{init.get('kind')} initial condition"
        )
        caption(
            fig,
            (
                f"Top: member {int(cfg['experiment']['options']['member'])} of the cells drawn: the n = {cfg['n']} "
                "target tokens at t = 0 (small, hollow) and at t1 (large), coloured by the source cluster nearest "
                "them at t1, and the source tokens (black crosses). Bottom: means over "
                f"{ds.sizes['member']} members of the order parameter (the fraction of target tokens at the most "
                f"chosen source cluster at t1), of the fraction captured (within $1 - \\cos < {cfg['cluster_eps']:g}$ "
                "of a source token) and of the fraction whose source cluster at t1 is the one nearest them at t = 0. "
                f"Target: uniform on $S^2$, softmax self-attention at $\\beta$, Q = K = V = I; source: m = "
                f"{cross['m']} tokens, {where}, held fixed; cross-attention at $\\beta_c$, Q = K = V = I. "
                f"{cfg['solver']} with dt = {cfg['dt']} to t1 = {cfg['t1']:g} in {cfg['dtype']}."
                + (
                    f" Dashed: $\\beta_c = \\sqrt{{{init['k']}}}$, below which every target token ends at the "
                    "direction of the source's mean."
                    if np.isfinite(threshold)
                    else ""
                )
            ),
            width=190,
        )
        return {"cross_attention": fig}


# The heatmaps of the diagram: variable, title, lowest value of the colour scale.
HEATMAPS = (
    ("largest_share_mean", "order parameter: share of the most chosen source cluster", None),
    ("final_capture_mean", "fraction captured by a source cluster", 0.0),
    ("start_agreement_mean", "fraction at the source cluster nearest at t = 0", 0.0),
)


def _edges(values: np.ndarray) -> np.ndarray:
    """Cell edges around log-spaced centres (geometric midpoints, the ends mirrored)."""
    logs = np.log10(values)
    if logs.size == 1:
        return 10 ** np.array([logs[0] - 0.5, logs[0] + 0.5])
    middle = (logs[1:] + logs[:-1]) / 2
    return 10 ** np.concatenate([[2 * logs[0] - middle[0]], middle, [2 * logs[-1] - middle[-1]]])


def _draw_heatmap(ax, fig, ds: xr.Dataset, name: str, title: str, low: float | None, letters: str) -> None:
    beta, cross_beta = ds["beta"].values, ds["cross_beta"].values
    values = ds[name].transpose("cross_beta", "beta").values
    if low is None:  # the order parameter: from the smallest share a split can give to 1
        low = float(np.nanmin(ds["initial_largest_share_mean"].values))
    image = ax.pcolormesh(_edges(beta), _edges(cross_beta), values, vmin=low, vmax=1.0, cmap="viridis", rasterized=True)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.grid(False)
    ax.set_xlabel(r"$\beta$ (target's self-attention)")
    ax.set_ylabel(r"$\beta_c$ (cross-attention)")
    ax.set_title(title, fontsize=9)
    threshold = float(ds["mean_direction_threshold"])
    if np.isfinite(threshold):
        ax.axhline(threshold, color="w", linestyle="--", linewidth=1.0)
    for k, letter in enumerate(letters):
        x, y = float(ds["case_beta"][k]), float(ds["case_cross_beta"][k])
        ax.scatter(x, y, s=60, facecolor="none", edgecolor="w", linewidth=1.2)
        ax.annotate(f"({letter})", (x, y), textcoords="offset points", xytext=(6, 4), color="w", fontsize=8)
    fig.colorbar(image, ax=ax, shrink=0.9, pad=0.01)


def _draw_case(ax, case: xr.Dataset, letter: str, eps: float) -> None:
    wireframe_sphere(ax, zoom=1.45, unit_limits=True)
    ax.computed_zorder = False  # the tokens at t1 drawn over the source they reach
    source = case["case_source"].values
    centre = source.mean(0)
    if np.linalg.norm(centre) > 0.1:  # looking at the source's side of the sphere
        u = centre / np.linalg.norm(centre)
        ax.view_init(elev=float(np.degrees(np.arcsin(u[2]))), azim=float(np.degrees(np.arctan2(u[1], u[0]))))
    cmap = colormap("tab10")
    x0, x1 = case["case_x0"].values, case["case_x1"].values
    chosen = case["case_cluster1"].values
    order = {c: i for i, c in enumerate(sorted(set(chosen.tolist()) | set(case["case_cluster0"].values.tolist())))}
    colours = [cmap(order[c] % 10) for c in chosen]
    ax.scatter(*source.T, s=70, c="k", marker="x", linewidths=1.0, depthshade=False, zorder=1)
    ax.scatter(*x0.T, s=14, facecolors="none", edgecolors=colours, linewidths=0.8, depthshade=False, zorder=2)
    ax.scatter(*x1.T, s=40, c=colours, edgecolors="k", linewidths=0.4, depthshade=False, zorder=3)
    share = np.bincount(chosen).max() / chosen.size
    captured = np.mean(np.max(_unit(x1) @ _unit(source).T, axis=1) > 1 - eps)
    ax.set_title(
        f"({letter}) $\\beta$ = {float(case['case_beta']):g}, $\\beta_c$ = {float(case['case_cross_beta']):g}\n"
        f"largest share {share:.2f}, captured {captured:.2f}",
        fontsize=9,
    )
