"""The noise-driven phase transition of unnormalized attention on the sphere.

Tokens under unnormalized attention (`attention_kind=usa`) with Q = K = V = I on
$S^{d-1}$, plus Brownian noise of strength sigma (`noise.sigma`, the Brownian motion of
the sphere), from uniform initial tokens. The mean-field (McKean-Vlasov) equation of this
system keeps the uniform law linearly stable exactly above
$\\sigma_c(\\beta, d) = \\sqrt{2 A(\\beta)}$, $A(\\beta) = \\Gamma(d/2)(2/\\beta)^{d/2-1} I_{d/2}(\\beta)/\\beta$
(`attnflow.critical_sigma`; docs/model.md, "Noise"). Below it the first spherical
harmonic grows and the tokens gather: the order parameter $|\\frac1n\\sum_i x_i|$ settles
at a value of order one; above it the order parameter stays at the finite-n floor of
uniform tokens, of order $1/\\sqrt n$.

One panel per (n, sigma), n from the `sizes` of the options (the config's `n` is
replaced), with the options' `members` at each size (null: the config's), sigma =
ratio x sigma_c for the `ratios` of the options, each a study of its own: the panels of
one n share one compiled program (sigma is data). The config's `summation` and
`noise.path` apply to every panel: the default, `summation=auto` and
`noise.path=increments`, sums the attention in harmonics from n = 240 (n L per step,
L = 7 at beta = 1) and draws one normal per step, which is what reaches n = 1e6.
`analyse` time-averages each member's order parameter over the late window (the last
`late` fraction of [t0, t1]) and averages over members (`order`, with its standard
error), records the floor (the mean order parameter of the uniform tokens at t0), and
measures the threshold from the disordered side: there the first mode of the empirical
measure is a linear (Ornstein-Uhlenbeck) fluctuation whose variance, by the rate of
docs/model.md, is $E|m|^2 = 1/(n(1 - \\sigma_c^2/\\sigma^2))$; the line
$1/(n E|m|^2)$ against $1/\\sigma^2$, fitted over the ratios above `disordered_from`,
vanishes at the measured threshold (`measured_threshold`). The runs take the Euler step
with projected noise, and the step has a threshold of its own above sigma_c (by
$\\sigma_c (d+1) A(\\beta) h/4$ to first order in the step h: 2.2% at the default dt and beta;
`attnflow.euler_critical_sigma`, docs/model.md "Noise"): the results record it
(`step_threshold`) and the step's $n E|m|^2$ above it (`step_susceptibility`), and the
measured threshold estimates it, not sigma_c; so the experiment takes `solver=euler`,
`noise.kind=projected` and a constant strength only. On the circle (d = 2) it
also records the mean-field prediction of the ordered side, the order parameter of the
stationary density (`attnflow.analysis.meanfield.circle_stationary_order`), at the
panels' sigma (`meanfield_order`) and on a fine grid of sigma for the figure
(`meanfield_curve`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..schema._errors import ConfigError
from ..schema._schema import setting
from ._common import caption, config_of, figure
from ._experiment import Counter, Experiment, Keeper
from ._lazy import lazy

if TYPE_CHECKING:
    import xarray as xr
    from matplotlib.figure import Figure

    from ..analysis import meanfield
    from ..numerics import _grid, _noise
else:
    xr = lazy("xarray")
    meanfield = lazy("attnflow.analysis.meanfield")
    _grid = lazy("attnflow.numerics._grid")
    _noise = lazy("attnflow.numerics._noise")


@dataclass
class Options:
    sizes: list[int] = setting(
        [32, 128, 512, 2048, 10000, 1000000], "the numbers of tokens n, one set of panels each (tiled above 1024)"
    )
    members: list[int] | None = setting(
        [64, 32, 16, 16, 8, 1],
        "members at each size, one per entry of sizes (null: the config's members at every size)",
        repeats=True,
    )
    ratios: list[float] = setting([0.6, 0.8, 0.9, 1.0, 1.1, 1.2, 1.35, 1.5], "sigma / sigma_c of the panels")
    late: float = setting(0.33333, "the order parameter is averaged over this last fraction of [t0, t1]")
    disordered_from: float = setting(
        1.15, "the ratios above fit the susceptibility 1/(n E|m|^2) = 1 - sigma_c^2/sigma^2"
    )


def members_per_size(sizes: list[int], members: list[int] | None, config: dict) -> list[int]:
    """The members at each size: the options' `members`, or the config's at every size."""
    return list(members) if members else [config["members"]] * len(sizes)


def meanfield_predictions(beta: float, d: int, sigma) -> tuple[dict, np.ndarray]:
    """The mean-field order parameter of the stationary density on the circle (d = 2;
    none on other spheres) at the panels' `sigma` (`meanfield_order`) and on a grid of
    sigma over their range, refined toward sigma_c (`meanfield_curve`); with that grid."""
    if d != 2:
        return {}, np.zeros(0)
    sigma_c = _noise.critical_sigma(beta, d)
    # One grid holds the panels' sigma too, so that each sigma is solved once.
    curve = np.unique(
        np.concatenate([sigma, np.linspace(sigma.min(), sigma.max(), 49), sigma_c * (1 - np.geomspace(1e-3, 0.1, 12))])
    )
    curve = curve[(curve >= sigma.min()) & (curve <= sigma.max())]
    order = np.asarray([meanfield.circle_stationary_order(beta, s) for s in curve])
    return {
        "meanfield_order": (
            ("ratio",),
            order[np.searchsorted(curve, sigma)],
            {
                "description": "order parameter of the stationary density of the mean-field equation (0 from "
                "sigma_c on: the uniform law)",
                "units": "1",
            },
        ),
        "meanfield_curve": (
            ("curve_sigma",),
            order,
            {
                "description": "order parameter of the stationary density of the mean-field equation, on a fine "
                "grid of sigma",
                "units": "1",
            },
        ),
    }, curve


def step_predictions(beta: float, d: int, h: float, sigma) -> dict:
    """The threshold of the step the runs take (`attnflow.euler_critical_sigma`, Euler with
    projected noise at the step h) and, at the panels' `sigma` above it, the stationary
    n E|m|^2 = (1 - c^2)/(1 - a^2) of its linear recursion m -> a m + noise
    (`attnflow.euler_first_mode_factor`; docs/model.md, "Noise")."""
    susceptibility = np.full(len(sigma), np.nan)
    for j, s in enumerate(sigma):
        a, c = _noise.euler_first_mode_factor(beta, d, float(s), h)
        if a < 1:
            susceptibility[j] = (1 - c**2) / (1 - a**2)
    return {
        "step_threshold": (
            (),
            _noise.euler_critical_sigma(beta, d, h),
            {
                "description": "linear stability threshold of the uniform law for the Euler step with projected "
                "noise at the run's dt (n -> infinity): what measured_threshold estimates",
                "units": "1",
            },
        ),
        "step_susceptibility": (
            ("ratio",),
            susceptibility,
            {
                "description": "n E|m|^2 of the step's linear fluctuation of the uniform law, (1 - c^2)/(1 - a^2) "
                "(n -> infinity; nan at and below step_threshold)",
                "units": "1",
            },
        ),
    }


def ordering_time(beta: float, h: float, sigma, order, floor) -> tuple:
    r"""The time the first mode takes to grow from the floor of uniform tokens to the mean
    field's stationary order parameter at the step's linear rate,
    $t_* = \log(r_{\mathrm{mf}} / r_0) / \lambda$ with $\lambda = \log(a) / h$ and a the step's
    factor (`attnflow.euler_first_mode_factor`), per (n, sigma); NaN where the mean field
    has no order (from sigma_c on). It grows like $\log(n)/2\lambda$: where it exceeds the
    late window's start, the tokens are still ordering in the window."""
    times = np.full((len(floor), len(sigma)), np.nan)
    for j, (s, r) in enumerate(zip(sigma, order)):
        a, _ = _noise.euler_first_mode_factor(beta, 2, float(s), h)
        if r > 0 and a > 1:
            times[:, j] = np.log(r / np.asarray(floor)) / (np.log(a) / h)
    return (
        ("n", "ratio"),
        times,
        {
            "description": "time for the first mode to grow from the floor to meanfield_order at the step's linear "
            "rate, log(meanfield_order / floor) / lambda (nan where the mean field is disordered)",
            "units": "1",
        },
    )


