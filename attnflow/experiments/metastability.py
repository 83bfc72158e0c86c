"""Metastability: clusters that persist for a long time, then merge.

Under softmax self-attention with Q = K = V = I on the sphere, tokens first gather into
a few clusters, quickly; two clusters at angle theta then pull on each other only
through the attention weight $e^{-\\beta(1 - \\cos\\theta)}$ that one pays to the
other, so they stay apart for a time exponentially long in beta before they merge ("A
Survey of Continuous Time Dynamics of Transformers", section 4.1, theorem 4.7 and
fig. 2; "Dynamic metastability in the self-attention model", Geshkovski, Koubbi,
Polyanskiy, Rigollet). On a log time axis the cluster count steps down and the
interaction energy climbs a staircase. Two panels:

- `sphere` (the experiment's own keys): tokens on S^2 in two small caps 90 degrees
  apart form two clusters, which persist, then merge (the survey's fig. 2);
- `circle` (`experiment.options.circle` over those keys): 5 uniform tokens on the circle
  at a large beta climb the energy staircase of the "dynamic metastability" paper
  through several merges.

`analyse` runs the detector of `attnflow.metastability` on every member: plateaus of the
energy relative to one cluster, $E_\\beta / E_\\beta^{\\max}$ with
$E_\\beta^{\\max} = e^\\beta / (2\\beta)$ (its levels are $\\sum_q m_q^2$ for well-separated
point clusters of mass fractions $m_q$), plateaus of the cluster count, and the merges
with their times and counts. For each merge of two clusters into one it also computes
the merge time of the two-point-cluster reduction: clusters A and B of mass fractions
$m_A, m_B$ at angle $\\theta$ move towards each other along the great circle with

$$
\\dot\\theta = -\\sin\\theta \\left(\\frac{m_B}{m_A e^{\\beta(1-\\cos\\theta)} + m_B}
+ \\frac{m_A}{m_B e^{\\beta(1-\\cos\\theta)} + m_A}\\right),
$$

(each token of A gives weight $m_B e^{\\beta\\cos\\theta}/(m_A e^\\beta + m_B e^{\\beta\\cos\\theta})$
to B), started at the saved time nearest the geometric middle of the two-cluster
stretch from the measured angle and masses, and ended when $\\cos\\theta > 1 - \\epsilon$,
the clustering threshold. It holds for Q = K = V = I softmax attention on the sphere
only (NaN otherwise).

The figure, for each panel: the drawn member's token paths (on the sphere, or as angles
over log time on the circle), the cluster count and the relative energy over log time
with that member's detected plateaus shaded and merges marked, the other members faint.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import xarray as xr
import yaml

from .._errors import ConfigError
from .._progress import Progress
from ..metastability import detect_metastability
from ._common import caption, config_of, pyplot, save, stack_panels, wireframe_sphere
from ._runner import merge_overrides

TITLE = "Metastability: clusters that persist, then merge; the energy staircase over log time"
PAPER = ("A Survey of Continuous Time Dynamics of Transformers, fig. 2 (theorem 4.7); "
         "Dynamic metastability in the self-attention model (energy staircase on the circle)")
OPTIONS = {
    "circle": {"n": 5, "d": 2, "beta": 15.0, "init": {"kind": "uniform"}},  # panel (b) over panel (a)'s keys
    "tol": 0.02,  # a plateau spans at most this fraction of the series' range
    "min_decades": 0.5,  # shortest plateau, in decades of t
    "hold_decades": 0.2,  # shortest hold of a cluster count before and after a merge, in decades of t
    "member": None,  # the member drawn large (None: the most merges, then the latest last merge)
}
SERIES = ("relative_energy", "clusters")


def check(cfg, options) -> None:
    """The detector's settings and the drawn member, checked before anything is solved."""
    tol, member = options["tol"], options["member"]
    if not (isinstance(tol, (int, float)) and 0 <= tol < 1):
        raise ConfigError(f"experiment.options.tol is a fraction of a series' range in [0, 1), got {tol!r}.")
    for key in ("min_decades", "hold_decades"):
        if not (isinstance(options[key], (int, float)) and options[key] >= 0):
            raise ConfigError(f"experiment.options.{key} must be a number of decades >= 0, got {options[key]!r}.")
    if member is not None and not (isinstance(member, int) and 0 <= member < cfg.members):
        raise ConfigError(f"experiment.options.member must be null or a member in [0, {cfg.members}), got {member!r}.")
    if options["circle"] is not None and not isinstance(options["circle"], Mapping):
        raise ConfigError("experiment.options.circle must be a mapping of keys for panel (b), or null to leave it out.")


