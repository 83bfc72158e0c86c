"""One table and one figure across the runs of a sweep (`attnflow report DIR`).

A Hydra multirun (`attnflow -m d=2,3 solver=euler_renorm,rk4 ...`) leaves one run
directory per job, each with its `results.nc`, whichever launcher ran the jobs.
`report(DIR)` reads all of them (at any depth under DIR, outside hidden folders such
as the submitit launcher's `.submitit/`; the `incomplete.nc` and `error.txt` of failed
jobs are not results and are left out), finds the swept keys (the config keys, as
dotted names such as `weights.v.kind`, whose values differ between runs) and writes
into DIR:

- `report.csv`: one row per run and beta, with the run's folder, the swept keys, beta,
  the final saved time, the fraction of failed members, and for each recorded metric
  the mean over members and its 10 and 90 % percentiles at the final time (failed
  members left out);
- `report.nc`: the same numbers as a Dataset indexed by the swept keys and beta (one
  dimension per swept key, its dots replaced by underscores: `weights.v.kind` ->
  `weights_v_kind`, the key itself in the coordinate's `config_key`), so that
  `ds.sel(d=8, solver="rk4")` picks a run; a combination that no job finished is NaN,
  and its `note` names the failed job and its error (or says that no job ran it);
- `report.png`: the final-time mean of each metric against the first swept key, one
  line per value of the other swept keys and beta (each its own dash pattern and
  marker, so that coinciding lines stay visible), with the members' 10-90 % band.

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
from typing import Any

import numpy as np
import xarray as xr
import yaml

from ._cf import CONVENTIONS, dimension_name
from ._errors import ConfigError
from ._figures import colormap, style, styled, subplots
from ._metric_registry import METRICS, PANELS
from ._store import _write_atomically, load_results, stored_config, write_results

# Per-member bookkeeping, not a result to summarize (the failed fraction stands for it).
_BOOKKEEPING = ("status", "failure_time")


def _natural(path: Path) -> list:
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
    """The keys of a run's command-line overrides in the order they were typed."""
    overrides = run / ".hydra" / "overrides.yaml"
    try:
        typed = yaml.safe_load(overrides.read_text()) if overrides.is_file() else None
    except (OSError, yaml.YAMLError):
        return []
    keys = []
    for item in typed or []:
        if isinstance(item, str) and "=" in item:
            keys.append(item.split("=", 1)[0].lstrip("+~"))
    return keys


def _label(name: str) -> str:
    """The summary figure's axis label of a metric (its own name otherwise)."""
    labels = {metric.reduced_name or metric.name: metric.label for metric in PANELS}
    return labels.get(name, name.replace("_", " "))


def _series(ds: xr.Dataset) -> dict[str, xr.DataArray]:
    """The per-member time series of a run, each with dims (beta?, member, time)."""
    found = {}
    for metric in PANELS:
        if metric.name in ds and {"member", "time"} <= set(ds[metric.name].dims):
            found[metric.reduced_name or metric.name] = metric.reduce(ds[metric.name])
    for name, da in ds.data_vars.items():
        reduced = name in METRICS and METRICS[name].reduced_name is not None
        if name in found or reduced or not {"member", "time"} <= set(da.dims):
            continue
        found[str(name)] = da
    return {name: da for name, da in found.items() if _squeezable(da, {"beta", "member", "time"})}


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
    """One row per beta of one run (without the swept keys)."""
    series = {name: _squeeze(da, {"beta", "member", "time"}) for name, da in _series(ds).items()}
    per_member = {
        str(name): _squeeze(da, {"beta", "member"}) for name, da in ds.data_vars.items()
        if "member" in da.dims and "time" not in da.dims and name not in _BOOKKEEPING
        and np.issubdtype(da.dtype, np.number) and _squeezable(da, {"beta", "member"})
    }
    scalars = {str(name): float(da.values) for name, da in ds.data_vars.items()
               if da.ndim == 0 and np.issubdtype(da.dtype, np.number)}
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
        if "status" in ds and "member" in ds["status"].dims:
            status = _squeeze(at_beta(ds["status"]), {"member"}).values
            row["failed_fraction"] = float(np.mean(status != 0)) if status.size else np.nan
        for name, da in series.items():
            final = at_beta(da).isel(time=-1).values
            row[f"{name}_mean"], row[f"{name}_q10"], row[f"{name}_q90"] = _statistics(final)
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
        raise ConfigError(f"{path} does not exist; give a run or sweep directory, or a results.nc file, to "
                          f"{command}.")
    # Hidden folders hold a launcher's or a run's bookkeeping (.submitit/, .hydra/,
    # .attnflow-pieces/), never a run.
    files = sorted((p for p in path.rglob("results.nc") if p.is_file()
                    and not any(part.startswith(".") for part in p.relative_to(path).parts[:-1])), key=_natural)
    if not files:
        raise ConfigError(f"{path} holds no results.nc (looked in it and in its folders at any depth, hidden "
                          f"ones aside); nothing to {command}.")
    return files


