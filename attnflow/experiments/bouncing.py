"""Bouncing: a value matrix that flips sign throws a cluster apart, and the tokens
gather again elsewhere.

n = 32 tokens start uniformly on S^4 (d = 5) and follow softmax self-attention on the
sphere with V(t) = diag(1, 1, 1, -1, -1) for t < 5 and -V(0) from t = 5 on, and Gaussian
random Q and K redrawn at t = 5 ("A Survey of Continuous Time Dynamics of
Transformers", sec. 5.2, eq. 48, fig. 4). Before the flip the +1 directions of V attract
and the -1 directions repel, so the tokens gather near the span of the first three
coordinates; the flip swaps the roles, the gathered tokens fly apart and then gather
again near the span of the last two: a different region of the sphere.

Stored: the drawn member's states `x_member` and their coordinates `pc` on the first two
principal components of its initial tokens (the view of the survey's figure), and over
all members the order parameter |mean_i x_i| (1 for one point, the cluster measure
here), the share of the tokens' squared norm in the attracting subspace of V(0) (the
span of the eigenvectors of its symmetric part with positive eigenvalues), and
`centre_cos`, the cosine between each member's mean direction at the switch and at the
end (near 0: the tokens gathered somewhere else).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..schema._errors import ConfigError
from ..schema._schema import setting
from ._common import caption, check_drawn_member, colormap, config_of, failed_members, member_summary, subplots
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


def attracting_subspace(v: np.ndarray) -> np.ndarray:
    """Orthonormal rows spanning the eigenvectors of the symmetric part of `v` with
    positive eigenvalues: the directions in which V pulls tokens together."""
    values, vectors = np.linalg.eigh(0.5 * (v + v.T))
    return vectors[:, values > 0].T


def principal_axes(points: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The centre and the two leading principal directions (rows) of `points` (rows),
    with the share of the variance each carries."""
    centre = points.mean(0)
    _, s, vt = np.linalg.svd(points - centre, full_matrices=False)
    return centre, vt[:2], (s[:2] ** 2) / np.sum(s**2)


