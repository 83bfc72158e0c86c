"""Metastability: clusters that persist for a long time, then merge, and the energy
staircase of "Dynamic metastability in the self-attention model".

Under self-attention on the sphere, tokens first gather into a few clusters, quickly;
two clusters at angle theta then pull on each other only through the attention weight
$e^{-\\beta(1 - \\cos\\theta)}$ that one pays to the other, so they stay apart for a time
exponentially long in beta before they merge ("A Survey of Continuous Time Dynamics of
Transformers", section 4.1, theorem 4.7 and fig. 2; "Dynamic metastability in the
self-attention model", Geshkovski, Koubbi, Polyanskiy, Rigollet). Two panels:

- `sphere` (a), the experiment's own keys: Q = K = V = I softmax attention, 16 tokens on
  S^2 in two small caps 90 degrees apart form two clusters, which persist, then merge
  (the survey's fig. 2), over log time;
- `staircase` (b), `experiment.options.staircase` over the defaults: the published
  staircase. n = 5 tokens on the circle at the angles
  $\\theta_0 = \\tfrac12 (0, L/2, 2L, 4L, 7L)$ with $L = \\log 2000 / \\sqrt{2000}$ (the same
  for every beta), the unnormalized (USA) field, the gradient of the interaction energy,
  run at constant speed $c = \\log\\beta$ (`time_change.speed=log_beta`: a time change
  that follows the exponentially small pulls between clusters at the speed of any other
  motion), Euler steps of $10^{-5}$ in rescaled time $s$ (the published step), tokens that
  meet merged (`time_change.collisions=1e-3`), for beta = 500 ... 4000 in one sweep. Its
  normalized energy $\\frac{1}{n^2} \\sum_{ij} e^{\\beta(\\cos(\\theta_i - \\theta_j) - 1)}$
  climbs the levels $\\sum_q m_q^2/n^2$ of the cluster partitions: 7/25 (2, 1, 1, 1),
  11/25 (3, 1, 1), 13/25 (3, 2), then 1, over a linear axis of rescaled time.

`analyse` runs the detector of `attnflow.analysis.plateaus` on every member: plateaus of the
energy relative to one cluster, $E_\\beta / E_\\beta^{\\max}$ with
$E_\\beta^{\\max} = e^\\beta / (2\\beta)$ (the normalized energy above; its levels are
$\\sum_q m_q^2$ for well-separated point clusters of mass fractions $m_q$) while the
cluster partition holds, each with its partition, plateaus of the cluster count, and the
merges with their times and counts. For each merge of two clusters into one in panel (a)
it also computes the merge time of the two-point-cluster reduction: clusters A and B of
mass fractions $m_A, m_B$ at angle $\\theta$ move towards each other along the great
circle with

$$
\\dot\\theta = -\\sin\\theta \\left(\\frac{m_B}{m_A e^{\\beta(1-\\cos\\theta)} + m_B}
+ \\frac{m_A}{m_B e^{\\beta(1-\\cos\\theta)} + m_A}\\right),
$$

(each token of A gives weight $m_B e^{\\beta\\cos\\theta}/(m_A e^\\beta + m_B e^{\\beta\\cos\\theta})$
to B), started at the saved time nearest the geometric middle of the two-cluster
stretch from the measured angle and masses, and ended when $\\cos\\theta > 1 - \\epsilon$,
the clustering threshold. It holds for Q = K = V = I softmax attention on the sphere
only (NaN otherwise).

The figure: (a) the drawn member's token paths on the sphere, the cluster count and the
relative energy over log time with that member's detected plateaus shaded and merges
marked, the other members faint; (b) the token angles at the largest beta, the energy
staircases of every beta over rescaled time with the partition levels as reference lines
and the detected plateaus marked, and the table of the detected plateaus.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..running._progress import Progress
from ..schema._config import defaults, to_container
from ..schema._errors import ConfigError
from ..schema._schema import setting
from ._common import caption, check_member_option, colormap, config_of, figure, wireframe_sphere
from ._experiment import Counter, Experiment, Keeper
from ._lazy import lazy

if TYPE_CHECKING:
    import jax
    import jax.numpy as jnp
    import matplotlib.lines as mlines
    import matplotlib.patches as mpatches
    import xarray as xr
    from matplotlib.figure import Figure

    from ..analysis import plateaus
    from ..numerics import _metrics
    from . import _runner
else:
    jax = lazy("jax")
    jnp = lazy("jax.numpy")
    xr = lazy("xarray")
    mlines = lazy("matplotlib.lines")
    mpatches = lazy("matplotlib.patches")
    plateaus = lazy("attnflow.analysis.plateaus")
    _metrics = lazy("attnflow.numerics._metrics")
    _runner = lazy("attnflow.experiments._runner")


def published_angles() -> list[float]:
    """The initial angles of the published staircase, $\\tfrac12 (0, L/2, 2L, 4L, 7L) \\bmod \\pi$
    (each term reduced mod pi before halving) with $L = \\log 2000 / \\sqrt{2000}$."""
    size = np.log(2000) / np.sqrt(2000)
    return (0.5 * np.mod(np.array([0.0, 0.5, 2.0, 4.0, 7.0]) * size, np.pi)).tolist()


@dataclass
class Detector:
    """Plateau detection (`attnflow.detect_metastability`)."""

    tol: float = setting(0.02, "a plateau spans at most this fraction of the series' range")
    min_length: float = setting(0.5, "shortest plateau")
    hold_length: float = setting(0.2, "shortest hold of a cluster count before and after a merge")


@dataclass
class Options:
    staircase: dict[str, Any] | None = setting(
        {
            "n": 5,
            "d": 2,
            "beta": [500.0, 1000.0, 1500.0, 2000.0, 3000.0, 4000.0],
            "attention_kind": "usa",
            "init": {"kind": "given", "value": [[float(np.cos(a)), float(np.sin(a))] for a in published_angles()]},
            "members": 1,
            "dtype": "float64",
            "t1": 0.2,
            "dt": 1.0e-5,
            "solver": "euler",
            "time_change": {"speed": "log_beta", "collisions": 1.0e-3},
            "saves": 2001,
            "save_states": True,
            "metrics": ["log_energy", "clusters", "cluster_sizes"],
            "cluster_eps": 1.0e-8,
        },
        "panel (b): keys over the defaults (not over panel (a)'s); conf/experiment/metastability.yaml holds them",
    )
    sphere_detector: Detector = setting(Detector(), "panel (a), lengths in decades of t")
    staircase_detector: Detector = setting(
        Detector(tol=0.02, min_length=0.005, hold_length=0.002), "panel (b), lengths in rescaled time s"
    )
    member: int | None = setting(
        None, "the member of panel (a) drawn large (null: the most merges, then the latest last merge)"
    )


SERIES = ("relative_energy", "clusters")
# The partitions of the published staircase and their levels sum_q m_q^2 / n^2.
STAIRCASE = {(2, 1, 1, 1): 7 / 25, (3, 1, 1): 11 / 25, (3, 2): 13 / 25, (5,): 1.0}


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
    return jax.jit(_metrics.cluster_labels)


def _cluster_labels(x: np.ndarray, eps: float) -> np.ndarray:
    """`attnflow.cluster_labels` of one state, compiled once per shape."""
    return np.asarray(_compiled_labels()(jnp.asarray(x), eps))


def _plain_attention(config: Mapping) -> bool:
    """Q = K = V = I softmax attention on the sphere, nothing else: where the
    two-cluster reduction holds."""
    identity = all(
        config["weights"][w]["kind"] == "identity"
        and config["weights"][w]["scale"] == 1
        and config["weights"][w]["sign"] == 1
        and not config["weights"][w]["switch_times"]
        and config["weights"][w]["poly"] is None
        for w in "qkv"
    )
    return (
        identity
        and config["weights"]["o"]["kind"] == "none"
        and config["attention_kind"] == "sa"
        and config["scheme"] == "sphere"
        and config["attention"]
        and not config["mlp"]["enabled"]
        and not config["causal"]
        and config["alibi"] is None
        and config["heads"] == 1
    )


def _predictions(res: xr.Dataset, found: xr.Dataset, config: Mapping) -> np.ndarray:
    """For each member, the two-cluster prediction of its last 2 -> 1 merge (NaN where
    there is none, the states are not saved, or the reduction does not hold)."""
    members = res.sizes["member"]
    out = np.full(members, np.nan)
    if "x" not in res or not _plain_attention(config):
        return out
    t, t0 = res["time"].values, float(config["t0"])
    beta, eps = float(config["beta"]), float(config["cluster_eps"])
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


def _labels_before_last_merge(
    x: np.ndarray, t: np.ndarray, found: xr.Dataset, member: int, config: Mapping
) -> np.ndarray:
    """Cluster labels (the smallest token index of each cluster) of one member's states
    `x` (time, token, dim) at the last saved time before its last merge."""
    times = found["merge_time"].values[member] if "merge" in found.dims else np.array([])
    times = times[np.isfinite(times)]
    k = int(np.flatnonzero(t < times[-1])[-1]) if times.size else t.size - 1
    return _cluster_labels(x[k], float(config["cluster_eps"]))


def _relative(res: xr.Dataset) -> xr.DataArray:
    """$E_\\beta / (e^\\beta / (2\\beta)) = \\frac{1}{n^2}\\sum_{ij} e^{\\beta(\\langle x_i, x_j\\rangle - 1)}$,
    from the log-energy where the run has it (finite for any beta)."""
    beta = res["beta"]
    if "log_energy" in res:
        relative = np.exp(res["log_energy"] - (beta - np.log(2 * beta)))
    else:
        relative = res["energy"] / (np.exp(beta) / (2 * beta))
    return relative.assign_attrs(
        description="interaction energy over its one-cluster value, "
        "E_beta / (e^beta / (2 beta)) = mean_ij exp(beta (<x_i, x_j> - 1))"
    )


def _sphere(res: xr.Dataset, settings: Detector, member: int | None) -> xr.Dataset:
    """Panel (a): its series over the members and saved times, the detected plateaus and
    merges over log time, `member`'s paths (None: `_representative`) and the two-cluster
    predictions."""
    config = config_of(res)
    beta, t0 = float(config["beta"]), float(config["t0"])
    res = res.assign(relative_energy=_relative(res))
    found = plateaus.detect_metastability(
        res,
        SERIES,
        tol=settings.tol,
        min_length=settings.min_length,
        hold_length=settings.hold_length,
        axis="log",
        origin=t0,
    )
    member = member if member is not None else _representative(found)
    dims = {"member": "member", "time": "sample", "cluster": "cluster"}
    part = xr.Dataset(coords={"member": res["member"].values})
    part["time"] = ("sample", res["time"].values, {"description": "saved times (log-spaced from t0 + dt)"})
    for name in ("clusters", "cluster_sizes", "energy", "log_energy", "relative_energy"):
        if name in res:
            da = res[name].transpose("member", "time", ...)
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
        part["drawn_clusters"] = (
            "token",
            _labels_before_last_merge(x, res["time"].values, found, member, config),
            {
                "description": "cluster of each token of the drawn member at the last saved time before its last "
                "merge (at the end when it has none)"
            },
        )
    part["drawn_member"] = ((), member, {"description": "the member of panel (a) drawn large"})
    part["sphere_beta"] = ((), beta, {"description": "beta of panel (a)"})
    part["two_cluster_time"] = (
        "member",
        _predictions(res, found, config),
        {
            "description": "time of the last 2 -> 1 merge predicted by the two-point-cluster reduction, started "
            "mid-way through the two-cluster stretch (NaN: no such merge, or Q = K = V = I sphere "
            "dynamics not in use)"
        },
    )
    part.attrs = {f"sphere_{key}": float(value) for key, value in dataclasses.asdict(settings).items()}
    return part


def _staircase(res: xr.Dataset, settings: Detector) -> xr.Dataset:
    """Panel (b): the normalized energy, cluster count, partition and angles over rescaled
    time for every beta (member 0: the published start is one given state), and the
    plateaus and merges detected on a linear axis; every name starts with `staircase_`."""
    config = config_of(res)
    res = res.isel(member=0)
    if "beta" not in res.dims:
        res = res.expand_dims("beta")
    res = res.assign(relative_energy=_relative(res))
    found = plateaus.detect_metastability(
        res,
        SERIES,
        sizes="cluster_sizes",
        tol=settings.tol,
        min_length=settings.min_length,
        hold_length=settings.hold_length,
        axis="linear",
        origin=float(config["t0"]),
    )
    rename: dict[Hashable, str] = {
        "time": "staircase_sample",
        "plateau": "staircase_plateau",
        "merge": "staircase_merge",
        "cluster": "staircase_cluster",
        "token": "staircase_token",
    }
    what = res.attrs.get("time_axis", "time t")
    part = xr.Dataset(coords={"beta": res["beta"].values})
    part["staircase_time"] = ("staircase_sample", res["time"].values, {"description": f"saved times: {what}"})
    for name, label in (("relative_energy", "energy"), ("clusters", "clusters"), ("cluster_sizes", "sizes")):
        da = res[name].transpose("beta", "time", ...)
        part[f"staircase_{label}"] = (tuple(rename.get(d, d) for d in da.dims), da.values, da.attrs)
    if "x" in res and res.sizes["dim"] == 2:
        x = res["x"].transpose("beta", "time", "token", "dim").values
        part["staircase_angles"] = (
            ("beta", "staircase_sample", "staircase_token"),
            np.arctan2(x[..., 1], x[..., 0]),
            {"description": "angle of each token on the circle (rad)", "units": "radian"},
        )
    for name, da in found.data_vars.items():
        part[f"staircase_{name}"] = (tuple(rename.get(d, d) for d in da.dims), da.values, da.attrs)
    part.attrs = {f"staircase_{key}": float(value) for key, value in dataclasses.asdict(settings).items()}
    return part


def _representative(found: xr.Dataset) -> int:
    """The member with the most merges, and among those the latest last merge (the
    staircase that spans the most decades)."""
    counts = found["merge_count"].values
    last = np.nan_to_num(found["merge_time"].max("merge").values, nan=-np.inf) if found.sizes["merge"] else 0 * counts
    return int(np.lexsort((-last, -counts))[0])


class Metastability(Experiment):
    title = (
        "Metastability: clusters that persist, then merge (log time); the energy staircase of the cluster "
        "partitions (rescaled time)"
    )
    paper = (
        "A Survey of Continuous Time Dynamics of Transformers, fig. 2 (theorem 4.7); "
        "Dynamic metastability in the self-attention model (the energy staircase, its published code's setup)"
    )
    Options = Options

    def check(self) -> None:
        """The detectors' settings and the drawn member, checked before anything is solved."""
        options = self.options
        for name, settings in (
            ("sphere_detector", options.sphere_detector),
            ("staircase_detector", options.staircase_detector),
        ):
            tol = settings.tol
            if not 0 <= tol < 1:
                raise ConfigError(
                    f"experiment.options.{name}.tol is a fraction of a series' range in [0, 1), got {tol!r}."
                )
            for key, value in (("min_length", settings.min_length), ("hold_length", settings.hold_length)):
                if not value >= 0:
                    raise ConfigError(f"experiment.options.{name}.{key} must be a number >= 0, got {value!r}.")
        check_member_option(options, self.cfg.members, optional=True)
        detector = options.staircase_detector
        if options.staircase is None and detector != Options().staircase_detector:
            raise ConfigError(
                f"experiment.options.staircase_detector={dataclasses.asdict(detector)} does not apply "
                "with experiment.options.staircase=null (no staircase panel to detect on); remove it or "
                "give the staircase."
            )

    def panels(self, base: dict) -> dict[str, dict]:
        """`sphere`: the experiment's keys, one beta; `staircase`: `experiment.options.staircase`
        over the defaults. Both record the cluster count and the energy; the staircase also
        the cluster sizes (its plateaus are read while the partition holds)."""
        configs = {"sphere": base}
        if self.options.staircase is not None:
            plain = to_container(defaults())
            plain.pop("experiment")
            for key in ("overwrite", "plot", "compilation_cache"):  # how to run, as the command line says
                plain[key] = base[key]
            configs["staircase"] = _runner.merge_overrides(plain, self.options.staircase)
        if isinstance(base["beta"], (list, Mapping)):
            raise ConfigError(f"panel sphere of experiment metastability takes one beta, got beta={base['beta']}.")
        detectors = {"sphere": self.options.sphere_detector, "staircase": self.options.staircase_detector}
        for label, config in configs.items():
            # The detector refuses a shortest plateau that a steady drift could fill: say so now.
            settings = detectors[label]
            span = config["t1"] - config["t0"]
            span, unit = (np.log10(span / config["dt"]), "decades of t") if label == "sphere" else (span, "of s")
            # (a time that is not finite is the panel's study's to refuse, naming it)
            if np.isfinite(span) and settings.min_length <= settings.tol * span:
                raise ConfigError(
                    f"experiment.options.{label}_detector.min_length={settings.min_length:g} must exceed "
                    f"tol x the span of the time axis ({settings.tol:g} x {span:.3g} {unit}), or a "
                    "steady drift would be cut into plateaus."
                )
            metrics = set(config["metrics"])
            needed = {"clusters", "cluster_sizes"} if label == "staircase" else {"clusters"}
            if not needed <= metrics or not metrics & {"energy", "log_energy"}:
                names = ", ".join(sorted(needed))
                raise ConfigError(
                    f"panel {label} of experiment metastability needs the metrics {names} and energy (or "
                    f"log_energy), got {config['metrics']}."
                )
        return configs

    def analyse(self, results: dict[str, xr.Dataset], *, on_piece: Counter, keep: Keeper) -> xr.Dataset:
        parts = [_sphere(results["sphere"], self.options.sphere_detector, self.options.member)]
        if "staircase" in results:
            parts.append(_staircase(results["staircase"], self.options.staircase_detector))
        attrs = {key: value for part in parts for key, value in part.attrs.items()}
        ds = xr.merge(parts, combine_attrs="override")  # each variable keeps its own description
        ds.attrs = attrs
        return ds

    @staticmethod
    def draw(ds: xr.Dataset) -> dict[str, Figure]:

        staircase = "staircase_time" in ds
        rows = 2 if staircase else 1
        fig = figure(figsize=(13.5, 4.1 * rows))
        grid = fig.add_gridspec(rows, 3, width_ratios=(1.0, 1.15, 1.15), wspace=0.3, hspace=0.45)
        config = config_of(ds, "sphere")
        member = int(ds["drawn_member"])
        t = ds["time"].values
        keep = np.isfinite(t) & (t > float(config["t0"]))
        _paths(fig, grid[0, 0], ds, config, keep, "a")
        ax = fig.add_subplot(grid[0, 1])
        _series(ax, ds, "clusters", keep, step=True)
        _marks(ax, ds, member, "clusters", t[keep], annotate=True)
        ax.set_ylabel(f"clusters ($\\langle x_i, x_j \\rangle > 1 - {config['cluster_eps']:g}$)")
        ax.set_yscale("log")
        top = int(np.nanmax(np.where(ds["clusters"].values >= 0, ds["clusters"].values, np.nan)))
        ticks = [k for k in (1, 2, 3, 4, 5, 6, 8, 10, 16, 32, 64, 128) if k <= top]
        ax.set_yticks(ticks, [str(k) for k in ticks])
        ax.minorticks_off()
        ax.set_title(f"(a) cluster count: n = {config['n']}, d = {config['d']}, $\\beta$ = {config['beta']:g}")
        ax2 = fig.add_subplot(grid[0, 2])
        _series(ax2, ds, "relative_energy", keep, step=False)
        _marks(ax2, ds, member, "relative_energy", t[keep], annotate=False)
        ax2.set_ylabel(r"$E_\beta / E_\beta^{\max}$,  $E_\beta^{\max} = e^\beta/(2\beta)$")
        ax2.set_title(f"(a) interaction energy relative to one cluster ({ds.sizes['member']} members)")
        handles = [
            mlines.Line2D([], [], color="C0", linewidth=2, label=f"member {member}"),
            mlines.Line2D([], [], color="0.6", linewidth=0.6, label="other members"),
            mpatches.Patch(color="C2", alpha=0.3, label="detected plateaus"),
            mlines.Line2D([], [], color="C3", linestyle="--", label="detected merges"),
        ]
        predicted = ds["two_cluster_time"].values
        if np.isfinite(predicted).any():
            handles.append(mlines.Line2D([], [], color="k", linestyle=":", label="two-cluster reduction"))
        ax2.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
        notes = [_sphere_note(ds, config)]
        if staircase:
            notes.append(_staircase_row(fig, grid, ds, config_of(ds, "staircase")))
        caption(fig, " ".join(notes), width=190)
        return {"metastability": fig}