def _read(folder: Path) -> list[tuple[Path, dict[str, Any], xr.Dataset]]:
    files = results_files(folder, "report")
    runs = []
    for path in files:
        try:
            config = yaml.safe_load(stored_config(path))
        except (ConfigError, yaml.YAMLError):  # not attnflow's, or its config is not plain YAML
            raise ConfigError(f"{path} is not a readable attnflow results file; remove it or move it out of "
                              f"{folder}.") from None
        runs.append((path, _flatten(config if isinstance(config, dict) else {}), load_results(path)))
    return runs


def _swept(runs: list[tuple[Path, dict[str, Any], xr.Dataset]]) -> list[str]:
    """The config keys whose values differ between runs, in the order they were typed on
    the command line (then alphabetically); beta has its own column."""
    keys = sorted({key for _, flat, _ in runs for key in flat})
    swept = [key for key in keys if key != "beta"
             and len({repr(_cell(flat.get(key))) for _, flat, _ in runs}) > 1]
    order = _override_order(runs[0][0].parent)
    return sorted(swept, key=lambda key: (order.index(key) if key in order else len(order), key))


def summary_table(folder: str | Path):
    """The report's table (a pandas DataFrame) of every `results.nc` under `folder`, and
    the swept keys; raises `ConfigError` when there is none."""
    import pandas as pd  # lazy: start-up

    folder = Path(folder)
    runs = _read(folder)
    swept = _swept(runs)
    rows = []
    for path, flat, ds in runs:
        run = str(path.parent.relative_to(folder)) if path.parent != folder else "."
        for row in _rows(ds, run, flat):
            if ds.attrs.get("experiment"):
                row["experiment"] = str(ds.attrs["experiment"])
            row.update({key: _cell(flat.get(key)) for key in swept})
            rows.append(row)
    table = pd.DataFrame(rows)
    first = ["run", *(["experiment"] if "experiment" in table else []), *swept, "beta", "final_time"]
    first += ["failed_fraction"] if "failed_fraction" in table else []
    table = table[first + [c for c in table.columns if c not in first]]
    table.attrs["series"] = sorted({name for _, _, ds in runs for name in _series(ds)})
    return table, swept


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
    numeric = all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
                  for v in x_values)
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
    for ax in axes.flat[len(metrics):]:
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
            style = {"marker": markers[index % len(markers)], "markersize": max(6.0 - 1.2 * index, 2.5),
                     "markerfacecolor": "none" if index % 2 else color}
            if numeric:
                ax.plot(xs[order], mean, linestyle=styles[index % len(styles)], linewidth=width, color=color,
                        label=label or "mean", **style)
                ax.fill_between(xs[order], low, high, color=color, alpha=0.18, linewidth=0)
            else:
                # Categories (a solver, a schedule) are not joined by lines; the lines'
                # points are set side by side so that none hides another.
                shift = 0.25 * (index - (len(lines) - 1) / 2) / max(len(lines), 1)
                ax.errorbar(xs[order] + shift, mean, yerr=[mean - low, high - mean], fmt="none", color=color,
                            capsize=2, linewidth=1)
                ax.plot(xs[order] + shift, mean, linestyle="none", color=color, label=label or "mean", **style)
        ax.set_xlabel(x_key)
        ax.set_ylabel(_label(name), fontsize=8)
        if numeric and min(x_values) > 0 and max(x_values) >= 20 * min(x_values):
            ax.set_xscale("log")  # d = 2 ... 128, members = 16 ... 2048
        if not numeric or len(x_values) <= 8:
            ax.set_xticks(list(positions.values()), [f"{v:g}" if numeric else str(v) for v in x_values],
                          rotation=20 if not numeric and len(x_values) > 3 else 0)
            ax.minorticks_off()
        if not numeric:
            ax.set_xlim(-0.6, len(x_values) - 0.4)
    if not metrics:
        axes[0, 0].text(0.5, 0.5, "these results record no per-member metric", ha="center", va="center")
    fig.suptitle(title, fontsize=10)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if groups and handles:
        fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 0.93), frameon=False,
                   title=f"{', '.join(groups)}\nmean over members\n({'band' if numeric else 'bars'}: 10-90 %)",
                   title_fontsize=8)
    fig.tight_layout()
    runs = table["run"].nunique()
    times = ", ".join(f"{t:g}" for t in sorted(set(table["final_time"].dropna())))
    others = [name for name in metrics if name not in table.attrs.get("series", metrics)]
    text = (f"{runs} run{'s' if runs > 1 else ''}; one point per run and beta: the mean over members of each "
            f"metric at the run's final saved time (t = {times})"
            + (f" ({', '.join(others)}: per member, as stored)" if others else "")
            + f", failed members left out; {'shaded' if numeric else 'bars'}: 10-90 % of the members. "
            f"Swept: {', '.join(swept) or 'nothing but beta'}.")
    fig.text(0.01, -0.01, "\n".join(textwrap.wrap(text, int(14 * fig.get_figwidth()))), ha="left", va="top",
             fontsize=8)
    return fig


