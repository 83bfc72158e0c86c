"""One table and one figure across the runs of a sweep (`attnflow report DIR`).

A Hydra multirun (`attnflow -m d=2,3 solver=euler_renorm,rk4 ...`) leaves one run
directory per job, each with its `results.nc`, whichever launcher ran the jobs.
`report(DIR)` reads all of them (at any depth under DIR, outside hidden folders such
as the submitit launcher's `.submitit/`; the `incomplete.nc` and `error.txt` of failed
jobs are not results), finds the swept keys (the config keys, as dotted names such as
`weights.v.kind`, whose values differ between runs, or that a failed job set to a value
of its own) and writes into DIR:

- `report.csv`: one row per run and beta, in run order, with the run's folder, the
  swept keys, beta, the saved time the statistics are taken at (`time`), the run's final
  saved time, the fraction of failed members, and for each recorded metric the mean over
  members and its 10 and 90 % percentiles at that time (failed members left out); a job
  that failed (its folder holds an `error.txt` and no results) is one row too, in its
  place among the runs, with the values its command-line overrides gave the swept keys
  (empty where they are not known) and no numbers; the last column, `note`, names the
  failed job and its error (empty for a run);
- `report.nc`: the same rows, in the same order, along one dimension `row`: the run's
  folder (`run`), each swept key (named by the key with its dots replaced by
  underscores, `weights.v.kind` -> `weights_v_kind`, the key itself in the variable's
  `config_key`; a key that takes text lists its values in the figure's order, job
  order, in `categories`) and `beta` are coordinates along `row`, every other column
  (the statistics, `note`) a variable along `row`. The runs of a sweep need not fill the
  grid of its keys' combinations (a run that changes two keys of its own, a failed
  job), so no array spans that grid. A selection is a condition on the row's values:

      ds = xr.open_dataset("sweeps/d/report.nc")
      ds.where((ds.d == 8) & (ds.solver == "rk4"), drop=True)   # the rows of d = 8 with rk4
      ds.set_xindex(["d", "solver", "beta"]).sel(d=8, solver="rk4", beta=4.0)   # one row, by its keys
      ds.where(ds.note != "", drop=True).note                    # the failed jobs and why

- `report.png`: the mean of each metric against the first swept key, one line per value
  of the other swept keys and beta (each its own dash pattern and marker, so that
  coinciding lines stay visible), with the members' 10-90 % band; its title names every
  swept key, beta included when it takes more than one value.

`ReportOptions` steer the report (`attnflow report DIR --x KEY --colour KEY --metrics
A,B --time T|final|all --panels KEY`, the keywords of `report`): the key on the x-axis,
the key whose values colour the lines, the metrics drawn and stored, the time the
statistics are taken at (the saved time nearest to T in each run, each run's final
saved time, or `all`: the whole trajectory, drawn against time, one line per run and
beta, and stored along a dimension `time` of report.nc and one row per saved time in
report.csv) and one column of panels per value of a key. Values that are numbers are
drawn in ascending order, text in job order (the order of first appearance among the
rows), the same order report.nc's `categories` lists.

Each results file is opened lazily and only what the report needs is read (each
per-member series at the chosen saved time, or all of it for `--time all`, the
per-member quantities, the scalars)
before it is closed, so that the work and memory grow with the number of runs, not
with their sizes or with the combinations of their keys; its config goes through
`read_config` (bounded work: an alias bomb is refused in one sentence). `report`
returns the files written and one line saying what was reported.

The metrics are those of the summary figure, reduced the same way (largest cluster as
a fraction of n, attention rank and concentration averaged over heads). An experiment's
results (`attnflow experiment=NAME`) are summarized as far as they have that shape:
its row always holds the folder, the experiment and the swept keys, plus its per-member
time series and per-member quantities and its scalar results.
"""

from __future__ import annotations

import json
import re
import textwrap
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np
import xarray as xr
import yaml

from ..schema._config import current_config, renamed_key
from ..schema._errors import ConfigError, did_you_mean
from ..schema._metric_registry import METRICS, PANELS
from ..storage._cf import CONVENTIONS, dimension_name, variable_attributes
from ..storage._store import read_config, stored_config, write_atomically, write_results
from ._figures import colormap, style, styled, subplots

if TYPE_CHECKING:
    import pandas as pd

# Per-member bookkeeping, not a result to summarize (the failed fraction stands for it).
_BOOKKEEPING = ("status", "failure_time")
# The most of a failed job's `error.txt` that is read (attnflow writes one sentence).
_REASON_BYTES = 4096
# The swept keys the one-line summary names before "and N more".
_NAMED_KEYS = 6


@dataclass(frozen=True)
class ReportOptions:
    """What `attnflow report` draws and stores (`report_options` checks them as given):
    the key on the x-axis (`x`: a swept key or beta), the key whose values colour the
    lines (`colour`), the metrics (`metrics`, none: every recorded one), the time the
    statistics are taken at (`time`: a saved time, "final" or "all") and the key whose
    values each have a column of panels (`panels`); None leaves each to the report."""

    x: str | None = None
    colour: str | None = None
    metrics: tuple[str, ...] = ()
    time: float | str = "final"
    panels: str | None = None


