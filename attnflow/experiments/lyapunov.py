"""Lyapunov spectra of the theory model against beta: consensus, and the slow exit of
metastable clusters, with the zeros that the rotation symmetry forces named and removed.

Every member of a study (by default $Q = K = V = I$ softmax self-attention on the sphere,
tokens uniform on $S^{d-1}$) gets its $k$ leading finite-time Lyapunov exponents by the
QR method of `attnflow.lyapunov_spectrum`: the state is stepped with the study's own
fixed-step map, $k$ deviation vectors tangent to the sphere ride along through its
tangent map and are re-orthonormalised every `reorthonormalize_every` steps.

At consensus (all tokens at one point $x^*$) the spectrum has a closed form
(tests/README.md, section 11): the linearised dynamics are
$\\dot v_i = -c\\,(v_i - \\bar v)$ on $(T_{x^*} S^{d-1})^n$, so the exponents are

- $0$ with multiplicity $d - 1$: the mean mode, moving the consensus point along the
  sphere (the rotations);
- $-c$ with multiplicity $(n - 1)(d - 1)$: the tokens contracting to their mean, with
  $c = H s_V$ for softmax attention whatever beta (the first-order attention is
  uniform) and $c = H s_V e^{\\beta s_Q s_K}$ without normalization (USA); $H$ heads,
  $s_Q, s_K, s_V$ the scales of identity weights ($c = 1$ and $c = e^\\beta$ by default).

**What the symmetry forces.** With $Q$, $K$, $V$ multiples of the identity the flow
commutes with every rotation of $\\mathbb R^d$, so a deviation along the rotation orbit,
$A X$ with $A$ skew-symmetric, is carried to $A X(t)$: it neither grows nor shrinks
while the orbit keeps its dimension. The spectrum therefore holds zeros whatever the
dynamics do: $d - 1$ of them at consensus (moving the consensus point), and
$d(d-1)/2$ while the tokens span a plane, for example split into two clusters. So
$\\lambda_1 = 0$ at every beta is the symmetry, not a finding, and for $d = 3$ so is
$\\lambda_3 = 0$ for a member still split into clusters (the third rotation, about the
consensus point, contracts with the tokens only once they meet).

**What is measured.** The *transverse* exponents, with the deviation vectors kept
orthogonal to the rotation orbit (`lyapunov_spectrum(..., quotient=rotation_orbit)`):
the spectrum of the flow on configurations up to rotation. At consensus they are all
$-c$ (the mean mode is the orbit). A member still split into several clusters (beta
large: metastability) keeps a transverse exponent near 0: the clusters' relative
position, driven by the attention weight $e^{-\\beta(1 - \\cos\\theta)}$ between clusters
at angle $\\theta$, is nearly neutral until they merge. Estimates over $[t_0, T]$ carry the
transient of the start as $O(1/T)$.

Stored (`analyse`): per beta and member the exponents over $[t_0, t_1]$ (`exponents`)
and over the second half $[t_h, t_1]$ (`late_exponents`, from differences of the
running cumulative sums: the start's transient left out); the same for the transverse
exponents (`transverse_exponents`, `late_transverse_exponents`) when the system commutes
with rotations (identity-like Q, K, V, no output matrix or MLP, on the sphere or in
R^d); the 10/50/90 percentiles over members of all of them and of the running
estimates at every re-orthonormalisation time; the closed-form consensus values where
the config has them (NaN otherwise); the share of members at consensus per beta.

All of it is one compiled program: a `jax.vmap` of `lyapunov_spectrum` over a piece of
(beta, member) pairs, beta being data, called once per piece (`chunk_size` pairs at
most). Every config key that builds the system (weights, heads, init, scheme,
attention_kind, MLP, dtype, solver, seed, members) is honoured through `build_system`; the output keys
of a study (saves, metrics, save_states, ...) do not apply and are refused.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..schema._config import Config
from ..schema._errors import ConfigError
from ..schema._schema import setting
from ._common import caption, colormap, config_of, member_summary, refuse_given, subplots
from ._experiment import Counter, Experiment, Keeper
from ._lazy import lazy
from ._spectra import PERCENTILES, Spectra, check_qr_options, check_spectrum, ensemble_spectra, exponent_count

if TYPE_CHECKING:
    import xarray as xr
    from matplotlib.figure import Figure

    from ..analysis import spectrum
    from ..numerics import _solvers
    from ..running import _build
else:
    xr = lazy("xarray")
    spectrum = lazy("attnflow.analysis.spectrum")
    _solvers = lazy("attnflow.numerics._solvers")
    _build = lazy("attnflow.running._build")


@dataclass
class Options:
    k: int | None = setting(None, "exponents kept (null: d, the d - 1 rotations and the first contracting one)")
    reorthonormalize_every: int = setting(10, "steps between QR factorizations (one time unit at dt = 0.1)")


# Study keys about a study's saved output: they mean nothing to a spectrum.
_OUTPUT_KEYS = ("saves", "save_spacing", "exact_times", "save_states", "metrics", "cluster_eps", "rank_rtol")


def study_config(cfg: Config) -> _build.Study:
    """The experiment's config as a checked, resolved single study (every key validated)."""
    return _build.resolve_study(dataclasses.replace(cfg, experiment=None))


