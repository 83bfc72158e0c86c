"""Polynomial weight magnitudes: weights that keep growing do not let tokens cluster.

"Neural ODE Transformers" (app. C.8, fig. 14) runs one head of attention without token
normalization, written there without a normaliser,
$\\dot x_i = \\sum_j \\exp(\\langle Q(t) x_i, K(t) x_j\\rangle/\\sqrt d)\\, V(t) x_j$,
with $Q(t) = K(t) = A_0 f(t)$ and $V(t) = V_0 f(t)$ ($A_0$, $V_0$ with standard Gaussian
entries), $T = 20$, 200 steps of $dt = 0.1$, $n = 40$ tokens uniform in
$[-2, 2]^3$, and six magnitudes

$f_0 = \\tfrac12$, $f_k = \\tfrac12 (t/T)^k$ ($k = 1, \\dots, 4$), $f_5 = \\tfrac12 (1 - t/T)^2$,

to mimic its trained model, whose weight spectra grow towards the last layers.

Option `normalizer` picks the attention: `none` is the equation as written (attnflow's
unnormalized attention, which divides by n, with V multiplied by n), `softmax` divides
each row by its sum instead. The figure uses softmax, because the equation as written
leaves the floating-point numbers at these sizes: its n = 40 terms add up and its logits
grow like $|x|^2$. Over 64 members the first non-finite state comes at t = 0.2-0.4 under
f_0 and f_5 in every member, and under f_1 ... f_4 in 95-97% of them (median t = 3.5,
7.2, 10.0, 12.0), so nothing is left at T = 20 to compare. attnflow then stops with one
sentence naming the panel.

The paper reports that a constant magnitude gives clusters, that magnitudes growing
faster than linearly do not, and that the output is more dispersed the higher the order
k. Each magnitude is one panel, the core's polynomial factor `weights.*.poly` holding its
coefficients ($f(t) = \\sum_k c_k t^k$, padded to five so that all panels share one
compiled program).

Two measures are computed per member from the saved states, each divided by its value
at t = 0:

- `dispersion`: the mean distance of a token to its nearest neighbour over the mean
  distance between two tokens. It does not change when the configuration is scaled,
  moved or rotated; it falls towards 0 as the tokens gather into tight clusters and
  stays near 1 while they stay as scattered as at the start;
- `spread`: the mean distance of a token to the centroid, the size of the configuration.

What the simulation shows (and the tests assert): the dispersion at T increases with
the order k = 1, ..., 4 (geometric mean over members) and the constant magnitude f_0
clusters far more than any growing one, as the paper says. The spread (geometric mean
over members), on the other hand, decreases with k: a higher order integrates to a
smaller total magnitude $\\int_0^T f_k = T/(2(k+1))$, so the tokens move less, both
together and apart. "More dispersed" therefore means less clustered relative to the
configuration's size, not larger. The drawn member (option `member`, by default the one
whose final dispersions are closest to the geometric means) is kept with its paths.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..schema._config import choice, to_container
from ..schema._errors import ConfigError
from ..schema._schema import setting
from ._common import caption, check_drawn_member, colormap, config_of, figure, member_summary
from ._experiment import Counter, Experiment, Keeper
from ._lazy import lazy
from ._magnitudes import SCHEDULES, coefficients, dispersion_index

if TYPE_CHECKING:
    import xarray as xr
    from matplotlib.figure import Figure
    from mpl_toolkits.mplot3d import art3d
else:
    xr = lazy("xarray")
    art3d = lazy("mpl_toolkits.mplot3d.art3d")

NORMALIZERS = ("softmax", "none")
Normalizer = choice("Normalizer", NORMALIZERS)


@dataclass
class Options:
    member: int | None = setting(
        None, "the member drawn (null: the one whose final dispersions are closest to the means)"
    )
    normalizer: Normalizer = setting(  # pyright: ignore[reportInvalidTypeForm]  # a Choice made at run time
        Normalizer.softmax,  # pyright: ignore[reportAttributeAccessIssue]  # a Choice's members are made at run time
        "softmax | none: the paper's equation as written, sum_j exp(logit) V x_j (it diverges at these sizes: see "
        "attnflow/experiments/polynomial.py)",
    )


def spread(x: np.ndarray) -> np.ndarray:
    """Mean distance of the tokens `x` (..., n, d) to their centroid."""
    return np.asarray(np.linalg.norm(x - x.mean(-2, keepdims=True), axis=-1).mean(-1))


def _geometric_mean(values: np.ndarray, axis: int) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.exp(np.nanmean(np.log(values), axis=axis))


def options_of(cfg: dict) -> dict:
    """The experiment's options of a stored config, with the defaults of keys it lacks."""
    return {**to_container(Options()), **cfg["experiment"]["options"]}