def report_options(
    x: str | None = None,
    colour: str | None = None,
    metrics: str | list[str] | tuple[str, ...] | None = None,
    time: float | str | None = None,
    panels: str | None = None,
) -> ReportOptions:
    """The options of a report as the command line or a caller gives them (`metrics` as
    `"a,b"` or a list, `time` as a number, its text, "final" or "all"), checked for their
    form; the keys and metrics are checked against the runs when they are read. Raises
    `ConfigError` in one sentence naming the option."""
    for flag, key in (("--x", x), ("--colour", colour), ("--panels", panels)):
        if key is not None and (not isinstance(key, str) or not key.strip()):
            raise ConfigError(f"{flag} takes one swept key (or beta), got {key!r}.")
    names: tuple[str, ...] = ()
    if metrics is not None:
        given = metrics.split(",") if isinstance(metrics, str) else list(metrics)
        names = tuple(str(name).strip() for name in given)
        if not names or "" in names:
            raise ConfigError(
                f"--metrics takes metric names separated by commas, such as clusters,energy; got {metrics!r}."
            )
    when: float | str = "final"
    if time is not None and time != "final":
        if time == "all":
            when = "all"
        else:
            try:
                when = float(time)  # pyright: ignore[reportArgumentType] anything float() reads; the rest is refused
            except (TypeError, ValueError):
                when = np.nan
            if isinstance(time, bool) or not np.isfinite(when):
                raise ConfigError(f"--time takes a time (a number), final or all, got {time!r}.")
    return ReportOptions(_stripped(x), _stripped(colour), names, when, _stripped(panels))


def _stripped(key: str | None) -> str | None:
    return key.strip() if isinstance(key, str) else None


class _Run(NamedTuple):
    """What the report keeps of one results file: its folder (under the report's), its
    config (flattened), its rows (one per beta, without the swept keys) and the names
    of its per-member series."""

    path: Path
    flat: dict[str, Any]
    rows: list[dict[str, Any]]
    series: list[str]


def _natural(path: Path | str) -> list:
    """Sort key putting run 2 before run 10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def _flatten(mapping: Any, prefix: str = "") -> dict[str, Any]:
    """`{"weights": {"v": {"kind": "tied"}}}` -> `{"weights.v.kind": "tied"}`; lists are values."""
    if not isinstance(mapping, dict):
        return {prefix: mapping} if prefix else {}
    flat = {}
    for key, value in mapping.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, name))
        else:
            flat[name] = value
    return flat


def _cell(value: Any) -> Any:
    """A config value as a table cell: numbers stay numbers, anything else is text
    (`true`, `null`, `[1.0, 2.0]`, as in the config)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return value if isinstance(value, str) else json.dumps(value)


def _override_order(run: Path) -> list[str]:
    """The keys of a run's command-line overrides in the order they were typed (none
    when its `.hydra/overrides.yaml` is missing, unreadable or not attnflow's)."""
    overrides = run / ".hydra" / "overrides.yaml"
    try:
        typed = read_config(overrides) if overrides.is_file() else None
    except (OSError, yaml.YAMLError, ConfigError):
        return []
    keys = []
    for item in typed if isinstance(typed, list) else []:
        if isinstance(item, str) and "=" in item:
            key = item.split("=", 1)[0].lstrip("+~")
            keys.append(renamed_key(key) or key)  # a run of an attnflow before the key was renamed
    return keys


def _label(name: str) -> str:
    """The summary figure's axis label of a metric (its own name otherwise)."""
    labels = {metric.reduced_name or metric.name: metric.label for metric in PANELS}
    return labels.get(name, name.replace("_", " "))


def _finals(ds: xr.Dataset, at: int | slice = -1) -> dict[str, xr.DataArray]:
    """The per-member time series of a run at its saved time `at` (an index: dims
    (beta?, member); a slice: (beta?, member, time)), as lazy as `ds` (only those times
    are read when their values are)."""
    if ds.sizes.get("time", 0) == 0:
        return {}
    found = {}
    for metric in PANELS:
        if metric.name in ds and {"member", "time"} <= set(ds[metric.name].dims):
            # The reductions (over clusters, heads, queries, keys) act at each time alone.
            found[metric.reduced_name or metric.name] = metric.reduce(ds[metric.name].isel(time=at))
    for name, da in ds.data_vars.items():
        reduced = name in METRICS and METRICS[name].reduced_name is not None  # pyright: ignore[reportArgumentType] xarray's names are Hashable; a str here
        if name in found or reduced or not {"member", "time"} <= set(da.dims):
            continue
        found[str(name)] = da.isel(time=at)
    kept = {"beta", "member", "time"} if isinstance(at, slice) else {"beta", "member"}
    return {name: da for name, da in found.items() if _squeezable(da, kept)}


def _time_indices(ds: xr.Dataset, run: str, when: float | str) -> list[int]:
    """The saved times (indices) a run's statistics are taken at: its last, the one
    nearest to a time `when` within its saved times (else `ConfigError`), or all."""
    times = ds["time"].values.astype(float) if "time" in ds.coords and ds["time"].ndim == 1 else np.array([])
    if times.size == 0:
        return []
    if when == "all":
        return list(range(times.size))
    if when == "final":
        return [times.size - 1]
    when = float(when)
    first, last = float(times.min()), float(times.max())
    tolerance = 1e-6 * max(abs(first), abs(last), 1.0)
    if not first - tolerance <= when <= last + tolerance:
        raise ConfigError(
            f"--time {when:g} is outside the saved times of run {run} ({first:g} to {last:g}); give a time "
            "between them, final or all."
        )
    return [int(np.abs(times - when).argmin())]


