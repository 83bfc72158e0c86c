"""Softmax at growing beta, its hardmax limit, and doubly stochastic (Sinkhorn) attention.

The same random initial tokens on the circle (the same seed: every panel draws the same
members) follow Q = K = V = I attention four ways: softmax at each beta of the config,
Sinkhorn attention at the same betas (`attention_kind: sinkhorn`, Sinkformers), hardmax
(`attention_kind: hardmax`, the beta -> infinity limit) and hardmax without self-attention.
`analyse` counts the clusters at t1 and histograms the cosines of all pairs i < j at t1.

With Q = K = I on the sphere every token is its own maximiser ($\\langle x_i, x_i\\rangle =
1$), so hardmax with self-attention is the frozen limit: the tangent field vanishes and
no token moves (the cluster count stays that of t = 0). Softmax at large beta weighs
every other token by $e^{-\\beta(1 - \\cos)}$ against itself and freezes more and more.
Without self-attention each token moves toward its nearest neighbour(s).

The second part draws the dominance cells of "Attention's forward pass and Frank-Wolfe"
(Alcalde, Geshkovski, Ruiz-Balet 2025, arXiv 2508.09628) for random k-gons: k vertices
uniform on the unit circle, interior tokens random convex combinations of them,
hardmax dynamics with Q = K = V = I in the plane (no normalisation). The hardmax step
toward $\\arg\\max_j \\langle x, x_j\\rangle$ is Frank-Wolfe's linear oracle on the convex hull of
the tokens; with the vertices on the unit circle the cell of a vertex v, the points
whose maximiser is v, is v's Voronoi cell among the vertices, every vertex is its own
maximiser (stationary), and an interior token runs straight to the vertex of its cell:
$y(t) = v + (y(0) - v) e^{-t}$. (The attention flow $\\dot x_i = \\sum_j a_{ij} x_j$ in the
plane grows like $e^t$; its rescaling $y = e^{-t} x$ follows $\\dot y_i = \\sum_j a_{ij} y_j - y_i$,
the continuous Frank-Wolfe flow, with the same maximisers, and is what is drawn.)
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..schema._errors import ConfigError
from ..schema._schema import setting
from ._common import caption, colormap, config_of, figure
from ._experiment import Counter, Experiment, Keeper
from ._lazy import lazy

if TYPE_CHECKING:
    import jax
    import jax.numpy as jnp
    import xarray as xr
    from matplotlib.figure import Figure

    from ..numerics import _field, _schedules, _simulate, _terms
else:
    jax = lazy("jax")
    jnp = lazy("jax.numpy")
    xr = lazy("xarray")
    _field = lazy("attnflow.numerics._field")
    _schedules = lazy("attnflow.numerics._schedules")
    _simulate = lazy("attnflow.numerics._simulate")
    _terms = lazy("attnflow.numerics._terms")


@dataclass
class Options:
    bins: int = setting(40, "pair-cosine histogram bins over [-1, 1]")
    polygons: int = setting(6, "random k-gons drawn")
    sides: int = setting(5, "k, the vertices of each k-gon")
    interior: int = setting(24, "interior tokens of each k-gon")
    kgon_t1: float = setting(8.0, "end time of the k-gon runs (rk4, dt = 0.05): a whole number of steps")


KGON_DT = 0.05  # the step of the k-gon runs


def _pair_cosines(x: np.ndarray) -> np.ndarray:
    """Cosines of the pairs i < j of every member's tokens x (member, n, d): (member, pairs)."""
    n = x.shape[-2]
    upper = np.triu_indices(n, 1)
    u = x / np.linalg.norm(x, axis=-1, keepdims=True)
    return np.clip(np.einsum("mid,mjd->mij", u, u)[:, upper[0], upper[1]], -1, 1)


