"""One table and one figure across the runs of a sweep (`attnflow report DIR`).

A Hydra multirun (`attnflow -m d=2,3 solver=euler_renorm,rk4 ...`) leaves one run
directory per job, each with its `results.nc`, whichever launcher ran the jobs.
`report(DIR)` reads all of them (at any depth under DIR, outside hidden folders such
as the submitit launcher's `.submitit/`; the `incomplete.nc` and `error.txt` of failed
jobs are not results), finds the swept keys (the config keys, as dotted names such as
`weights.v.kind`, whose values differ between runs, or that a failed job set to a value
of its own) and writes into DIR:

- `report.csv`: one row per run and beta, in run order, with the run's folder, the
  swept keys, beta, the final saved time, the fraction of failed members, and for each
  recorded metric the mean over members and its 10 and 90 % percentiles at the final
  time (failed members left out); a job that failed (its folder holds an `error.txt`
  and no results) is one row too, in its place among the runs, with the values its
  command-line overrides gave the swept keys (empty where they are not known) and no
  numbers; the last column, `note`, names the failed job and its error (empty for a
  run);
- `report.nc`: the same rows, in the same order, along one dimension `row`: the run's
  folder (`run`), each swept key (named by the key with its dots replaced by
  underscores, `weights.v.kind` -> `weights_v_kind`, the key itself in the variable's
  `config_key`) and `beta` are coordinates along `row`, every other column (the
  statistics, `note`) a variable along `row`. The runs of a sweep need not fill the
  grid of its keys' combinations (a run that changes two keys of its own, a failed
  job), so no array spans that grid. A selection is a condition on the row's values:

      ds = xr.open_dataset("sweeps/d/report.nc")
      ds.where((ds.d == 8) & (ds.solver == "rk4"), drop=True)   # the rows of d = 8 with rk4
      ds.set_xindex(["d", "solver", "beta"]).sel(d=8, solver="rk4", beta=4.0)   # one row, by its keys
      ds.where(ds.note != "", drop=True).note                    # the failed jobs and why

- `report.png`: the final-time mean of each metric against the first swept key, one
  line per value of the other swept keys and beta (each its own dash pattern and
  marker, so that coinciding lines stay visible), with the members' 10-90 % band.

Each results file is opened lazily and only what the report needs is read (each
per-member series at its final saved time, the per-member quantities, the scalars)
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
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np
import xarray as xr
import yaml

from ..schema._config import current_config, renamed_key
from ..schema._errors import ConfigError
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


def _finals(ds: xr.Dataset) -> dict[str, xr.DataArray]:
    """The per-member time series of a run at its final saved time, each with dims
    (beta?, member), as lazy as `ds` (only that time is read when their values are)."""
    if ds.sizes.get("time", 0) == 0:
        return {}
    found = {}
    for metric in PANELS:
        if metric.name in ds and {"member", "time"} <= set(ds[metric.name].dims):
            # The reductions (over clusters, heads, queries, keys) act at each time alone.
            found[metric.reduced_name or metric.name] = metric.reduce(ds[metric.name].isel(time=-1))
    for name, da in ds.data_vars.items():
        reduced = name in METRICS and METRICS[name].reduced_name is not None  # pyright: ignore[reportArgumentType] xarray's names are Hashable; a str here
        if name in found or reduced or not {"member", "time"} <= set(da.dims):
            continue
        found[str(name)] = da.isel(time=-1)
    return {name: da for name, da in found.items() if _squeezable(da, {"beta", "member"})}


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


def _rows(ds: xr.Dataset, run: str, flat: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per beta of one run (without the swept keys); reads from a lazily opened
    `ds` only the final saved time of each series, the per-member quantities and the
    scalars."""
    finals = {name: _squeeze(da, {"beta", "member"}).load() for name, da in _finals(ds).items()}
    per_member = {
        str(name): _squeeze(da, {"beta", "member"}).load()
        for name, da in ds.data_vars.items()
        if "member" in da.dims
        and "time" not in da.dims
        and name not in _BOOKKEEPING
        and np.issubdtype(da.dtype, np.number)
        and _squeezable(da, {"beta", "member"})
    }
    scalars = {
        str(name): float(da.values)
        for name, da in ds.data_vars.items()
        if da.ndim == 0 and np.issubdtype(da.dtype, np.number)
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
    final_time = float(ds["time"].values[-1]) if "time" in ds.coords and ds["time"].size else np.nan
    rows = []
    for position, beta in enumerate(betas):

        def at_beta(da: xr.DataArray, position: int = position) -> xr.DataArray:
            return da.isel(beta=position) if "beta" in da.dims else da

        row: dict[str, Any] = {"run": run, "beta": beta, "final_time": final_time}
        if ds.attrs.get("experiment"):
            row["experiment"] = str(ds.attrs["experiment"])
        if status is not None:
            values = at_beta(status).values
            row["failed_fraction"] = float(np.mean(values != 0)) if values.size else np.nan
        for name, da in finals.items():
            row[f"{name}_mean"], row[f"{name}_q10"], row[f"{name}_q90"] = _statistics(at_beta(da).values)
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


def _read(folder: Path) -> list[_Run]:
    """What the report needs of every results file under `folder`, one file open at a time."""
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
        # only the part they need (the final saved time of a series).
        with xr.open_dataset(path, engine="netcdf4", cache=False) as ds:
            runs.append(_Run(path, flat, _rows(ds, run, flat), list(_finals(ds))))
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


def _table(folder: Path):
    """Every row of the report (a pandas DataFrame: the runs' and the failed jobs', in run
    order, with `note`) and the swept keys."""
    import pandas as pd  # lazy: start-up

    runs = _read(folder)
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
    first = ["run", *(["experiment"] if "experiment" in table else []), *swept, "beta", "final_time"]
    first += ["failed_fraction"] if "failed_fraction" in table else []
    table = table[first + [c for c in table.columns if c not in (*first, "note")] + ["note"]]
    table.attrs["series"] = sorted({name for run in runs for name in run.series})
    return table, swept


def summary_table(folder: str | Path):
    """The report's table (a pandas DataFrame) of every `results.nc` under `folder`, one
    row per run and beta (the failed jobs' rows left out), and the swept keys; raises
    `ConfigError` when there is none."""
    table, swept = _table(Path(folder))
    # the rows of the finished runs (a DataFrame: pandas' annotations say less)
    finished = cast("pd.DataFrame", table[table["note"] == ""]).drop(columns="note").reset_index(drop=True)
    finished.attrs = dict(table.attrs)
    return finished, swept


def _metrics(table) -> list[str]:
    names = [c.removesuffix("_mean") for c in table.columns if c.endswith("_mean")]
    names = [name for name in names if {f"{name}_q10", f"{name}_q90"} <= set(table.columns)]
    if "energy" in names and "log_energy" in names:
        names.remove("energy")  # the summary figure's choice: the log scale shows every beta
    if "num_steps" in names and table["num_steps_mean"].nunique() == 1:
        names.remove("num_steps")  # a fixed step: nothing to show
    return [name for name in names if np.isfinite(table[f"{name}_mean"].to_numpy(dtype=float)).any()]


@styled
def report_figure(table, swept: list[str], title: str):
    """The final-time mean of each metric against the first swept key (or beta, or the
    run, when nothing else was swept), one line per value of the other swept keys and
    beta, with the 10-90 % band of the members (error bars when the swept key takes
    categories rather than numbers)."""
    metrics = _metrics(table)
    betas = sorted(set(table["beta"].dropna())) if "beta" in table else []
    if swept:
        x_key, groups = swept[0], swept[1:] + (["beta"] if len(betas) > 1 else [])
    elif len(betas) > 1:
        x_key, groups = "beta", []
    else:
        x_key, groups = "run", []
    x_values = list(dict.fromkeys(table[x_key].tolist()))
    numeric = all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in x_values)
    positions = {v: (float(v) if numeric else i) for i, v in enumerate(x_values)}
    lines = list(dict.fromkeys(tuple(row) for row in table[groups].itertuples(index=False))) if groups else [()]
    colors = colormap("viridis")(np.linspace(0.0, 0.9, max(len(lines), 1)))
    # Lines that coincide (a swept key that changes nothing) stay visible: each line has
    # its own dash pattern and marker, and the later ones are drawn thinner on top.
    styles = ["-", "--", ":", "-."]
    markers = ["o", "s", "^", "D", "v", "P", "X"]
    # As few rows as three panels per row allow, filled evenly (four panels: 2 x 2).
    rows = max(-(-len(metrics) // 3), 1)
    columns = max(-(-len(metrics) // rows), 1)
    fig, axes = subplots(rows, columns, figsize=(3.8 * columns + 2.2, 2.9 * rows + 0.9), squeeze=False)
    for ax in axes.flat[len(metrics) :]:
        ax.set_axis_off()
    for ax, name in zip(axes.flat, metrics):
        for index, (color, line) in enumerate(zip(colors, lines)):
            chosen = table
            for key, value in zip(groups, line):
                chosen = chosen[chosen[key] == value]
            xs = np.array([positions[v] for v in chosen[x_key]])
            order = np.argsort(xs, kind="stable")
            mean, low, high = (chosen[f"{name}_{s}"].to_numpy(dtype=float)[order] for s in ("mean", "q10", "q90"))
            label = ", ".join(f"{k} = {v:g}" if isinstance(v, float) else f"{k} = {v}" for k, v in zip(groups, line))
            width = max(2.2 - 0.5 * index, 0.8)
            style = {
                "marker": markers[index % len(markers)],
                "markersize": max(6.0 - 1.2 * index, 2.5),
                "markerfacecolor": "none" if index % 2 else color,
            }
            if numeric:
                ax.plot(
                    xs[order],
                    mean,
                    linestyle=styles[index % len(styles)],
                    linewidth=width,
                    color=color,
                    label=label or "mean",
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
                ax.plot(xs[order] + shift, mean, linestyle="none", color=color, label=label or "mean", **style)
        ax.set_xlabel(x_key)
        ax.set_ylabel(_label(name), fontsize=8)
        if numeric and min(x_values) > 0 and max(x_values) >= 20 * min(x_values):
            ax.set_xscale("log")  # d = 2 ... 128, members = 16 ... 2048
        if not numeric or len(x_values) <= 8:
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
    if groups and handles:
        fig.legend(
            handles,
            labels,
            loc="upper left",
            bbox_to_anchor=(1.0, 0.93),
            frameon=False,
            title=f"{', '.join(groups)}\nmean over members\n({'band' if numeric else 'bars'}: 10-90 %)",
            title_fontsize=8,
        )
    fig.tight_layout()
    runs = table["run"].nunique()
    times = ", ".join(f"{t:g}" for t in sorted(set(table["final_time"].dropna())))
    others = [name for name in metrics if name not in table.attrs.get("series", metrics)]
    text = (
        f"{runs} run{'s' if runs > 1 else ''}; one point per run and beta: the mean over members of each "
        f"metric at the run's final saved time (t = {times})"
        + (f" ({', '.join(others)}: per member, as stored)" if others else "")
        + f", failed members left out; {'shaded' if numeric else 'bars'}: 10-90 % of the members. "
        f"Swept: {', '.join(swept) or 'nothing but beta'}."
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


def report_dataset(table, swept: list[str]) -> xr.Dataset:
    """The report's rows (`_table`: one per run and beta, and one per failed job) as a
    Dataset along the dimension `row`: the run's folder (`run`), each swept key (named
    by `dimension_name`, the key in its `config_key`) and beta as coordinates along
    `row`, every other column as a variable along `row`."""
    coords = {
        "run": (
            "row",
            _variable(table["run"].astype(str)),
            {"long_name": "the run's folder under the report's folder (a failed job's, for its row)"},
        )
    }
    for key in swept:
        coords[dimension_name(key)] = (
            "row",
            _variable(table[key]),
            {"long_name": f"the swept config key {key}", "config_key": key},
        )
    coords["beta"] = (
        "row",
        table["beta"].to_numpy(dtype=float),
        {"long_name": "inverse temperature beta of the attention", "units": "1"},
    )
    data = {}
    for name in table.columns:
        if name in ("run", "beta", *swept):
            continue
        values = _variable(table[name])
        base, _, statistic = str(name).rpartition("_")
        what = {
            "mean": "mean over members",
            "q10": "10th percentile over members",
            "q90": "90th percentile over members",
        }.get(statistic)
        attrs = {
            "long_name": f"{what} of {base} at the final saved time"
            if what is not None
            else str(name).replace("_", " ")
        }
        if name == "experiment":
            attrs["long_name"] = "the experiment of the run"
        elif name == "note":
            attrs["long_name"] = "the failed job and its error (empty for a run)"
        if values.dtype.kind in "iuf":
            attrs["units"] = "1"
        data[str(name)] = ("row", values, attrs)
    ds = xr.Dataset(data, coords=coords)
    for name, variable in ds.variables.items():  # CF: a short long_name (the prose in description), units
        variable.attrs = variable_attributes(str(name), variable.attrs, variable.values)
    ds.attrs = {
        "Conventions": CONVENTIONS,
        "title": "attnflow report",
        "swept_keys": ", ".join(swept),
        "description": "one row per run and beta, and one per failed job (the rows of report.csv, in "
        "its order): the member mean and 10/90 % percentiles of each metric at the final "
        "saved time; select rows by their values, e.g. "
        "ds.where((ds.d == 8) & (ds.solver == 'rk4'), drop=True)",
    }
    return ds


def _reported(table, swept: list[str]) -> str:
    """What the report holds, in one line: `reported 12 runs in 25 rows (12 runs x 2
    betas, 1 failed job; swept keys a, b)`."""
    finished = table[table["note"] == ""]
    runs = finished["run"].nunique()
    failed = len(table) - len(finished)
    per_run = finished.groupby("run").size()
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
    return (
        f"reported {runs} run{'s' if runs != 1 else ''} in {len(table)} row{'s' if len(table) != 1 else ''} "
        f"({shape}; {keys})"
    )


def report(folder: str | Path) -> tuple[list[Path], str]:
    """Summarize every run under `folder` into `report.csv` (one row per run and beta,
    and per failed job), `report.nc` (the same rows, `report_dataset`) and `report.png`
    there (each written whole or not at all); returns their paths and one line saying
    what was reported (`_reported`)."""
    folder = Path(folder)
    table, swept = _table(folder)
    csv = write_atomically(folder / "report.csv", lambda tmp: table.to_csv(tmp, index=False))
    ds = report_dataset(table, swept)
    ds.attrs["source"] = str(folder.resolve())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Warning)  # xarray's notes on string encodings
        nc = write_results(ds, folder / "report.nc")
    finished = cast("pd.DataFrame", table[table["note"] == ""])  # the rows of the finished runs (a DataFrame)
    finished.attrs = dict(table.attrs)
    runs = finished["run"].nunique()
    fig = report_figure(
        finished,
        swept,
        f"attnflow report: {runs} run{'s' if runs > 1 else ''}" + (f", swept: {', '.join(swept)}" if swept else ""),
    )
    with style():
        png = write_atomically(folder / "report.png", lambda tmp: fig.savefig(tmp, format="png"))
    return [csv, nc, png], _reported(table, swept)