def _squeezable(da: xr.DataArray, allowed: set[str]) -> bool:
    return all(dim in allowed or da.sizes[dim] == 1 for dim in da.dims)


def _squeeze(da: xr.DataArray, allowed: set[str]) -> xr.DataArray:
    return da.squeeze([dim for dim in da.dims if dim not in allowed], drop=True)


def _statistics(values: np.ndarray) -> tuple[float, float, float]:
    values = values.astype(float)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return np.nan, np.nan, np.nan
    low, high = np.percentile(values, [10, 90])
    return float(values.mean()), float(low), float(high)


def _rows(ds: xr.Dataset, run: str, flat: dict[str, Any], when: float | str = "final") -> list[dict[str, Any]]:
    """One row per beta of one run (without the swept keys), or per beta and saved time
    for `when="all"`; reads from a lazily opened `ds` only the chosen saved time of each
    series (all of them for "all"), the per-member quantities and the scalars (neither
    for "all": they have no time)."""
    indices = _time_indices(ds, run, when)
    trajectory = when == "all"
    kept = {"beta", "member", "time"} if trajectory else {"beta", "member"}
    finals = {
        name: _squeeze(da, kept).load()
        for name, da in (_finals(ds, slice(None) if trajectory else indices[0]) if indices else {}).items()
    }
    per_member = {
        str(name): _squeeze(da, {"beta", "member"}).load()
        for name, da in ds.data_vars.items()
        if not trajectory
        and "member" in da.dims
        and "time" not in da.dims
        and name not in _BOOKKEEPING
        and np.issubdtype(da.dtype, np.number)
        and _squeezable(da, {"beta", "member"})
    }
    scalars = {
        str(name): float(da.values)
        for name, da in ds.data_vars.items()
        if not trajectory and da.ndim == 0 and np.issubdtype(da.dtype, np.number)
    }
    status = (
        _squeeze(ds["status"], {"beta", "member"}).load()
        if "status" in ds and "member" in ds["status"].dims and _squeezable(ds["status"], {"beta", "member"})
        else None
    )
    if "beta" in ds.dims:
        betas = [float(b) for b in ds["beta"].values]
    elif "beta" in ds.coords and ds["beta"].ndim == 0:
        betas = [float(ds["beta"])]
    else:
        beta = flat.get("beta")
        betas = [float(beta) if isinstance(beta, (int, float)) and not isinstance(beta, bool) else np.nan]
    times = ds["time"].values.astype(float) if indices else np.array([])
    final_time = float(times[-1]) if times.size else np.nan
    rows = []
    for position, beta in enumerate(betas):

        def at_beta(da: xr.DataArray, position: int = position) -> xr.DataArray:
            return da.isel(beta=position) if "beta" in da.dims else da

        failed = None
        if status is not None:
            values = at_beta(status).values
            failed = float(np.mean(values != 0)) if values.size else np.nan
        for index in indices or [None]:
            row: dict[str, Any] = {
                "run": run,
                "beta": beta,
                "time": float(times[index]) if index is not None else np.nan,
                "final_time": final_time,
            }
            if ds.attrs.get("experiment"):
                row["experiment"] = str(ds.attrs["experiment"])
            if failed is not None:
                row["failed_fraction"] = failed
            for name, da in finals.items():
                values = at_beta(da)
                values = values.isel(time=index) if "time" in values.dims else values
                row[f"{name}_mean"], row[f"{name}_q10"], row[f"{name}_q90"] = _statistics(values.values)
            for name, da in per_member.items():
                row[f"{name}_mean"], row[f"{name}_q10"], row[f"{name}_q90"] = _statistics(at_beta(da).values)
            row.update(scalars)
            rows.append(row)
    return rows