class Bouncing(Experiment):
    title = "Bouncing: V flips sign at t = 5, the tokens scatter and gather elsewhere"
    paper = "A Survey of Continuous Time Dynamics of Transformers, sec. 5.2, eq. 48, fig. 4"
    coordinates = {"component": ("principal component of the initial tokens (1: the first)", "1")}
    Options = Options

    def check(self) -> None:
        cfg = self.cfg
        check_drawn_member("bouncing", cfg, self.options, "reads the tokens' states")
        if "order_parameter" not in cfg.metrics:
            raise ConfigError("experiment bouncing draws the order parameter: add order_parameter to metrics.")
        v = cfg.weights.v
        if v.kind != "matrix" or np.shape(v.value) != (cfg.d, cfg.d) or len(v.switch_times) != 1 or len(v.factors) != 2:
            raise ConfigError(
                "experiment bouncing needs weights.v.kind=matrix with one (d, d) value, one switch time "
                "and two factors (the flip of eq. 48)."
            )

    def analyse(self, results: dict[str, xr.Dataset], *, on_piece: Counter, keep: Keeper) -> xr.Dataset:
        cfg = self.cfg
        ds = results["main"]
        member = self.options.member
        switch = float(cfg.weights.v.switch_times[0])
        t = ds["time"].values
        x = ds["x"].values  # (member, time, token, dim)
        v0 = np.asarray(cfg.weights.v.value, np.float64).reshape(cfg.d, cfg.d) * cfg.weights.v.scale
        v0 = v0 * cfg.weights.v.factors[0]
        basis = attracting_subspace(v0)
        share = np.mean(np.sum((x @ basis.T) ** 2, -1) / np.sum(x**2, -1), -1)  # (member, time)
        mean = x.mean(2)
        direction = mean / np.linalg.norm(mean, axis=-1, keepdims=True)
        at_switch = int(np.argmin(np.abs(t - switch)))
        centre_cos = np.sum(direction[:, at_switch] * direction[:, -1], -1)
        centre, axes, variance = principal_axes(x[member, 0])
        members = ds["member"].values
        out = xr.merge(
            [
                member_summary(ds["order_parameter"]),
                member_summary(
                    xr.DataArray(
                        share, dims=("member", "time"), coords={"member": members, "time": t}, name="attracting_share"
                    )
                ),
            ]
        )
        out["attracting_share_mean"].attrs["description"] = (
            "mean over members of the tokens' average share of squared norm in the attracting subspace of V(0)"
        )
        out["order_parameter_member"] = (
            ds["order_parameter"]
            .isel(member=member)
            .drop_vars("member")
            .assign_attrs(description=f"order parameter |mean_i x_i| of member {member}")
        )
        out["attracting_share_member"] = xr.DataArray(share[member], dims="time").assign_attrs(
            description=f"share of squared norm in the attracting subspace of V(0), member {member}"
        )
        out["order_parameter_all"] = ds["order_parameter"].assign_attrs(
            description="order parameter |mean_i x_i| of every member (1: one point)"
        )
        out["centre_cos"] = xr.DataArray(centre_cos, dims="member", coords={"member": members}).assign_attrs(
            description=f"cosine between the mean direction of the tokens at t = {t[at_switch]:g} (the switch) and at "
            f"t = {t[-1]:g}"
        )
        out["x_member"] = (
            ds["x"]
            .isel(member=member)
            .drop_vars("member")
            .assign_attrs(description=f"states x(time, token, dim) of member {member}")
        )
        out["pc"] = xr.DataArray(
            (x[member] - centre) @ axes.T, dims=("time", "token", "component"), coords={"component": [1, 2]}
        ).assign_attrs(
            description=f"member {member}'s tokens on the first two principal components of its initial tokens"
        )
        out["pc_variance"] = xr.DataArray(variance, dims="component").assign_attrs(
            description="share of the initial tokens' variance along each principal component"
        )
        out["attracting_basis"] = xr.DataArray(basis, dims=("direction", "dim")).assign_attrs(
            description="orthonormal basis of the attracting subspace of V(0) (positive eigenvalues of its symmetric "
            "part)"
        )
        out["switch_time"] = xr.DataArray(switch).assign_attrs(description="the time at which V flips sign")
        out["failed_members"] = failed_members(ds)
        return out

    @staticmethod
    def draw(ds: xr.Dataset) -> dict[str, Figure]:

        cfg = config_of(ds)
        member = int(cfg["experiment"]["options"]["member"])
        t = ds["time"].values
        switch = float(ds["switch_time"])
        at_switch = int(np.argmin(np.abs(t - switch)))
        fig, axes = subplots(
            1, 3, figsize=(13.5, 4.2), layout="constrained", gridspec_kw={"width_ratios": [1.25, 1, 1]}
        )
        ax = axes[0]
        norm = mcolors.Normalize(t[0], t[-1])
        cmap = colormap("plasma")
        y = ds["pc"].values
        for i in range(y.shape[1]):
            lines = mcoll.LineCollection(np.stack([y[:-1, i], y[1:, i]], axis=1), cmap=cmap, norm=norm, linewidth=0.9)  # pyright: ignore[reportArgumentType]  # an (N, 2, 2) array of segments
            lines.set_array(0.5 * (t[:-1] + t[1:]))
            ax.add_collection(lines)
        ax.scatter(
            y[0, :, 0], y[0, :, 1], s=12, facecolor="white", edgecolor="0.3", linewidth=0.7, zorder=3, label="t = 0"
        )
        ax.scatter(
            y[at_switch, :, 0],
            y[at_switch, :, 1],
            s=14,
            color="k",
            marker="s",
            zorder=4,
            label=f"t = {t[at_switch]:g} (flip)",
        )
        ax.scatter(
            y[-1, :, 0],
            y[-1, :, 1],
            s=60,
            marker="*",
            color="tab:green",
            edgecolor="k",
            linewidth=0.4,
            zorder=5,
            label=f"t = {t[-1]:g}",
        )
        ax.autoscale_view()
        variance = ds["pc_variance"].values
        ax.set_xlabel(f"PC1 of the initial tokens ({100 * variance[0]:.0f}% of their variance)")
        ax.set_ylabel(f"PC2 ({100 * variance[1]:.0f}%)")
        ax.set_title(f"(a) member {member}'s tokens on two principal components")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3)
        bar = fig.colorbar(cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="time t", shrink=0.9)
        bar.ax.axhline(switch, color="k", linewidth=1.5)
        members = int(ds.sizes["member"])
        for ax, name, label, letter, title in (
            (axes[1], "order_parameter", r"order parameter $|\frac{1}{n}\sum_i x_i|$", "b", "gathering"),
            (axes[2], "attracting_share", r"share of $|x_i|^2$ in the +1 directions of $V(0)$", "c", "where"),
        ):
            ax.fill_between(
                t, ds[f"{name}_q10"], ds[f"{name}_q90"], color="C0", alpha=0.2, linewidth=0, label="10-90% of members"
            )
            ax.plot(t, ds[f"{name}_median"], color="C0", label="median")
            ax.plot(t, ds[f"{name}_member"], color="C1", linewidth=1, label=f"member {member}")
            ax.axvline(switch, color="k", linestyle="--", linewidth=1, label="V flips, Q, K redrawn")
            ax.set_xlabel("time t")
            ax.set_ylabel(label)
            ax.set_ylim(-0.02, 1.02)
            ax.set_title(f"({letter}) {title}, {members} members")
        axes[1].legend(loc="lower right")
        v = np.asarray(cfg["weights"]["v"]["value"], float)
        diagonal = ", ".join(f"{value:g}" for value in np.diag(v)) if np.allclose(v, np.diag(np.diag(v))) else None
        v_text = f"V = diag({diagonal})" if diagonal else "V as configured"
        cos = ds["centre_cos"].values
        caption(
            fig,
            (
                f"Softmax attention on $S^{{{cfg['d'] - 1}}}$, n = {cfg['n']}, $\\beta$ = {cfg['beta']}; {v_text} "
                f"until t = {switch:g}, then its negative; Q, K {cfg['weights']['q']['law']} random per member, "
                f"redrawn at t = {switch:g}; {cfg['solver']} with dt = {cfg['dt']}, uniform initial tokens. (a) paths "
                "coloured by time (black squares: the flip). (b) how tightly the tokens are gathered. (c) where they "
                "are gathered: the +1 directions of $V(0)$ before the flip, the others after. Median cosine between "
                f"the tokens' mean direction at the flip and at t = {t[-1]:g}: {np.nanmedian(cos):.2f} (0: another "
                "place)."
            ),
            width=150,
        )
        return {"bouncing": fig}
