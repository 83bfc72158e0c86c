"""Post-LN against pre-LN: exponential against polynomial collapse of the tokens.

Two places for the normalization around softmax self-attention with random weights:

- post-LN (`scheme=sphere`): the tokens live on the unit sphere,
  $\\dot x_i = P^\\perp_{x_i} \\sum_j P_{ij} V x_j$ (the survey's model);
- pre-LN (`scheme=pre`): the residual stream $x_i$ is free and attention reads the
  normalized tokens, $\\dot x_i = \\sum_j P_{ij}(N(X))\\, V N(x_j)$, with $N$ the RMSNorm
  (or LayerNorm, option `pre_norm`) of gain $d^{-1/2}$, so that $N(x_i) = x_i/|x_i|$: the
  very tokens post-LN would see, with the same $\\beta$.

With the same random Q, K, V (Ginibre, drawn per member) and the same initial tokens,
both collapse towards one direction, but at different speeds. On the sphere the
cosines approach 1 exponentially: $1 - \\overline{\\cos} \\sim e^{-rt}$. In pre-LN, once
the directions are nearly equal, every token gets nearly the same update: the attention
rows sum to 1, so the update $\\sum_j P_{ij} V u_j$ differs between tokens only at second
order in their spread. The differences $x_i - x_j$ then freeze while the common update
makes $|x_i|$ grow like $c (t - t_0)$, and $1 - \\overline{\\cos} \\propto |x_i - x_j|^2/|x|^2
\\sim (t - t_0)^{-2}$. This is the known contrast between the two placements of the
normalization (exponential rank collapse with post-LN, polynomial with pre-LN).

Measured from the saved states: `collapse` $= 1 - $ the mean cosine over pairs
$i \\ne j$, computed without cancellation as $\\frac{1}{n-1}\\sum_i |u_i - \\bar u|^2$
($u_i = x_i/|x_i|$), so that it can be followed far below $10^{-16}$; the mean token norm
and its growth line $c (t - t_0)$, fitted on the second half of the run. Fitted on the
geometric mean over members (and on every member), once the collapse is below
`fit_from` and until it reaches `floor`: an exponential (the slope of
$\\log(1 - \\overline{\\cos})$ against $t$) and a power law (its slope against
$\\log(t - t_0)$; $t_0 = 0$ on the sphere). Which model the series follows is read from
the $R^2$ of each line over that whole window. The rate and the exponent themselves are
fitted only where the local slope has settled, within `settle` (2%) of its value at the
end of the window: before that the slope is still moving (the pre-LN exponent in t fell
from 2.7 at t = 5 to 2.1 at t = 52 in the figure run, and a fit from t = 6 gave 2.3),
and a fit over it would report the transient.

n = 32 tokens, 4 members, d = 512, $\\beta = \\sqrt d$ (logits of order one, as the
$1/\\sqrt d$ of a transformer on tokens of norm $\\sqrt d$), to t = 60 with RK4 at
dt = 0.2 and log-spaced output: long enough for two decades of t in the pre-LN power
law, while post-LN reaches the round-off of float64 unit vectors by t of about 30.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..schema._config import choice
from ..schema._errors import ConfigError
from ..schema._schema import setting
from ._common import caption, check_member_option, config_of, subplots
from ._experiment import Counter, Experiment, Keeper
from ._lazy import lazy

if TYPE_CHECKING:
    import xarray as xr
    from matplotlib.figure import Figure
else:
    xr = lazy("xarray")

PreNorm = choice("PreNorm", ("rms", "layer"))


@dataclass
class Options:
    member: int = setting(0, "the member drawn darker")
    pre_norm: PreNorm = setting(  # pyright: ignore[reportInvalidTypeForm]  # a Choice made at run time
        PreNorm.rms,  # pyright: ignore[reportAttributeAccessIssue]  # a Choice's members are made at run time
        "N of pre-LN: rms or layer, both with gain d^{-1/2} (unit normalized tokens)",
    )
    fit_from: float = setting(0.1, "the fits start once 1 - mean cosine is below this ...")
    floor: float = setting(1.0e-24, "... and stop once it is below this (round-off of float64 unit vectors is ~1e-32)")
    settle: float = setting(
        0.02, "rate and exponent: fitted where the local slope stays within this share of its end value"
    )


SCHEMES = {"post_ln": "post-LN (sphere)", "pre_ln": "pre-LN (residual stream)"}


def collapse(x: np.ndarray) -> np.ndarray:
    """$1 - $ the mean cosine over pairs $i \\ne j$ of tokens x (..., n, d), as
    $\\frac{1}{n-1}\\sum_i |u_i - \\bar u|^2$, free of the cancellation of $1 - \\cos$."""
    u = x / np.linalg.norm(x, axis=-1, keepdims=True)
    n = x.shape[-2]
    return np.asarray(np.sum((u - u.mean(-2, keepdims=True)) ** 2, axis=(-1, -2)) / (n - 1))


_FIT_DESCRIPTIONS = {
    "exp_rate": "r of the exponential fit 1 - mean cos ~ exp(-r t) (minus the slope of log(1 - cos) against t), "
    "on the window where that slope has settled (exp_start to fit_end)",
    "exp_log_amplitude": "log A of the exponential fit A exp(-r t)",
    "exp_start": "first time of the exponential fit: from here on the local rate stays within `settle` of its end "
    "value",
    "exp_r2": "R^2 of a line in (t, log(1 - cos)) over the whole window fit_start to fit_end",
    "power_exponent": "p of the power-law fit 1 - mean cos ~ (t - norm_origin)^(-p) (minus the slope against "
    "log(t - norm_origin)), on the window where that slope has settled (power_start to fit_end)",
    "power_log_amplitude": "log A of the power-law fit A (t - norm_origin)^(-p)",
    "power_start": "first time of the power-law fit: from here on the local exponent stays within `settle` of its end "
    "value",
    "power_r2": "R^2 of a line in (log(t - norm_origin), log(1 - cos)) over the whole window fit_start to fit_end",
    "fit_start": "first time with 1 - mean cos below fit_from",
    "fit_end": "last time with 1 - mean cos above floor",
}


def _line(u: np.ndarray, v: np.ndarray) -> tuple[float, float, float]:
    """Slope, intercept and $R^2$ of the least-squares line of v against u."""
    slope, intercept = np.polyfit(u, v, 1)
    residual = v - (slope * u + intercept)
    return float(slope), float(intercept), float(1 - np.sum(residual**2) / np.sum((v - v.mean()) ** 2))


def settled_from(u: np.ndarray, v: np.ndarray, settle: float) -> int:
    """The first index from which the local slope dv/du stays within `settle` (a share)
    of its end value, the slope of the line through the last quarter of the points; the
    asymptotic regime of a series that becomes a line in (u, v)."""
    local = np.gradient(v, u)
    tail = max(4, u.size // 4)
    end = np.polyfit(u[-tail:], v[-tail:], 1)[0]
    off = np.flatnonzero(np.abs(local - end) > settle * abs(end))
    return int(off[-1] + 1) if off.size else 0


def fit_rates(
    t: np.ndarray, y: np.ndarray, fit_from: float, floor: float, origin: float = 0.0, settle: float = 0.02
) -> dict[str, float]:
    """Exponential and power-law fits of the series y(t) on the window that starts when
    y drops below `fit_from` and ends before it drops below `floor`.

    The $R^2$ of each model (a line in log y against t, or against $\\log(t - t_0)$ with
    $t_0$ = `origin`) is taken over the whole window: it tells which model the series
    follows. The rate r of $y \\sim e^{-rt}$ and the exponent p of $y \\sim (t - t_0)^{-p}$
    are fitted in the asymptotic part of the window only: from where the local slope
    stays within `settle` of its end value (`settled_from`). Before that the slope is
    still moving and a fit over it would mix in the transient."""
    nan = dict.fromkeys(_FIT_DESCRIPTIONS, np.nan)
    below = np.flatnonzero((y < fit_from) & (t > origin))
    if below.size == 0:
        return nan
    start = below[0]
    ended = np.flatnonzero(~(y[start:] > floor))
    stop = start + (ended[0] if ended.size else y.size - start)
    if stop - start < 8:
        return nan
    tt, ly = t[start:stop], np.log(y[start:stop])
    lt = np.log(tt - origin)
    _, _, exp_r2 = _line(tt, ly)
    _, _, pow_r2 = _line(lt, ly)
    out = {"exp_r2": exp_r2, "power_r2": pow_r2, "fit_start": float(tt[0]), "fit_end": float(tt[-1])}
    for name, u in (("exp", tt), ("power", lt)):
        first = min(settled_from(u, ly, settle), u.size - 4)
        slope, level, _ = _line(u[first:], ly[first:])
        key = "exp_rate" if name == "exp" else "power_exponent"
        out.update({key: -slope, f"{name}_log_amplitude": level, f"{name}_start": float(tt[first])})
    return out


def norm_line(t: np.ndarray, norm: np.ndarray) -> tuple[float, float]:
    """The growth c and origin $t_0$ of $|x| \\approx c (t - t_0)$, fitted on the second half
    of the run; (0, 0) for a norm that does not grow (the sphere)."""
    late = t >= t[-1] / 2
    c, b = np.polyfit(t[late], norm[late], 1)
    if not c > 1e-6 * np.abs(norm[late]).max():
        return 0.0, 0.0
    return float(c), float(-b / c)


class Normalization(Experiment):
    title = "Post-LN collapses exponentially, pre-LN polynomially"
    paper = (
        "post-LN: the sphere model of A Survey of Continuous Time Dynamics of Transformers; pre-LN: the "
        "same attention on the residual stream"
    )
    coordinates = {
        "scheme": ("normalization scheme: post_ln or pre_ln", None),
        "scheme_name": ("the normalization scheme in words", None),
    }
    Options = Options

    def check(self) -> None:
        cfg, options = self.cfg, self.options
        check_member_option(options, cfg.members)
        if not 0 < options.settle < 1:
            raise ConfigError(f"experiment.options.settle must be a fraction in (0, 1), got {options.settle!r}.")
        if not (0 < options.floor < options.fit_from < 1):
            raise ConfigError(
                f"experiment.options needs 0 < floor < fit_from < 1, got floor={options.floor} and "
                f"fit_from={options.fit_from}."
            )
        if not cfg.save_states:
            raise ConfigError(
                "experiment normalization reads the cosines and norms from the states: keep save_states=true."
            )
        if cfg.scheme != "sphere":
            raise ConfigError(
                f"experiment normalization sets the schemes itself (sphere, then pre); keep scheme=sphere, "
                f"got scheme={cfg.scheme}."
            )

    def panels(self, base: dict) -> dict[str, dict]:
        """Post-LN as configured (on the sphere) and pre-LN with a unit-gain normalization."""
        pre = copy.deepcopy(base)
        pre["scheme"] = "pre"
        pre["token_norm"].update(kind=str(self.options.pre_norm), eps=0.0, gamma=float(base["d"]) ** -0.5, shift=None)
        return {"post_ln": base, "pre_ln": pre}

    def analyse(self, results: dict[str, xr.Dataset], *, on_piece: Counter, keep: Keeper) -> xr.Dataset:
        labels = list(results)
        first = results[labels[0]]
        t = first["time"].values
        fit_from, floor = self.options.fit_from, self.options.floor
        series, norms, failed = [], [], []
        for label in labels:
            x = results[label]["x"].values  # (member, time, token, dim)
            series.append(collapse(x))
            norms.append(np.linalg.norm(x, axis=-1).mean(-1))
            failed.append(int((results[label]["status"] != 0).sum()))
        series = np.stack(series)  # (scheme, member, time)
        with np.errstate(divide="ignore"):
            gmean = np.exp(np.mean(np.log(series), axis=1))
        ds = xr.Dataset(coords={"scheme": labels, "member": first["member"].values, "time": t})
        ds = ds.assign_coords(scheme_name=("scheme", [SCHEMES.get(label, label) for label in labels]))
        ds["collapse"] = xr.DataArray(series, dims=("scheme", "member", "time")).assign_attrs(
            description="1 - mean cosine over pairs of distinct tokens"
        )
        ds["collapse_gmean"] = xr.DataArray(gmean, dims=("scheme", "time")).assign_attrs(
            description="geometric mean over members of 1 - mean cosine"
        )
        ds["token_norm"] = xr.DataArray(np.stack(norms), dims=("scheme", "member", "time")).assign_attrs(
            description="mean norm |x_i| of the tokens (the residual stream for pre-LN; 1 on the sphere)"
        )
        settle = self.options.settle
        norms = np.stack(norms)  # (scheme, member, time)
        lines = [norm_line(t, norms[k].mean(0)) for k in range(len(labels))]
        member_lines = [[norm_line(t, norms[k, m]) for m in range(norms.shape[1])] for k in range(len(labels))]
        fits = [fit_rates(t, gmean[k], fit_from, floor, lines[k][1], settle) for k in range(len(labels))]
        member_fits = [
            [fit_rates(t, series[k, m], fit_from, floor, member_lines[k][m][1], settle) for m in range(series.shape[1])]
            for k in range(len(labels))
        ]
        ds["norm_growth"] = xr.DataArray([c for c, _ in lines], dims="scheme").assign_attrs(
            description="c of |x| ~ c (t - t_0), mean token norm fitted on the second half of the run (0 on the sphere)"
        )
        ds["norm_origin"] = xr.DataArray([t0 for _, t0 in lines], dims="scheme").assign_attrs(
            description="t_0 of |x| ~ c (t - t_0): where the residual stream's linear growth starts (0 on the sphere)"
        )
        ds["norm_origin_member"] = xr.DataArray(
            [[t0 for _, t0 in row] for row in member_lines], dims=("scheme", "member")
        ).assign_attrs(description="t_0 of |x| ~ c (t - t_0), per member")
        for key, text in _FIT_DESCRIPTIONS.items():
            ds[key] = xr.DataArray([f[key] for f in fits], dims="scheme").assign_attrs(
                description=f"{text}, on the geometric mean over members"
            )
            ds[f"{key}_member"] = xr.DataArray(
                [[f[key] for f in row] for row in member_fits], dims=("scheme", "member")
            ).assign_attrs(description=f"{text}, per member")
        ds["failed_members"] = xr.DataArray(failed, dims="scheme").assign_attrs(
            description="members whose solve failed, per scheme"
        )
        return ds

    @staticmethod
    def draw(ds: xr.Dataset) -> dict[str, Figure]:
        cfg = config_of(ds)
        options = cfg["experiment"]["options"]
        member = int(options["member"])
        t = ds["time"].values
        positive = t > 0
        fig, axes = subplots(1, 3, figsize=(14.0, 4.4), layout="constrained")
        colors = {label: f"C{k}" for k, label in enumerate(ds["scheme"].values)}
        for ax, kind in ((axes[0], "power"), (axes[1], "exp")):
            for label in ds["scheme"].values:
                part = ds.sel(scheme=label)
                color = colors[label]
                for m in ds["member"].values:
                    ax.plot(
                        t[positive],
                        part["collapse"].sel(member=m).values[positive],
                        color=color,
                        linewidth=1.0 if m == member else 0.5,
                        alpha=0.8 if m == member else 0.3,
                    )
                r2 = {key: float(part[key]) for key in ("exp_r2", "power_r2")}
                ax.plot(
                    t[positive],
                    part["collapse_gmean"].values[positive],
                    color=color,
                    linewidth=2,
                    label=f"{part['scheme_name'].item()}: R$^2$ exp {r2['exp_r2']:.3f}, power {r2['power_r2']:.3f}",
                )
                start, end = float(part[f"{kind}_start"]), float(part["fit_end"])
                better = (r2["power_r2"] > r2["exp_r2"]) == (kind == "power")
                if np.isfinite(start) and better:  # each scheme's fit where its model is the one it follows
                    window = np.geomspace(start, end, 50)
                    if kind == "power":
                        p, origin = float(part["power_exponent"]), float(part["norm_origin"])
                        fit = np.exp(float(part["power_log_amplitude"])) * (window - origin) ** (-p)
                        text = f"(t - {origin:.2g})$^{{-{p:.2f}}}$" if origin else f"t$^{{-{p:.2f}}}$"
                    else:
                        r = float(part["exp_rate"])
                        fit = np.exp(float(part["exp_log_amplitude"]) - r * window)
                        text = f"e$^{{-{r:.2f}t}}$"
                    ax.plot(window, fit, color="k", linestyle="--", linewidth=1)
                    ax.annotate(text, (window[-1], fit[-1]), textcoords="offset points", xytext=(4, 0), fontsize=8)
            ax.set_yscale("log")
            ax.set_xlabel("time t" + (" (log)" if kind == "power" else ""))
            ax.set_ylabel(r"$1 - $ mean cosine over pairs")
        axes[0].set_xscale("log")
        axes[0].set_title("(a) log-log: a power law is a line (dashed: power-law fit)")
        axes[1].set_title("(b) semilog: an exponential is a line (dashed: exponential fit)")
        # The power law of pre-LN is one in t - t_0, the origin of the residual stream's growth.
        axes[0].legend(loc="lower left")
        ax = axes[2]
        for label in ds["scheme"].values:
            part = ds.sel(scheme=label)
            ax.plot(t[positive], part["token_norm"].values[:, positive].T, color=colors[label], linewidth=0.8)
            ax.plot([], [], color=colors[label], label=part["scheme_name"].item())
        for label in ds["scheme"].values:
            part = ds.sel(scheme=label)
            c, origin = float(part["norm_growth"]), float(part["norm_origin"])
            if c > 0:
                late = c * (t - origin) >= 1.0
                ax.plot(
                    t[late],
                    c * (t[late] - origin),
                    color="k",
                    linestyle=":",
                    linewidth=1,
                    label=f"|x| = {c:.2f} (t - {origin:.2g})",
                )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("time t (log)")
        ax.set_ylabel(r"mean token norm $|x_i|$")
        ax.set_title("(c) the pre-LN residual stream grows like t")
        ax.legend(loc="upper left")
        fits = {label: ds.sel(scheme=label) for label in ds["scheme"].values}
        words = "; ".join(
            f"{part['scheme_name'].item()}: exp rate {float(part['exp_rate']):.2f} (t in "
            f"[{float(part['exp_start']):.3g}, {float(part['fit_end']):.3g}]), power exponent "
            f"{float(part['power_exponent']):.2f} in t - {float(part['norm_origin']):.2g} (t in "
            f"[{float(part['power_start']):.3g}, {float(part['fit_end']):.3g}]), "
            f"$R^{{2}}$ over [{float(part['fit_start']):.3g}, {float(part['fit_end']):.3g}]: exp "
            f"{float(part['exp_r2']):.4f}, power {float(part['power_r2']):.4f}"
            for part in fits.values()
        )
        caption(
            fig,
            (
                f"Softmax attention with Ginibre Q, K, V drawn per member, n = {cfg['n']}, d = {cfg['d']}, $\\beta$ = "
                f"sqrt(d) = {cfg['beta']:.3g}, {ds.sizes['member']} members (thin; member {member} darker; thick: "
                f"geometric mean), unit initial tokens uniform on the sphere, {cfg['solver']} with dt = {cfg['dt']} in "
                f"{cfg['dtype']}. Post-LN keeps the tokens on the sphere; pre-LN feeds x/|x| ({options['pre_norm']} "
                "norm with gain d^(-1/2)) to attention and adds the update to the residual stream. 1 - mean cosine is "
                "computed as $\\frac{1}{n - 1} \\sum_i |u_i - \\bar u|^2$, exact far below 1e-16. Fits on the "
                f"geometric mean, between 1 - cos = {options['fit_from']:g} and {options['floor']:g}; the rate and the "
                f"exponent only where the local slope has settled (within {options.get('settle', 0.02):g} of its end "
                f"value), the power law in t - t_0 with t_0 the origin of the fitted growth |x| = c (t - t_0): {words}."
            ),
            width=175,
        )
        return {"normalization": fig}