def results_files(path: str | Path, command: str) -> list[Path]:
    """The results files that `path` names for `attnflow plot` or `attnflow report`
    (`command`): a results file itself, or every `results.nc` in a folder (a run's, an
    experiment run's, a sweep's) at any depth outside hidden folders, in run order.
    Raises `ConfigError`, in one sentence naming what was looked for, when there is none."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise ConfigError(f"{path} does not exist; give a run or sweep directory, or a results.nc file, to {command}.")
    # Hidden folders hold a launcher's or a run's bookkeeping (.submitit/, .hydra/,
    # .attnflow-pieces/), never a run.
    files = sorted(
        (
            p
            for p in path.rglob("results.nc")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts[:-1])
        ),
        key=_natural,
    )
    if not files:
        raise ConfigError(
            f"{path} holds no results.nc (looked in it and in its folders at any depth, hidden "
            f"ones aside); nothing to {command}."
        )
    return files


def _read(folder: Path, when: float | str = "final") -> list[_Run]:
    """What the report needs of every results file under `folder` at the time `when`
    (`_rows`), one file open at a time."""
    runs = []
    for path in results_files(folder, "report"):
        try:
            text = stored_config(path)
        except ConfigError:  # not attnflow's
            text = None
        try:
            # (a config too large, or an alias bomb: read_config's own sentence)
            config = current_config(read_config(path, text)) if text is not None else None
        except yaml.YAMLError:  # its config is not plain YAML
            text = None
        if text is None:
            raise ConfigError(f"{path} is not a readable attnflow results file; remove it or move it out of {folder}.")
        flat = _flatten(config if isinstance(config, dict) else {})
        run = str(path.parent.relative_to(folder)) if path.parent != folder else "."
        # Lazily, uncached: a variable's values are read when the rows need them, and
        # only the part they need (the chosen saved time of a series).
        with xr.open_dataset(path, engine="netcdf4", cache=False) as ds:
            runs.append(_Run(path, flat, _rows(ds, run, flat, when), list(_finals(ds))))
    return runs


def _swept(runs: list[_Run], failed: list[tuple[str, dict[str, Any], str]]) -> list[str]:
    """The config keys whose values differ between runs, or that a failed job's
    overrides set to a value of their own, in the order they were typed on the command
    line (then alphabetically); beta has its own column."""
    keys = sorted({key for run in runs for key in run.flat} - {"beta"})
    swept = []
    for key in keys:
        values = {repr(_cell(run.flat.get(key))) for run in runs}
        values |= {repr(_cell(overrides[key])) for _, overrides, _ in failed if key in overrides}
        if len(values) > 1:
            swept.append(key)
    order = _override_order(runs[0].path.parent)
    return sorted(swept, key=lambda key: (order.index(key) if key in order else len(order), key))


def _table(folder: Path, when: float | str = "final"):
    """Every row of the report at the time `when` (a pandas DataFrame: the runs' and the
    failed jobs', in run order, with `note`) and the swept keys."""
    import pandas as pd  # lazy: start-up

    runs = _read(folder, when)
    failed = _failed_jobs(folder)
    swept = _swept(runs, failed)
    rows = []
    for run in runs:
        for row in run.rows:
            rows.append({**row, **{key: _cell(run.flat.get(key)) for key in swept}, "note": ""})
    experiments = any("experiment" in row for row in rows)
    for job, overrides, reason in failed:
        beta = overrides.get("beta")
        row = {
            "run": job,
            "beta": float(beta) if isinstance(beta, (int, float)) and not isinstance(beta, bool) else np.nan,
            "note": f"job {job} failed: {reason}",
        }
        if experiments and isinstance(overrides.get("experiment"), str):
            row["experiment"] = overrides["experiment"]
        row.update({key: _cell(overrides[key]) for key in swept if key in overrides})
        rows.append(row)
    # A failed job in its place among the runs (its folder's), the betas of a run in order.
    rows = [rows[i] for i in sorted(range(len(rows)), key=lambda i: _natural(rows[i]["run"]))]
    table = pd.DataFrame(rows)
    first = ["run", *(["experiment"] if "experiment" in table else []), *swept, "beta", "time", "final_time"]
    first += ["failed_fraction"] if "failed_fraction" in table else []
    table = table[first + [c for c in table.columns if c not in (*first, "note")] + ["note"]]
    table.attrs["series"] = sorted({name for run in runs for name in run.series})
    return table, swept


def summary_table(folder: str | Path, time: float | str | None = None):
    """The report's table (a pandas DataFrame) of every `results.nc` under `folder`, one
    row per run and beta (the failed jobs' rows left out; a row per saved time too for
    `time="all"`), at the time `time` (`report_options`), and the swept keys; raises
    `ConfigError` when there is none."""
    table, swept = _table(Path(folder), report_options(time=time).time)
    # the rows of the finished runs (a DataFrame: pandas' annotations say less)
    finished = cast("pd.DataFrame", table[table["note"] == ""]).drop(columns="note").reset_index(drop=True)
    finished.attrs = dict(table.attrs)
    return finished, swept


def _recorded(table) -> list[str]:
    """Every metric the table holds statistics of (the names before `_mean`)."""
    names = [c.removesuffix("_mean") for c in table.columns if c.endswith("_mean")]
    return [name for name in names if {f"{name}_q10", f"{name}_q90"} <= set(table.columns)]


def _metrics(table) -> list[str]:
    names = _recorded(table)
    if "energy" in names and "log_energy" in names:
        names.remove("energy")  # the summary figure's choice: the log scale shows every beta
    if "num_steps" in names and table["num_steps_mean"].nunique() == 1:
        names.remove("num_steps")  # a fixed step: nothing to show
    return [name for name in names if np.isfinite(table[f"{name}_mean"].to_numpy(dtype=float)).any()]


def _numeric(values: list) -> bool:
    return all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in values)


def _ordered(column) -> list:
    """The values of a table's column in the report's order: numbers ascending, text in
    job order (as they first appear among the rows); missing values left out."""
    values = [v for v in dict.fromkeys(column.tolist()) if not (v is None or (isinstance(v, float) and np.isnan(v)))]
    return sorted(values) if _numeric(values) else values


def _varied(table, swept: list[str]) -> list[str]:
    """The keys whose values differ between the rows: the swept keys, and beta when it
    takes more than one value (a list, or swept)."""
    return swept + (["beta"] if "beta" in table and len(_ordered(table["beta"])) > 1 else [])


