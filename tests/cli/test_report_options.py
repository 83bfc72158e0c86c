"""`attnflow report DIR --x KEY --colour KEY --metrics A,B --time T|final|all --panels KEY`
(issue 37, item 3): each option changes what report.png draws (the axes of the figure
object) and what report.nc stores (its data, checked against each run's own
`results.nc`); text values are in job order in both; the title names every swept key,
beta included; a bad option is one sentence naming the nearest name; `attnflow help
report` is a page of its own listing every option.

The sweep is `-m solver=rk4,euler_renorm d=3,2` with two betas per job: its first job's
solver (rk4) sorts after the second's, and its first job's d after the second's, so that
job order and sorted order differ for both keys.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import xarray as xr
from commands import attnflow, command, one_sentence  # noqa: F401 (command: a fixture)
from matplotlib.colors import to_hex

from attnflow import _help, load_results
from attnflow.presentation._report import (
    _label,
    report,
    report_figure,
    report_options,
    report_title,
    summary_table,
)

SWEEP = ["-m", "solver=rk4,euler_renorm", "d=3,2", "n=4", "members=4", "t1=1", "dt=0.1", "saves=3", "beta=[1,2]",
         "plot=false", "compilation_cache=false"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("sweep")
    proc = attnflow(*SWEEP, f"hydra.sweep.dir={folder}", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    return folder


def stored(folder: Path) -> xr.Dataset:
    with xr.open_dataset(folder / "report.nc") as ds:
        return ds.load()


def drawn(folder: Path, **options):
    """The figure `report` draws for `options` (the same table, title and options)."""
    table, swept = summary_table(folder, time=options.get("time"))
    return report_figure(table, swept, report_title(table, swept, report_options(**options).time),
                         report_options(**options))


def legend_lines(ax) -> list:
    return [line for line in ax.get_lines() if not line.get_label().startswith("_")]


def member_statistics(values: np.ndarray) -> tuple[float, float, float]:
    values = values.astype(float)
    low, high = np.percentile(values, [10, 90])
    return values.mean(), low, high


def test_by_default_the_title_names_every_swept_key_and_text_is_in_job_order_in_figure_and_nc(sweep):
    written, reported = report(sweep)
    assert reported == "reported 4 runs in 8 rows (4 runs x 2 betas; swept keys solver, d)"
    ds = stored(sweep)
    # The title names every swept key, beta too (a list of two in each run).
    assert ds.attrs["title"] == "attnflow report: 4 runs, swept: solver, d, beta"
    # Text in job order: rk4 (job 0) before euler_renorm, in the rows, in `categories`, on the x-axis.
    assert list(ds["solver"].values) == ["rk4"] * 4 + ["euler_renorm"] * 4
    assert json.loads(ds["solver"].attrs["categories"]) == ["rk4", "euler_renorm"]
    assert "categories" not in ds["d"].attrs  # numbers: ascending
    np.testing.assert_array_equal(ds["time"].values, 1.0)  # the final saved time
    fig = drawn(sweep)
    try:
        assert fig._suptitle.get_text() == ds.attrs["title"]
        for ax in fig.axes:
            if ax.get_visible() and ax.axison:
                assert ax.get_xlabel() == "solver"
                assert [t.get_text() for t in ax.get_xticklabels()] == ["rk4", "euler_renorm"]
        # A line per d and beta, the numbers ascending in the legend.
        labels = [line.get_label() for line in legend_lines(fig.axes[0])]
        assert labels == ["d = 2, beta = 1", "d = 2, beta = 2", "d = 3, beta = 1", "d = 3, beta = 2"]
    finally:
        plt.close(fig)


def test_x_colour_metrics_and_a_time_change_what_is_drawn_and_stored(sweep):
    options = {"x": "beta", "colour": "d", "metrics": "clusters,energy", "time": 0.4}
    report(sweep, **options)
    ds = stored(sweep)
    # Only the chosen metrics' statistics are stored, taken at the saved time nearest to 0.4.
    statistics = sorted(name for name in ds.data_vars if re.search(r"_(mean|q10|q90)$", str(name)))
    assert statistics == sorted(f"{m}_{s}" for m in ("clusters", "energy") for s in ("mean", "q10", "q90"))
    table = pd.read_csv(sweep / "report.csv")
    assert not any(c.startswith(("log_energy", "order_parameter", "num_steps")) for c in table.columns)
    np.testing.assert_array_equal(ds["time"].values, 0.5)
    np.testing.assert_array_equal(ds["final_time"].values, 1.0)
    assert ds.attrs["title"].endswith(", at t = 0.4")
    for row in range(ds.sizes["row"]):
        run = load_results(sweep / str(ds["run"].values[row]) / "results.nc")
        at = run.sel(beta=ds["beta"].values[row], time=0.5)
        for metric in ("clusters", "energy"):
            expected = member_statistics(at[metric].values)
            got = [ds[f"{metric}_{s}"].values[row] for s in ("mean", "q10", "q90")]
            np.testing.assert_allclose(got, expected, rtol=1e-6)
    # The final time differs (the flow moved): --time is not the default.
    final = summary_table(sweep)[0]
    assert not np.allclose(final["energy_mean"], ds["energy_mean"].values)

    fig = drawn(sweep, **options)
    try:
        shown = [ax for ax in fig.axes if ax.axison]
        assert [ax.get_ylabel() for ax in shown] == [_label("clusters"), _label("energy")]
        assert all(ax.get_xlabel() == "beta" for ax in shown)
        lines = legend_lines(shown[1])
        assert len(lines) == 4  # solver x d
        # One colour per d, whatever the solver; the two d's differ.
        colours = {}
        for line in lines:
            d = re.search(r"d = (\d)", line.get_label()).group(1)
            colours.setdefault(d, set()).add(to_hex(line.get_color()))
        assert all(len(c) == 1 for c in colours.values()) and colours["2"] != colours["3"]
        # The points are the stored means against beta.
        line = next(line for line in lines if line.get_label() == "solver = rk4, d = 3")
        rows = ds.where((ds.solver == "rk4") & (ds.d == 3), drop=True)
        np.testing.assert_array_equal(line.get_xdata(), rows["beta"].values)
        np.testing.assert_allclose(line.get_ydata(), rows["energy_mean"].values)
    finally:
        plt.close(fig)


def test_time_all_draws_and_stores_each_runs_trajectory_with_panels_per_value(sweep):
    options = {"time": "all", "colour": "solver", "panels": "d", "metrics": "energy,clusters"}
    report(sweep, **options)
    ds = stored(sweep)
    assert ds["energy_mean"].dims == ("row", "time") and ds.sizes["row"] == 8
    np.testing.assert_allclose(ds["time"].values, [0.0, 0.5, 1.0])
    assert ds.attrs["title"].endswith(", over time")
    for row in range(ds.sizes["row"]):
        run = load_results(sweep / str(ds["run"].values[row]) / "results.nc").sel(beta=ds["beta"].values[row])
        np.testing.assert_allclose(ds["energy_mean"].values[row], run["energy"].mean("member").values, rtol=1e-6)
    table = pd.read_csv(sweep / "report.csv")
    assert len(table) == 8 * 3 and sorted(set(table["time"])) == [0.0, 0.5, 1.0]

    fig = drawn(sweep, **options)
    try:
        shown = [ax for ax in fig.axes if ax.axison]
        # A row per metric, a column per d (ascending).
        assert [ax.get_title() for ax in shown] == ["d = 2", "d = 3", "d = 2", "d = 3"]
        assert [ax.get_ylabel() for ax in shown] == [_label("energy")] * 2 + [_label("clusters")] * 2
        assert all(ax.get_xlabel() == "time" for ax in shown)
        lines = legend_lines(shown[1])  # energy, d = 3: a line per solver and beta
        assert [line.get_label() for line in lines] == [
            "solver = rk4, beta = 1", "solver = rk4, beta = 2",
            "solver = euler_renorm, beta = 1", "solver = euler_renorm, beta = 2"]
        assert len({to_hex(line.get_color()) for line in lines}) == 2  # a colour per solver
        for line in lines:
            solver, beta = re.match(r"solver = (\w+), beta = (\d)", line.get_label()).groups()
            row = ds.where((ds.solver == solver) & (ds.d == 3) & (ds.beta == float(beta)), drop=True)
            np.testing.assert_allclose(line.get_xdata(), [0.0, 0.5, 1.0])
            np.testing.assert_allclose(line.get_ydata(), row["energy_mean"].values[0])
    finally:
        plt.close(fig)


@pytest.mark.parametrize(("arguments", "expected"), [
    (["--x", "solvr"], "--x solvr is not a swept key (did you mean solver?); choose one of solver, d, beta."),
    (["--colour=dd"], "--colour dd is not a swept key (did you mean d?); choose one of solver, d, beta."),
    (["--panels", "beat"], "--panels beat is not a swept key (did you mean beta?); choose one of solver, d, beta."),
    (["--metrics", "clusters,enrgy"], "--metrics enrgy is not a metric these runs recorded (did you mean energy?)"),
    (["--colur", "d"], "attnflow report has no option --colur (did you mean --colour?)"),
    (["--x", "d", "--panels", "d"], "--x d and --panels d name the same key; give each its own key."),
    (["--x", "d", "--time", "all"], "--x d cannot go with --time all, whose x-axis is time; leave --x out."),
    (["--time", "ten"], "--time takes a time (a number), final or all, got 'ten'."),
    (["--time", "5"], "--time 5 is outside the saved times of run 0 (0 to 1); give a time between them, final or all."),
    (["--metrics", "energy,"], "--metrics takes metric names separated by commas"),
    (["--time"], "--time takes T|final|all"),
    (["--x", "d", "--x", "beta"], "--x is given twice; give it once."),
])
def test_a_bad_option_is_one_sentence_and_writes_nothing(sweep, command, arguments, expected):
    before = {path.name: path.stat().st_mtime_ns for path in sweep.glob("report.*")}
    code, err = command("report", str(sweep), *arguments)
    assert code == 2 and len(err) == 1 and err[0].startswith(f"attnflow: error: {expected}"), err
    assert err[0].endswith(".")
    assert {path.name: path.stat().st_mtime_ns for path in sweep.glob("report.*")} == before


def test_the_python_function_takes_the_same_options_and_refuses_them_the_same_way(sweep):
    with pytest.raises(ValueError) as error:
        report(sweep, x="solvr")
    assert one_sentence(error).startswith("--x solvr is not a swept key (did you mean solver?)")
    with pytest.raises(ValueError) as error:
        report(sweep, metrics=["clusters", "log_enrgy"])
    assert "(did you mean log_energy?)" in one_sentence(error)


def test_the_command_line_options_reach_the_report(sweep):
    proc = attnflow("report", str(sweep), "--x=beta", "--color", "solver", "--metrics", "order_parameter",
                    "--time", "final", cwd=sweep)
    assert proc.returncode == 0, proc.stderr
    ds = stored(sweep)
    assert ds.attrs["figure"] == ("report.png: order_parameter against beta, one line per value of solver, d, "
                                  "coloured by solver, at the final saved time")
    assert [name for name in ds.data_vars if str(name).endswith("_mean")] == ["order_parameter_mean"]


def test_help_report_is_a_page_of_its_own_listing_every_option(command):
    code, err = command("help", "report")
    assert code == 0 and err == []
    page = command.out
    assert page.startswith("usage: attnflow report DIR [--x KEY] [--colour KEY]")
    flat = " ".join(page.split())
    for name, (takes, meaning) in _help.REPORT_OPTIONS.items():
        assert re.search(rf"^  --{name} {re.escape(takes)} ", page, re.M), name
        assert " ".join(meaning.split()) in flat, name
    assert command("report", "--help") == (0, []) and command.out == page
    assert "--x KEY" in _help.reference_markdown()


def test_help_report_runs_as_a_command(tmp_path):
    proc: subprocess.CompletedProcess = attnflow("help", "report", cwd=tmp_path)
    assert proc.returncode == 0 and "--panels KEY" in proc.stdout