def panels(base: dict, options) -> dict[str, dict]:
    """`sphere`: the experiment's keys; `circle`: `experiment.options.circle` over them.
    Each takes one beta and records the cluster count and the energy."""
    configs = {"sphere": base}
    if options["circle"] is not None:
        configs["circle"] = merge_overrides(base, options["circle"])
    for label, config in configs.items():
        if isinstance(config["beta"], (list, Mapping)):
            raise ConfigError(f"panel {label} of experiment metastability takes one beta, got beta={config['beta']}.")
        metrics = set(config["metrics"])
        if "clusters" not in metrics or not metrics & {"energy", "log_energy"}:
            raise ConfigError(f"panel {label} of experiment metastability needs the metrics clusters and energy "
                              f"(or log_energy), got {config['metrics']}.")
    return configs


def two_cluster_time(theta: float, mass: float, beta: float, eps: float) -> float:
    """Time for two point clusters of mass fractions `mass` and 1 - `mass` at angle
    `theta` to reach $\\cos\\theta > 1 - \\epsilon$ under Q = K = V = I softmax
    attention on the sphere (the ODE of the module docstring): the integral of
    $d\\theta / |\\dot\\theta|$, taken in $u = \\log\\theta$ where it is smooth."""
    end = float(np.arccos(1 - eps))
    if not theta > end:
        return 0.0
    if not theta < np.pi:
        return float("inf")  # antipodal clusters do not move
    u = np.linspace(np.log(end), np.log(theta), 4001)
    angle = np.exp(u)
    weight = np.exp(-beta * (1 - np.cos(angle)))  # e^{-beta (1 - cos theta)}, never overflows
    a, b = mass, 1 - mass
    pull = b * weight / (a + b * weight) + a * weight / (b + a * weight)
    return float(np.trapezoid(angle / (np.sin(angle) * pull), u))


@functools.cache
def _compiled_labels():
    import jax

    from .. import cluster_labels

    return jax.jit(cluster_labels)


def _cluster_labels(x: np.ndarray, eps: float) -> np.ndarray:
    """`attnflow.cluster_labels` of one state, compiled once per shape."""
    import jax.numpy as jnp

    return np.asarray(_compiled_labels()(jnp.asarray(x), eps))


def _plain_attention(config: Mapping) -> bool:
    """Q = K = V = I softmax attention on the sphere, nothing else: where the
    two-cluster reduction holds."""
    identity = all(
        config["weights"][w]["kind"] == "identity" and config["weights"][w]["scale"] == 1
        and config["weights"][w]["sign"] == 1 and not config["weights"][w]["switch_times"]
        and config["weights"][w]["poly"] is None
        for w in "qkv")
    return (identity and config["weights"]["o"]["kind"] == "none" and config["dynamics"] == "sa"
            and config["norm"] == "sphere" and config["attention"] and not config["mlp"]["enabled"]
            and not config["causal"] and config["alibi"] is None and config["heads"] == 1)


