"""Lyapunov spectra under the polynomial weight magnitudes of "Neural ODE Transformers"
(app. C.8): how sensitive the tokens are to their start when the weights grow.

The system is experiment=polynomial's: one head of softmax attention without
normalization in $\\mathbb{R}^3$, $Q(t) = K(t) = A_0 f(t)$, $V(t) = V_0 f(t)$ ($A_0$, $V_0$
standard Gaussian, drawn per member), $n = 40$ tokens uniform in $[-2, 2]^3$, $T = 20$,
200 Euler steps, and the six magnitudes $f_0 = \\tfrac12$, $f_k = \\tfrac12 (t/T)^k$
($k = 1, \\dots, 4$), $f_5 = \\tfrac12 (1 - t/T)^2$ (`_magnitudes.SCHEDULES`, one set of
coefficients per schedule, all of the same length: one compiled program).

For every schedule and member the $k$ leading finite-time Lyapunov exponents of the
Euler step map in $\\mathbb{R}^{nd}$ are computed by the QR method (as in
experiment=lyapunov, by the same `ensemble_spectra`), over $[0, T]$ (`exponents`)
and over the second half $[T/2, T]$ (`late_exponents`), with the running estimates'
percentiles over members, and the exponents over each QR interval (the local rates,
`local_*`).

With `compare_every`, the spectra are computed a second time with another QR interval:
in exact arithmetic nothing changes, so the difference (`roundoff`, `late_roundoff`)
measures the round-off. It matters here: without normalization the tokens can grow by
orders of magnitude, the logits with $|x|^2$, and the derivatives of the attention lose
digits to cancellation. With `dispersion`, the same members are also solved as the core
studies of experiment=polynomial (one panel per schedule, the states saved), and the
dispersion index of that experiment (mean nearest-neighbour distance over mean pairwise
distance, relative to $t = 0$; small means clustered) is stored beside the exponents,
per member.

The exponents of this flow are rates per unit time, so they scale with the size of the
weights: a magnitude that integrates to less moves the tokens less, apart and together.
The time averages $\\bar f = \\frac1T \\int_0^T f$ are $\\tfrac12$ for $f_0$, $1/(2(k+1))$
for $f_k$ and $\\tfrac16$ for $f_5$; over the second half they are
$(1 - 2^{-(k+1)})/(k+1)$ for $f_k$, still below $f_0$'s $\\tfrac12$. Both are stored
(`mean_magnitude`, `late_mean_magnitude`) for comparison.

Without normalization, tokens gathered at one point move together by
$\\dot x = f(t) V_0 x$ (the attention is uniform among equal tokens), a linear flow whose
top exponent over a window is the window's mean of $f$ times the largest real part of
an eigenvalue of $V_0$: `value_growth` (per member) and `single_cluster_rate` (per
schedule and member, over the late window) hold it, to set beside the members that
cluster.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..schema._config import choice, to_container
from ..schema._errors import ConfigError
from ..schema._schema import setting
from ._common import caption, config_of, member_summary, subplots
from ._experiment import Counter, Experiment, Keeper
from ._lazy import lazy
from ._magnitudes import SCHEDULES, coefficients, dispersion_index
from ._spectra import PERCENTILES, check_qr_options, check_spectrum, ensemble_spectra, exponent_count, local_exponents

if TYPE_CHECKING:
    import jax
    import jax.numpy as jnp
    import xarray as xr
    from matplotlib.figure import Figure

    from ..numerics import _terms
    from ..running import _build
else:
    jax = lazy("jax")
    jnp = lazy("jax.numpy")
    xr = lazy("xarray")
    _terms = lazy("attnflow.numerics._terms")
    _build = lazy("attnflow.running._build")

Schedule = choice("Schedule", tuple(SCHEDULES))


@dataclass
class Options:
    k: int | None = setting(3, "exponents kept per member (null: d)")
    reorthonormalize_every: int = setting(5, "Euler steps between QR factorizations")
    schedules: list[Schedule] = setting(list(Schedule), "which magnitudes f_0 ... f_5")  # pyright: ignore[reportInvalidTypeForm]  # a Choice made at run time
    dispersion: bool = setting(True, "also solve experiment polynomial's studies for the dispersion index")
    compare_every: int | None = setting(1, "a second run with this QR interval estimates the round-off (null: none)")


def _base(cfg) -> dict:
    base = to_container(cfg)
    base.pop("experiment")
    return base


def schedule_configs(base: dict, names: list[str]) -> dict[str, dict]:
    """One study config per magnitude of `names`, the same factor on Q, K and V."""
    configs = {}
    for name in names:
        config = copy.deepcopy(base)
        for matrix in "qkv":
            config["weights"][matrix]["poly"] = coefficients(name, base["t1"])
        configs[name] = config
    return configs


def _average(coefficients: list[float], a: float, b: float) -> float:
    """$\\frac{1}{b - a} \\int_a^b f$ for $f(t) = \\sum_k c_k t^k$."""
    integral = np.polynomial.polynomial.polyint(coefficients)
    values = np.polynomial.polynomial.polyval([a, b], integral)
    return float((values[1] - values[0]) / (b - a))


def value_growth(cfg) -> np.ndarray:
    """Per member of a validated study config (its poly factors left out), the largest
    real part of an eigenvalue of its value matrix $V_0$, the largest over heads; NaN
    where there is no square value matrix."""
    system = _build.build_system(cfg)
    keys = jax.random.split(jax.random.key(cfg.seed), cfg.members)

    def values(key):
        field, _, _ = system(key, cfg.beta)
        terms = [term for term in field.terms if isinstance(term, _terms.SelfAttention)]
        return terms[0].value(0.0) if terms else jnp.full((1, 1, 2), jnp.nan)

    matrices = np.asarray(jax.vmap(values)(keys), np.float64)  # (member, heads, d_v, d)
    if matrices.shape[-1] != matrices.shape[-2]:
        return np.full(cfg.members, np.nan)
    return np.linalg.eigvals(matrices).real.max(axis=(-1, -2))


def _rank_correlation(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (no ties expected in continuous data)."""
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


