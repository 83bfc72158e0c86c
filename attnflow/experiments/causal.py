"""Causal attention: every token converges to the first one, which does not move.

n = 8 tokens start uniformly on S^2 and follow causal softmax self-attention on the
sphere (token i attends to the tokens j <= i) with Q = K = V = I. Theorem 4.3 of "A
Survey of Continuous Time Dynamics of Transformers" (after Karagodin et al., for V = I
and any constant Q, K): x_i(t) -> x_1(0) for every i. The first token attends only to
itself, so its velocity P_{x_1}^perp(x_1) = 0 (eq. 38) and it never moves.

The theorem says nothing of rates. Linearizing at the limit (a computation of ours, not
of the survey): near x_1 every logit is about beta <Q x_1, K x_1>, so token i attends
uniformly to its i visible tokens, and the tangent offsets y_i = x_i - x_1 follow
y_i' = (1/i) sum_{j<i} y_j - ((i-1)/i) y_i. The system is triangular with rates
(i-1)/i; the slowest, 1/2, belongs to token 2 and drives all later tokens. Its mode is
y_i = (i-1) y_2: asymptotically every token approaches x_1 at the same rate 1/2, and the
later a token, the farther behind, in proportion to i - 1. This holds for any constant
Q, K. Transients can last long (a token near the antipode of the cluster lingers), so
the figure and the tests look at the median over members.

Stored: the chordal distances |x_i - x_1| over time (their member statistics, and the
drawn member's), `x1_drift` (how far x_1 ever moved), `final_distance`, `rate` (minus
the slope of log |x_i - x_1| fitted from `fit_from` of the run on) and `lag`
(|x_i - x_1| / |x_2 - x_1| at the end) per member and token, and the drawn member's
states (drawn also as an interactive sphere, causal.html, and an animation, causal.gif,
when d = 3).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..schema._errors import ConfigError
from ..schema._schema import setting
from ._animate import animate_states
from ._common import (
    caption,
    check_member_option,
    colormap,
    config_of,
    failed_members,
    figure,
    member_summary,
    wireframe_sphere,
)
from ._experiment import Counter, Experiment, Keeper
from ._lazy import lazy

if TYPE_CHECKING:
    import xarray as xr
    from matplotlib.figure import Figure

    from ..running import _build
else:
    xr = lazy("xarray")
    _build = lazy("attnflow.running._build")


@dataclass
class Options:
    member: int = setting(0, "the member whose tokens are drawn")
    fit_from: float = setting(0.75, "decay rates are fitted on the times after this fraction of [t0, t1]")
    tolerance: float = setting(1e-3, "converged: every |x_i - x_1| below this at t1")


def decay_rates(t: np.ndarray, distance: np.ndarray) -> np.ndarray:
    """Minus the least-squares slope of log(distance) against t (last axis of
    `distance` over `t`); NaN where a distance is zero."""
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log(distance)
        tc = t - t.mean()
        slope = np.sum(tc * (logs - logs.mean(-1, keepdims=True)), -1) / np.sum(tc**2)
        return np.where(np.isfinite(slope), -slope, np.nan)


class Causal(Experiment):
    title = "Causal attention: every token converges to the first one"
    paper = "A Survey of Continuous Time Dynamics of Transformers, theorem 4.3 (eq. 37-38)"
    Options = Options

    def check(self) -> None:
        cfg = self.cfg
        check_member_option(self.options, cfg.members)
        fit_from = self.options.fit_from
        if not 0 <= fit_from < 1:
            raise ConfigError(f"experiment.options.fit_from must be a fraction in [0, 1), got {fit_from!r}.")
        tolerance = self.options.tolerance
        if not tolerance > 0:
            raise ConfigError(f"experiment.options.tolerance must be a positive number, got {tolerance!r}.")
        if not cfg.save_states:
            raise ConfigError("experiment causal measures the tokens' distances: keep save_states=true.")
        if cfg.n < 2:
            raise ConfigError(f"experiment causal needs at least two tokens, got n={cfg.n}.")
        # The decay rates are slopes fitted on the saved times from fit_from on: one time fits none (NaN rates).
        t = _build.resolve_study(dataclasses.replace(cfg, experiment=None)).grid.times
        if len(t) < 2 or t[-2] < t[0] + fit_from * (t[-1] - t[0]):
            before = (t[-2] - t[0]) / (t[-1] - t[0]) if len(t) > 1 else None
            lower = "" if before is None else f"take fit_from at most {before:.4g} (the saved time before t1) or "
            raise ConfigError(
                f"experiment.options.fit_from={fit_from!r} leaves one saved time to fit the decay rates "
                f"on; {lower}raise saves={cfg.saves}."
            )

    def analyse(self, results: dict[str, xr.Dataset], *, on_piece: Counter, keep: Keeper) -> xr.Dataset:
        ds = results["main"]
        member = self.options.member
        t = ds["time"].values
        x = ds["x"].values  # (member, time, token, dim)
        distance = np.linalg.norm(x - x[:, :, :1], axis=-1)  # (member, time, token)
        members = ds["member"].values
        tokens = np.arange(1, self.cfg.n + 1)
        dist = xr.DataArray(
            distance,
            dims=("member", "time", "token"),
            coords={"member": members, "time": t, "token": tokens},
            name="distance",
        )
        late = t >= t[0] + self.options.fit_from * (t[-1] - t[0])
        rate = decay_rates(t[late], np.moveaxis(distance[:, late], 1, -1))  # (member, token)
        rate[:, 0] = np.nan
        with np.errstate(divide="ignore", invalid="ignore"):
            lag = distance[:, -1] / distance[:, -1, 1:2]
        lag[:, 0] = np.nan
        per_token = {"member": members, "token": tokens}
        out = member_summary(dist)
        out["distance_member"] = (
            dist.sel(member=member).drop_vars("member").assign_attrs(description=f"|x_i - x_1| of member {member}")
        )
        out["x1_drift"] = xr.DataArray(
            np.abs(x[:, :, 0] - x[:, :1, 0]).max((1, 2)), dims="member", coords={"member": members}
        ).assign_attrs(description="largest |x_1(t) - x_1(0)| (component-wise) over the run")
        out["final_distance"] = (
            dist.isel(time=-1).drop_vars("time").assign_attrs(description=f"|x_i - x_1| at t = {t[-1]:g}")
        )
        tolerance = self.options.tolerance
        out["converged"] = xr.DataArray(
            distance[:, -1].max(-1) < tolerance, dims="member", coords={"member": members}
        ).assign_attrs(description=f"every |x_i - x_1| below {tolerance:g} at t = {t[-1]:g}", tolerance=tolerance)
        out["rate"] = xr.DataArray(rate, dims=("member", "token"), coords=per_token).assign_attrs(
            description=f"minus the fitted slope of log |x_i - x_1| over t >= {t[late][0]:g} "
            "(linearization: 1/2 for every token)"
        )
        out["lag"] = xr.DataArray(lag, dims=("member", "token"), coords=per_token).assign_attrs(
            description=f"|x_i - x_1| / |x_2 - x_1| at t = {t[-1]:g} (linearization: i - 1)"
        )
        out["x_member"] = (
            ds["x"]
            .isel(member=member)
            .drop_vars("member")
            .assign_attrs(description=f"states x(time, token, dim) of member {member}")
        )
        out["fit_start"] = xr.DataArray(float(t[late][0])).assign_attrs(description="first time of the rate fit")
        out["failed_members"] = failed_members(ds)
        return out

    @staticmethod
    def draw(ds: xr.Dataset) -> dict[str, Figure]:
        cfg = config_of(ds)
        member = int(cfg["experiment"]["options"]["member"])
        t = ds["time"].values
        tokens = ds["token"].values
        n = len(tokens)
        colors = colormap("viridis")(np.linspace(0, 0.95, n))
        fig = figure(figsize=(15.0, 4.3), layout="constrained")
        grid = fig.add_gridspec(1, 4, width_ratios=[1.1, 1.2, 1, 1])
        x = ds["x_member"].values
        if x.shape[-1] == 3:
            ax = fig.add_subplot(grid[0], projection="3d")
            wireframe_sphere(ax)
            for i in range(n):
                ax.plot(*x[:, i].T, color=colors[i], linewidth=1.3)
                ax.scatter(*x[0, i], color=colors[i], s=18)
            ax.scatter(*x[0, 0], color="red", marker="*", s=120, zorder=5)
            ax.set_title(f"(a) member {member}: paths (o start), * $x_1$", y=1.0)
        else:
            ax = fig.add_subplot(grid[0])
            ax.set_axis_off()
            ax.text(0.5, 0.5, f"d = {x.shape[-1]}: no sphere picture", ha="center", va="center")
        ax = fig.add_subplot(grid[1])
        distance = ds["distance_member"].values
        for i in range(1, n):
            ax.semilogy(t, distance[:, i], color=colors[i], label=f"i = {tokens[i]}")
        reference = distance[-1, 1] * np.exp(-0.5 * (t - t[-1]))
        ax.semilogy(t, reference, color="k", linestyle=":", linewidth=1, label=r"$\propto e^{-t/2}$")
        ax.set_ylim(max(distance[:, 1:].min() * 0.3, 1e-16), 3)
        ax.set_xlabel("time t")
        ax.set_ylabel(r"$|x_i(t) - x_1(t)|$")
        ax.set_title(f"(b) member {member}: distance to the first token")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=4)
        members = int(ds.sizes["member"])
        ax = fig.add_subplot(grid[2])
        rate = ds["rate"].values[:, 1:]
        ax.boxplot([r[np.isfinite(r)] for r in rate.T], positions=tokens[1:], widths=0.6, showfliers=False)
        ax.axhline(0.5, color="C3", linestyle="--", linewidth=1, label="1/2 (linearization)")
        ax.set_xlabel("token i")
        ax.set_ylabel(r"decay rate of $|x_i - x_1|$")
        ax.set_title(f"(c) rates for t >= {float(ds['fit_start']):g}, {members} members")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16))
        ax = fig.add_subplot(grid[3])
        lag = ds["lag"].values[:, 1:]
        ax.boxplot([r[np.isfinite(r)] for r in lag.T], positions=tokens[1:], widths=0.6, showfliers=False)
        ax.plot(tokens[1:], tokens[1:] - 1, color="C3", linestyle="--", linewidth=1, label="i - 1 (linearization)")
        ax.set_xlabel("token i")
        ax.set_ylabel(r"$|x_i - x_1| \,/\, |x_2 - x_1|$")
        ax.set_title(f"(d) who lags behind at t = {t[-1]:g}")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16))
        q = cfg["weights"]["q"]
        qk = (
            "Q = K = I"
            if q["kind"] == "identity" and cfg["weights"]["k"]["kind"] == "identity"
            else f"Q {q['kind']}, K {cfg['weights']['k']['kind']}"
        )
        converged = int(ds["converged"].sum())
        lingering = (
            ""
            if converged == members
            else f" (in the other{'s' if members - converged > 1 else ''} a token that started near the antipode "
            f"of $x_1$ lingers there before it leaves)"
        )
        drift = float(ds["x1_drift"].max())
        caption(
            fig,
            (
                f"Causal softmax attention on $S^{{{cfg['d'] - 1}}}$, {qk}, V = I, n = {cfg['n']}, $\\beta$ = "
                f"{cfg['beta']}, {cfg['solver']} with dt = {cfg['dt']}, uniform initial tokens, {members} members. "
                f"Every token converges to $x_1$, which never moves (largest drift {drift:.1e}): {converged} of "
                f"{members} members have every $|x_i - x_1|$ < {float(ds['converged'].attrs['tolerance']):g} at t = "
                f"{t[-1]:g}{lingering}. Near the limit all tokens approach $x_1$ at rate 1/2 "
                f"and token i lags i - 1 times as far as token 2 (boxes: quartiles over members, whiskers 1.5 IQR, "
                f"outliers not drawn)."
            ),
            width=170,
        )
        return {"causal": fig}

    @staticmethod
    def write_files(ds: xr.Dataset, folder: Path, plotly_js: str = "embed") -> list[Path]:
        """The drawn member's paths as an interactive view and a GIF."""
        member = int(config_of(ds)["experiment"]["options"]["member"])
        states = xr.Dataset({"x": ds["x_member"]})
        title = f"causal attention, {ds.sizes['token']} tokens, member {member}: all go to $x_1$"
        return animate_states(states, folder, "causal", title=title, plotly_js=plotly_js)