def _predictions(res: xr.Dataset, found: xr.Dataset, config: Mapping) -> np.ndarray:
    """For each member, the two-cluster prediction of its last 2 -> 1 merge (NaN where
    there is none, the states are not saved, or the reduction does not hold)."""
    members = res.sizes["member"]
    out = np.full(members, np.nan)
    if "x" not in res or not _plain_attention(config):
        return out
    t, t0 = res["time"].values, float(config["t0"])
    beta, eps = float(config["beta"]), float(config["eps"])
    clusters = res["clusters"].values
    with Progress("two-cluster predictions", members, unit="members") as bar:
        for m in range(members):
            out[m] = _prediction(res, found, clusters, m, t, t0, beta, eps)
            bar.advance()
    return out


def _prediction(res, found, clusters, m: int, t, t0: float, beta: float, eps: float) -> float:
    """The two-cluster prediction of member m's last 2 -> 1 merge (NaN where none)."""
    pairs = np.flatnonzero((found["merge_from"].values[m] == 2) & (found["merge_to"].values[m] == 1))
    if not pairs.size:
        return np.nan
    merged = found["merge_time"].values[m, pairs[-1]]
    two = np.flatnonzero((clusters[m] == 2) & (t > t0) & (t < merged))
    if not two.size:
        return np.nan
    middle = t0 + np.sqrt((t[two[0]] - t0) * (merged - t0))
    k = two[np.argmin(abs(np.log(t[two] - t0) - np.log(middle - t0)))]
    x = res["x"].values[m, k]
    labels = _cluster_labels(x, eps)
    ids = np.unique(labels)
    if ids.size != 2:
        return np.nan
    centres = [x[labels == i].sum(0) for i in ids]
    centres = [c / np.linalg.norm(c) for c in centres]
    theta = float(np.arccos(np.clip(centres[0] @ centres[1], -1, 1)))
    mass = float(np.mean(labels == ids[0]))
    return t[k] + two_cluster_time(theta, mass, beta, eps)


def _labels_before_last_merge(x: np.ndarray, t: np.ndarray, found: xr.Dataset, member: int,
                              config: Mapping) -> np.ndarray:
    """Cluster labels (the smallest token index of each cluster) of one member's states
    `x` (time, token, dim) at the last saved time before its last merge."""
    times = found["merge_time"].values[member] if "merge" in found.dims else np.array([])
    times = times[np.isfinite(times)]
    k = int(np.flatnonzero(t < times[-1])[-1]) if times.size else t.size - 1
    return _cluster_labels(x[k], float(config["eps"]))


def _panel(res: xr.Dataset, options) -> xr.Dataset:
    config = yaml.safe_load(res.attrs["config"])
    beta, t0 = float(config["beta"]), float(config["t0"])
    if "log_energy" in res:
        relative = np.exp(res["log_energy"] - (beta - np.log(2 * beta)))
    else:
        relative = res["energy"] / (np.exp(beta) / (2 * beta))
    res = res.assign(relative_energy=relative.assign_attrs(
        description="interaction energy over its one-cluster value, E_beta / (e^beta / (2 beta)), in (0, 1]"))
    found = detect_metastability(res, SERIES, tol=options["tol"], min_decades=options["min_decades"],
                                 hold_decades=options["hold_decades"], origin=t0)
    member = options["member"] if options["member"] is not None else _representative(found)
    dims = {"member": "member", "time": "sample"}
    part = xr.Dataset(coords={"member": res["member"].values})
    part["time"] = ("sample", res["time"].values, {"description": "saved times (log-spaced from t0 + dt)"})
    for name in ("clusters", "energy", "log_energy", "relative_energy"):
        if name in res:
            da = res[name].transpose("member", "time")
            part[name] = (tuple(dims[d] for d in da.dims), da.values, da.attrs)
    for name in ("status", "failure_time", "num_steps"):
        if name in res:
            part[name] = ("member", res[name].values)
    part["clusters"].attrs["description"] = "connected components of the graph <x_i, x_j> > 1 - eps"
    for name, da in found.data_vars.items():
        part[name] = (da.dims, da.values, da.attrs)
    if "x" in res:
        x = res["x"].isel(member=member).transpose("time", ...).values
        part["x"] = (("sample", "token", "dim"), x, {"description": "states of the drawn member"})
        part["drawn_clusters"] = ("token", _labels_before_last_merge(x, res["time"].values, found, member, config), {
            "description": "cluster of each token of the drawn member at the last saved time before its last "
                           "merge (at the end when it has none)"})
    part["drawn_member"] = ((), member, {"description": "the member drawn large"})
    part["beta"] = ((), beta)
    part["two_cluster_time"] = ("member", _predictions(res, found, config), {
        "description": "time of the last 2 -> 1 merge predicted by the two-point-cluster reduction, started "
                       "mid-way through the two-cluster stretch (NaN: no such merge, or Q = K = V = I sphere "
                       "dynamics not in use)"})
    return part