def stability_limit(solver: str) -> float:
    """The largest $x$ such that the solver's step is stable for $\\dot v = -s v$ at every
    $s h \\le x$: $|R(-s h)| \\le 1$, with $R(z) = 1 + \\sum_m (b^T A^m \\mathbf 1) z^{m+1}$
    the stability polynomial of its explicit tableau (2 for Euler, 2.785 for RK4)."""
    table = _solvers.tableau(solver)
    stages = len(table.b)
    a = np.zeros((stages, stages))
    for i, row in enumerate(table.a):
        a[i, : len(row)] = row
    b = np.asarray(table.b)
    coefficients, power = [1.0], np.ones(stages)
    for _ in range(stages):
        coefficients.append(float(b @ power))
        power = a @ power
    x = np.linspace(0.0, 20.0, 200_001)[1:]
    unstable = np.abs(np.polynomial.polynomial.polyval(-x, coefficients)) > 1 + 1e-12
    return float(x[np.argmax(unstable)]) if unstable.any() else float(x[-1])


def consensus_rate(cfg: Config, beta: float) -> float | None:
    """The contraction rate $c$ of the differential modes at consensus, or None when the
    config has no closed form (anything but identity-like Q, K, V attention on the sphere:
    other weights, an output matrix, a mask, ALiBi, an MLP, another normalization)."""
    w = cfg.weights

    def plain(spec) -> bool:
        return spec.kind == "identity" and not spec.switch_times and not spec.factors and spec.poly is None

    if not (
        cfg.scheme == "sphere"
        and cfg.attention
        and not cfg.mlp.enabled
        and not cfg.causal
        and cfg.alibi is None
        and all(plain(getattr(w, m)) for m in "qkv")
        and w.o.kind == "none"
        and cfg.d_k in (None, cfg.d)
        and cfg.d_v in (None, cfg.d)
    ):
        return None
    uniform = 1.0 if cfg.attention_kind.value == "sa" else math.exp(beta * w.q.scale * w.k.scale)
    return cfg.heads * w.v.scale * uniform


def rotation_equivariant(cfg: Config) -> bool:
    """Whether the config's flow commutes with every rotation of R^d (a structural fact):
    attention alone with Q, K, V multiples of the identity (scales, switches and
    polynomial factors allowed), no output matrix, on the sphere or without
    normalization. Masks and ALiBi act on positions, not on R^d, and keep it."""
    w = cfg.weights
    return (
        cfg.attention
        and not cfg.mlp.enabled
        and cfg.scheme in ("sphere", "none")
        and w.o.kind == "none"
        and all(getattr(w, m).kind == "identity" for m in "qkv")
        and cfg.d_k in (None, cfg.d)
        and cfg.d_v in (None, cfg.d)
    )


def consensus_spectrum(cfg: Config, beta: float, k: int) -> np.ndarray:
    """The $k$ leading exponents at consensus: $0$ ($d - 1$ times) and $-c$
    ($(n - 1)(d - 1)$ times), in descending order; NaN without a closed form."""
    rate = consensus_rate(cfg, beta)
    if rate is None:
        return np.full(k, np.nan)
    values = [0.0] * (cfg.d - 1) + [-rate] * ((cfg.n - 1) * (cfg.d - 1))
    return np.asarray(sorted(values, reverse=True)[:k])