# --- the figure -----------------------------------------------------------------


def _paths(fig, spec, p: xr.Dataset, config: Mapping, keep: np.ndarray, letter: str) -> None:
    member = int(p["drawn_member"])
    n = int(config["n"])
    x = p["x"].values[keep, :n, : int(config["d"])]  # a smaller panel is padded
    t = p["time"].values[keep]
    labels = p["drawn_clusters"].values[:n]
    colors = colormap("tab10")(np.unique(labels, return_inverse=True)[1] % 10)
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
                ax.annotate(f"{b}→{a}", (time, b), xytext=(3, 2), textcoords="offset points", fontsize=7, color="C3")
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


def _staircase_row(fig, grid, ds: xr.Dataset, config: Mapping) -> str:
    """Panel (b): token angles at the largest beta, the staircases of every beta with the
    partition levels and the detected plateaus, and the table of the plateaus; returns
    the caption's sentence."""

    s = ds["staircase_time"].values
    betas = ds["beta"].values
    colors = colormap("viridis")(np.linspace(0.0, 0.9, len(betas)))
    ax = fig.add_subplot(grid[1, 0])
    last = len(betas) - 1
    if "staircase_angles" in ds:
        angles = np.unwrap(ds["staircase_angles"].values[last], axis=0)
        for i in range(angles.shape[1]):
            ax.plot(s, angles[:, i], color=colormap("tab10")(i), linewidth=1.2)
    for time in ds["staircase_merge_time"].values[last]:
        if np.isfinite(time):
            ax.axvline(time, color="C3", linestyle="--", linewidth=0.8)
    ax.set_xlim(s[0], s[-1])
    ax.set_xlabel("rescaled time s")
    ax.set_ylabel("angle on the circle (rad)")
    ax.set_title(f"(b) token angles, $\\beta$ = {betas[last]:g}; merges dashed")
    ax = fig.add_subplot(grid[1, 1])
    for partition, level in STAIRCASE.items():
        ax.axhline(level, color="0.5", linestyle=":", linewidth=0.9)
        ax.annotate(
            f"{_fraction(level)} {partition}",
            (s[-1], level),
            xytext=(-2, 2),
            textcoords="offset points",
            ha="right",
            va="bottom",
            fontsize=7,
            color="0.35",
        )
    energy = ds["staircase_energy"].values
    for b, color in enumerate(colors):
        ax.plot(s, energy[b], color=color, linewidth=1.3)
        starts, ends, levels = (
            ds[f"staircase_relative_energy_plateau_{f}"].values[b] for f in ("start", "end", "level")
        )
        for a, e, level in zip(starts, ends, levels):
            if np.isfinite(a):
                ax.plot([a, e], [level, level], color=color, linewidth=6, alpha=0.3, solid_capstyle="butt")
    ax.set_xlim(s[0], s[-1])
    ax.set_xlabel(r"rescaled time $s$ (constant speed $\log \beta$)")
    ax.set_ylabel(r"energy $n^{-2} \sum_{ij} e^{\beta(\cos(\theta_i - \theta_j) - 1)}$")
    ax.set_title("(b) the energy staircase, n = 5 on the circle (USA)")
    handles = [mlines.Line2D([], [], color=c, linewidth=1.3, label=f"$\\beta$ = {b:g}") for b, c in zip(betas, colors)]
    handles += [
        mlines.Line2D([], [], color="0.5", linewidth=6, alpha=0.3, label="detected plateaus"),
        mlines.Line2D([], [], color="0.5", linestyle=":", label="partition levels"),
    ]
    ax.legend(handles=handles, loc="upper left", fontsize=7, frameon=False)
    ax = fig.add_subplot(grid[1, 2])
    ax.axis("off")
    table, worst = _plateau_table(ds)
    header = [r"$\beta$"] + [f"{p}\n{_fraction(v)}" for p, v in STAIRCASE.items()]
    cells = ax.table(cellText=table, colLabels=header, loc="center", cellLoc="center")
    cells.auto_set_font_size(False)
    cells.set_fontsize(8)
    cells.scale(1.0, 1.6)
    ax.set_title("(b) detected plateaus: measured level under each partition", fontsize=10)
    init = config["init"]["value"]
    return (
        f"(b) the published staircase: n = {config['n']} tokens on the circle at the published angles "
        f"({', '.join(f'{np.arctan2(y, x):.4f}' for x, y in init)} rad), the unnormalized field at constant speed "
        f"$\\log \\beta$ in rescaled time $s$, {config['solver']} steps of {config['dt']:g}, tokens within "
        f"{config['time_change']['collisions']:g} merged, {config['dtype']}, "
        f"$\\varepsilon$ = {config['cluster_eps']:g}; "
        f"plateaus (shaded bars) are read while the cluster partition holds (tol {ds.attrs['staircase_tol']:g} of the "
        f"range, at least {ds.attrs['staircase_min_length']:g} of $s$). Largest distance of a measured level from its "
        f"partition's level: {worst}."
    )