def _representative(found: xr.Dataset) -> int:
    """The member with the most merges, and among those the latest last merge (the
    staircase that spans the most decades)."""
    counts = found["merge_count"].values
    last = np.nan_to_num(found["merge_time"].max("merge").values, nan=-np.inf) if found.sizes["merge"] else 0 * counts
    return int(np.lexsort((-last, -counts))[0])


def _padded(part: xr.Dataset, sizes: Mapping[str, int]) -> xr.Dataset:
    """`part` with every dimension padded at its end to `sizes` (-1 for integers, NaN
    for floats)."""
    out = {}
    for name, da in part.data_vars.items():
        widths = [(0, sizes[d] - da.sizes[d]) for d in da.dims]
        values = da.values
        if any(w for _, w in widths):
            integer = np.issubdtype(values.dtype, np.integer)
            values = np.pad(values if integer else values.astype(np.float64), widths,
                            constant_values=-1 if integer else np.nan)
        out[name] = (da.dims, values, da.attrs)
    coords = {d: np.arange(sizes[d]) for d in ("member", "sample", "plateau", "merge") if d in sizes}
    return xr.Dataset(out, coords=coords)


def analyse(cfg, options, results: dict[str, xr.Dataset]) -> xr.Dataset:
    parts = {label: _panel(res, options) for label, res in results.items()}
    sizes: dict[str, int] = {}
    for part in parts.values():
        for dim, size in part.sizes.items():
            sizes[dim] = max(sizes.get(dim, 0), size)
    ds = stack_panels({label: _padded(part, sizes) for label, part in parts.items()})
    ds.attrs = {key: float(options[key]) for key in ("tol", "min_decades", "hold_decades")}
    return ds


# --- the figure -----------------------------------------------------------------


def _paths(fig, spec, p: xr.Dataset, config: Mapping, keep: np.ndarray, letter: str) -> None:
    plt = pyplot()
    member = int(p["drawn_member"])
    n = int(config["n"])
    x = p["x"].values[keep, :n, : int(config["d"])]  # a smaller panel is padded
    t = p["time"].values[keep]
    labels = p["drawn_clusters"].values[:n]
    colors = plt.cm.tab10(np.unique(labels, return_inverse=True)[1] % 10)
    if x.shape[-1] == 3:
        ax = fig.add_subplot(spec, projection="3d")
        wireframe_sphere(ax, zoom=1.3)
        for i in range(x.shape[1]):
            ax.plot(*x[:, i].T, color=colors[i], linewidth=1.0)
            ax.scatter(*x[0, i], color=colors[i], marker="o", s=12)
        ax.scatter(*x[-1].T, color="k", marker="*", s=60, depthshade=False)
        ax.view_init(elev=25, azim=45)
        ax.set_title(f"({letter}) token paths, member {member}: o start, * end", pad=0)
        return
    ax = fig.add_subplot(spec)
    if x.shape[-1] == 2:
        angle = np.unwrap(np.arctan2(x[..., 1], x[..., 0]), axis=0)
        final = np.sort(np.mod(angle[-1], 2 * np.pi))
        gaps = np.diff(np.r_[final, final[0] + 2 * np.pi])
        cut = final[np.argmax(gaps)] + gaps.max() / 2 - 2 * np.pi  # the widest final gap sits at the edges
        angle -= 2 * np.pi * np.floor((angle[-1] - cut) / (2 * np.pi))
        ax.set_ylabel("angle on the circle (rad)")
    else:
        mean = x[-1].sum(0) / np.linalg.norm(x[-1].sum(0))
        angle = x @ mean
        ax.set_ylabel("cosine with the final mean direction")
    for i in range(x.shape[1]):
        ax.plot(t, angle[:, i], color=colors[i], linewidth=1.2)
    ax.set_xscale("log")
    ax.set_xlabel("time t")
    ax.set_title(f"({letter}) token angles, member {member}")