class _Layout(NamedTuple):
    """What the figure draws: the metrics, the x-axis key ("time" for trajectories), the
    keys whose values split the lines, the one of them that colours them (None: each
    line its own colour) and the key with a column of panels per value (None: one
    panel per metric)."""

    metrics: list[str]
    x: str
    groups: list[str]
    colour: str | None
    panels: str | None


def _layout(table, swept: list[str], options: ReportOptions) -> _Layout:
    """The figure's layout for `options` over the rows of `table` (a DataFrame with the
    columns of `_table`), each key and metric checked against them: a key that is not
    swept (nor beta when it takes several values), a key given two roles, a metric the
    runs did not record, or `--x` with `--time all`, is refused in one sentence."""
    keys = _varied(table, swept)
    roles = {"--x": options.x, "--colour": options.colour, "--panels": options.panels}
    for flag, key in roles.items():
        if key is None or key in keys:
            continue
        if key in table.columns or key == "beta":
            held = _ordered(table[key]) if key in table.columns else []
            raise ConfigError(
                f"{flag} {key}: {key} takes one value in every run ({', '.join(map(str, held)) or 'none'}), "
                f"nothing to spread out; choose a swept key ({', '.join(keys) or 'none was swept'})."
            )
        raise ConfigError(
            f"{flag} {key} is not a swept key{did_you_mean(key, keys)}; choose one of "
            f"{', '.join(keys) or 'none (nothing was swept here)'}."
        )
    given = [(flag, key) for flag, key in roles.items() if key is not None]
    for i, (flag, key) in enumerate(given):
        for other, same in given[i + 1 :]:
            if key == same:
                raise ConfigError(f"{flag} {key} and {other} {same} name the same key; give each its own key.")
    if options.time == "all" and options.x is not None:
        raise ConfigError(f"--x {options.x} cannot go with --time all, whose x-axis is time; leave --x out.")
    recorded = _recorded(table)
    for name in options.metrics:
        if name not in recorded:
            raise ConfigError(
                f"--metrics {name} is not a metric these runs recorded{did_you_mean(name, recorded)}; choose "
                f"among {', '.join(recorded) or 'none'}."
            )
    metrics = list(dict.fromkeys(options.metrics)) or _metrics(table)
    if options.time == "all":
        groups = [key for key in keys if key != options.panels] or ["run"]
        return _Layout(metrics, "time", groups, options.colour, options.panels)
    x = options.x or (keys[0] if keys else "run")
    groups = [key for key in keys if key not in (x, options.panels)]
    return _Layout(metrics, x, groups, options.colour, options.panels)


def _when(time: float | str, table) -> str:
    """The time of the statistics, in words."""
    times = ", ".join(f"{t:g}" for t in _ordered(table["time"])) if "time" in table else ""
    if time == "all":
        return "at every saved time"
    if time == "final":
        return f"at the run's final saved time (t = {times})"
    return f"at the saved time nearest to t = {time:g} (t = {times})"


def report_title(table, swept: list[str], time: float | str = "final") -> str:
    """The figure's (and report.nc's) title: the runs, every swept key (beta too when it
    takes more than one value) and the time of the statistics."""
    finished = table[table["note"] == ""] if "note" in table else table
    runs = finished["run"].nunique()
    keys = _varied(table, swept)
    when = "" if time == "final" else ", over time" if time == "all" else f", at t = {float(time):g}"
    return (
        f"attnflow report: {runs} run{'s' if runs != 1 else ''}"
        + (f", swept: {', '.join(keys)}" if keys else "")
        + when
    )


def _line_label(groups: list[str], line: tuple) -> str:
    return ", ".join(f"{k} = {v:g}" if isinstance(v, float) else f"{k} = {v}" for k, v in zip(groups, line))