def _shape(x: np.ndarray) -> np.ndarray:
    """Tokens x (..., n, d) centred on their centroid and divided by their spread: the
    configuration's shape, which is what the dispersion measures."""
    centred = x - x.mean(-2, keepdims=True)
    return centred / spread(x)[..., None, None]


def _configuration(ax, x: np.ndarray, cmap) -> None:
    """Paths (thin) and end points (dots) of the shape of the tokens x (time, token, 3)."""

    y = _shape(x)
    colors = cmap(np.argsort(np.argsort(x[0, :, 0])) / max(x.shape[1] - 1, 1))  # by initial first coordinate
    # One collection for all paths and one scatter for all end points: far faster to render.
    ax.add_collection3d(art3d.Line3DCollection(np.swapaxes(y, 0, 1), colors=colors, linewidths=0.4, alpha=0.35))
    ax.scatter(*y[-1].T, c=colors, s=12, depthshade=False, edgecolor="k", linewidth=0.2)
    limit = float(np.abs(y).max())
    for set_lim in (ax.set_xlim, ax.set_ylim, ax.set_zlim):
        set_lim(-limit, limit)
    ax.set_box_aspect((1, 1, 1))
    ax.tick_params(labelsize=6, pad=0)


class Polynomial(Experiment):
    title = "Polynomial weight magnitudes: growing weights keep tokens dispersed"
    paper = "Neural ODE Transformers, app. C.8, fig. 14"
    Options = Options
    coordinates = {
        "schedule": ("weight magnitude schedule: f0 to f5", None),
        "formula": ("the schedule f(t) of the weight magnitude", None),
    }

    def check(self) -> None:
        check_drawn_member("polynomial", self.cfg, self.options, "measures the dispersion on the states", optional=True)
        if self.cfg.attention_kind != "sa":
            raise ConfigError(
                f"experiment polynomial sets the attention itself from experiment.options.normalizer; "
                f"keep attention_kind=sa, got attention_kind={self.cfg.attention_kind.value}."
            )
        if self.cfg.t0 != 0:
            raise ConfigError(f"experiment polynomial runs on [0, T] with T = t1; set t0=0, got t0={self.cfg.t0}.")
        for name in "qkv":
            if getattr(self.cfg.weights, name).poly is not None:
                raise ConfigError(
                    f"experiment polynomial sets weights.{name}.poly itself (one schedule per panel); leave it null."
                )

    def panels(self, base: dict) -> dict[str, dict]:
        """One study per magnitude f_0 ... f_5, with the same factor on Q, K and V. With
        normalizer `none` the attention is the paper's sum without a normaliser: attnflow's
        unnormalized attention (exp(logit)/n) with V multiplied by n."""
        configs = {}
        for name in SCHEDULES:
            config = copy.deepcopy(base)
            for matrix in "qkv":
                config["weights"][matrix]["poly"] = coefficients(name, base["t1"])
            if self.options.normalizer == "none":
                config["attention_kind"] = "usa"
                config["weights"]["v"]["scale"] = float(config["weights"]["v"]["scale"]) * base["n"]
            configs[name] = config
        return configs

    def analyse(self, results: dict[str, xr.Dataset], *, on_piece: Counter, keep: Keeper) -> xr.Dataset:
        names = list(results)
        first = results[names[0]]
        t = first["time"].values
        members = first["member"].values
        dispersion, size, paths, failed = [], [], [], []
        for name in names:
            x = results[name]["x"].values  # (member, time, token, dim)
            index = dispersion_index(x)
            dispersion.append(index / index[:, :1])
            radius = spread(x)
            size.append(radius / radius[:, :1])
            paths.append(x)
            failed.append(int((results[name]["status"] != 0).sum()))
        dispersion, size = np.stack(dispersion), np.stack(size)  # (schedule, member, time)
        member = self.options.member
        if member is None:
            # The most typical member: its final dispersions closest, in log, to the geometric means.
            with np.errstate(divide="ignore", invalid="ignore"):
                logs = np.log(dispersion[:, :, -1])
                distance = np.nansum((logs - np.nanmean(logs, axis=1, keepdims=True)) ** 2, axis=0)
            member = int(np.argmin(distance))
        paths = [x[member] for x in paths]
        coords = {"schedule": names, "member": members, "time": t}
        ds = xr.Dataset(coords=coords)
        ds = ds.assign_coords(formula=("schedule", [SCHEDULES[name][0] for name in names]))
        ds["dispersion"] = xr.DataArray(dispersion, dims=("schedule", "member", "time")).assign_attrs(
            description="mean nearest-neighbour distance over mean pairwise distance of the tokens, divided by its "
            "value at t = 0 (1: as scattered as the initial cube; towards 0: tight clusters)"
        )
        ds["spread"] = xr.DataArray(size, dims=("schedule", "member", "time")).assign_attrs(
            description="mean distance of the tokens to their centroid, divided by its value at t = 0"
        )
        for name, values in (("dispersion", dispersion), ("spread", size)):
            ds[f"{name}_gmean"] = xr.DataArray(_geometric_mean(values, 1), dims=("schedule", "time")).assign_attrs(
                description=f"geometric mean over members of {name}"
            )
            summary = member_summary(ds[name])
            for key in ("q10", "median", "q90"):
                ds[f"{name}_{key}"] = summary[f"{name}_{key}"]
        final = ds["dispersion_gmean"].isel(time=-1)
        ds["final_dispersion"] = final.drop_vars("time").assign_attrs(
            description=f"geometric mean over members of the dispersion at T = {t[-1]:g}: the measure per schedule"
        )
        orders = [name for name in ("f1", "f2", "f3", "f4") if name in names]
        ds["dispersion_grows_with_order"] = xr.DataArray(
            int(np.all(np.diff(final.sel(schedule=orders).values) > 0))
        ).assign_attrs(description="1 when the final dispersion increases from f_1 to f_4 (the paper's claim), else 0")
        ds["x_member"] = xr.DataArray(np.stack(paths), dims=("schedule", "time", "token", "dim")).assign_attrs(
            description=f"states x(time, token, dim) of member {member} under each schedule"
        )
        ds["magnitude"] = xr.DataArray(
            np.stack([np.polynomial.polynomial.polyval(t, coefficients(name, self.cfg.t1)) for name in names]),
            dims=("schedule", "time"),
        ).assign_attrs(description="the magnitude f(t) of each schedule")
        ds["drawn_member"] = xr.DataArray(member).assign_attrs(description="the member whose tokens are drawn")
        ds["failed_members"] = xr.DataArray(failed, dims="schedule").assign_attrs(
            description="members whose solve failed, per schedule"
        )
        return ds

    @staticmethod
    def draw(ds: xr.Dataset) -> dict[str, Figure]:
        cfg = config_of(ds)
        member = int(ds["drawn_member"])
        names = list(ds["schedule"].values)
        formulas = {name: str(f) for name, f in zip(names, ds["formula"].values)}
        t = ds["time"].values
        fig = figure(figsize=(13.0, 10.5), layout="constrained")
        rows = -(-len(names) // 3)
        grid = fig.add_gridspec(rows + 1, 3, height_ratios=[1.0] * rows + [0.95])
        cmap = colormap("viridis")
        final = ds["final_dispersion"]
        letters = "abcdefghijkl"
        for k, name in enumerate(names):
            ax = fig.add_subplot(grid[k // 3, k % 3], projection="3d")
            _configuration(ax, ds["x_member"].sel(schedule=name).values, cmap)
            own = float(ds["dispersion"].sel(schedule=name).isel(member=member, time=-1))
            ax.set_title(f"({letters[k]}) f = {formulas[name]}: dispersion {own:.2g}", fontsize=9)
        colors = {name: f"C{k}" for k, name in enumerate(names)}
        ax = fig.add_subplot(grid[rows, 0])
        for name in names:
            ax.plot(t, ds["dispersion_gmean"].sel(schedule=name), color=colors[name], label=f"f = {formulas[name]}")
        ax.set_yscale("log")
        ax.set_xlabel("time t (layer x dt)")
        ax.set_ylabel("dispersion / dispersion at t = 0")
        ax.set_title(f"({letters[len(names)]}) dispersion, geometric mean of {ds.sizes['member']} members")
        ax.legend(loc="lower left", ncol=2)
        ax = fig.add_subplot(grid[rows, 1])
        for name in names:
            ax.plot(t, ds["spread_gmean"].sel(schedule=name), color=colors[name])
        ax.set_yscale("log")
        ax.set_xlabel("time t")
        ax.set_ylabel("spread / spread at t = 0")
        ax.set_title(f"({letters[len(names) + 1]}) spread, geometric mean (colours as in {letters[len(names)]})")
        ax = fig.add_subplot(grid[rows, 2])
        rng = np.random.default_rng(0)
        values = ds["dispersion"].isel(time=-1)
        for k, name in enumerate(names):
            points = values.sel(schedule=name).values
            ax.scatter(
                k + rng.uniform(-0.18, 0.18, points.size), points, s=6, color=colors[name], alpha=0.5, linewidth=0
            )
            ax.scatter(
                k,
                float(final.sel(schedule=name)),
                s=70,
                marker="_",
                color="k",
                linewidth=2,
                label="geometric mean" if k == 0 else None,
            )
        ax.set_xticks(range(len(names)), [formulas[name] for name in names], rotation=30, fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel(f"dispersion at T = {t[-1]:g}")
        ax.set_title(f"({letters[len(names) + 2]}) final dispersion, every member")
        ax.legend(loc="lower right")
        grows = bool(int(ds["dispersion_grows_with_order"]))
        attention = (
            "Softmax attention"
            if options_of(cfg)["normalizer"] == "softmax"
            else "The paper's unnormalized attention $\\sum_j e^{\\mathrm{logit}_{ij}} V x_j$"
        )
        caption(
            fig,
            (
                f"{attention} without token normalization, Q = K = A_0 f(t), V = V_0 f(t), A_0 and V_0 standard "
                f"Gaussian (drawn per member), logits / sqrt(d); n = {cfg['n']}, d = {cfg['d']}, T = {cfg['t1']:g}, "
                f"{cfg['solver']} with dt = {cfg['dt']} ({round(cfg['t1'] / cfg['dt'])} layers), tokens uniform in "
                f"[{cfg['init']['low']:g}, {cfg['init']['high']:g}]^{cfg['d']}; {ds.sizes['member']} members, the same "
                f"weights and tokens under every f. (a-f) member {member}'s tokens (its dispersion at T in the title), "
                "centred on their centroid and divided by their spread at every time (the shape of the configuration, "
                "whose size and place vary by orders of magnitude): paths and end points, coloured by the initial "
                "first coordinate. Dispersion = mean nearest-neighbour distance / mean pairwise distance, relative to "
                f"t = 0 (small: clustered). The final dispersion {'increases' if grows else 'does not increase'} with "
                "the order of (t/T)^k, k = 1..4, and the constant f clusters; the spread instead shrinks with k, since "
                "a higher order integrates to a smaller total weight magnitude."
            ),
            width=170,
        )
        return {"polynomial": fig}
