"""Clusters without normalization: polytopes, hyperplanes, and leaders.

"The emergence of clusters in self-attention dynamics" (Geshkovski, Letrouit,
Polyanskiy, Rigollet, 2023) studies softmax self-attention in $\\mathbb{R}^d$ with fixed
weights and no normalization,
$\\dot x_i = \\sum_j P_{ij}(t)\\, V x_j$, $P_{ij} = \\mathrm{softmax}_j(\\beta\\langle Q x_i, K x_j\\rangle)$.
The tokens grow like $e^{tV}$, so the paper follows the rescaled tokens
$z_i(t) = e^{-tV} x_i(t)$. With $V = I$ they obey
$\\dot z_i = \\sum_j P_{ij} z_j - z_i$ with logits $\\beta e^{2t}\\langle Q z_i, K z_j\\rangle$:
each token moves towards a convex combination of the others, the convex hull of the
$z_i$ shrinks, and since the attention sharpens exponentially each row of $P$ ends on
one "leader", the token $j$ that maximizes $\\langle Q z_i, K z_j\\rangle$. The paper's
results, one panel each:

- `polytope`, $V = I$, $Q^T K \\succ 0$: the $z_i$ converge to points of the boundary of
  a convex polytope, in practice its vertices (the leaders);
- `hyperplanes`, $V$ with a simple, positive top eigenvalue $\\lambda$ (right
  eigenvector $\\varphi$, left eigenvector $\\psi$): the coordinate $\\langle\\psi, z_i\\rangle$
  converges to one of at most three values, so the $z_i$ end on at most three parallel
  hyperplanes $\\{\\langle\\psi, z\\rangle = c\\}$ (two generically: the largest and the smallest
  value, the third is through 0). Here $V$ = [[1, 0.5], [0, 0]] by default, whose second
  eigenvalue 0 leaves the coordinate along the hyperplanes where it started, so the
  picture stays bounded;
- `product`, $V = \\mathrm{diag}(1, 1, -1/2)$, a top eigenvalue with a two-dimensional
  eigenspace $F$: the projection of $z_i$ on $F$ converges to the vertices of a polygon
  in $F$, while nothing is fixed along the third axis, where $z_i$ drifts like $e^{t/2}$:
  the limit set is a polygon times the complementary line ("polytope x hyperplane").

In every panel the attention matrix becomes Boolean (one-hot rows) with as many
distinct columns as leaders, so its rank falls from n to a small k: the paper's
"leaders" (proved there in dimension one; observed here in every panel).

`d = 2` for the two planar results (the polygon and the lines are seen exactly, with
no projection) and `d = 3` for the product, which needs a third axis. Stored: the
rescaled tokens `z_member` of the drawn member of each panel (option `member`; by
default the member with the most distinct limits, the richest picture) and `z_final` of
every member; the speed of their projection on the top eigenspace (`top_speed`, which
the theorems send to 0); the number of distinct limits, whether they are in convex
position, the number of distinct values of the top coordinate (hyperplanes); the
attention rank over time, the final attention matrices, their number of leader columns
and how far their rows are from one-hot (`boolean_defect`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..schema._errors import ConfigError
from ..schema._schema import setting
from ._common import caption, check_drawn_member, colormap, config_of, figure, member_summary
from ._experiment import Counter, Experiment, Keeper
from ._lazy import lazy

if TYPE_CHECKING:
    import xarray as xr
    from matplotlib.figure import Figure
    from scipy import linalg, spatial
else:
    xr = lazy("xarray")
    linalg = lazy("scipy.linalg")
    spatial = lazy("scipy.spatial")


@dataclass
class Options:
    member: int | None = setting(None, "the member drawn (null: in each panel the one with the most distinct limits)")
    hyperplane_v: Any = setting(
        [[1.0, 0.5], [0.0, 0.0]], "V of the hyperplanes panel (the default: eigenvalues 1, simple, and 0)"
    )
    product_v: Any = setting([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, -0.5]], "V of the product panel")
    tol: float = setting(1.0e-3, "two rescaled limits closer than tol * (their largest norm) are one point")


PANEL_TITLES = {
    "polytope": "V = I: vertices of a convex polygon",
    "hyperplanes": "simple top eigenvalue: parallel lines",
    "product": "V = diag(1, 1, -1/2): polygon x line",
}


def _matrix(value: Any, key: str) -> np.ndarray:
    """`value`, the option `experiment.options.KEY`, as a square matrix of size at least 2."""
    matrix = np.asarray(value, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1] or matrix.shape[0] < 2:
        raise ConfigError(f"experiment.options.{key} must be a square matrix of size at least 2, got {value!r}.")
    return matrix


def top_eigenspace(v: np.ndarray, rtol: float = 1e-9) -> tuple[float, np.ndarray, np.ndarray]:
    """The eigenvalue of `v` with the largest real part, the projector on its eigenspace
    along the others, and the left eigenvectors (rows) that give the coordinates in it.

    `v` must be diagonalizable with a real top eigenvalue."""
    values, right = np.linalg.eig(v)
    top = values[np.argmax(values.real)]  # pyright: ignore[reportAttributeAccessIssue]  # numpy's stub: .real of eig's values
    if abs(top.imag) > rtol * max(1.0, abs(top)):
        raise ConfigError(f"the top eigenvalue of V is not real ({top:.3g}); the rescaled limits need a real one.")
    which = np.abs(values - top) <= rtol * max(1.0, abs(top))
    left = np.linalg.inv(right)[which]
    projector = (right[:, which] @ left).real
    return float(top.real), projector, left.real


def rescale(x: np.ndarray, t: np.ndarray, v: np.ndarray) -> np.ndarray:
    """$z_i(t) = e^{-tV} x_i(t)$ for states x (member, time, token, dim)."""

    back = np.stack([linalg.expm(-s * v) for s in t])  # (time, dim, dim)
    return np.einsum("tab,mtib->mtia", back, x)


def distinct(points: np.ndarray, tol: float) -> np.ndarray:
    """One representative of every group of `points` (rows) closer than `tol` to it."""
    kept: list[np.ndarray] = []
    for p in points:
        if not any(np.linalg.norm(p - q) <= tol for q in kept):
            kept.append(p)
    return np.asarray(kept)


def convex_position(points: np.ndarray, tol: float) -> bool:
    """Whether every one of `points` (distinct rows) is a vertex of their convex hull."""

    k = points.shape[0]
    if k <= 2:
        return True
    centred = points - points.mean(0)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    rank = int(np.sum(s > tol * max(s[0], 1e-300)))
    if rank == 1:
        return k == 2  # on a line only the two ends are vertices
    if k <= rank + 1:
        return True  # affinely independent points
    hull = spatial.ConvexHull(centred @ vt[:rank].T)
    return len(hull.vertices) == k


def _limits(z_end: np.ndarray, left: np.ndarray, tol: float) -> tuple[int, bool]:
    """Number of distinct limits of the top-eigenspace coordinates and whether they are in
    convex position, for one member's final rescaled tokens (token, dim)."""
    coordinates = z_end @ left.T
    scale = tol * max(float(np.abs(coordinates).max()), 1e-300)
    points = distinct(coordinates, scale)
    return len(points), convex_position(points, tol)