class LyapunovPolynomial(Experiment):
    title = "Lyapunov spectra under polynomial weight magnitudes"
    paper = "Neural ODE Transformers, app. C.8 (weight magnitudes) and sec. 5.2, app. B (Lyapunov exponents)"
    Options = Options
    coordinates = {
        "formula": ("the schedule f(t) of the weight magnitude", None),
    }

    def _schedules(self) -> list[str]:
        """The names of the magnitudes of the option `schedules`, in its order."""
        return [str(name) for name in self.options.schedules]

    def check(self) -> None:
        options, cfg = self.options, self.cfg
        check_qr_options("lyapunov_polynomial", options.k, options.reorthonormalize_every)
        names = self._schedules()
        if not names or len(set(names)) != len(names):
            raise ConfigError(
                f"experiment.options.schedules must be a list of distinct names among "
                f"{', '.join(SCHEDULES)}, got {names!r}."
            )
        if cfg.t0 != 0:
            raise ConfigError(f"experiment lyapunov_polynomial runs on [0, T] with T = t1; set t0=0, got t0={cfg.t0}.")
        for name in "qkv":
            if getattr(cfg.weights, name).poly is not None:
                raise ConfigError(
                    f"experiment lyapunov_polynomial sets weights.{name}.poly itself (one schedule "
                    "each); leave it null."
                )
        if isinstance(cfg.beta, (list, tuple)):
            raise ConfigError(
                f"experiment lyapunov_polynomial takes one beta (1/sqrt(d) in the paper), got {cfg.beta!r}."
            )
        if options.dispersion and not cfg.save_states:
            raise ConfigError(
                "experiment lyapunov_polynomial measures the dispersion on the states: keep "
                "save_states=true (or set experiment.options.dispersion=false)."
            )
        studies = [_build.resolve_study(config) for config in schedule_configs(_base(cfg), names).values()]
        k, compare = exponent_count(cfg, options.k), options.compare_every
        check_spectrum("lyapunov_polynomial", studies[0], k, options.reorthonormalize_every)
        if compare is not None:
            if compare < 1:
                raise ConfigError(
                    f"experiment.options.compare_every must be null or a whole number of steps >= 1, got {compare!r}."
                )
            if compare == options.reorthonormalize_every:
                raise ConfigError(
                    f"experiment.options.compare_every={compare} equals reorthonormalize_every: the "
                    "comparison needs another QR interval (or null for none)."
                )
            check_spectrum("lyapunov_polynomial", studies[0], k, compare, "compare_every")

    def panels(self, base: dict) -> dict[str, dict]:
        """With `dispersion`, the studies of experiment=polynomial (their states give the
        dispersion index); the spectra are computed in `analyse`."""
        return schedule_configs(base, self._schedules()) if self.options.dispersion else {}

    def analyse(self, results: dict[str, xr.Dataset], *, on_piece: Counter, keep: Keeper) -> xr.Dataset:
        cfg, options = self.cfg, self.options
        names = self._schedules()
        configs = schedule_configs(_base(cfg), names)
        k, every = exponent_count(cfg, options.k), options.reorthonormalize_every
        studies = [_build.resolve_study(configs[name]) for name in names]
        spectra = [ensemble_spectra(study, k, every) for study in studies]
        first = spectra[0]
        t = first.times
        coords = {"schedule": names, "member": np.arange(cfg.members), "exponent": np.arange(1, k + 1), "time": t}
        ds = xr.Dataset(coords=coords).assign_coords(formula=("schedule", [SCHEDULES[name][0] for name in names]))
        stack = lambda attribute: np.stack([getattr(s, attribute)[0] for s in spectra])  # the one beta
        ds["exponents"] = xr.DataArray(stack("exponents"), dims=("schedule", "member", "exponent")).assign_attrs(
            description=f"finite-time Lyapunov exponents of the Euler step map over [0, {cfg.t1:g}], descending"
        )
        ds["late_exponents"] = xr.DataArray(stack("late"), dims=("schedule", "member", "exponent")).assign_attrs(
            description=f"exponents over [{first.window:g}, {cfg.t1:g}], of the same deviation vectors"
        )
        for name in ("exponents", "late_exponents"):
            summary = member_summary(ds[name])
            for key in ("q10", "median", "q90"):
                ds[f"{name}_{key}"] = summary[f"{name}_{key}"]
        running = member_summary(
            xr.DataArray(stack("running"), dims=("schedule", "member", "time", "exponent"), name="running")
        )
        for key in ("q10", "median", "q90"):
            ds[f"running_{key}"] = running[f"running_{key}"].assign_attrs(
                description=f"{PERCENTILES[key]} over members of the exponents over [0, time]"
            )
        local = member_summary(
            xr.DataArray(
                np.stack([local_exponents(s, cfg.t0)[0] for s in spectra]),
                dims=("schedule", "member", "time", "exponent"),
                name="local",
            )
        )
        for key in ("q10", "median", "q90"):
            ds[f"local_{key}"] = local[f"local_{key}"].assign_attrs(
                description=f"{PERCENTILES[key]} over members of the exponents over each QR interval ending at `time`"
            )
        mean = lambda a, b: np.asarray([_average(coefficients(name, cfg.t1), a, b) for name in names])
        ds["mean_magnitude"] = xr.DataArray(mean(0.0, cfg.t1), dims="schedule").assign_attrs(
            description="time average of f over [0, T]"
        )
        ds["late_mean_magnitude"] = xr.DataArray(mean(first.window, cfg.t1), dims="schedule").assign_attrs(
            description="time average of f over the late window"
        )
        growth = value_growth(_build.validate_config(_base(cfg)))
        ds["value_growth"] = xr.DataArray(growth, dims="member").assign_attrs(
            description="largest real part of an eigenvalue of V_0 (the value matrix before the magnitude f; the "
            "largest over heads): a single point cluster moves by dx/dt = f(t) V_0 x"
        )
        ds["single_cluster_rate"] = xr.DataArray(
            ds["late_mean_magnitude"].values[:, None] * growth[None], dims=("schedule", "member")
        ).assign_attrs(
            description="the exponent of dx/dt = f(t) V_0 x over the late window, (mean of f) x value_growth: "
            "the top exponent of a member whose tokens move as one point"
        )
        ds["magnitude"] = xr.DataArray(
            np.stack([np.polynomial.polynomial.polyval(t, coefficients(name, cfg.t1)) for name in names]),
            dims=("schedule", "time"),
        ).assign_attrs(description="the magnitude f(t) at the QR times")
        if options.compare_every is not None:
            # In exact arithmetic the exponents do not depend on the QR interval: the
            # difference is the round-off, which the attention's derivatives amplify as the
            # logits grow like |x|^2 (tokens that grow without normalization).
            other = [ensemble_spectra(study, k, options.compare_every) for study in studies]
            windows = (("roundoff", "exponents", "[0, T]"), ("late_roundoff", "late", "the late window"))
            for name, attribute, window in windows:
                gap = np.stack(
                    [
                        np.abs(getattr(a, attribute)[0] - getattr(b, attribute)[0]).max(-1)
                        for a, b in zip(spectra, other)
                    ]
                )
                ds[name] = xr.DataArray(gap, dims=("schedule", "member")).assign_attrs(
                    description=f"largest difference of the exponents over {window} from those with a QR "
                    f"factorization every {options.compare_every} steps: their round-off"
                )
        ds["late_window"] = xr.DataArray(first.window).assign_attrs(description="start of the late window")
        if results:
            dispersion, size = [], []
            for name in names:
                x = results[name]["x"].values  # (member, time, token, dim)
                index = dispersion_index(x[:, [0, -1]])
                dispersion.append(index[:, 1] / index[:, 0])
                size.append(np.linalg.norm(x[:, -1], axis=-1).max(axis=-1))
            ds["final_size"] = xr.DataArray(np.stack(size), dims=("schedule", "member")).assign_attrs(
                description="largest token norm |x_i(T)| per member: without normalization the tokens can grow by "
                "orders of magnitude"
            )
            ds["dispersion"] = xr.DataArray(np.stack(dispersion), dims=("schedule", "member")).assign_attrs(
                description="dispersion index at T over its value at t = 0 (experiment polynomial: mean "
                "nearest-neighbour distance over mean pairwise distance; small: clustered)"
            )
            ds["failed_members"] = xr.DataArray(
                [int((results[name]["status"] != 0).sum()) for name in names], dims="schedule"
            ).assign_attrs(description="members whose dispersion solve failed, per schedule")
        return ds

    @staticmethod
    def draw(ds: xr.Dataset) -> dict[str, Figure]:
        cfg = config_of(ds)
        names = list(ds["schedule"].values)
        formulas = [str(f) for f in ds["formula"].values]
        k = ds.sizes["exponent"]
        has_dispersion = "dispersion" in ds
        fig, axes = subplots(
            1, 4 if has_dispersion else 3, figsize=(17.0 if has_dispersion else 13.0, 4.6), layout="constrained"
        )
        x = np.arange(len(names))
        rng = np.random.default_rng(0)
        offsets = np.linspace(-0.22, 0.22, k) if k > 1 else np.zeros(1)
        window, t1 = float(ds["late_window"]), cfg["t1"]
        titles = {
            "exponents": f"(a) exponents over [0, {t1:g}]",
            "late_exponents": f"(b) exponents over [{window:g}, {t1:g}]",
        }
        for ax, name in zip(axes[:2], ("exponents", "late_exponents")):
            for j in range(k):
                part = ds.isel(exponent=j)
                values = part[name].values  # (schedule, member)
                for s in range(len(names)):
                    ax.scatter(
                        x[s] + offsets[j] + rng.uniform(-0.03, 0.03, values.shape[1]),
                        values[s],
                        s=4,
                        color=f"C{j}",
                        alpha=0.35,
                        linewidth=0,
                    )
                median = part[f"{name}_median"].values
                ax.errorbar(
                    x + offsets[j],
                    median,
                    yerr=[median - part[f"{name}_q10"].values, part[f"{name}_q90"].values - median],
                    fmt="o",
                    color=f"C{j}",
                    markersize=4,
                    capsize=2,
                    label=f"$\\lambda_{{{j + 1}}}$",
                )
            ax.axhline(0, color="k", linewidth=0.5)
            ax.set_xticks(x, formulas, rotation=30, fontsize=7)
            ax.set_ylabel("Lyapunov exponent")
            ax.set_title(titles[name])
        axes[0].legend(loc="upper right", title="median, 10-90%")
        ax = axes[2]
        t = ds["time"].values
        every = t[1] - t[0] if t.size > 1 else t[0]
        for s, name in enumerate(names):
            ax.step(
                t,
                ds["local_median"].sel(schedule=name, exponent=1),
                where="pre",
                color=f"C{s}",
                label=f"f = {formulas[s]}",
            )
        ax.axhline(0, color="k", linewidth=0.5)
        ax.set_xlabel("t")
        ax.set_ylabel("$\\lambda_1$ over one QR interval (median over members)")
        ax.set_title(f"(c) local top exponent, over intervals of {every:g}")
        ax.legend(loc="upper left", fontsize=7)
        if has_dispersion:
            ax = axes[3]
            for s, name in enumerate(names):
                ax.scatter(
                    ds["dispersion"].sel(schedule=name),
                    ds["exponents"].sel(schedule=name, exponent=1),
                    s=6,
                    color=f"C{s}",
                    alpha=0.6,
                    linewidth=0,
                    label=f"f = {formulas[s]}",
                )
            ax.set_xscale("log")
            ax.set_xlabel(f"dispersion at T = {t1:g} (relative to t = 0; small: clustered)")
            ax.set_ylabel(f"$\\lambda_1$ over [0, {t1:g}]")
            ax.set_title("(d) every member: top exponent against dispersion")
        caption(fig, _caption(ds, cfg, names, formulas), width=220 if has_dispersion else 170)
        return {"lyapunov_polynomial": fig}