class NoiseTransition(Experiment):
    title = "Noise-driven phase transition of unnormalized attention on the sphere"
    paper = (
        "A mathematical perspective on Transformers (noisy dynamics and the mean-field limit); "
        "the linear stability threshold sigma_c of docs/model.md"
    )
    Options = Options
    coordinates = {
        "n": ("number of tokens", "1"),
        "ratio": ("noise strength over the predicted critical one, sigma / sigma_c", "1"),
        "sigma": ("noise strength sigma", "1"),
        "curve_sigma": ("noise strength sigma of the mean-field curve", "1"),
    }

    def check(self) -> None:
        cfg, options = self.cfg, self.options
        ratios = options.ratios
        if not ratios or any(not isinstance(r, (int, float)) or r <= 0 for r in ratios) or sorted(ratios) != ratios:
            raise ConfigError(
                f"experiment.options.ratios must be increasing positive numbers (sigma / sigma_c), got {ratios!r}."
            )
        # Each ratio is a panel labelled by its 6 significant digits: two ratios that share them would be one panel,
        # read back for both.
        labels = [f"{r:g}" for r in ratios]
        same = next((r for r, label in zip(ratios, labels) if labels.count(label) > 1), None)
        if same is not None:
            others = [r for r, label in zip(ratios, labels) if label == f"{same:g}"]
            raise ConfigError(
                f"experiment.options.ratios holds {' and '.join(map(repr, others))}, one panel "
                f"(ratio={same:g}); give ratios that differ in their first 6 significant digits."
            )
        above = [r for r in ratios if r > options.disordered_from]
        if len(above) < 2:
            raise ConfigError(
                f"experiment.options.disordered_from={options.disordered_from!r} leaves "
                f"{len(above)} of the ratios {ratios!r} above it; the measured threshold is a line "
                f"fitted on the ratios above it, so give at least two there."
            )
        if not 0 < options.late <= 1:
            raise ConfigError(f"experiment.options.late must be in (0, 1], got {options.late!r}.")
        if cfg.attention_kind != "usa" or cfg.scheme != "sphere" or cfg.mlp.enabled or not cfg.attention:
            raise ConfigError(
                "experiment noise_transition is the unnormalized attention of the sphere alone: keep "
                "attention_kind=usa, scheme=sphere, attention=true and mlp.enabled=false."
            )
        noise = cfg.noise
        if (
            cfg.solver != "euler"
            or noise.kind != "projected"
            or noise.switch_times
            or noise.factors
            or noise.poly is not None
        ):
            raise ConfigError(
                "experiment noise_transition compares with the threshold of the Euler step with projected noise of "
                "constant strength: keep solver=euler, noise.kind=projected, noise.switch_times=[], noise.factors=[] "
                "and noise.poly=null."
            )
        if any(getattr(cfg.weights, m).kind != "identity" or getattr(cfg.weights, m).scale != 1 for m in "qkv"):
            raise ConfigError(
                "experiment noise_transition predicts sigma_c for Q = K = V = I: keep weights.q, k and v the identity."
            )
        if isinstance(cfg.d, list) or isinstance(cfg.beta, list):
            raise ConfigError("experiment noise_transition takes one d and one beta (its panels are n and sigma).")
        sizes = options.sizes
        if not sizes or any(isinstance(n, bool) or not isinstance(n, int) or n < 2 for n in sizes):
            raise ConfigError(
                f"experiment.options.sizes must be a non-empty list of whole numbers n >= 2, got {sizes!r}."
            )
        members = options.members
        if members is not None and (
            not isinstance(members, list)
            or len(members) != len(sizes)
            or any(isinstance(m, bool) or not isinstance(m, int) or m < 1 for m in members)
        ):
            raise ConfigError(
                f"experiment.options.members must be null or one whole number >= 1 per size ({len(sizes)} here), "
                f"got {members!r}; experiment.options.members=null takes the config's members at every size."
            )

    def panels(self, base: dict) -> dict[str, dict]:
        sigma_c = _noise.critical_sigma(float(base["beta"]), int(base["d"]))
        configs = {}
        for n, count in zip(self.options.sizes, members_per_size(self.options.sizes, self.options.members, base)):
            for ratio in self.options.ratios:
                configs[f"n={n},ratio={ratio:g}"] = {
                    **base,
                    "n": n,
                    "members": count,
                    "noise": {**base["noise"], "sigma": ratio * sigma_c},
                }
        return configs

    def analyse(self, results: dict[str, xr.Dataset], *, on_piece: Counter, keep: Keeper) -> xr.Dataset:
        cfg, options = self.cfg, self.options
        sizes, ratios = [int(n) for n in options.sizes], [float(r) for r in options.ratios]
        sigma_c = _noise.critical_sigma(float(cfg.beta), int(cfg.d))
        order = np.empty((len(sizes), len(ratios)))
        error, square = np.empty_like(order), np.empty_like(order)
        floor = np.empty(len(sizes))
        for i, n in enumerate(sizes):
            starts = []
            for j, ratio in enumerate(ratios):
                ds = results[f"n={n},ratio={ratio:g}"]
                r = ds["order_parameter"].transpose("member", "time")
                t = ds["time"].values
                window = t >= cfg.t1 - options.late * (cfg.t1 - cfg.t0) - 1e-12
                per_member = r.values[:, window].mean(axis=1)
                order[i, j] = per_member.mean()
                square[i, j] = (r.values[:, window] ** 2).mean()
                error[i, j] = per_member.std(ddof=1) / np.sqrt(per_member.size) if per_member.size > 1 else np.nan
                starts.append(r.values[:, 0])
            floor[i] = np.concatenate(starts).mean()
        sigma = np.asarray(ratios) * sigma_c
        # 1/(n E|m|^2) = 1 - sigma_c^2/sigma^2 on the disordered side: a line in 1/sigma^2
        # whose zero is the measured threshold.
        fit = np.asarray(ratios) > options.disordered_from
        measured = np.full(len(sizes), np.nan)
        if fit.sum() >= 2:
            for i, n in enumerate(sizes):
                slope, intercept = np.polyfit(sigma[fit] ** -2.0, 1 / (n * square[i, fit]), 1)
                measured[i] = np.sqrt(-slope / intercept) if slope < 0 < intercept else np.nan
        predictions, curve = meanfield_predictions(float(cfg.beta), int(cfg.d), sigma)
        h = (cfg.t1 - cfg.t0) / _grid.step_count(cfg.t0, cfg.t1, cfg.dt)  # pyright: ignore[reportArgumentType]  # noise takes fixed steps: dt is set
        if "meanfield_order" in predictions:
            predictions["ordering_time"] = ordering_time(
                float(cfg.beta), h, sigma, predictions["meanfield_order"][1], floor
            )
        return xr.Dataset(
            {
                **predictions,
                **step_predictions(float(cfg.beta), int(cfg.d), h, sigma),
                "order": (
                    ("n", "ratio"),
                    order,
                    {
                        "description": "order parameter |mean_i x_i| averaged over the late window and the members",
                        "units": "1",
                    },
                ),
                "order_square": (
                    ("n", "ratio"),
                    square,
                    {"description": "|mean_i x_i|^2 averaged over the late window and the members", "units": "1"},
                ),
                "order_error": (
                    ("n", "ratio"),
                    error,
                    {"description": "standard error over members of the late-window order parameter", "units": "1"},
                ),
                "floor": (
                    ("n",),
                    floor,
                    {
                        "description": "mean order parameter of the uniform initial tokens (the finite-n floor)",
                        "units": "1",
                    },
                ),
                "measured_threshold": (
                    ("n",),
                    measured,
                    {
                        "description": "threshold fitted from the disordered side: the zero in 1/sigma^2 of the line "
                        "1/(n E|m|^2) = 1 - sigma_c^2/sigma^2 (an estimate of step_threshold)",
                        "units": "1",
                    },
                ),
                "critical_sigma": (
                    (),
                    sigma_c,
                    {
                        "description": "predicted critical sigma_c = sqrt(2 A(beta)) of the mean-field equation (the "
                        "flow, dt -> 0); the panels' sigma are ratio x sigma_c",
                        "units": "1",
                    },
                ),
            },
            coords={"n": sizes, "ratio": ratios, "sigma": ("ratio", sigma), "curve_sigma": curve},
        )

    @staticmethod
    def draw(ds: xr.Dataset) -> dict[str, Figure]:
        cfg = config_of(ds)
        fig = figure(figsize=(7.0, 4.2))
        ax = fig.add_subplot(1, 1, 1)
        sigma, sigma_c = ds["sigma"].values, float(ds["critical_sigma"])
        for i, n in enumerate(ds["n"].values):
            line = ax.errorbar(
                sigma,
                ds["order"].values[i],
                yerr=ds["order_error"].values[i],
                marker="o",
                markersize=4,
                capsize=2,
                label=f"n = {n}",
            )
            ax.axhline(float(ds["floor"].values[i]), color=line[0].get_color(), linestyle=":", linewidth=0.9)
        ax.axvline(sigma_c, color="k", linestyle="--", linewidth=1.2, label=rf"predicted $\sigma_c$ = {sigma_c:.3f}")
        if "meanfield_curve" in ds:
            ax.plot(
                ds["curve_sigma"].values,
                ds["meanfield_curve"].values,
                color="k",
                linewidth=1.4,
                label=r"mean field, $n \to \infty$: stationary $|\int e^{i\theta}\rho|$",
            )
        ax.set_xlabel(r"noise $\sigma$")
        ax.set_ylabel(r"stationary order parameter $|\frac{1}{n}\sum_i x_i|$")
        ax.set_ylim(0, None)
        ax.legend(loc="upper right")
        measured = ", ".join(f"n = {n}: {m:.3f}" for n, m in zip(ds["n"].values, ds["measured_threshold"].values))
        above = float(cfg["experiment"]["options"]["disordered_from"])
        t1, late = cfg["t1"], cfg["experiment"]["options"]["late"]
        start = t1 - late * (t1 - cfg["t0"])
        ordering = ""
        if "ordering_time" in ds:
            late_ones = [
                f"n = {n} at {r:g} $\\sigma_c$ ({t:.0f})"
                for n, row in zip(ds["n"].values, ds["ordering_time"].values)
                for r, t in zip(ds["ratio"].values, row)
                if t > start
            ]
            if late_ones:
                ordering = (
                    " Still ordering in the window, where the first mode's growth from the floor at the step's "
                    f"linear rate reaches the mean field's order only after t = {start:.4g}: "
                    + ", ".join(late_ones)
                    + "."
                )
        solid = "; solid: the order parameter of its stationary density" if "meanfield_curve" in ds else ""
        caption(
            fig,
            (
                f"Unnormalized attention (USA) with Q = K = V = I on $S^{{{cfg['d'] - 1}}}$, $\\beta$ = {cfg['beta']}, "
                "plus the Brownian motion of the sphere of strength $\\sigma$; uniform tokens at t = 0, "
                f"{cfg['solver']} with dt = {cfg['dt']} in {cfg['dtype']}, {_members(cfg)} per point. The "
                f"order parameter is averaged over t in [{t1 - late * (t1 - cfg['t0']):.4g}, {t1:g}] and over members "
                "(bars: standard error); dotted: the floor of uniform tokens at each n. Dashed: the linear stability "
                f"threshold of the uniform law of the mean-field equation{solid}. Measured threshold (the zero of "
                "$1/(n E|m|^2)$, linear in $1/\\sigma^2$, fitted "
                f"for $\\sigma > {above:g}\\sigma_c$): {measured}.{ordering}"
            ),
            width=110,
        )
        return {"noise_transition": fig}


def _members(cfg: dict) -> str:
    """The members per point, in words: one number, or one per n where they differ."""
    options = cfg["experiment"]["options"]
    members = members_per_size(options["sizes"], options.get("members"), cfg)
    if len(set(members)) == 1:
        return f"{members[0]} member{'s' if members[0] > 1 else ''}"
    return "members " + ", ".join(f"{m} at n = {n}" for n, m in zip(options["sizes"], members))