def _loop(points: np.ndarray) -> np.ndarray:
    """The vertices of the convex hull of 2-D `points` in order, closed (the points
    themselves when there are fewer than three or they are collinear)."""

    if len(points) < 3:
        return points
    try:
        vertices = spatial.ConvexHull(points).vertices
    except spatial.QhullError:
        return points[np.argsort(points[:, 0])]
    return points[np.append(vertices, vertices[0])]


def _hull(ax, points: np.ndarray, **style) -> None:
    """Fill the convex hull of 2-D `points` (a segment when they are collinear)."""
    loop = _loop(points)
    ax.fill(loop[:, 0], loop[:, 1], **style)


class Polytope(Experiment):
    title = "Without normalization: rescaled tokens reach polytopes and hyperplanes, attention gets leaders"
    paper = "The emergence of clusters in self-attention dynamics (Geshkovski, Letrouit, Polyanskiy, Rigollet, 2023)"
    Options = Options

    def check(self) -> None:
        cfg = self.cfg
        check_drawn_member("polytope", cfg, self.options, "rescales the saved states", optional=True)
        if cfg.scheme != "none":
            raise ConfigError(
                "experiment polytope is about dynamics without normalization: keep scheme=none, "
                f"got scheme={cfg.scheme}."
            )
        missing = {"attention", "attention_rank"} - set(cfg.metrics)
        if missing:
            raise ConfigError(
                f"experiment polytope needs the metrics attention and attention_rank; add {', '.join(sorted(missing))}."
            )
        if not 0 < self.options.tol < 1:
            raise ConfigError(f"experiment.options.tol must be a number in (0, 1), got {self.options.tol!r}.")
        v = cfg.weights.v
        if v.kind not in ("identity", "matrix") or v.switch_times or v.poly is not None:
            raise ConfigError(
                "experiment polytope needs a constant V (weights.v.kind identity or matrix, without "
                f"switches or polynomial factor), got weights.v.kind={v.kind}."
            )
        for key in ("hyperplane_v", "product_v"):
            try:
                top = top_eigenspace(_matrix(getattr(self.options, key), key))[0]
            except ConfigError as error:
                raise ConfigError(f"experiment.options.{key}: {error}") from None
            if top <= 0:
                raise ConfigError(f"experiment.options.{key} needs a positive top eigenvalue, got {top:.3g}.")
        if top_eigenspace(_matrix(self.options.hyperplane_v, "hyperplane_v"))[2].shape[0] != 1:
            raise ConfigError("experiment.options.hyperplane_v needs a simple top eigenvalue.")

    def panels(self, base: dict) -> dict[str, dict]:
        """V = I as configured, then the hyperplane and product value matrices of the options
        (each with the dimension of its matrix)."""
        configs = {"polytope": copy.deepcopy(base)}
        v = configs["polytope"]["weights"]["v"]
        if v["kind"] == "identity":
            # The identity as a matrix: the two planar panels then share one compiled program.
            v.update(kind="matrix", value=(float(v["scale"]) * np.eye(base["d"])).tolist(), scale=1.0)
        for label, key in (("hyperplanes", "hyperplane_v"), ("product", "product_v")):
            config = copy.deepcopy(base)
            value = _matrix(getattr(self.options, key), key)
            config["d"] = value.shape[0]
            config["weights"]["v"].update(kind="matrix", value=value.tolist(), scale=1.0)
            configs[label] = config
        return configs

    def value_matrix(self, label: str) -> np.ndarray:
        """V of panel `label`: the configured one for `polytope` (identity or matrix, times its
        scale), the options' matrices for the others."""
        if label == "hyperplanes":
            return _matrix(self.options.hyperplane_v, "hyperplane_v")
        if label == "product":
            return _matrix(self.options.product_v, "product_v")
        cfg = self.cfg
        spec = cfg.weights.v
        if spec.kind == "identity":
            v = np.eye(cfg.d)
        elif spec.kind == "matrix":
            v = np.asarray(spec.value, np.float64).reshape(-1, cfg.d, cfg.d)[0]
        else:
            raise ConfigError(
                f"experiment polytope needs a fixed V (identity or matrix), got weights.v.kind={spec.kind}."
            )
        return float(spec.scale) * v

    def analyse(self, results: dict[str, xr.Dataset], *, on_piece: Counter, keep: Keeper) -> xr.Dataset:
        tol, chosen = self.options.tol, self.options.member
        labels = list(results)
        matrices = {label: self.value_matrix(label) for label in labels}
        first = results[labels[0]]
        t = first["time"].values
        members = first["member"].values
        dim = max(v.shape[0] for v in matrices.values())
        n = first.sizes["token"]

        def pad(a: np.ndarray) -> np.ndarray:
            out = np.full(a.shape[:-1] + (dim,), np.nan)
            out[..., : a.shape[-1]] = a
            return out

        rows: dict[str, list] = {
            key: []
            for key in (
                "z_member",
                "z_final",
                "top_speed",
                "limits",
                "convex",
                "levels",
                "rank",
                "attention_final",
                "leaders",
                "defect",
                "top_eigenvalue",
                "top_dimension",
                "v",
                "left",
                "failed",
                "drawn",
            )
        }
        for label in labels:
            ds = results[label]
            v = matrices[label]
            top, projector, left = top_eigenspace(v)
            z = rescale(ds["x"].values, t, v)  # (member, time, token, dim)
            moved = np.einsum("ab,mtib->mtia", projector, np.diff(z, axis=1))
            speed = np.linalg.norm(moved, axis=-1).max(-1) / np.diff(t)  # (member, time - 1)
            rows["top_speed"].append(np.concatenate([np.full((z.shape[0], 1), np.nan), speed], axis=1))
            rows["z_final"].append(pad(z[:, -1]))
            limits = [_limits(z[m, -1], left, tol) for m in range(z.shape[0])]
            member = int(np.argmax([count for count, _ in limits])) if chosen is None else chosen
            rows["drawn"].append(member)
            rows["z_member"].append(pad(z[member]))
            rows["limits"].append([count for count, _ in limits])
            rows["convex"].append([int(flag) for _, flag in limits])
            psi = left[:1]  # a left eigenvector of the top eigenvalue: the hyperplanes' normal
            levels = [
                len(distinct(z[m, -1] @ psi.T, tol * float(np.abs(z[m, -1] @ psi.T).max()))) for m in range(z.shape[0])
            ]
            rows["levels"].append(levels if left.shape[0] == 1 else [-1] * len(levels))
            attention = ds["attention"].isel(head=0).values  # (member, time, query, key)
            final = attention[:, -1]
            rows["attention_final"].append(final)
            rows["leaders"].append([len(set(np.argmax(a, axis=-1))) for a in final])
            rows["defect"].append(1.0 - final.max(-1).min(-1))
            rows["rank"].append(ds["attention_rank"].isel(head=0).values)
            rows["top_eigenvalue"].append(top)
            rows["top_dimension"].append(left.shape[0])
            padded_v = np.full((dim, dim), np.nan)
            padded_v[: v.shape[0], : v.shape[1]] = v
            rows["v"].append(padded_v)
            rows["left"].append(pad(psi[0]))
            rows["failed"].append(int((ds["status"] != 0).sum()))
        a = {key: np.asarray(value) for key, value in rows.items()}
        out = xr.Dataset(
            coords={
                "panel": labels,
                "member": members,
                "time": t,
                "token": np.arange(n),
                "dim": np.arange(dim),
                "query": np.arange(n),
                "key": np.arange(n),
            }
        )
        pm, pmt = ("panel", "member"), ("panel", "member", "time")
        out["drawn_member"] = xr.DataArray(a["drawn"], dims="panel").assign_attrs(
            description="the member whose tokens are drawn, per panel"
        )
        out["z_member"] = xr.DataArray(a["z_member"], dims=("panel", "time", "token", "dim")).assign_attrs(
            description="rescaled tokens z = exp(-tV) x of the drawn member (NaN beyond the panel's d)"
        )
        out["z_final"] = xr.DataArray(a["z_final"], dims=("panel", "member", "token", "dim")).assign_attrs(
            description=f"rescaled tokens z = exp(-tV) x of every member at t = {t[-1]:g}"
        )
        out["top_speed"] = xr.DataArray(a["top_speed"], dims=pmt).assign_attrs(
            description="largest speed over tokens of the projection of z on the top eigenspace of V (finite "
            "difference between saved times; the theorems send it to 0)"
        )
        out["limit_count"] = xr.DataArray(a["limits"], dims=pm).assign_attrs(
            description="number of distinct final top-eigenspace coordinates of the rescaled tokens"
        )
        out["convex_position"] = xr.DataArray(a["convex"], dims=pm).assign_attrs(
            description="1 when those distinct limits are all vertices of their convex hull"
        )
        out["hyperplane_count"] = xr.DataArray(a["levels"], dims=pm).assign_attrs(
            description="number of distinct final values of <psi, z>, psi the left eigenvector of the top eigenvalue "
            "(the parallel hyperplanes <psi, z> = c; at most 3 for a simple top eigenvalue; -1 where the "
            "top eigenvalue is not simple)"
        )
        out["attention_rank"] = xr.DataArray(a["rank"], dims=pmt).assign_attrs(
            description="numerical rank of the attention matrix (singular values above n * eps * the largest)"
        )
        out["attention_final"] = xr.DataArray(
            a["attention_final"], dims=("panel", "member", "query", "key")
        ).assign_attrs(description=f"attention matrix at t = {t[-1]:g}")
        out["leader_count"] = xr.DataArray(a["leaders"], dims=pm).assign_attrs(
            description="number of distinct columns holding the largest entry of a row of the final attention matrix"
        )
        out["boolean_defect"] = xr.DataArray(a["defect"], dims=pm).assign_attrs(
            description="1 - the smallest row maximum of the final attention matrix (0: every row one-hot)"
        )
        out["top_eigenvalue"] = xr.DataArray(a["top_eigenvalue"], dims="panel").assign_attrs(
            description="the eigenvalue of V with the largest real part"
        )
        out["top_dimension"] = xr.DataArray(a["top_dimension"], dims="panel").assign_attrs(
            description="dimension of its eigenspace"
        )
        out["value_matrix"] = xr.DataArray(a["v"], dims=("panel", "row", "dim")).assign_attrs(
            description="V of each panel (NaN beyond the panel's d)"
        )
        out["hyperplane_normal"] = xr.DataArray(a["left"], dims=("panel", "dim")).assign_attrs(
            description="psi: a left eigenvector of the top eigenvalue of V"
        )
        for name in ("attention_rank", "top_speed"):
            summary = member_summary(out[name])
            for key in ("median", "q10", "q90"):
                out[f"{name}_{key}"] = summary[f"{name}_{key}"]
        out["failed_members"] = xr.DataArray(a["failed"], dims="panel").assign_attrs(
            description="members whose solve failed, per panel"
        )
        return out

    @staticmethod
    def draw(ds: xr.Dataset) -> dict[str, Figure]:
        cfg = config_of(ds)
        options = cfg["experiment"]["options"]
        tol = float(options["tol"])
        labels = [str(label) for label in ds["panel"].values]
        drawn = {label: int(ds["drawn_member"].sel(panel=label)) for label in labels}
        t = ds["time"].values
        fig = figure(figsize=(14.0, 9.0), layout="constrained")
        grid = fig.add_gridspec(2, 3)
        letters = iter("abcdefgh")
        leader_colors = colormap("tab10")
        for k, label in enumerate(labels):
            d = int(np.sum(np.isfinite(ds["value_matrix"].sel(panel=label).values[0])))
            z = ds["z_member"].sel(panel=label).values[..., :d]  # (time, token, d)
            attention = ds["attention_final"].sel(panel=label, member=drawn[label]).values
            leader = np.argmax(attention, axis=-1)
            names = {j: i for i, j in enumerate(sorted(set(leader)))}
            colors = [leader_colors(names[j] % 10) for j in leader]
            title = f"({next(letters)}) {label}, member {drawn[label]}: {PANEL_TITLES.get(label, label)}"
            if d == 2:
                ax = fig.add_subplot(grid[0, k])
                _hull(ax, z[0], facecolor="none", edgecolor="0.6", linestyle=":", linewidth=1)
                for i in range(z.shape[1]):
                    ax.plot(z[:, i, 0], z[:, i, 1], color=colors[i], linewidth=0.7, alpha=0.7)
                ax.scatter(
                    z[0, :, 0],
                    z[0, :, 1],
                    s=14,
                    facecolor="white",
                    edgecolor="0.3",
                    linewidth=0.6,
                    zorder=3,
                    label="t = 0",
                )
                ends = distinct(z[-1], tol * float(np.abs(z[-1]).max()))
                if label == "hyperplanes":
                    psi = ds["hyperplane_normal"].sel(panel=label).values[:d]
                    span = np.array([-psi[1], psi[0]]) / np.linalg.norm(psi)
                    levels = distinct((z[-1] @ psi)[:, None], tol * float(np.abs(z[-1] @ psi).max()))[:, 0]
                    for j, level in enumerate(sorted(levels)):
                        foot = level * psi / (psi @ psi)
                        ax.axline(
                            tuple(foot),
                            tuple(foot + span),
                            color="k",
                            linestyle="--",
                            linewidth=1,
                            label=r"$\langle\psi, z\rangle = c$" if j == 0 else None,
                        )
                else:
                    _hull(ax, ends, facecolor="C0", alpha=0.12, edgecolor="C0")
                    _hull(ax, ends, facecolor="none", edgecolor="C0", linewidth=1.2, linestyle="--")
                ax.scatter(
                    z[-1, :, 0],
                    z[-1, :, 1],
                    s=45,
                    c=colors,
                    marker="*",
                    edgecolor="k",
                    linewidth=0.3,
                    zorder=4,
                    label=f"t = {t[-1]:g}",
                )
                ax.set_aspect("equal", adjustable="datalim")
                ax.set_xlabel("$z_1$")
                ax.set_ylabel("$z_2$")
                ax.legend(loc="best", fontsize=7, framealpha=0.9)
            else:
                ax = fig.add_subplot(grid[0, k], projection="3d")
                ends = distinct(z[-1, :, :2], tol * float(np.abs(z[-1, :, :2]).max()))
                height = float(np.abs(z[-1, :, 2]).max())
                for i in range(z.shape[1]):
                    ax.plot(z[:, i, 0], z[:, i, 1], z[:, i, 2], color=colors[i], linewidth=0.6, alpha=0.6)
                ax.scatter(z[-1, :, 0], z[-1, :, 1], z[-1, :, 2], s=30, c=colors, marker="*", depthshade=False)
                for p in ends:
                    ax.plot([p[0], p[0]], [p[1], p[1]], [-height, height], color="k", linestyle="--", linewidth=0.8)
                if len(ends) >= 2:
                    loop = _loop(ends)
                    ax.plot(loop[:, 0], loop[:, 1], 0 * loop[:, 0], color="C0", linewidth=1.2)
                ax.set_xlabel("$z_1$", labelpad=-2)
                ax.set_ylabel("$z_2$", labelpad=-2)
                ax.set_zlabel("$z_3 = e^{t/2} x_3$", labelpad=-2)
                ax.tick_params(labelsize=6, pad=0)
            ax.set_title(title, fontsize=9)
        ax = fig.add_subplot(grid[1, 0])
        for k, label in enumerate(labels):
            part = ds.sel(panel=label)
            ax.fill_between(
                t, part["attention_rank_q10"], part["attention_rank_q90"], color=f"C{k}", alpha=0.15, linewidth=0
            )
            ax.plot(t, part["attention_rank_median"], color=f"C{k}", label=f"{label} (median, 10-90%)")
            ax.plot(t, part["attention_rank"].sel(member=drawn[label]), color=f"C{k}", linewidth=0.8, linestyle=":")
        ax.set_xlabel("time t")
        ax.set_ylabel("numerical rank of the attention matrix")
        ax.set_title(f"({next(letters)}) attention rank over {ds.sizes['member']} members (dotted: drawn members)")
        ax.legend(loc="upper right")
        ax = fig.add_subplot(grid[1, 1])
        attention = ds["attention_final"].sel(panel=labels[0], member=drawn[labels[0]]).values
        leader = np.argmax(attention, axis=-1)
        order = np.lexsort((np.arange(len(leader)), leader))
        columns = np.concatenate([sorted(set(leader)), [j for j in range(len(leader)) if j not in set(leader)]])
        image = ax.imshow(attention[np.ix_(order, columns)], cmap="Greys", vmin=0, vmax=1, interpolation="nearest")
        ax.set_xticks(range(len(columns)), columns, fontsize=6)
        ax.set_yticks(range(len(order)), order, fontsize=6)
        ax.set_xlabel("key token (leaders first)")
        ax.set_ylabel("query token (grouped by leader)")
        ax.grid(False)
        fig.colorbar(image, ax=ax, shrink=0.8, label="attention weight")
        ax.set_title(f"({next(letters)}) {labels[0]}: attention at t = {t[-1]:g}, member {drawn[labels[0]]}")
        ax = fig.add_subplot(grid[1, 2])
        for k, label in enumerate(labels):
            part = ds.sel(panel=label)
            ax.plot(t, part["top_speed_median"], color=f"C{k}", label=label)
            ax.fill_between(t, part["top_speed_q10"], part["top_speed_q90"], color=f"C{k}", alpha=0.15, linewidth=0)
        ax.set_yscale("log")
        ax.set_xlabel("time t")
        ax.set_ylabel("max$_i$ |d/dt of z_i projected on the top eigenspace|")
        ax.set_title(f"({next(letters)}) the rescaled limits are reached")
        ax.legend(loc="upper right")
        leaders = ds["leader_count"]
        ranks = ds["attention_rank"].isel(time=-1)
        convex = ds["convex_position"].sel(panel=labels[0])
        caption(
            fig,
            (
                f"Softmax attention in $R^d$ without normalization, Q = K = I, $\\beta$ = {cfg['beta']}, n = "
                f"{cfg['n']} tokens uniform in [{cfg['init']['low']:g}, {cfg['init']['high']:g}]^d, {cfg['solver']} "
                f"with dt = {cfg['dt']} to t = {cfg['t1']:g} in {cfg['dtype']}, {ds.sizes['member']} members. Rescaled "
                f"tokens z = exp(-tV) x of one member per panel: open circles at t = 0, stars at t = {t[-1]:g}, paths "
                "coloured by the final leader (the token a row of the attention attends to). (a) dotted: the initial "
                f"hull, shaded: the limit polygon; {int(convex.sum())} of {convex.size} members end with their limits "
                f"in convex position. (b) V = {np.asarray(options['hyperplane_v']).tolist()}: the lines <psi, z> = c, "
                "psi the left top eigenvector. (c) the vertical lines through the polygon in the top eigenspace. (d) "
                "the rank falls from n to the number of leaders: final rank = leaders in "
                f"{int((ranks == leaders).sum())} of {ranks.size} runs, largest distance of a final attention row from "
                f"one-hot {float(ds['boolean_defect'].max()):.1e}. (f) the speed of the rescaled tokens' projection on "
                "the top eigenspace of V decays like e^(-t) in every panel."
            ),
            width=170,
        )
        return {"polytope": fig}