def _caption(ds, cfg, names, formulas) -> str:
    top = ds["exponents_median"].sel(exponent=1).values
    late = ds["late_exponents_median"].sel(exponent=1).values
    per = "; ".join(f"{formulas[s]}: {top[s]:.3f} (late {late[s]:.3f})" for s in range(len(names)))
    text = (
        f"Softmax attention without normalization, Q = K = A_0 f(t), V = V_0 f(t), A_0 and V_0 standard "
        f"Gaussian (per member), logits / sqrt(d); n = {cfg['n']}, d = {cfg['d']}, T = {cfg['t1']:g}, "
        f"{cfg['solver']} with dt = {cfg['dt']:g}, tokens uniform in [{cfg['init']['low']:g}, "
        f"{cfg['init']['high']:g}]^{cfg['d']}; {ds.sizes['member']} members, the same weights and tokens under "
        f"every f. The {ds.sizes['exponent']} leading finite-time Lyapunov exponents of the step map in "
        f"$R^{{n d}}$ by the QR method (dots: members). Median $\\lambda_1$ over [0, T] (late: over the second half): "
        f"{per}. "
    )
    index = {name: s for s, name in enumerate(names)}
    orders = [index[name] for name in ("f1", "f2", "f3", "f4") if name in index]
    if len(orders) > 1:
        falls = bool(np.all(np.diff(top[orders]) < 0))
        text += (
            f"Over the horizon the top exponent {'falls' if falls else 'does not fall steadily'} with the order "
            f"k of (t/T)^k, as the time-averaged magnitude (1/T) int f does "
            f"({', '.join(f'{m:.3g}' for m in ds['mean_magnitude'].values[orders])}): exponents are rates per "
            "unit time and scale with the weights, so a magnitude that grows later leaves the tokens less "
            "sensitive to their start over the whole horizon. "
        )
        local = ds["local_median"].sel(exponent=1).isel(time=-1).values
        ends = "; ".join(f"{formulas[s]}: {local[s]:.2f}" for s in range(len(names)))
        text += f"(c) Over the last interval, where every f_k is near 1/2, the median local rates are {ends}"
        if "f0" in index:
            above = [formulas[s] for s in orders if local[s] > local[index["f0"]]]
            text += (
                f": {'the growing magnitudes ' + ', '.join(above) if above else 'none of the growing magnitudes'}"
                f" exceed{'s' if len(above) == 1 else ''} the constant one there. "
            )
        else:
            text += ". "
    if "roundoff" in ds:
        gap, late_gap = ds["roundoff"].values, ds["late_roundoff"].values
        worst = names[int(np.argmax(late_gap.max(axis=1)))]
        text += (
            f"Round-off: with a QR factorization at another interval the exponents over [0, T] move by at most "
            f"{gap.max():.2g}, those over the late window by at most {late_gap.max():.2g} "
            f"({int((late_gap > 0.01).sum())} of {late_gap.size} members beyond 0.01, most under "
            f"f = {formulas[names.index(worst)]}): in exact arithmetic they would not move; the attention's "
            "derivatives lose digits as its logits grow like |x|^2 with tokens that grow without "
            "normalization. "
        )
    if "dispersion" in ds and "f0" in index:
        s = index["f0"]
        rho = _rank_correlation(
            ds["dispersion"].isel(schedule=s).values, ds["exponents"].isel(schedule=s, exponent=0).values
        )
        tight = ds["dispersion"].isel(schedule=s).values < 1e-3
        gather = (
            "the members that gather have the larger exponents"
            if rho < -0.3
            else "the members that gather have the smaller exponents"
            if rho > 0.3
            else "gathering and the top exponent go together only weakly"
        )
        text += (
            f"(d) The dispersion of experiment polynomial for the same members: {gather} (rank correlation "
            f"{rho:.2f} under f = {formulas[s]}). "
        )
        if tight.sum() and np.isfinite(ds["single_cluster_rate"].values).all():
            gap = np.abs(
                ds["late_exponents"].isel(schedule=s, exponent=0).values
                - ds["single_cluster_rate"].isel(schedule=s).values
            )[tight]
            text += (
                f"Without normalization a group of tokens at one point moves by dx/dt = f V_0 x, at the rate "
                f"f max Re eig V_0: for the {int(tight.sum())} members whose dispersion ends below 1e-3, the late "
                f"$\\lambda_1$ is within {np.median(gap):.2f} of that rate (median; {int((gap < 0.1).sum())} of them "
                "within 0.1): their top exponent is mostly that of the gathered tokens' common linear motion "
                "(on the sphere that motion is a rotation, of exponent 0)."
            )
    return text