def _failed_jobs(folder: Path) -> list[tuple[str, dict[str, Any], str]]:
    """The jobs under `folder` that left no results: their folder, their overrides (the
    keys as typed, the values as YAML reads them; empty when the job was refused before
    it wrote `.hydra/`) and why (their `error.txt`)."""
    failed = []
    for error in sorted(folder.rglob("error.txt"), key=_natural):
        job = error.parent
        if (job / "results.nc").exists() or any(part.startswith(".") for part in job.relative_to(folder).parts):
            continue
        overrides = {}
        try:
            typed = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
            for item in typed or []:
                key, _, value = str(item).partition("=")
                overrides[key.lstrip("+~")] = yaml.safe_load(value)
        except (OSError, yaml.YAMLError):
            overrides = {}
        try:
            reason = error.read_text().strip()
        except OSError:
            reason = "failed"
        failed.append((str(job.relative_to(folder)), overrides, reason))
    return failed


def _coordinate(values: list) -> np.ndarray:
    """A swept key's values as a coordinate: numbers when every value is one, else text."""
    if all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in values):
        return np.asarray(values)
    return np.asarray([str(v) for v in values], dtype=object)


def report_dataset(table, swept: list[str], failed: list[tuple[str, dict[str, Any], str]] = ()) -> xr.Dataset:
    """The report as a Dataset indexed by the swept keys (and beta): one dimension per
    swept key, named by the key with its dots replaced by underscores
    (`weights.v.kind` -> `weights_v_kind`; the key itself is the coordinate's
    `config_key`), so that `ds.sel(d=8, solver="rk4")` picks a run. A combination
    without a finished run is NaN, and its `note` says why: the failed job's error, or
    that no job ran it."""
    dims = [dimension_name(key) for key in swept]
    index = list(swept)
    if "beta" in table and table["beta"].notna().any():
        index.append("beta")
        dims.append("beta")
    if not index or table.duplicated(index).any():
        index.append("run")  # runs the swept keys do not tell apart (the same config twice)
        dims.append("run")
    frame = table.copy()
    frame["run"] = frame["run"].astype(str)
    frame = frame.set_index(index)
    frame.index = frame.index.set_names(dims)
    ds = xr.Dataset.from_dataframe(frame)
    grid = [dim for dim in dims if dim not in ("beta", "run")]
    # A failed job's values of the swept keys belong to the grid too (its cells NaN).
    placed = []
    for job, overrides, reason in failed:
        if grid and all(key in overrides for key in swept):
            placed.append(({dim: _cell(overrides[key]) for key, dim in zip(swept, grid)}, job, reason))
    extended = {dim: list(dict.fromkeys([*ds[dim].values.tolist(), *(where[dim] for where, _, _ in placed)]))
                for dim in grid}
    ds = ds.reindex({dim: _coordinate(values) for dim, values in extended.items()})
    for name in list(ds.data_vars):
        if ds[name].dtype == object:
            ds[name] = ds[name].fillna("").astype(str)
    for key, dim in zip(swept, dims):
        ds[dim] = _coordinate(list(ds[dim].values))
        ds[dim].attrs.update(long_name=f"the swept config key {key}", config_key=key)
    note = xr.DataArray(np.full([ds.sizes[d] for d in grid], "", dtype=object), dims=grid,
                        coords={d: ds[d] for d in grid})
    found = ds["run"].isel({d: 0 for d in ("beta",) if d in ds["run"].dims})
    if "run" in found.dims:
        found = found.isel(run=0)
    note = note.where(found != "", "no finished run of this combination")
    for where, job, reason in placed:
        where = {dim: str(value) if note[dim].dtype == object else value for dim, value in where.items()}
        note.loc[where] = f"job {job} failed: {reason}"
    # A job refused before it recorded its overrides has no known place in the grid.
    unplaced = [f"{job}: {reason}" for job, overrides, reason in failed
                if not (grid and all(key in overrides for key in swept))]
    ds["note"] = note.astype(str)
    ds["note"].attrs["long_name"] = "why a combination has no values (empty where its run finished)"
    ds["run"].attrs["long_name"] = "the run's folder under the report's folder"
    if "experiment" in ds:
        ds["experiment"].attrs["long_name"] = "the experiment of the run"
    for name in ds.data_vars:
        attrs = ds[name].attrs
        base, _, statistic = str(name).rpartition("_")
        if "long_name" not in attrs:
            what = {"mean": "mean over members", "q10": "10th percentile over members",
                    "q90": "90th percentile over members"}.get(statistic)
            attrs["long_name"] = (f"{what} of {base} at the final saved time" if what is not None
                                  else str(name).replace("_", " "))
        if ds[name].dtype.kind in "iuf" and "units" not in attrs:
            attrs["units"] = "1"
    if "beta" in ds.coords:
        ds["beta"].attrs.update(long_name="inverse temperature beta of the attention", units="1")
    ds.attrs = {"Conventions": CONVENTIONS, "title": "attnflow report",
                "swept_keys": ", ".join(swept),
                "dimensions": ", ".join(f"{dim} = {key}" for key, dim in zip(swept, dims)),
                "description": "the member mean and 10/90 % percentiles of each metric at the final saved time, "
                               "by swept key (and beta); NaN where no run finished (see `note`)"}
    if unplaced:
        ds.attrs["failed_jobs"] = "; ".join(unplaced)
    return ds


def report(folder: str | Path) -> list[Path]:
    """Summarize every run under `folder` into `report.csv` (one row per run and beta),
    `report.nc` (the same numbers indexed by the swept keys, `report_dataset`) and
    `report.png` there (each written whole or not at all); returns their paths."""
    folder = Path(folder)
    table, swept = summary_table(folder)
    csv = _write_atomically(folder / "report.csv", lambda tmp: table.to_csv(tmp, index=False))
    ds = report_dataset(table, swept, _failed_jobs(folder))
    ds.attrs["source"] = str(folder.resolve())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Warning)  # xarray's notes on string encodings
        nc = write_results(ds, folder / "report.nc")
    runs = table["run"].nunique()
    fig = report_figure(table, swept, f"attnflow report: {runs} run{'s' if runs > 1 else ''}"
                        + (f", swept: {', '.join(swept)}" if swept else ""))
    with style():
        png = _write_atomically(folder / "report.png", lambda tmp: fig.savefig(tmp, format="png"))
    return [csv, nc, png]