def kgon_runs(seed: int, polygons: int, sides: int, interior: int, t1: float, saves: int = 41):
    """Hardmax flows (Q = K = V = I, self-attention, the plane) of random k-gons: vertices
    uniform on the unit circle, interior tokens Dirichlet(1) combinations of them.
    Returns the vertices (polygon, k, 2), the states (polygon, time, k + interior, 2) and
    the times."""
    rng = np.random.default_rng(seed)
    angles = np.sort(rng.uniform(0, 2 * np.pi, (polygons, sides)), axis=1)
    vertices = np.stack([np.cos(angles), np.sin(angles)], -1)
    weights = rng.dirichlet(np.ones(sides), (polygons, interior))
    x0 = np.concatenate([vertices, np.einsum("pik,pkd->pid", weights, vertices)], axis=1)
    eye = _schedules.Identity(1, 2, "float64")
    term = _terms.SelfAttention(eye, eye, eye, None, jnp.asarray(1.0), None, heads=1, kind="hardmax")
    field = _field.VectorField((term,), scheme="none")
    dt = KGON_DT
    steps = int(round(t1 / dt))
    every = max(steps // (saves - 1), 1)
    run = jax.jit(
        jax.vmap(
            lambda y: _simulate.simulate(
                field, y, t1=steps * dt, dt=dt, solver="rk4", save_every=every, record=lambda t, x, f: {"x": x}
            )
        )
    )
    sol = run(jnp.asarray(x0))
    return vertices, np.asarray(sol.stats["x"]), np.asarray(sol.ts[0])


def _kgon_results(out: xr.Dataset, vertices: np.ndarray, states: np.ndarray, times: np.ndarray) -> xr.Dataset:
    # The attention flow dx/dt = a(X) X in the plane grows like e^t; e^{-t} x(t) follows the
    # Frank-Wolfe flow dy/dt = a(Y) Y - y (the argmax is unchanged by a common positive scale).
    states = states * np.exp(-times)[None, :, None, None]
    k = vertices.shape[1]
    inner0 = states[:, 0, k:]
    cell = np.argmax(np.einsum("pid,pkd->pik", inner0, vertices), axis=-1)  # the vertex of each token's cell
    target = np.take_along_axis(vertices, cell[..., None], axis=1)  # (polygon, interior, 2)
    predicted = target[:, None] + (inner0 - target)[:, None] * np.exp(-times)[None, :, None, None]
    out = out.assign_coords(grid=times)
    out["kgon_vertices"] = xr.DataArray(
        vertices,
        dims=("polygon", "vertex", "dim"),
        attrs={"description": "vertices of each random k-gon, uniform on the unit circle"},
    )
    out["kgon_x"] = xr.DataArray(
        states,
        dims=("polygon", "grid", "token", "dim"),
        attrs={"description": "e^{-t} x(t) of the hardmax flow of each k-gon in the plane (the vertices first)"},
    )
    out["kgon_cell"] = xr.DataArray(
        cell.astype(np.int32),
        dims=("polygon", "interior"),
        attrs={"description": "the vertex whose dominance cell holds each interior token at t = 0"},
    )
    out["kgon_vertex_motion"] = xr.DataArray(
        float(np.max(np.abs(states[:, :, :k] - vertices[:, None]))),
        attrs={"description": "largest distance a vertex moved (0: vertices are stationary)"},
    )
    out["kgon_line_error"] = xr.DataArray(
        float(np.max(np.abs(states[:, :, k:] - predicted))),
        attrs={
            "description": "largest distance between an interior token and v + (x(0) - v) exp(-t), v its cell's vertex"
        },
    )
    return out


class HardmaxSinkhorn(Experiment):
    title = "Softmax at growing beta, hardmax and Sinkhorn attention; the Frank-Wolfe cells of random k-gons"
    paper = "Sinkformers (Sander et al. 2022); Attention's forward pass and Frank-Wolfe (Alcalde et al. 2025)"
    Options = Options
    coordinates = {
        "case": ("the dynamics: softmax or sinkhorn at one beta, hardmax, or hardmax without self-attention", None),
        "cosine": ("centre of a pair-cosine histogram bin", "1"),
        "polygon": ("random k-gon (index)", "1"),
        "vertex": ("vertex of a k-gon (counter-clockwise)", "1"),
        "token": ("token of a k-gon's run: the vertices first, then the interior tokens", "1"),
        "dim": ("coordinate of the plane", "1"),
        "grid": ("time of the k-gon runs", "1"),
    }

    def check(self) -> None:
        cfg, options = self.cfg, self.options
        if cfg.attention_kind != "sa":
            raise ConfigError(
                f"experiment hardmax_sinkhorn sets the dynamics of each panel itself: leave attention_kind=sa, "
                f"got {cfg.attention_kind}."
            )
        if cfg.scheme != "sphere" or not cfg.save_states:
            raise ConfigError(
                "experiment hardmax_sinkhorn needs scheme=sphere and save_states=true (the pair cosines at t1)."
            )
        for key, value, low in (
            ("bins", options.bins, 2),
            ("polygons", options.polygons, 1),
            ("sides", options.sides, 3),
            ("interior", options.interior, 1),
        ):
            if not value >= low:
                raise ConfigError(f"experiment.options.{key} must be at least {low}, got {value!r}.")
        # The k-gon runs take round(kgon_t1 / KGON_DT) steps: another time would end them elsewhere (below half a
        # step: at t = 0) without a word.
        steps = options.kgon_t1 / KGON_DT
        if not (steps >= 1 - 1e-6 and abs(steps - round(steps)) <= 1e-6 * round(steps)):
            raise ConfigError(
                f"experiment.options.kgon_t1 must be a positive multiple of the k-gon runs' step "
                f"{KGON_DT:g}, got {options.kgon_t1!r}."
            )

    def panels(self, base: dict) -> dict[str, dict]:
        """Softmax at the config's betas, Sinkhorn at the same betas (with its column error
        recorded), hardmax with and without self-attention (beta does not enter: one run)."""
        # The sinkhorn and hardmax keys go to their own panels only (elsewhere they take
        # their defaults: a changed value is refused where it does not apply).
        softmax = {key: value for key, value in base.items() if key not in ("sinkhorn", "hardmax")}
        sinkhorn = copy.deepcopy(softmax)
        sinkhorn.update(
            attention_kind="sinkhorn",
            sinkhorn=copy.deepcopy(base["sinkhorn"]),
            metrics=list(base["metrics"]) + ["marginal_error"],
        )
        out = {"softmax": softmax, "sinkhorn": sinkhorn}
        for label, own in (("hardmax", True), ("hardmax_no_self", False)):
            hard = copy.deepcopy(softmax)
            hard.update(attention_kind="hardmax", beta=1.0, hardmax={**base["hardmax"], "self_attention": own})
            out[label] = hard
        return out

    def analyse(self, results: dict[str, xr.Dataset], *, on_piece: Counter, keep: Keeper) -> xr.Dataset:
        cfg, options = self.cfg, self.options
        edges = np.linspace(-1, 1, options.bins + 1)
        cases, finals, initials, histograms, columns = [], [], [], [], []
        first = {}
        for label, ds in results.items():
            if "beta" not in ds.dims:
                ds = ds.expand_dims(beta=[float(ds["beta"])])
            for b, beta in enumerate(ds["beta"].values):
                part = ds.isel(beta=b)
                name = label if label.startswith("hardmax") else f"{label} beta={beta:g}"
                x = part["x"].transpose("member", "time", ...).values
                first[name] = x[:, 0]
                cases.append(name)
                finals.append(part["clusters"].isel(time=-1).values)
                initials.append(part["clusters"].isel(time=0).values)
                cos = _pair_cosines(x[:, -1])
                histograms.append(np.histogram(cos.ravel(), edges)[0] / cos.size)
                columns.append(float(part["marginal_error"].max()) if "marginal_error" in part else np.nan)
        x0 = list(first.values())
        spread = max(float(np.max(np.abs(x - x0[0]))) for x in x0)
        out = xr.Dataset(
            coords={
                "case": cases,
                "member": results["softmax"]["member"].values,
                "cosine": (edges[1:] + edges[:-1]) / 2,
            }
        )
        out["final_clusters"] = xr.DataArray(
            np.stack(finals).astype(np.int32),
            dims=("case", "member"),
            attrs={"description": f"clusters (cos > 1 - {cfg.cluster_eps:g}) of every member at t = {cfg.t1:g}"},
        )
        out["initial_clusters"] = xr.DataArray(
            np.stack(initials).astype(np.int32),
            dims=("case", "member"),
            attrs={"description": "clusters of every member at t = t0"},
        )
        out["pair_cosine_histogram"] = xr.DataArray(
            np.stack(histograms),
            dims=("case", "cosine"),
            attrs={
                "description": f"fraction of the pairs i < j of all members whose cosine at t = {cfg.t1:g} falls in "
                "the bin"
            },
        )
        out["sinkhorn_marginal_error"] = xr.DataArray(
            np.asarray(columns),
            dims="case",
            attrs={
                "description": "largest column-sum error max_j |sum_i a_ij - 1| over the members and saved times "
                "(sinkhorn only, NaN otherwise)"
            },
        )
        out["initial_token_spread"] = xr.DataArray(
            spread,
            attrs={
                "description": "largest difference between the initial tokens of any two cases (0: the same tokens)"
            },
        )
        vertices, states, times = kgon_runs(
            cfg.seed, options.polygons, options.sides, options.interior, options.kgon_t1
        )
        out = _kgon_results(out, vertices, states, times)
        return out

    @staticmethod
    def draw(ds: xr.Dataset) -> dict[str, Figure]:
        cfg = config_of(ds)
        cases = [str(c) for c in ds["case"].values]
        fig = figure(figsize=(13, 8.2), layout="constrained")
        grid = fig.add_gridspec(2, 6)
        ax = fig.add_subplot(grid[0, :2])
        counts = ds["final_clusters"].values
        colours = [_colour(c, cases) for c in cases]
        parts = ax.violinplot([row for row in counts], positions=range(len(cases)), showmedians=True, widths=0.8)
        for body, colour in zip(parts["bodies"], colours):  # pyright: ignore[reportArgumentType]  # "bodies" is a list of PolyCollections
            body.set_color(colour)
        ax.set_xticks(range(len(cases)))
        ax.set_xticklabels(
            [c.replace(" beta=", "\n" r"$\beta$=").replace("_no_self", "\n" r"$j \neq i$") for c in cases], fontsize=6
        )
        ax.set_yscale("log")
        ax.set_ylabel(f"clusters at t = {cfg['t1']:g}")
        ax.set_title(f"cluster count over {ds.sizes['member']} members")
        ax = fig.add_subplot(grid[0, 2:])
        centres = ds["cosine"].values
        for c, colour in zip(cases, colours):
            ax.step(
                centres,
                ds["pair_cosine_histogram"].sel(case=c).values,
                where="mid",
                color=colour,
                linestyle="--" if c.startswith("sinkhorn") else "-",
                label=c,
            )
        ax.set_yscale("log")
        ax.set_xlabel(r"$\cos(x_i, x_j)$ at $t_1$, pairs $i < j$")
        ax.set_ylabel("fraction of pairs")
        ax.set_title("pair cosines (softmax solid, Sinkhorn dashed)")
        ax.legend(fontsize=6, ncol=2)
        polygons = min(ds.sizes["polygon"], 6)
        for p in range(polygons):
            _draw_cells(fig.add_subplot(grid[1, p]), ds, p)
        sink = ds["sinkhorn_marginal_error"].values
        caption(
            fig,
            (
                f"Top: Q = K = V = I on the circle, n = {cfg['n']}, the same {ds.sizes['member']} initial token sets "
                f"under softmax and Sinkhorn attention ({cfg['sinkhorn']['iterations']} iterations; column-sum error "
                f"at most {np.nanmax(sink):.1e}) at each beta, and hardmax with and without self-attention, "
                f"{cfg['solver']} dt = {cfg['dt']} to t = {cfg['t1']:g}. Hardmax with self-attention is frozen (every "
                f"token its own maximiser). Bottom: dominance cells of random {ds.sizes['vertex']}-gons (vertices on "
                "the unit circle) and the hardmax flow of interior tokens in the plane, rescaled (y = exp(-t) x, the "
                "Frank-Wolfe flow): each runs straight to the vertex v of its cell, y(t) = v + (y(0) - v) exp(-t) to "
                f"{float(ds['kgon_line_error']):.0e}; the vertices move by {float(ds['kgon_vertex_motion']):.0e}."
            ),
            width=190,
        )
        return {"hardmax_sinkhorn": fig}


def _colour(case: str, cases: list[str]):
    family = [c for c in cases if c.split(" ")[0] == case.split(" ")[0]]
    if case.startswith("hardmax"):
        return "k" if case == "hardmax" else "0.5"
    cmap = colormap("Blues" if case.startswith("softmax") else "Oranges")
    return cmap(0.35 + 0.6 * family.index(case) / max(len(family) - 1, 1))


def _draw_cells(ax, ds: xr.Dataset, p: int) -> None:
    vertices = ds["kgon_vertices"].isel(polygon=p).values
    k = vertices.shape[0]
    side = np.linspace(-1.1, 1.1, 300)
    gx, gy = np.meshgrid(side, side)
    owner = np.argmax(np.stack([gx, gy], -1) @ vertices.T, axis=-1)
    cmap = colormap("tab10")
    ax.imshow(
        owner,
        extent=(-1.1, 1.1, -1.1, 1.1),
        origin="lower",
        cmap=cmap,
        vmin=0,
        vmax=9,
        alpha=0.25,
        interpolation="nearest",
    )
    closed = np.vstack([vertices, vertices[:1]])
    ax.plot(closed[:, 0], closed[:, 1], color="0.3", linewidth=0.8)
    x = ds["kgon_x"].isel(polygon=p).values  # (time, token, 2)
    cells = ds["kgon_cell"].isel(polygon=p).values
    for i in range(k, x.shape[1]):
        colour = cmap(cells[i - k] % 10)
        ax.plot(x[:, i, 0], x[:, i, 1], color=colour, linewidth=0.7)
        ax.scatter(x[0, i, 0], x[0, i, 1], s=6, color=colour)
    ax.scatter(vertices[:, 0], vertices[:, 1], s=18, color="k", zorder=3)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(f"{k}-gon {p + 1}", fontsize=8)