def _marks(ax, p: xr.Dataset, member: int, series: str, keep_t: np.ndarray, annotate: bool) -> None:
    """Shade the member's plateaus of `series` (two shades in turn, so that neighbours
    stay apart) and mark its merges, labelled with the counts when `annotate`."""
    starts = p[f"{series}_plateau_start"].sel(member=member).values
    ends = p[f"{series}_plateau_end"].sel(member=member).values
    for k, (a, b) in enumerate(zip(starts, ends)):
        if np.isfinite(a):
            ax.axvspan(a, b, color="C2", alpha=0.12 if k % 2 else 0.25, linewidth=0)
    times = p["merge_time"].sel(member=member).values
    before = p["merge_from"].sel(member=member).values
    after = p["merge_to"].sel(member=member).values
    later = np.r_[times[1:], np.nan]
    for time, following, b, a in zip(times, later, before, after):
        if np.isfinite(time):
            ax.axvline(time, color="C3", linestyle="--", linewidth=1)
            # a label needs about half a decade before the next merge's line
            if annotate and not np.log10(following / time) < 0.5:
                ax.annotate(f"{b}→{a}", (time, b), xytext=(3, 2), textcoords="offset points", fontsize=7,
                            color="C3")
    predicted = float(p["two_cluster_time"].sel(member=member))
    if np.isfinite(predicted) and keep_t[0] < predicted < keep_t[-1]:
        ax.axvline(predicted, color="k", linestyle=":", linewidth=1.2)


def _series(ax, p: xr.Dataset, name: str, keep: np.ndarray, step: bool) -> None:
    member = int(p["drawn_member"])
    t = p["time"].values[keep]
    values = p[name].values[:, keep].astype(float)
    values[values < 0] = np.nan  # padding
    draw = (lambda a, y, **kw: a.step(t, y, where="post", **kw)) if step else (lambda a, y, **kw: a.plot(t, y, **kw))
    for m in range(values.shape[0]):
        if m != member and np.isfinite(values[m]).any():
            draw(ax, values[m], color="0.6", linewidth=0.6, alpha=0.6)
    draw(ax, values[member], color="C0", linewidth=2)
    ax.set_xscale("log")
    ax.set_xlim(t[0], t[-1])
    ax.set_xlabel("time t")