def transverse_count(cfg: Config, k: int) -> int:
    """How many transverse exponents are kept: k, at most the n(d - 1) tangent directions
    (n d in R^d) less the d(d - 1)/2 rotations."""
    dimension = cfg.n * (cfg.d - 1) if cfg.scheme == "sphere" else cfg.n * cfg.d
    return min(k, dimension - cfg.d * (cfg.d - 1) // 2)


def transverse_dataset(cfg: Config, spectra: Spectra, k: int) -> xr.Dataset:
    """The transverse exponents (rotations removed) as `spectrum_dataset` stores the full
    ones, on their own dimension `transverse` (numbered from 1), with their closed form at
    consensus (-c, every one) and the share of members at consensus."""
    index = np.arange(1, k + 1)
    coords = {"beta": spectra.betas, "member": np.arange(cfg.members), "transverse": index, "time": spectra.times}
    ds = xr.Dataset(coords=coords)
    dims = ("beta", "member", "transverse")
    ds["transverse_exponents"] = xr.DataArray(spectra.exponents, dims=dims).assign_attrs(
        description=f"finite-time Lyapunov exponents over [t0, t1] = [{cfg.t0:g}, {cfg.t1:g}] of deviations kept "
        "orthogonal to the rotation orbit (the zeros forced by the symmetry removed), descending"
    )
    ds["late_transverse_exponents"] = xr.DataArray(spectra.late, dims=dims).assign_attrs(
        description=f"transverse exponents over [{spectra.window:g}, {cfg.t1:g}] (the second half of the QR times)"
    )
    for name in ("transverse_exponents", "late_transverse_exponents"):
        summary = member_summary(ds[name])
        for key in ("q10", "median", "q90"):
            ds[f"{name}_{key}"] = summary[f"{name}_{key}"]
    running = xr.DataArray(spectra.running, dims=("beta", "member", "time", "transverse"), name="running")
    summary = member_summary(running)
    for key in ("q10", "median", "q90"):
        ds[f"transverse_running_{key}"] = summary[f"running_{key}"].assign_attrs(
            description=f"{PERCENTILES[key]} over members of the transverse exponents over [t0, time]"
        )
    rates = np.array([consensus_rate(cfg, b) if consensus_rate(cfg, b) is not None else np.nan for b in spectra.betas])
    ds["transverse_consensus"] = xr.DataArray(
        np.broadcast_to(-rates[:, None], (len(rates), k)).copy(), dims=("beta", "transverse")
    ).assign_attrs(description="the transverse exponents at consensus in closed form: -c, every one (NaN without it)")
    return ds


def spectrum_dataset(cfg: Config, spectra: Spectra, k: int) -> xr.Dataset:
    """The exponents of every beta and member, their percentiles over members, the
    running estimates' percentiles and the closed-form consensus values (dims `beta`,
    `member`, `exponent` numbered from 1, `time` of the QR factorizations)."""
    index = np.arange(1, k + 1)
    coords = {"beta": spectra.betas, "member": np.arange(cfg.members), "exponent": index, "time": spectra.times}
    ds = xr.Dataset(coords=coords)
    ds["exponents"] = xr.DataArray(spectra.exponents, dims=("beta", "member", "exponent")).assign_attrs(
        description=f"finite-time Lyapunov exponents over [t0, t1] = [{cfg.t0:g}, {cfg.t1:g}], descending"
    )
    ds["late_exponents"] = xr.DataArray(spectra.late, dims=("beta", "member", "exponent")).assign_attrs(
        description=f"exponents over [{spectra.window:g}, {cfg.t1:g}] (the second half of the QR times: the "
        "transient of the start left out), of the same deviation vectors as `exponents`"
    )
    for name in ("exponents", "late_exponents"):
        summary = member_summary(ds[name])
        for key in ("q10", "median", "q90"):
            ds[f"{name}_{key}"] = summary[f"{name}_{key}"]
    running = xr.DataArray(spectra.running, dims=("beta", "member", "time", "exponent"), name="running")
    summary = member_summary(running)
    for key in ("q10", "median", "q90"):
        ds[f"running_{key}"] = summary[f"running_{key}"].assign_attrs(
            description=f"{PERCENTILES[key]} over members of the exponents over [t0, time] (their convergence in T)"
        )
    ds["consensus"] = xr.DataArray(
        np.stack([consensus_spectrum(cfg, b, k) for b in spectra.betas]), dims=("beta", "exponent")
    ).assign_attrs(
        description="the exponents at consensus in closed form: 0 (d - 1 times), -c ((n - 1)(d - 1) times); NaN "
        "where the config has no closed form"
    )
    ds["late_window"] = xr.DataArray(spectra.window).assign_attrs(description="start of the late window")
    if k >= cfg.d:
        # The first contracting exponent at consensus, index d: within 10% of -c over the
        # late window means the member sat at consensus there.
        rate = -ds["consensus"].sel(exponent=cfg.d)
        close = np.abs(ds["late_exponents"].sel(exponent=cfg.d) - (-rate)) < 0.1 * np.abs(rate)
        ds["consensus_fraction"] = (
            close.mean("member")
            .where(np.isfinite(rate) & (rate != 0))
            .assign_attrs(
                description=f"share of members whose late lambda_{cfg.d} is within 10% of its consensus value -c: at "
                "consensus over the late window (NaN without a closed form)"
            )
        )
    return ds


def _band(ax, x, ds, name, j, color, label, marker="o", dim="exponent"):
    part = ds.sel({dim: j})
    ax.fill_between(x, part[f"{name}_q10"], part[f"{name}_q90"], color=color, alpha=0.2, linewidth=0)
    ax.plot(x, part[f"{name}_median"], color=color, marker=marker, markersize=3, label=label)


def _drawn_exponents(ds, d: int) -> list[int]:
    """The top exponent and the first contracting one at consensus (index d), or the
    last kept when k < d."""
    k = ds.sizes["exponent"]
    return [1] if k == 1 else [1, min(d, k)]


def _sample(values, count: int) -> list[int]:
    """Up to `count` indices spread evenly over `values` (first and last included)."""
    size = len(values)
    return sorted(set(np.linspace(0, size - 1, min(count, size)).round().astype(int).tolist()))


class Lyapunov(Experiment):
    title = "Lyapunov spectrum against beta: the consensus spectrum and metastability"
    paper = (
        "Neural ODE Transformers, sec. 5.2 and app. B (Lyapunov exponents of the dynamics); "
        "consensus spectrum: tests/README.md, section 11"
    )
    Options = Options
    coordinates = {
        "transverse": (
            "rank of a transverse Lyapunov exponent (the zeros a symmetry forces left out), largest first",
            "1",
        ),
    }

    def check(self) -> None:
        k, every = self.options.k, self.options.reorthonormalize_every
        check_qr_options("lyapunov", k, every)
        resolved = study_config(self.cfg)
        study = resolved.config
        refuse_given(study, _OUTPUT_KEYS, "lyapunov", "it stores exponents, not a study's saved output")
        check_spectrum("lyapunov", resolved, exponent_count(study, k), every)
        betas = resolved.betas.tolist()
        limit = stability_limit(study.solver.value)
        if study.solver.value == "euler_renorm":
            # A step along the unprojected field, then the retraction: at consensus the
            # differential modes are divided by 1 + c h, stable at any step.
            betas = []
        for beta in betas:
            rate = consensus_rate(study, beta)
            if rate is not None and rate * study.dt > limit:  # pyright: ignore[reportOperatorIssue]  # fixed steps: dt is set
                raise ConfigError(
                    f"at beta={beta:g} the tokens contract at consensus at rate c = {rate:.4g}, too fast for "
                    f"{study.solver.value} with dt={study.dt:g} (stable while c dt <= {limit:.3g}); take dt below "
                    f"{limit / rate:.3g} or smaller betas."
                )

    def panels(self, base: dict) -> dict[str, dict]:
        return {}  # everything is computed in `analyse`: one compiled spectrum program

    def analyse(self, results: dict[str, xr.Dataset], *, on_piece: Counter, keep: Keeper) -> xr.Dataset:
        resolved = study_config(self.cfg)
        study = resolved.config
        k = exponent_count(study, self.options.k)
        every = self.options.reorthonormalize_every
        ds = spectrum_dataset(study, ensemble_spectra(resolved, k, every), k)
        if rotation_equivariant(study) and transverse_count(study, k) >= 1:
            count = transverse_count(study, k)
            ds = ds.merge(
                transverse_dataset(
                    study, ensemble_spectra(resolved, count, every, quotient=spectrum.rotation_orbit), count
                )
            )
        return ds

    @staticmethod
    def draw(ds: xr.Dataset) -> dict[str, Figure]:
        cfg = config_of(ds)
        d = cfg["d"]
        betas = ds["beta"].values
        drawn = _drawn_exponents(ds, d)
        colors = {drawn[0]: "C0", drawn[-1]: "C3"}
        transverse = "transverse_exponents" in ds
        fig, axes = subplots(
            1, 4 if transverse else 3, figsize=(18.0 if transverse else 14.0, 4.4), layout="constrained"
        )
        window = float(ds["late_window"])
        t1 = cfg["t1"]
        has_theory = bool(np.isfinite(ds["consensus"].values).any())
        # (a) the whole spectrum over the late window, its forced zeros named.
        ax = axes[0]
        for j in range(1, ds.sizes["exponent"] + 1):
            if j not in drawn:
                ax.plot(
                    betas,
                    ds["late_exponents_median"].sel(exponent=j),
                    color="0.6",
                    linewidth=0.8,
                    label="others: median" if j == 2 else None,
                )
        for j in drawn:
            _band(ax, betas, ds, "late_exponents", j, colors[j], f"$\\lambda_{{{j}}}$: median, 10-90%")
            if has_theory:
                ax.plot(
                    betas,
                    ds["consensus"].sel(exponent=j),
                    color=colors[j],
                    linestyle="--",
                    linewidth=1,
                    label=f"$\\lambda_{{{j}}}$ at consensus",
                )
        ax.axhline(0, color="k", linewidth=0.5)
        ax.set_xlabel(r"$\beta$")
        ax.set_ylabel("Lyapunov exponent")
        forced = " ($\\lambda_1$ = 0 forced by rotations)" if transverse else ""
        ax.set_title(f"(a) full spectrum over [{window:g}, {t1:g}]{forced}")
        ax.legend(loc="lower left", fontsize=7)
        if transverse:
            # (b) the transverse exponents: what the symmetry does not fix.
            ax = axes[1]
            count = ds.sizes["transverse"]
            last = min(d, count)
            for j, color in ((1, "C2"), (last, "C4")) if last > 1 else ((1, "C2"),):
                _band(
                    ax,
                    betas,
                    ds,
                    "late_transverse_exponents",
                    j,
                    color,
                    f"transverse $\\lambda_{{{j}}}$: median, 10-90%",
                    dim="transverse",
                )
            if np.isfinite(ds["transverse_consensus"].values).any():
                ax.plot(
                    betas,
                    ds["transverse_consensus"].sel(transverse=1),
                    color="k",
                    linestyle="--",
                    linewidth=1,
                    label="every transverse exponent at consensus",
                )
            ax.axhline(0, color="k", linewidth=0.5)
            ax.set_xlabel(r"$\beta$")
            ax.set_ylabel("Lyapunov exponent")
            ax.set_title(f"(b) transverse spectrum (rotations removed) over [{window:g}, {t1:g}]")
            ax.legend(loc="lower right", fontsize=7)
        if "consensus_fraction" in ds:
            ax = axes[2] if transverse else axes[1]
            ax.plot(betas, 100 * ds["consensus_fraction"].values, color="C1", marker="o", markersize=3)
            ax.set_ylim(-3, 103)
            ax.set_xlabel(r"$\beta$")
            ax.set_ylabel("members at consensus over the late window (%)")
            ax.set_title(f"({'c' if transverse else 'b'}) share of members at consensus")
        else:
            (axes[2] if transverse else axes[1]).set_visible(False)
        # Last: the running estimates (the transverse ones where they exist).
        ax = axes[-1]
        t = ds["time"].values
        chosen = _sample(betas, 4)
        cmap = colormap("viridis")
        name, dim, which = ("transverse_running", "transverse", [1]) if transverse else ("running", "exponent", drawn)
        for c, b in enumerate(chosen):
            color = cmap(c / max(len(chosen) - 1, 1))
            for j, style in zip(which, ("-", "--")):
                ax.plot(
                    t,
                    ds[f"{name}_median"].isel(beta=b).sel({dim: j}),
                    color=color,
                    linestyle=style,
                    label=f"$\\beta$ = {betas[b]:.3g}" if j == which[0] else None,
                )
        ax.axhline(0, color="k", linestyle=":", linewidth=0.8)
        ax.axvline(window, color="0.5", linewidth=0.6)
        ax.set_xlabel("T")
        ax.set_ylabel("exponent over [t0, T] (median over members)")
        label = (
            "transverse $\\lambda_1$"
            if transverse
            else f"$\\lambda_{{{drawn[0]}}}$ solid" + (f", $\\lambda_{{{drawn[-1]}}}$ dashed" if len(drawn) > 1 else "")
        )
        ax.set_title(f"({'d' if transverse else 'c'}) running estimates: {label}")
        ax.legend(loc="lower right")
        caption(fig, _caption(ds, cfg, drawn), width=240 if transverse else 190)
        return {"lyapunov": fig}


def _fixed(value: float) -> str:
    """Three decimals, without the sign of a value that rounds to zero."""
    text = f"{value:.3f}"
    return text[1:] if text == "-0.000" else text


def _caption(ds, cfg, drawn) -> str:
    weights = cfg["weights"]
    plain = all(weights[m]["kind"] == "identity" for m in "qkv") and weights["o"]["kind"] == "none"
    system = (
        f"{cfg['attention_kind'].upper()} attention, Q = K = V = I"
        if plain
        else f"{cfg['attention_kind'].upper()} attention, weights q={weights['q']['kind']}, k={weights['k']['kind']}, "
        f"v={weights['v']['kind']}"
    )
    extra = " with an MLP" if cfg["mlp"]["enabled"] else ""
    text = (
        f"{system}{extra}, scheme={cfg['scheme']}, n = {cfg['n']}, d = {cfg['d']}, {ds.sizes['member']} members "
        f"per $\\beta$ ({cfg['init']['kind']} initial tokens, the same for every $\\beta$), {cfg['solver']} with "
        f"dt = {cfg['dt']:g} on [{cfg['t0']:g}, {cfg['t1']:g}]; the {ds.sizes['exponent']} leading finite-time "
        f"exponents by the QR method, tangent to the sphere where the tokens live on it. "
    )
    last = drawn[-1]
    low, high = ds.isel(beta=0), ds.isel(beta=-1)
    median = lambda part, name, j, dim="exponent": _fixed(float(part[f"{name}_median"].sel({dim: j})))
    if "transverse_exponents" in ds:
        d = cfg["d"]
        text += (
            f"The flow commutes with every rotation of $R^{{{d}}}$: the spectrum (a) holds zeros that the symmetry "
            f"forces, {d - 1} at consensus and {d * (d - 1) // 2} while the tokens are split into clusters, so "
            f"$\\lambda_1$ = 0 at every $\\beta$ is not a finding, nor is $\\lambda_{{{last}}}$ = 0 for a split "
            "member. (b) The transverse exponents, deviations kept orthogonal to the rotation orbit: all -c at "
            "consensus (dashed). Median late transverse $\\lambda_1$: "
            f"{median(low, 'late_transverse_exponents', 1, 'transverse')} at $\\beta$ = {float(low['beta']):.3g}, "
            f"{median(high, 'late_transverse_exponents', 1, 'transverse')} at $\\beta$ = {float(high['beta']):.3g}: a "
            "member still split into clusters has a transverse direction (the clusters' relative position) that is "
            "nearly neutral over the window. "
        )
        bump = float(ds["transverse_running_median"].sel(transverse=1).max())
        text += (
            f"(d) Its running estimate over [t0, T] reaches at most {bump:.2f} at short times (the transient of "
            "the start) and decays: nearby configurations, up to rotation, do not keep separating. "
        )
    else:
        text += (
            f"Median $\\lambda_1$ and $\\lambda_{{{last}}}$ over the late window: at $\\beta$ = "
            f"{float(low['beta']):.3g} {median(low, 'late_exponents', 1)} and {median(low, 'late_exponents', last)}; "
            f"at $\\beta$ = {float(high['beta']):.3g} {median(high, 'late_exponents', 1)} and "
            f"{median(high, 'late_exponents', last)}. "
        )
    consensus = ds["consensus"].sel(exponent=last).values
    if np.isfinite(consensus).all():
        text += (
            "Dashed (a): the consensus spectrum in closed form, 0 for the d - 1 rotations of the consensus "
            "point and -c for the contraction of the tokens to it (c = 1 for softmax attention, $e^\\beta$ without "
            "normalization). "
        )
        if "consensus_fraction" in ds:
            shares = ", ".join(f"{100 * v:.0f}" for v in ds["consensus_fraction"].values)
            text += (
                f"Members at consensus over the second half (late $\\lambda_{{{last}}}$ within 10% of -c), in % for "
                f"$\\beta$ = {', '.join(f'{b:g}' for b in ds['beta'].values)}: {shares}. "
            )
    else:
        text += "This config has no closed-form consensus spectrum (it is known for identity Q, K, V on the sphere)."
    return text