def merge_brackets(ds: xr.Dataset) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per member of panel (a): the last saved time before its last 2 -> 1 merge, the
    first saved time of the merged cluster (the detected merge time), and the merge time
    the two-cluster reduction predicts (NaN where there is none)."""
    t = ds["time"].values
    predicted = ds["two_cluster_time"].values
    before, after = np.full(predicted.shape, np.nan), np.full(predicted.shape, np.nan)
    for m in range(predicted.size):
        pairs = np.flatnonzero((ds["merge_from"].values[m] == 2) & (ds["merge_to"].values[m] == 1))
        if pairs.size and np.isfinite(predicted[m]):
            after[m] = ds["merge_time"].values[m, pairs[-1]]
            before[m] = t[np.flatnonzero(t < after[m])[-1]]
    return before, after, predicted


def _fraction(level: float) -> str:
    return "1" if level == 1 else f"{round(level * 25)}/25"


def _plateau_table(ds: xr.Dataset) -> tuple[list[list[str]], str]:
    """One row per beta: the measured level of the plateau held under each partition of
    the staircase ('-' where none is detected); and the largest deviation per beta."""
    rows, deviations = [], []
    for b, beta in enumerate(ds["beta"].values):
        parts = ds["staircase_relative_energy_plateau_partition"].values[b]
        levels = ds["staircase_relative_energy_plateau_level"].values[b]
        row, worst = [f"{beta:g}"], 0.0
        for partition, level in STAIRCASE.items():
            key = np.array(partition + (0,) * (parts.shape[-1] - len(partition)))
            held = [lv for part, lv in zip(parts, levels) if np.isfinite(lv) and np.array_equal(part, key)]
            row.append(" ".join(f"{lv:.4f}" for lv in held) if held else "-")
            worst = max([worst] + [abs(lv - level) for lv in held])
        rows.append(row)
        deviations.append(f"{worst:.1e} at $\\beta$ = {beta:g}")
    return rows, "; ".join(deviations)


def _sphere_note(ds: xr.Dataset, config: Mapping) -> str:
    counts = ds["merge_count"].values
    note = (
        f"(a) Q = K = V = I softmax attention, n = {config['n']} tokens on $S^{{{config['d'] - 1}}}$, $\\beta$ = "
        f"{config['beta']:g}, {_init_words(config)}, {config['solver']} with adaptive steps (rtol "
        f"{config['rtol']:g}) in {config['dtype']}, output at {ds.sizes['sample']} log-spaced times to "
        f"t = {config['t1']:g}; merges per member: {_spread(counts)}"
    )
    before, after, predicted = merge_brackets(ds)
    known = np.isfinite(predicted)
    if known.any():
        inside = int(np.sum((before[known] <= predicted[known]) & (predicted[known] <= after[known])))
        ratios = after[known] / predicted[known]
        note += (
            f"; the 2 -> 1 merge time of the two-cluster reduction lies between the last sample before and the "
            f"first sample after the detected merge for {inside} of {int(known.sum())} members (first sample "
            f"after / predicted: median {np.median(ratios):.3f}, range {ratios.min():.3f}-{ratios.max():.3f})"
        )
    return note + (
        f". Plateaus: windows whose values span at most {ds.attrs['sphere_tol']:g} of the series' range "
        f"for at least {ds.attrs['sphere_min_length']:g} decades of t while the partition holds, longest "
        f"first (shaded, two shades in turn); merges: steps down between cluster counts that each hold "
        f"at least {ds.attrs['sphere_hold_length']:g} decades, at the first time of the lower count."
    )


def _init_words(config: Mapping) -> str:
    init = config["init"]
    if init["kind"] == "caps":
        return f"{init['k']} caps of radius {init['radius']:g}" + (" (centres given)" if init.get("centres") else "")
    return f"{init['kind']} initial tokens"


def _spread(counts: np.ndarray) -> str:
    counts = counts[counts >= 0]
    values, number = np.unique(counts, return_counts=True)
    return ", ".join(f"{v} ({k} members)" if k > 1 else f"{v} (1 member)" for v, k in zip(values, number))