def draw(ds: xr.Dataset, folder: Path) -> list[Path]:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    plt = pyplot()
    labels = [str(label) for label in ds["panel"].values]
    fig = plt.figure(figsize=(13.5, 3.9 * len(labels)))
    grid = fig.add_gridspec(len(labels), 3, width_ratios=(1.0, 1.15, 1.15), wspace=0.3, hspace=0.45)
    notes = []
    for row, label in enumerate(labels):
        p = ds.sel(panel=label)
        config = config_of(ds, label)
        member = int(p["drawn_member"])
        t = p["time"].values
        keep = np.isfinite(t) & (t > float(config["t0"]))
        letter = "ab"[row] if row < 2 else str(row + 1)
        _paths(fig, grid[row, 0], p, config, keep, letter)
        ax = fig.add_subplot(grid[row, 1])
        _series(ax, p, "clusters", keep, step=True)
        _marks(ax, p, member, "clusters", t[keep], annotate=True)
        ax.set_ylabel(f"clusters (<x_i, x_j> > 1 - {config['eps']:g})")
        ax.set_yscale("log")
        top = int(np.nanmax(np.where(p["clusters"].values >= 0, p["clusters"].values, np.nan)))
        ticks = [k for k in (1, 2, 3, 4, 5, 6, 8, 10, 16, 32, 64, 128) if k <= top]
        ax.set_yticks(ticks, [str(k) for k in ticks])
        ax.minorticks_off()
        ax.set_xscale("log")
        ax.set_title(f"cluster count: n = {config['n']}, d = {config['d']}, beta = {config['beta']:g}")
        ax2 = fig.add_subplot(grid[row, 2])
        _series(ax2, p, "relative_energy", keep, step=False)
        _marks(ax2, p, member, "relative_energy", t[keep], annotate=False)
        ax2.set_ylabel(r"$E_\beta / E_\beta^{\max}$,  $E_\beta^{\max} = e^\beta/(2\beta)$")
        ax2.set_title(f"interaction energy relative to one cluster ({p.sizes['member']} members)")
        handles = [Line2D([], [], color="C0", linewidth=2, label=f"member {member}"),
                   Line2D([], [], color="0.6", linewidth=0.6, label="other members"),
                   Patch(color="C2", alpha=0.3, label="detected plateaus"),
                   Line2D([], [], color="C3", linestyle="--", label="detected merges")]
        predicted = p["two_cluster_time"].values
        if np.isfinite(predicted).any():
            handles.append(Line2D([], [], color="k", linestyle=":", label="two-cluster reduction"))
        ax2.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
        counts = p["merge_count"].values
        note = (f"({letter}) n = {config['n']} tokens on S^{config['d'] - 1}, beta = {config['beta']:g}, "
                f"{_init_words(config)}; merges per member: {_spread(counts)}")
        final = p["merge_time"].values
        ratio = np.array([final[m][np.isfinite(final[m])][-1] / predicted[m] if np.isfinite(predicted[m]) else np.nan
                          for m in range(len(predicted))])
        if np.isfinite(ratio).any():
            note += (f"; detected / predicted time of the 2 -> 1 merge: median {np.nanmedian(ratio):.3f} "
                     f"(range {np.nanmin(ratio):.3f}-{np.nanmax(ratio):.3f})")
        notes.append(note + ".")
    config = config_of(ds)
    caption(fig, (
        f"Q = K = V = I softmax attention on the sphere, {config['solver']} with adaptive steps (rtol "
        f"{config['rtol']:g}) in {config['dtype']}, output at {ds.sizes['sample']} log-spaced times to "
        f"t = {config['t1']:g}. " + " ".join(notes) + f" Plateaus: windows whose values span at most "
        f"{ds.attrs['tol']:g} of the series' range for at least {ds.attrs['min_decades']:g} decades of t, "
        f"longest first (shaded, two shades in turn); merges: steps down between cluster counts that each hold "
        f"at least {ds.attrs['hold_decades']:g} decades, at the first time of the lower count."), width=190)
    return save(fig, folder, "metastability")


def _init_words(config: Mapping) -> str:
    init = config["init"]
    if init["kind"] == "caps":
        return f"{init['k']} caps of radius {init['radius']:g}" + (" (centres given)" if init.get("centres") else "")
    return f"{init['kind']} initial tokens"


def _spread(counts: np.ndarray) -> str:
    counts = counts[counts >= 0]
    values, number = np.unique(counts, return_counts=True)
    return ", ".join(f"{v} ({k} members)" if k > 1 else f"{v} (1 member)" for v, k in zip(values, number))
