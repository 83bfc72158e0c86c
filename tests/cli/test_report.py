"""`attnflow report DIR` and `attnflow plot DIR`, run as a researcher runs them.

A small sweep over d (`attnflow -m d=2,3 ...`, a beta list in each job) is summarized
into one table whose rows hold, per run and beta, the mean and the 10/90 % percentiles
over members of each metric at the final time: they must equal what each run's own
`results.nc` gives, and `report.nc` holds the same rows in the same order. A directory
without results is refused with one sentence. `attnflow plot` redraws a plain run's
summary and an experiment's figures from `results.nc` alone, and a folder of experiment
runs is summarized without failing.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import yaml

from attnflow import load_results, write_results
from attnflow.presentation._report import report
from attnflow.experiments import run_experiment
from commands import attnflow


SWEEP = ["-m", "d=2,3", "n=4", "members=4", "t1=1", "dt=0.1", "saves=3", "beta=[1,2]", "plot=false",
         "compilation_cache=false"]


def assert_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("sweep")
    assert_ok(attnflow(*SWEEP, f"hydra.sweep.dir={folder}", cwd=folder))
    return folder


def test_report_matches_each_run(sweep):
    proc = attnflow("report", str(sweep), cwd=sweep)
    assert_ok(proc)
    assert proc.stdout.splitlines()[-1] == "attnflow: reported 2 runs in 4 rows (2 runs x 2 betas; swept key d)"
    table = pd.read_csv(sweep / "report.csv")
    assert sorted(set(table["d"])) == [2, 3]
    assert len(table) == 2 * 2  # two runs, two betas each
    assert table["failed_fraction"].eq(0).all()
    for row in table.itertuples(index=False):
        ds = load_results(sweep / str(row.run) / "results.nc")
        assert ds.attrs["config"].count(f"d: {row.d}\n") == 1
        final = ds.sel(beta=row.beta).isel(time=-1)
        for metric in ("energy", "log_energy", "pair_density", "clusters", "order_parameter"):
            values = final[metric].values.astype(float)
            np.testing.assert_allclose(getattr(row, f"{metric}_mean"), np.nanmean(values), rtol=1e-6, atol=1e-12)
            low, high = np.nanpercentile(values, [10, 90])
            np.testing.assert_allclose(getattr(row, f"{metric}_q10"), low, rtol=1e-6, atol=1e-12)
            np.testing.assert_allclose(getattr(row, f"{metric}_q90"), high, rtol=1e-6, atol=1e-12)
    # report.nc holds the same rows, in the same order, along `row`; a row is selected by its values.
    with xr.open_dataset(sweep / "report.nc") as stored:
        stored.load()
    assert stored.attrs["swept_keys"] == "d" and stored.attrs["Conventions"] == "CF-1.11"
    assert stored["energy_mean"].dims == ("row",) and stored.sizes["row"] == len(table)
    assert list(stored["run"].values) == [str(run) for run in table["run"]]
    np.testing.assert_array_equal(stored["d"].values, table["d"])
    np.testing.assert_array_equal(stored["beta"].values, table["beta"])
    assert stored["d"].attrs["config_key"] == "d"
    for row in table.itertuples(index=False):
        chosen = stored.where((stored.d == row.d) & (stored.beta == row.beta), drop=True)
        assert chosen.sizes["row"] == 1 and chosen["run"].item() == str(row.run)
        for metric in ("energy", "clusters"):
            for statistic in ("mean", "q10", "q90"):
                np.testing.assert_allclose(chosen[f"{metric}_{statistic}"].item(),
                                           getattr(row, f"{metric}_{statistic}"))
    keyed = stored.set_xindex(["d", "beta"])
    np.testing.assert_allclose(keyed.sel(d=3, beta=2.0)["energy_mean"].item(),
                               table[(table["d"] == 3) & (table["beta"] == 2.0)]["energy_mean"].item())
    assert (stored["note"] == "").all()
    for name in [*stored.coords, *stored.data_vars]:
        assert stored[name].attrs["long_name"], name
    assert (sweep / "report.png").stat().st_size > 0


def test_report_nc_holds_one_row_per_run_and_beta_and_one_per_failed_job(sweep, tmp_path):
    """Three runs that differ in d, the solver and a nested key (their numbers copied
    from the sweep: the runs with the other solver coincide with the first), and a
    failed job: `report.nc` holds their rows, in the order of report.csv, a user selects
    rows by their keys' values (`where`, or `set_xindex` and `sel`), and the failed
    job's row holds its overrides, NaN numbers and a note naming it and its error;
    `report.png` draws every line with its own style and names the swept keys, not the
    folder."""
    from attnflow.presentation._report import report_figure, summary_table

    runs = {"a": ("0", {}), "b": ("1", {}), "c": ("0", {"solver": "rk4"}), "e": ("1", {"token_norm": {"eps": 0.5}})}
    for name, (source, change) in runs.items():
        ds = load_results(sweep / source / "results.nc")
        config = yaml.safe_load(ds.attrs["config"])
        for key, value in change.items():
            config[key] = {**config[key], **value} if isinstance(value, dict) else value
        ds.attrs["config"] = yaml.safe_dump(config)
        write_results(ds, tmp_path / name / "results.nc")
    failed = tmp_path / "f"
    (failed / ".hydra").mkdir(parents=True)
    (failed / ".hydra" / "overrides.yaml").write_text("- d=4\n- solver=rk4\n- token_norm.eps=0.0\n")
    (failed / "error.txt").write_text("the state became non-finite at t = 0.5.\n")
    written, reported = report(tmp_path)
    assert [path.name for path in written] == ["report.csv", "report.nc", "report.png"]
    assert reported == ("reported 4 runs in 9 rows (4 runs x 2 betas, 1 failed job; swept keys d, solver, "
                        "token_norm.eps)")
    with xr.open_dataset(tmp_path / "report.nc") as stored:
        stored.load()
    table = pd.read_csv(tmp_path / "report.csv", keep_default_na=False, na_values=[""])
    assert list(stored["run"].values) == ["a", "a", "b", "b", "c", "c", "e", "e", "f"]
    assert list(table["run"]) == list(stored["run"].values)
    assert all(stored[name].dims == ("row",) for name in [*stored.coords, *stored.data_vars])
    assert stored["token_norm_eps"].attrs["config_key"] == "token_norm.eps"
    assert list(stored["d"].values) == [2, 2, 3, 3, 2, 2, 3, 3, 4]
    assert list(stored["solver"].values) == ["euler_renorm"] * 4 + ["rk4"] * 2 + ["euler_renorm"] * 2 + ["rk4"]
    np.testing.assert_allclose(stored["energy_mean"].values[:8], table["energy_mean"].values[:8])
    same = stored.where((stored.d == 2) & (stored.token_norm_eps == 0.0), drop=True)
    np.testing.assert_array_equal(same.where(same.solver == "rk4", drop=True)["energy_mean"].values,
                                  same.where(same.solver == "euler_renorm", drop=True)["energy_mean"].values)
    keyed = stored.set_xindex(["d", "solver", "token_norm_eps", "beta"])
    assert keyed.sel(d=2, solver="rk4", token_norm_eps=0.0, beta=1.0)["run"].item() == "c"
    # The failed job: its overrides, no numbers, and why; and so in report.csv.
    job = stored.where(stored.note != "", drop=True)
    assert job["run"].values.tolist() == ["f"] and job["solver"].item() == "rk4" and job["d"].item() == 4
    assert np.isnan(job["energy_mean"].item()) and np.isnan(job["beta"].item())
    assert job["note"].item() == "job f failed: the state became non-finite at t = 0.5."
    assert table["note"].isna().tolist() == [True] * 8 + [False] and table["note"].iloc[-1] == job["note"].item()
    assert table.iloc[-1]["solver"] == "rk4" and table.iloc[-1]["d"] == 4 and np.isnan(table.iloc[-1]["energy_mean"])
    # A combination no job ran has no row (nothing stands for the grid of the keys' values).
    assert stored.where((stored.d == 3) & (stored.solver == "rk4"), drop=True).sizes["row"] == 0

    table, swept = summary_table(tmp_path)
    fig = report_figure(table, swept, "title")
    try:
        lines = [line for line in fig.axes[0].get_lines() if line.get_label() and not line.get_label().startswith("_")]
        styles = {(line.get_linestyle(), line.get_marker()) for line in lines}
        assert len(lines) > 1 and len(styles) == len(lines)  # coinciding lines stay visible
        legend = fig.legends[0].get_title().get_text()
        assert "solver" in legend and "token_norm.eps" in legend
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
    import matplotlib.image

    assert matplotlib.image.imread(tmp_path / "report.png").size > 0


def test_report_of_an_empty_directory_is_one_sentence(tmp_path):
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "incomplete.nc").write_bytes(b"")  # a failed job's file is not a result
    proc = attnflow("report", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("attnflow: error: ") and "Traceback" not in proc.stderr
    assert not list(tmp_path.glob("report.*"))


def test_plot_redraws_a_run_and_an_experiment(sweep, tmp_path):
    # An experiment run, reduced, written as the command line writes it (two seeds: a
    # small sweep of experiment runs).
    experiments = tmp_path / "experiments"
    for seed in (0, 1):
        ds = run_experiment("single_cluster", {"members": 2, "t1": 2.0, "saves": 21, "seed": seed,
                                               "compilation_cache": False})
        write_results(ds, experiments / str(seed) / "results.nc")
    run = sweep / "0"
    assert not (run / "summary.png").exists()  # the sweep ran with plot=false
    assert_ok(attnflow("plot", str(run), str(experiments / "0"), cwd=tmp_path))
    assert (run / "summary.png").stat().st_size > 0
    for suffix in ("png", "pdf", "html", "gif"):
        assert (experiments / "0" / f"single_cluster.{suffix}").stat().st_size > 0

    # The report of experiment runs names each run and the swept key, and fails on nothing.
    paths, reported = report(experiments)
    assert [p.name for p in paths] == ["report.csv", "report.nc", "report.png"]
    assert reported == "reported 2 runs in 2 rows (2 runs x 1 beta; swept key seed)"
    table = pd.read_csv(experiments / "report.csv")
    assert list(table["run"]) == [0, 1] and list(table["seed"]) == [0, 1]
    assert set(table["experiment"]) == {"single_cluster"}
    assert "energy_mean" in table and "energy_increase_mean" in table
