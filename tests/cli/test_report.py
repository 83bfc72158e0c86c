"""`attnflow report DIR` and `attnflow plot DIR`, run as a researcher runs them.

A small sweep over d (`attnflow -m d=2,3 ...`, a beta list in each job) is summarized
into one table whose rows hold, per run and beta, the mean and the 10/90 % percentiles
over members of each metric at the final time: they must equal what each run's own
`results.nc` gives. A directory without results is refused with one sentence. `attnflow
plot` redraws a plain run's summary and an experiment's figures from `results.nc` alone,
and a folder of experiment runs is summarized without failing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from attnflow import load_results, write_results
from attnflow._report import report
from attnflow.experiments import run_experiment

ATTNFLOW = Path(sys.executable).with_name("attnflow")
if not ATTNFLOW.exists():
    ATTNFLOW = Path(shutil.which("attnflow") or ATTNFLOW)

SWEEP = ["-m", "d=2,3", "n=4", "members=4", "t1=1", "dt=0.1", "saves=3", "beta=[1,2]", "plot=false",
         "compilation_cache=false"]


def attnflow(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([str(ATTNFLOW), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
                          check=False)


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
    with xr.open_dataset(sweep / "report.nc") as stored:
        assert stored.attrs["swept_keys"] == "d"
        np.testing.assert_array_equal(stored["d"].values, table["d"].values)
    assert (sweep / "report.png").stat().st_size > 0


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
    paths = report(experiments)
    assert [p.name for p in paths] == ["report.csv", "report.nc", "report.png"]
    table = pd.read_csv(experiments / "report.csv")
    assert list(table["run"]) == [0, 1] and list(table["seed"]) == [0, 1]
    assert set(table["experiment"]) == {"single_cluster"}
    assert "energy_mean" in table and "energy_increase_mean" in table
