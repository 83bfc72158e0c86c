"""The summary figure of a results Dataset (drawn from the file, never from live
simulation objects).

`summary_figure(ds)` builds it; `plot_summary(ds, path)` saves it as a PNG (a run and
`attnflow plot` title it `summary_title(ds)`). One panel per recorded time series, in
the order of the clustering story: pair density, cluster count, interaction energy,
normalized energy, order parameter, largest cluster, attention rank and attention
concentration. Each panel shows the ensemble mean over members (one line per beta) and
the 10-90 % band of the members. A caption under the panels says what was run: the
initial condition, the weight schedule, the dynamics and the solver, and how many
members failed.

matplotlib is imported inside the functions: importing attnflow must stay fast.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import xarray as xr
import yaml

from ..schema._config import current_config
from ..schema._metric_registry import PANELS
from ..schema._words import number_text as _number
from ..schema._words import sequence_text as _sequence
from ..schema.initial import INITS, InitialCondition
from ..schema.system import PARTS
from ..storage._store import read_config, write_atomically
from ._figures import figure, wrap

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.figure import Figure

# The panels: every metric's label, reduction to (beta?, member, time) and y range, from
# the metric registry, in its panel order. Reductions keep NaN (skipna=False) so that a
# member whose state blew up is NaN at that time and drops out of the ensemble
# statistics instead of biasing them.
_STATUS = {1: "state became non-finite", 2: "solver stopped early"}

# Sizes in inches: a panel cell (axes plus its labels), the caption's line height,
# the title band, and the characters of the 8 pt caption font per inch of width.
_CELL = (4.4, 3.0)
_LINE = 0.16
_TITLE = 0.4
_CHARS_PER_INCH = 14
_PANELS_PER_ROW = 3
_MIN_WIDTH = 7.0


def _config(ds: xr.Dataset) -> dict:
    """The run's stored config ({} when it has none, or it is not YAML), with the keys
    renamed since under their new names (`current_config`); one that is not attnflow's
    (an alias bomb) raises `ConfigError` (`read_config`)."""
    try:
        cfg = read_config(ds.encoding.get("source", "this Dataset"), ds.attrs.get("config", "")) or {}
    except yaml.YAMLError:
        return {}
    return current_config(cfg) if isinstance(cfg, dict) else {}


def _panels(ds: xr.Dataset) -> list[tuple[str, str, xr.DataArray, tuple[float, float] | None, bool]]:
    """The recorded time series to draw, each reduced to dims `(beta?, member?, time)`."""
    panels = []
    for metric in PANELS:
        name = metric.name
        if name not in ds or "time" not in ds[name].dims:
            continue
        if name == "energy" and "log_energy" in ds:
            continue
        series = metric.reduce(ds[name])
        if set(series.dims) <= {"beta", "member", "time"}:
            panels.append((name, metric.label, series, metric.limits, metric.reads_eps))
    # A researcher's own metric (its variable says where it comes from, `metric`): drawn
    # from the stored values and attributes alone, its code never imported.
    for name, da in ds.data_vars.items():
        if "metric" in da.attrs and set(da.dims) <= {"beta", "member", "time"} and "time" in da.dims:
            label = str(da.attrs.get("long_name", name))
            units = da.attrs.get("units")
            label = "\n".join(wrap(label + (f" ({units})" if units not in (None, "1") else ""), 34))
            panels.append((str(name), label, da, None, False))
    return panels


def _betas(ds: xr.Dataset, cfg: dict) -> list:
    if "beta" in ds.coords or "beta" in ds.dims:
        return list(np.atleast_1d(ds["beta"].values))
    beta = cfg.get("beta")
    return list(np.atleast_1d(beta)) if beta is not None else [None]


def _beta_label(beta) -> str:
    return r"$\beta$ = ?" if beta is None else rf"$\beta$ = {float(beta):g}"


def _members(series: xr.DataArray) -> np.ndarray:
    """`(member, time)` values as floats, non-finite values as NaN."""
    if "member" not in series.dims:
        series = series.expand_dims("member")
    values = series.transpose("member", "time").values.astype(float)
    return np.where(np.isfinite(values), values, np.nan)


def _ensemble_statistics(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """NaN-aware mean and 10 and 90 % percentiles over members (axis 0)."""
    with warnings.catch_warnings():
        # A time at which every member is NaN gives NaN, not a warning.
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(values, axis=0)
        low, high = np.nanpercentile(values, [10, 90], axis=0)
    return mean, low, high


def _initial_condition(cfg: dict) -> str:
    init = cfg.get("init")
    if not isinstance(init, dict):
        return str(init) if init is not None else "not recorded"
    return INITS.get(init.get("kind"), InitialCondition).describe(init)  # pyright: ignore[reportCallIssue, reportArgumentType] any key may be looked up


def _system(cfg: dict) -> str:
    """The caption's sentence on the system: its size and scheme, then what each part of
    the field (`attnflow.schema.system.PARTS`) and each term of `terms` says of itself."""
    n, d = cfg.get("n", "?"), cfg.get("d", "?")
    size = f"n = {n} tokens, d = {d}"
    token_norm = cfg.get("token_norm")
    scheme = f"scheme = {cfg.get('scheme', '?')}"
    if cfg.get("scheme") in ("pre", "peri") and isinstance(token_norm, dict):
        scheme += f" ({token_norm.get('kind', '?')} norm)"
    parts = [phrase for part in PARTS.values() for phrase in part.describe(cfg)]
    parts[1:1] = [scheme, size]
    terms = cfg.get("terms")
    for name, spec in terms.items() if isinstance(terms, dict) else ():
        if isinstance(spec, dict):  # a term by name: its class and settings, as the config gave them
            settings = ", ".join(
                f"{key} = {_sequence(value) if isinstance(value, list) else _number(value)}"
                for key, value in spec.items()
                if key != "_target_"
            )
            parts.append(f"term {name}: {spec.get('_target_', '?')}" + (f" ({settings})" if settings else ""))
    return "; ".join(parts)


def _solver(cfg: dict, saves: int | None) -> str:
    text = f"Solver {cfg.get('solver', '?')}, dt = {_number(cfg.get('dt', '?'))}"
    if cfg.get("adaptive"):
        text += f" (adaptive, rtol {_number(cfg.get('rtol'))}, atol {_number(cfg.get('atol'))})"
    if "t0" in cfg and "t1" in cfg:
        text += f", t from {_number(cfg['t0'])} to {_number(cfg['t1'])}"
    # The stored times, not the `saves` asked for: saves may be moved onto the step grid.
    if saves is not None:
        text += f", {saves} {cfg.get('save_spacing', 'linear')}-spaced saves"
    if "dtype" in cfg:
        text += f", {cfg['dtype']}"
    return text


def _switches(cfg: dict, first: float, last: float) -> dict[float, str]:
    """The times in [first, last] at which a part of the field switches (a weight
    matrix's `switch_times`), each with what switches then ("V", "Q, K")."""
    found: dict[float, list[str]] = {}
    for part in PARTS.values():
        for at, names in part.switches(cfg).items():
            if first <= at <= last:
                found.setdefault(at, []).extend(name for name in names if name not in found.get(at, []))
    return {at: ", ".join(names) for at, names in sorted(found.items())}


def _failures(ds: xr.Dataset, panels: list) -> str | None:
    """How many (beta, member) runs failed and how, or a note on NaN values."""
    if "status" in ds:
        status = ds["status"].values
        failed = np.isfinite(status) & (status != 0)
        if failed.any():
            kinds = ", ".join(
                f"{int((status[failed] == code).sum())} {_STATUS.get(int(code), f'status {int(code)}')}"
                for code in np.unique(status[failed])
            )
            runs = "runs (beta, member)" if "beta" in ds["status"].dims else "members"
            text = f"Failed: {int(failed.sum())} of {status.size} {runs}: {kinds}"
            if "failure_time" in ds and np.isfinite(ds["failure_time"].values).any():
                text += f", the first at t = {np.nanmin(ds['failure_time'].values):.4g}"
            return text + "; their statistics are NaN from then on and are left out of the means and bands."
    if any(not np.isfinite(series.values.astype(float)).all() for _, _, series, _, _ in panels):
        return "Some values are NaN or infinite (a state blew up); they are left out of the means and bands."
    return None


def _caption(ds: xr.Dataset, cfg: dict, panels: list) -> list[str]:
    """The caption's paragraphs: what the lines and bands are, and what was run."""
    paragraphs = []
    if panels:
        members = ds.sizes.get("member", cfg.get("members", "?"))
        legend = f"Lines: ensemble means over {members} members; bands: 10–90 % of members."
        if any(uses_eps for *_, uses_eps in panels):
            eps = _number(cfg.get("cluster_eps", "?"))
            legend += (
                r" Clustering threshold: a pair is close when $\cos(x_i, x_j) > 1 - \varepsilon$, "
                rf"$\varepsilon$ = {eps}."
            )
        paragraphs.append(legend)
    paragraphs += [
        f"Initial condition: {_initial_condition(cfg)}. {_system(cfg)}.",
        *(f"{paragraph}." for paragraph in (part.paragraph(cfg) for part in PARTS.values()) if paragraph),
        f"{_solver(cfg, ds.sizes.get('time'))}.",
    ]
    failures = _failures(ds, panels)
    if failures:
        paragraphs.append(failures)
    stored = [f"{name} ({ds[name].attrs.get('long_name', name)})" for name in ("x", "source_x") if name in ds]
    if panels and stored:
        paragraphs.append(f"Not drawn, stored in results.nc: {', '.join(stored)}.")
    return paragraphs


def summary_figure(ds: xr.Dataset, title: str | None = None) -> Figure:
    """The summary figure of a results Dataset.

    One panel per recorded time series (at most three per row), x axis t (log spaced
    when `save_spacing: log`, then against $t - t_0$), the ensemble mean over members
    as one line per beta and the 10-90 % band of the members around it; a dashed
    vertical line, labelled, at each time a weight matrix switches (`switch_times`).
    The legend (beta values) sits to the right of the panels and the caption under
    them. When no time series was recorded the figure holds a single panel saying what
    the file holds. The figure is a `matplotlib.figure.Figure` outside pyplot: the
    backend and rcParams are left as they are.
    """
    import matplotlib  # lazy: start-up
    from matplotlib.lines import Line2D  # lazy: start-up
    from matplotlib.patches import Patch  # lazy: start-up
    from matplotlib.ticker import MaxNLocator  # lazy: start-up
    from matplotlib.transforms import blended_transform_factory  # lazy: start-up

    cfg = _config(ds)
    panels = _panels(ds)
    betas = _betas(ds, cfg)
    colors = matplotlib.colormaps["viridis"](np.linspace(0.0, 0.9, len(betas)))

    # As few rows as three panels per row allow, filled evenly (four panels: 2 x 2).
    rows = max(math.ceil(len(panels) / _PANELS_PER_ROW), 1)
    columns = max(math.ceil(len(panels) / rows), 1)
    panel_height = rows * _CELL[1] if panels else 1.6
    # The legend is one column of entries to the right of the panels, more columns
    # when the betas do not fit in the panels' height.
    entries = len(betas) + 1
    legend_columns = math.ceil(entries / max(int(panel_height / 0.22), 1))
    legend_width = 1.4 * legend_columns if panels else 0.0
    width = max(columns * _CELL[0] + legend_width, _MIN_WIDTH)
    width_chars = int(width * _CHARS_PER_INCH)
    caption = [line for paragraph in _caption(ds, cfg, panels) for line in wrap(paragraph, width_chars)]
    caption_height = len(caption) * _LINE + 0.25
    title_height = _TITLE if title else 0.0
    height = panel_height + caption_height + title_height

    fig = figure(figsize=(width, height))
    grid = fig.add_gridspec(rows, columns)
    if title:
        fig.suptitle(title, fontsize=11, y=1 - 0.08 / height, va="top")
    fig.text(0.01, (caption_height - 0.1) / height, "\n".join(caption), fontsize=8, va="top", ha="left", gid="caption")

    if not panels:
        ax = fig.add_subplot(grid[0, 0])
        ax.set_axis_off()
        recorded = cfg.get("metrics", "not recorded")
        stored = ", ".join(name for name in ds.data_vars) or "nothing"  # pyright: ignore[reportCallIssue, reportArgumentType] the names are str
        ax.text(
            0.5,
            0.5,
            f"No time-series metric was recorded (metrics = {recorded}).\n"
            f"results.nc holds: {stored}." + ("\nThe states x are in results.nc." if "x" in ds else ""),
            ha="center",
            va="center",
            fontsize=10,
            wrap=True,
        )
        fig.tight_layout(rect=(0, caption_height / height, 1, 1 - title_height / height))
        return fig

    time = ds["time"].values.astype(float)
    log_time = cfg.get("save_spacing") == "log"
    t0 = float(cfg.get("t0", time[0])) if log_time else 0.0
    # A log axis cannot show t = t0: those points are left out.
    shown = time - t0 > 0 if log_time else np.ones(time.shape, bool)
    abscissa = (time - t0)[shown]
    # A run at constant speed (time_change) records the rescaled time s.
    rescaled = (cfg.get("time_change") or {}).get("speed") is not None
    name = "s" if rescaled else "t"
    xlabel = (
        (name if t0 == 0 else f"{name} − {name}0 ({name}0 = {t0:g})")
        + (" (rescaled time)" if rescaled else "")
        + (", log scale" if log_time else "")
    )
    marker = "o" if abscissa.size == 1 else None
    # Weight switches are times t of the run: a rescaled time s does not show them.
    switches = {} if rescaled else _switches(cfg, float(time.min()), float(time.max()))

    for index, (name, label, series, limits, _) in enumerate(panels):
        ax = fig.add_subplot(grid[index // columns, index % columns])
        finite = False
        for position, (color, beta) in enumerate(zip(colors, betas)):
            values = _members(series.isel(beta=position) if "beta" in series.dims else series)[:, shown]
            mean, low, high = _ensemble_statistics(values)
            finite |= bool(np.isfinite(mean).any())
            ax.plot(abscissa, mean, color=color, marker=marker, linewidth=1.5, label=_beta_label(beta))
            ax.fill_between(abscissa, low, high, color=color, alpha=0.2, linewidth=0)
        for at, names in switches.items():
            ax.axvline(at - t0, color="0.3", linestyle="--", linewidth=0.9, gid="weight_switch")
            ax.text(
                at - t0,
                0.98,
                f" {names} switch{'es' if ',' not in names else ''} ",
                transform=blended_transform_factory(ax.transData, ax.transAxes),
                rotation=90,
                ha="right",
                va="top",
                fontsize=7,
                color="0.3",
                gid="weight_switch",
            )
        if not finite:
            ax.text(0.5, 0.5, "no finite values", transform=ax.transAxes, ha="center", va="center", color="0.4")
        if log_time and abscissa.size:
            ax.set_xscale("log")
        if limits is not None:
            ax.set_ylim(limits[0] - 0.04, limits[1] + 0.04)
        if name == "clusters":
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(xlabel, fontsize=9)
        ax.set_ylabel(label, fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.25, linewidth=0.5)

    right = 1 - legend_width / width
    top = 1 - title_height / height
    fig.tight_layout(rect=(0, caption_height / height, right, top), h_pad=1.0, w_pad=1.0)
    handles: list[Artist] = [Line2D([], [], color=color, linewidth=1.5) for color in colors]
    handles.append(Patch(color="0.5", alpha=0.3, linewidth=0))
    labels = [_beta_label(beta) for beta in betas] + ["10–90 %\nof members"]
    if switches:
        handles.append(Line2D([], [], color="0.3", linestyle="--", linewidth=0.9))
        labels.append("weight switch\n" + ", ".join(f"$t$ = {at:g}" for at in switches))
    fig.legend(
        handles,
        labels,
        loc="upper left",
        bbox_to_anchor=(right + 0.05 / width, top - 0.1 / height),
        ncols=legend_columns,
        fontsize=8,
        frameon=False,
        title="mean over members",
        title_fontsize=8,
    )
    return fig


def summary_title(ds: xr.Dataset) -> str | None:
    """The title of a run's summary figure, from its stored config: the attention kind, the
    scheme, n, d, the members, the solver and dt (None when the config lacks one
    of them)."""
    cfg = _config(ds)
    keys = ("attention_kind", "scheme", "n", "d", "members", "solver", "dt")
    if not all(key in cfg for key in keys):
        return None
    return (
        f"{str(cfg['attention_kind']).upper()} on scheme={cfg['scheme']}, n={cfg['n']}, d={cfg['d']}, "
        f"{cfg['members']} members, {cfg['solver']} dt={cfg['dt']}"
    )


def plot_summary(ds: xr.Dataset, path: str | Path, title: str | None = None) -> Path:
    """Save `summary_figure(ds, title)` as a PNG at `path`, whole or not at all, and
    return the path."""
    fig = summary_figure(ds, title=title)
    return write_atomically(Path(path), lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