@styled
def report_figure(table, swept: list[str], title: str, options: ReportOptions | None = None):
    """Each metric's member mean against the x-axis key (`_layout`: the first swept key,
    or beta, or the run, when `options` name none; the saved times for `--time all`),
    one line per value of the other swept keys and beta (coloured by the `colour` key's
    value when one is given), with the 10-90 % band of the members (error bars when the
    x-axis key takes categories rather than numbers); a column of panels per value of
    the `panels` key."""
    options = options or ReportOptions()
    layout = _layout(table, swept, options)
    metrics = layout.metrics
    x_values = _ordered(table[layout.x])
    numeric = _numeric(x_values)
    positions = {v: (float(v) if numeric else i) for i, v in enumerate(x_values)}
    orders = [{v: i for i, v in enumerate(_ordered(table[key]))} for key in layout.groups]
    lines = sorted(
        {tuple(row) for row in table[layout.groups].itertuples(index=False)},
        key=lambda line: [order.get(v, len(order)) for order, v in zip(orders, line)],
    )
    if layout.colour is not None:
        shades = _ordered(table[layout.colour])
        where = layout.groups.index(layout.colour)
        scale = colormap("viridis")(np.linspace(0.0, 0.9, max(len(shades), 1)))
        colors = [scale[shades.index(line[where])] for line in lines]
    else:
        colors = list(colormap("viridis")(np.linspace(0.0, 0.9, max(len(lines), 1))))
    panel_values = _ordered(table[layout.panels]) if layout.panels else [None]
    # Lines that coincide (a swept key that changes nothing) stay visible: each line has
    # its own dash pattern and marker, and the later ones are drawn thinner on top.
    styles = ["-", "--", ":", "-."]
    markers = ["o", "s", "^", "D", "v", "P", "X"]
    if layout.panels:  # a row per metric, a column per value
        rows, columns = max(len(metrics), 1), len(panel_values)
    else:  # as few rows as three panels per row allow, filled evenly (four panels: 2 x 2)
        rows = max(-(-len(metrics) // 3), 1)
        columns = max(-(-len(metrics) // rows), 1)
    fig, axes = subplots(rows, columns, figsize=(3.8 * columns + 2.2, 2.9 * rows + 0.9), squeeze=False)
    cells = (
        [(axes[r, c], name, value) for r, name in enumerate(metrics) for c, value in enumerate(panel_values)]
        if layout.panels
        else [(ax, name, None) for ax, name in zip(axes.flat, metrics)]
    )
    for ax in axes.flat[len(cells) :]:
        ax.set_axis_off()
    for ax, name, value in cells:
        panel = table if layout.panels is None else table[table[layout.panels] == value]
        panel = panel[panel[layout.x].isin(list(positions))]  # (a row without a value on the x-axis: not drawn)
        for index, (color, line) in enumerate(zip(colors, lines)):
            chosen = panel
            for key, part in zip(layout.groups, line):
                chosen = chosen[chosen[key] == part]
            if chosen.empty:
                continue
            xs = np.array([positions[v] for v in chosen[layout.x]])
            order = np.argsort(xs, kind="stable")
            mean, low, high = (chosen[f"{name}_{s}"].to_numpy(dtype=float)[order] for s in ("mean", "q10", "q90"))
            label = _line_label(layout.groups, line) or "mean"
            style = {
                "marker": markers[index % len(markers)] if layout.x != "time" else None,
                "markersize": max(6.0 - 1.2 * index, 2.5),
                "markerfacecolor": "none" if index % 2 else color,
            }
            if numeric:
                ax.plot(
                    xs[order],
                    mean,
                    linestyle=styles[index % len(styles)],
                    linewidth=max(2.2 - 0.5 * index, 0.8),
                    color=color,
                    label=label,
                    **style,
                )
                ax.fill_between(xs[order], low, high, color=color, alpha=0.18, linewidth=0)
            else:
                # Categories (a solver, a schedule) are not joined by lines; the lines'
                # points are set side by side so that none hides another.
                shift = 0.25 * (index - (len(lines) - 1) / 2) / max(len(lines), 1)
                ax.errorbar(
                    xs[order] + shift,
                    mean,
                    yerr=[mean - low, high - mean],
                    fmt="none",
                    color=color,
                    capsize=2,
                    linewidth=1,
                )
                ax.plot(xs[order] + shift, mean, linestyle="none", color=color, label=label, **style)
        ax.set_xlabel(layout.x)
        ax.set_ylabel(_label(name), fontsize=8)
        if layout.panels is not None:
            ax.set_title(f"{layout.panels} = {value:g}" if isinstance(value, float) else f"{layout.panels} = {value}")
        if layout.x != "time" and numeric and min(x_values) > 0 and max(x_values) >= 20 * min(x_values):
            ax.set_xscale("log")  # d = 2 ... 128, members = 16 ... 2048
        if layout.x != "time" and (not numeric or len(x_values) <= 8):
            ax.set_xticks(
                list(positions.values()),
                [f"{v:g}" if numeric else str(v) for v in x_values],
                rotation=20 if not numeric and len(x_values) > 3 else 0,
            )
            ax.minorticks_off()
        if not numeric:
            ax.set_xlim(-0.6, len(x_values) - 0.4)
    if not metrics:
        axes[0, 0].text(0.5, 0.5, "these results record no per-member metric", ha="center", va="center")
    fig.suptitle(title, fontsize=10)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if layout.groups and handles:
        fig.legend(
            handles,
            labels,
            loc="upper left",
            bbox_to_anchor=(1.0, 0.93),
            frameon=False,
            title=f"{', '.join(layout.groups)}\nmean over members\n({'band' if numeric else 'bars'}: 10-90 %)",
            title_fontsize=8,
        )
    fig.tight_layout()
    runs = table["run"].nunique()
    others = [name for name in metrics if name not in table.attrs.get("series", metrics)]
    point = "one line per run and beta" if layout.x == "time" else "one point per run and beta"
    text = (
        f"{runs} run{'s' if runs > 1 else ''}; {point}: the mean over members of each metric "
        f"{_when(options.time, table)}"
        + (f" ({', '.join(others)}: per member, as stored)" if others else "")
        + f", failed members left out; {'shaded' if numeric else 'bars'}: 10-90 % of the members. "
        f"Swept: {', '.join(_varied(table, swept)) or 'nothing'}."
    )
    fig.text(0.01, -0.01, "\n".join(textwrap.wrap(text, int(14 * fig.get_figwidth()))), ha="left", va="top", fontsize=8)
    return fig


def _failed_jobs(folder: Path) -> list[tuple[str, dict[str, Any], str]]:
    """The jobs under `folder` that left no results: their folder, their overrides (the
    keys as typed, the values as YAML reads them; empty when the job was refused before
    it wrote `.hydra/`, or its record is not attnflow's) and why (their `error.txt`, at
    most `_REASON_BYTES` of it)."""
    failed = []
    for error in sorted(folder.rglob("error.txt"), key=_natural):
        job = error.parent
        if (job / "results.nc").exists() or any(part.startswith(".") for part in job.relative_to(folder).parts):
            continue
        overrides = {}
        record = job / ".hydra" / "overrides.yaml"
        try:
            typed = read_config(record)
            for item in typed if isinstance(typed, list) else []:
                key, _, value = str(item).partition("=")
                key = key.lstrip("+~")
                overrides[renamed_key(key) or key] = read_config(record, value)
        except (OSError, yaml.YAMLError, ConfigError):
            overrides = {}
        try:
            with open(error, "rb") as file:
                text = file.read(_REASON_BYTES + 1)
            reason = text[:_REASON_BYTES].decode(errors="replace").strip() + (
                " ..." if len(text) > _REASON_BYTES else ""
            )
        except OSError:
            reason = "failed"
        failed.append((str(job.relative_to(folder)), overrides, reason))
    return failed


def _variable(column) -> np.ndarray:
    """A column of the table as a NetCDF variable: numbers where every cell is a number
    or empty (NaN), else text (an empty cell as "")."""
    if column.dtype.kind in "iuf":
        return column.to_numpy()
    cells = column.tolist()

    def missing(cell: Any) -> bool:
        return cell is None or (isinstance(cell, float) and np.isnan(cell))

    if all(
        missing(cell) or (isinstance(cell, (int, float, np.integer, np.floating)) and not isinstance(cell, bool))
        for cell in cells
    ):
        return np.asarray([np.nan if missing(cell) else cell for cell in cells], dtype=float)
    return np.asarray(["" if missing(cell) else str(cell) for cell in cells], dtype=object)


def _at(time: float | str) -> str:
    """Where the statistics of a column are taken, in a long name's words."""
    if time == "all":
        return "at each saved time"
    if time == "final":
        return "at the final saved time"
    return f"at the saved time nearest to t = {time:g} (the variable time)"


def report_dataset(table, swept: list[str], options: ReportOptions | None = None) -> xr.Dataset:
    """The report's rows (`_table`: one per run and beta, and one per failed job) as a
    Dataset along the dimension `row`: the run's folder (`run`), each swept key (named
    by `dimension_name`, the key in its `config_key`, a key's text values in the
    figure's order in `categories`) and beta as coordinates along `row`, every other
    column as a variable along `row`. For `options.time == "all"` (the table holding
    one row per run, beta and saved time) the statistics are along (`row`, `time`),
    NaN at a time a run did not save."""
    options = options or ReportOptions()
    trajectory = options.time == "all"
    statistics = {f"{name}_{s}" for name in _recorded(table) for s in ("mean", "q10", "q90")}
    rows, along_time, times = table, {}, np.array([])
    if trajectory:
        ids = table.groupby(["run", "beta"], sort=False, dropna=False).ngroup().to_numpy()
        rows = table[~table.duplicated(subset=["run", "beta"])].reset_index(drop=True)
        times = np.unique(table["time"].dropna().to_numpy(dtype=float))
        saved = table["time"].notna().to_numpy()
        at = np.searchsorted(times, table["time"].to_numpy(dtype=float)[saved])
        for name in statistics:
            values = np.full((len(rows), times.size), np.nan)
            values[ids[saved], at] = table[name].to_numpy(dtype=float)[saved]
            along_time[name] = values
    coords: dict[str, Any] = {
        "run": (
            "row",
            _variable(rows["run"].astype(str)),
            {"long_name": "the run's folder under the report's folder (a failed job's, for its row)"},
        )
    }
    for key in swept:
        attrs = {"long_name": f"the swept config key {key}", "config_key": key}
        values = _variable(rows[key])
        if values.dtype.kind not in "iuf":  # text: its values in the order the figure draws them
            attrs["categories"] = json.dumps([str(v) for v in _ordered(rows[key])])
        coords[dimension_name(key)] = ("row", values, attrs)
    coords["beta"] = (
        "row",
        rows["beta"].to_numpy(dtype=float),
        {"long_name": "inverse temperature beta of the attention", "units": "1"},
    )
    if trajectory:
        coords["time"] = ("time", times, {"long_name": "saved time t of the flow (dimensionless)", "units": "1"})
    data = {}
    for name in rows.columns:
        if name in ("run", "beta", *swept) or (trajectory and name == "time"):
            continue
        base, _, statistic = str(name).rpartition("_")
        what = {
            "mean": "mean over members",
            "q10": "10th percentile over members",
            "q90": "90th percentile over members",
        }.get(statistic)
        named = {
            "time": "the saved time the statistics are taken at",
            "final_time": "the run's final saved time",
            "experiment": "the experiment of the run",
            "note": "the failed job and its error (empty for a run)",
        }
        attrs = {
            "long_name": named.get(
                str(name),
                f"{what} of {base} {_at(options.time)}" if what is not None else str(name).replace("_", " "),
            )
        }
        if name in along_time:
            values, dims = along_time[name], ("row", "time")
        else:
            values, dims = _variable(rows[name]), "row"
        if values.dtype.kind in "iuf":
            attrs["units"] = "1"
        data[str(name)] = (dims, values, attrs)
    ds = xr.Dataset(data, coords=coords)
    shape = "one row per run and beta, and one per failed job"
    for name, variable in ds.variables.items():  # CF: a short long_name (the prose in description), units
        variable.attrs = variable_attributes(str(name), variable.attrs, variable.values)
    ds.attrs = {
        "Conventions": CONVENTIONS,
        "title": report_title(table, swept, options.time),
        "swept_keys": ", ".join(swept),
        "description": (
            f"{shape}: the member mean and 10/90 % percentiles of each metric at each saved time (along time)"
            if trajectory
            else f"{shape} (the rows of report.csv, in its order): the member mean and 10/90 % percentiles of "
            f"each metric {_at(options.time)}"
        )
        + "; select rows by their values, e.g. ds.where((ds.d == 8) & (ds.solver == 'rk4'), drop=True)",
    }
    return ds


def _reported(table, swept: list[str]) -> str:
    """What the report holds, in one line: `reported 12 runs in 25 rows (12 runs x 2
    betas, 1 failed job; swept keys a, b)`."""
    finished = table[table["note"] == ""]
    runs = finished["run"].nunique()
    failed = len(table) - len(finished)
    rows = len(table.drop_duplicates(["run", "beta"]))  # report.nc's
    per_run = finished.groupby("run")["beta"].nunique(dropna=False)  # (a row per saved time too, for --time all)
    low, high = (int(per_run.min()), int(per_run.max())) if len(per_run) else (0, 0)
    shape = (
        f"{runs} run{'s' if runs != 1 else ''} x {low} beta{'s' if low != 1 else ''}"
        if low == high
        else f"{runs} runs, {low} to {high} betas each"
    )
    if failed:
        shape += f", {failed} failed job{'s' if failed != 1 else ''}"
    named = ", ".join(swept[:_NAMED_KEYS]) + (
        f" and {len(swept) - _NAMED_KEYS} more" if len(swept) > _NAMED_KEYS else ""
    )
    keys = f"swept key{'s' if len(swept) != 1 else ''} {named}" if swept else "nothing swept"
    return f"reported {runs} run{'s' if runs != 1 else ''} in {rows} row{'s' if rows != 1 else ''} ({shape}; {keys})"


def report(
    folder: str | Path,
    *,
    x: str | None = None,
    colour: str | None = None,
    metrics: str | list[str] | tuple[str, ...] | None = None,
    time: float | str | None = None,
    panels: str | None = None,
) -> tuple[list[Path], str]:
    """Summarize every run under `folder` into `report.csv` (one row per run and beta,
    and per failed job), `report.nc` (the same rows, `report_dataset`) and `report.png`
    there (each written whole or not at all); returns their paths and one line saying
    what was reported (`_reported`). The keywords are `attnflow report`'s options
    (`report_options`: the x-axis key, the colour key, the metrics drawn and stored, the
    time of the statistics or "all", the key with a column of panels per value); a bad
    one is refused in one sentence before anything is written."""
    options = report_options(x, colour, metrics, time, panels)
    folder = Path(folder)
    table, swept = _table(folder, options.time)
    finished = cast("pd.DataFrame", table[table["note"] == ""])  # the rows of the finished runs (a DataFrame)
    layout = _layout(finished, swept, options)  # the options checked before anything is written
    if options.metrics:  # the chosen metrics' statistics, and the columns that say what a row is
        chosen = {f"{name}_{s}" for name in layout.metrics for s in ("mean", "q10", "q90")}
        statistics = {c for c in table.columns if c.endswith(("_mean", "_q10", "_q90"))}
        dropped = (statistics - chosen) | _scalar_columns(table, swept)
        shown = [c for c in table.columns if c not in dropped]
        attrs = dict(table.attrs)
        table = cast("pd.DataFrame", table[shown])
        table.attrs = attrs
        finished = cast("pd.DataFrame", table[table["note"] == ""])
    csv = write_atomically(folder / "report.csv", lambda tmp: table.to_csv(tmp, index=False))
    ds = report_dataset(table, swept, options)
    ds.attrs["source"] = str(folder.resolve())
    ds.attrs["figure"] = _figure_note(layout, options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Warning)  # xarray's notes on string encodings
        nc = write_results(ds, folder / "report.nc")
    finished.attrs = dict(table.attrs)
    fig = report_figure(finished, swept, report_title(table, swept, options.time), options)
    with style():
        png = write_atomically(folder / "report.png", lambda tmp: fig.savefig(tmp, format="png"))
    return [csv, nc, png], _reported(table, swept)


def _scalar_columns(table, swept: list[str]) -> set[str]:
    """The columns of a run's scalar results (a step count): neither what a row is nor
    a metric's statistics."""
    known = {"run", "experiment", *swept, "beta", "time", "final_time", "failed_fraction", "note"}
    return {c for c in table.columns if c not in known and not c.endswith(("_mean", "_q10", "_q90"))}


def _figure_note(layout: _Layout, options: ReportOptions) -> str:
    """What report.png draws, in one line (report.nc's `figure`)."""
    return (
        f"report.png: {', '.join(layout.metrics) or 'no metric'} against {layout.x}"
        + (f", one line per value of {', '.join(layout.groups)}" if layout.groups else "")
        + (f", coloured by {layout.colour}" if layout.colour else "")
        + (f", a column of panels per value of {layout.panels}" if layout.panels else "")
        + f", {_at(options.time).replace(' (the variable time)', '')}"
    )
