"""Post-LN against pre-LN: exponential against polynomial collapse of the tokens.

Two places for the normalization around softmax self-attention with random weights:

- post-LN (`norm=sphere`): the tokens live on the unit sphere,
  $\\dot x_i = P^\\perp_{x_i} \\sum_j P_{ij} V x_j$ (the survey's model);
- pre-LN (`norm=pre`): the residual stream $x_i$ is free and attention reads the
  normalized tokens, $\\dot x_i = \\sum_j P_{ij}(N(X))\\, V N(x_j)$, with $N$ the RMSNorm
  (or LayerNorm, option `pre_norm`) of gain $d^{-1/2}$, so that $N(x_i) = x_i/|x_i|$: the
  very tokens post-LN would see, with the same $\\beta$.

With the same random Q, K, V (Ginibre, drawn per member) and the same initial tokens,
both collapse towards one direction, but at different speeds. On the sphere the
cosines approach 1 exponentially: $1 - \\overline{\\cos} \\sim e^{-rt}$. In pre-LN every
update has norm at most $|V|$ while the aligned updates add up, so $|x_i|$ grows like
$t$ and the directions $x_i/|x_i|$ move like the post-LN ones slowed down by $1/|x_i|$:
a time change $s \\sim \\log t$ turns the exponential into a power law,
$1 - \\overline{\\cos} \\sim t^{-p}$. This is the known contrast between the two
placements of the normalization (exponential rank collapse with post-LN, polynomial with
pre-LN).

Measured from the saved states: `collapse` $= 1 - $ the mean cosine over pairs
$i \\ne j$, computed without cancellation as $\\frac{1}{n-1}\\sum_i |u_i - \\bar u|^2$
($u_i = x_i/|x_i|$), so that it can be followed far below $10^{-16}$; the mean token norm.
Fitted on the geometric mean over members (and on every member), once the collapse is
below `fit_from` and until it reaches `floor`: an exponential (the slope of
$\\log(1 - \\overline{\\cos})$ against $t$) and a power law (its slope against $\\log t$),
each with its coefficient of determination $R^2$. Post-LN is fitted better by the
exponential, pre-LN by the power law, and post-LN ends far more collapsed.

n = 32 tokens, 4 members, d = 512, $\\beta = \\sqrt d$ (logits of order one, as the
$1/\\sqrt d$ of a transformer on tokens of norm $\\sqrt d$), to t = 60 with RK4 at
dt = 0.2 and log-spaced output: long enough for two decades of t in the pre-LN power
law, while post-LN reaches the round-off of float64 unit vectors by t of about 30.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import xarray as xr

from .._errors import ConfigError
from ._common import caption, config_of, pyplot, save

TITLE = "Post-LN collapses exponentially, pre-LN polynomially"
PAPER = ("post-LN: the sphere model of A Survey of Continuous Time Dynamics of Transformers; pre-LN: the "
         "same attention on the residual stream")
OPTIONS = {
    "member": 0,  # the member drawn darker
    "pre_norm": "rms",  # N of pre-LN: rms or layer, gain d^{-1/2}
    "fit_from": 0.1,  # the fits start once 1 - mean cosine is below this
    "floor": 1.0e-24,  # and stop once it is below this
}
SCHEMES = {"post_ln": "post-LN (sphere)", "pre_ln": "pre-LN (residual stream)"}


def check(cfg, options) -> None:
    member = options["member"]
    if not (isinstance(member, int) and 0 <= member < cfg.members):
        raise ConfigError(f"experiment.options.member must be a member index from 0 to {cfg.members - 1}, "
                          f"got {member!r}.")
    if options["pre_norm"] not in ("rms", "layer"):
        raise ConfigError(f"experiment.options.pre_norm must be rms or layer, got {options['pre_norm']!r}.")
    if not (0 < float(options["floor"]) < float(options["fit_from"]) < 1):
        raise ConfigError(f"experiment.options needs 0 < floor < fit_from < 1, got floor={options['floor']} and "
                          f"fit_from={options['fit_from']}.")
    if not cfg.save_states:
        raise ConfigError("experiment normalization reads the cosines and norms from the states: keep "
                          "save_states=true.")
    if cfg.norm != "sphere":
        raise ConfigError(f"experiment normalization sets the schemes itself (sphere, then pre); keep norm=sphere, "
                          f"got norm={cfg.norm}.")


def panels(base: dict, options) -> dict[str, dict]:
    """Post-LN as configured (on the sphere) and pre-LN with a unit-gain normalization."""
    pre = copy.deepcopy(base)
    pre["norm"] = "pre"
    pre["token_norm"].update(kind=options["pre_norm"], eps=0.0, gamma=float(base["d"]) ** -0.5, shift=None)
    return {"post_ln": base, "pre_ln": pre}


def collapse(x: np.ndarray) -> np.ndarray:
    """$1 - $ the mean cosine over pairs $i \\ne j$ of tokens x (..., n, d), as
    $\\frac{1}{n-1}\\sum_i |u_i - \\bar u|^2$, free of the cancellation of $1 - \\cos$."""
    u = x / np.linalg.norm(x, axis=-1, keepdims=True)
    n = x.shape[-2]
    return np.asarray(np.sum((u - u.mean(-2, keepdims=True)) ** 2, axis=(-1, -2)) / (n - 1))


_FIT_DESCRIPTIONS = {
    "exp_rate": "r of the exponential fit 1 - mean cos ~ exp(-r t) (minus the slope of log(1 - cos) against t)",
    "exp_log_amplitude": "log A of the exponential fit A exp(-r t)",
    "exp_r2": "R^2 of the exponential fit (a line in (t, log(1 - cos)))",
    "power_exponent": "p of the power-law fit 1 - mean cos ~ t^(-p) (minus the slope against log t)",
    "power_log_amplitude": "log A of the power-law fit A t^(-p)",
    "power_r2": "R^2 of the power-law fit (a line in (log t, log(1 - cos)))",
    "fit_start": "first time of the fit window",
    "fit_end": "last time of the fit window",
}


def fit_rates(t: np.ndarray, y: np.ndarray, fit_from: float, floor: float) -> dict[str, float]:
    """Exponential and power-law fits of the series y(t) on the window that starts when
    y drops below `fit_from` and ends before it drops below `floor`: rate r of
    $y \\sim e^{-rt}$, exponent p of $y \\sim t^{-p}$, and the $R^2$ of each line in log y."""
    nan = dict.fromkeys(_FIT_DESCRIPTIONS, np.nan)
    below = np.flatnonzero((y < fit_from) & (t > 0))
    if below.size == 0:
        return nan
    start = below[0]
    ended = np.flatnonzero(~(y[start:] > floor))
    stop = start + (ended[0] if ended.size else y.size - start)
    if stop - start < 4:
        return nan
    tt, ly = t[start:stop], np.log(y[start:stop])

    def line(u: np.ndarray) -> tuple[float, float, float]:
        slope, intercept = np.polyfit(u, ly, 1)
        residual = ly - (slope * u + intercept)
        return float(slope), float(intercept), float(1 - np.sum(residual**2) / np.sum((ly - ly.mean()) ** 2))

    exp_slope, exp_level, exp_r2 = line(tt)
    pow_slope, pow_level, pow_r2 = line(np.log(tt))
    return {"exp_rate": -exp_slope, "exp_log_amplitude": exp_level, "exp_r2": exp_r2,
            "power_exponent": -pow_slope, "power_log_amplitude": pow_level, "power_r2": pow_r2,
            "fit_start": float(tt[0]), "fit_end": float(tt[-1])}


def analyse(cfg, options, results: dict[str, xr.Dataset]) -> xr.Dataset:
    labels = list(results)
    first = results[labels[0]]
    t = first["time"].values
    fit_from, floor = float(options["fit_from"]), float(options["floor"])
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
        description="1 - mean cosine over pairs of distinct tokens")
    ds["collapse_gmean"] = xr.DataArray(gmean, dims=("scheme", "time")).assign_attrs(
        description="geometric mean over members of 1 - mean cosine")
    ds["token_norm"] = xr.DataArray(np.stack(norms), dims=("scheme", "member", "time")).assign_attrs(
        description="mean norm |x_i| of the tokens (the residual stream for pre-LN; 1 on the sphere)")
    fits = [fit_rates(t, gmean[k], fit_from, floor) for k in range(len(labels))]
    member_fits = [[fit_rates(t, series[k, m], fit_from, floor) for m in range(series.shape[1])]
                   for k in range(len(labels))]
    for key, text in _FIT_DESCRIPTIONS.items():
        ds[key] = xr.DataArray([f[key] for f in fits], dims="scheme").assign_attrs(
            description=f"{text}, on the geometric mean over members")
        ds[f"{key}_member"] = xr.DataArray([[f[key] for f in row] for row in member_fits],
                                           dims=("scheme", "member")).assign_attrs(description=f"{text}, per member")
    ds["failed_members"] = xr.DataArray(failed, dims="scheme").assign_attrs(
        description="members whose solve failed, per scheme")
    return ds


def draw(ds: xr.Dataset, folder: Path) -> list[Path]:
    plt = pyplot()
    cfg = config_of(ds)
    options = cfg["experiment"]["options"]
    member = int(options["member"])
    t = ds["time"].values
    positive = t > 0
    fig, axes = plt.subplots(1, 3, figsize=(14.0, 4.4), layout="constrained")
    colors = {label: f"C{k}" for k, label in enumerate(ds["scheme"].values)}
    for ax, kind in ((axes[0], "power"), (axes[1], "exp")):
        for label in ds["scheme"].values:
            part = ds.sel(scheme=label)
            color = colors[label]
            for m in ds["member"].values:
                ax.plot(t[positive], part["collapse"].sel(member=m).values[positive], color=color,
                        linewidth=1.0 if m == member else 0.5, alpha=0.8 if m == member else 0.3)
            r2 = {key: float(part[key]) for key in ("exp_r2", "power_r2")}
            ax.plot(t[positive], part["collapse_gmean"].values[positive], color=color, linewidth=2,
                    label=f"{part['scheme_name'].item()}: R$^2$ exp {r2['exp_r2']:.3f}, power {r2['power_r2']:.3f}")
            start, end = float(part["fit_start"]), float(part["fit_end"])
            if np.isfinite(start):
                window = np.geomspace(start, end, 50)
                if kind == "power":
                    p = float(part["power_exponent"])
                    fit = np.exp(float(part["power_log_amplitude"])) * window ** (-p)
                    text = f"t$^{{-{p:.2f}}}$"
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
    axes[0].set_title("(a) log-log: a power law is a line (dashed: power-law fits)")
    axes[1].set_title("(b) semilog: an exponential is a line (dashed: exponential fits)")
    axes[0].legend(loc="lower left")
    ax = axes[2]
    for label in ds["scheme"].values:
        part = ds.sel(scheme=label)
        ax.plot(t[positive], part["token_norm"].values[:, positive].T, color=colors[label], linewidth=0.8)
        ax.plot([], [], color=colors[label], label=part["scheme_name"].item())
    ax.plot(t[positive], t[positive], color="k", linestyle=":", linewidth=1, label="|x| = t")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("time t (log)")
    ax.set_ylabel(r"mean token norm $|x_i|$")
    ax.set_title("(c) the pre-LN residual stream grows like t")
    ax.legend(loc="upper left")
    fits = {label: ds.sel(scheme=label) for label in ds["scheme"].values}
    words = "; ".join(
        f"{part['scheme_name'].item()}: exp rate {float(part['exp_rate']):.2f}, power exponent "
        f"{float(part['power_exponent']):.2f} (fit on t in [{float(part['fit_start']):.3g}, "
        f"{float(part['fit_end']):.3g}])" for part in fits.values())
    caption(fig, (
        f"Softmax attention with Ginibre Q, K, V drawn per member, n = {cfg['n']}, d = {cfg['d']}, beta = "
        f"sqrt(d) = {cfg['beta']:.3g}, {ds.sizes['member']} members (thin; member {member} darker; thick: geometric "
        f"mean), unit initial tokens uniform on the sphere, {cfg['solver']} with dt = {cfg['dt']} in {cfg['dtype']}. "
        f"Post-LN keeps the tokens on the sphere; pre-LN feeds x/|x| ({options['pre_norm']} norm with gain "
        f"d^(-1/2)) to attention and adds the update to the residual stream. 1 - mean cosine is computed as "
        f"sum_i |u_i - mean u|^2 / (n - 1), exact far below 1e-16. Fits on the geometric mean, from 1 - cos < "
        f"{options['fit_from']:g} to {options['floor']:g}: {words}."), width=175)
    return save(fig, folder, "normalization")
