"""Sweeps on Hydra's launchers, run as real subprocesses the way a researcher runs them.

The joblib launcher runs a sweep's jobs in parallel local processes and the submitit
launcher as submitit jobs (its local executor here: one subprocess per job, as SLURM
would run them on its nodes). Whatever ran them, a sweep must give the numbers the basic
launcher gives (same seed, same results), run every job whatever the others do, name
its failed jobs and exit non-zero, resume after being killed without recomputing a
finished job (a half-finished one from its pieces), and leave a folder that `attnflow
report` reads. Each subprocess pays JAX's start-up, so the sweeps are tiny and few.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml
from hydra.types import RunMode
from omegaconf import OmegaConf

from attnflow.cli import _history
from attnflow.presentation._report import report, summary_table
from commands import ATTNFLOW, attnflow, environment

pytest.importorskip("hydra_plugins.hydra_joblib_launcher", reason="pip install 'attnflow[joblib]'")
pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install 'attnflow[slurm]'")


# Four jobs: beta=1 with 2 members (one piece) and 4096 members (32 pieces of 128, a few
# seconds: the job that is interrupted half-way; with 16 pieces, 4 to 16 were done when
# job 0 finished, too close to a job 1 that ends before the kill), and the same two with beta=-1, which
# no run accepts. One CPU device each, so that a piece is one chunk of 128 members.
SWEEP = ["-m", "beta=1,-1", "members=2,4096", "chunk_size=128", "n=32", "d=3", "t1=20", "dt=0.1", "saves=3",
         "plot=false", "cpu_devices=1"]
JOBLIB = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]


def load(path: Path) -> xr.Dataset:
    with xr.open_dataset(path, engine="netcdf4") as ds:
        return ds.load()


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    assert "Traceback" not in proc.stderr, proc.stderr
    return [line for line in proc.stderr.splitlines() if line.strip()]


def assert_failed_jobs_named(proc: subprocess.CompletedProcess, failed: list[str], jobs: int) -> None:
    """Exit code 2; the last line names every failed job (its number and overrides)."""
    assert proc.returncode == 2, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    last = error_lines(proc)[-1]
    assert last.startswith(f"attnflow: error: {len(failed)} of {jobs} jobs failed: "), proc.stderr
    for job in failed:
        assert f"{job} (" in last, last
    for line in error_lines(proc)[:-1]:
        assert line.startswith("attnflow: error: job "), proc.stderr


@pytest.fixture(scope="module")
def basic(tmp_path_factory) -> Path:
    """The sweep on Hydra's basic launcher: every job in turn, in one process."""
    folder = tmp_path_factory.mktemp("basic")
    proc = attnflow(*SWEEP, f"hydra.sweep.dir={folder}", cwd=folder)
    assert_failed_jobs_named(proc, ["job 2", "job 3"], jobs=4)
    return folder


def test_joblib_sweep_equals_the_basic_one_and_resumes_after_a_kill(basic, tmp_path):
    sweep = tmp_path / "joblib"
    args = [*SWEEP, *JOBLIB, f"hydra.sweep.dir={sweep}"]
    pieces = sweep / "1" / ".attnflow-pieces"

    # Killed (SIGTERM, as a scheduler or `timeout` does) once job 0 has finished and
    # job 1 is half-way through its pieces.
    proc = subprocess.Popen([str(ATTNFLOW), *args], cwd=tmp_path, env=environment(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while proc.poll() is None and time.monotonic() < deadline and not (
            (sweep / "0" / "results.nc").exists() and len(list(pieces.glob("piece-*.npz"))) >= 2):
        time.sleep(0.02)
    assert proc.poll() is None, f"the sweep ended before it could be killed\n{proc.communicate()}"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    # The last line says the sweep was interrupted; before it, only the failures of jobs 2
    # and 3 may have been reported (a free worker can take job 2 while job 1 runs).
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("attnflow: interrupted; the finished jobs"), stderr
    assert "resumes" in lines[-1] and "Traceback" not in stderr
    assert f"the same command with hydra.sweep.dir={sweep} resumes" in lines[-1], stderr
    for line in lines[:-1]:
        assert line.startswith(("attnflow: error: job 2 (beta=-1", "attnflow: error: job 3 (beta=-1")), stderr
    assert not (sweep / "1" / "results.nc").exists()
    # Usually job 1 is half-way; on a fast machine it can have finished all its pieces
    # (not yet its results file) by the time job 0's file appears (seen on a 2-core AMD
    # EPYC). Either way it resumes from its pieces below.
    kept = len(list(pieces.glob("piece-*.npz")))
    assert 2 <= kept <= 32
    finished = (sweep / "0" / "results.nc").stat().st_mtime_ns

    # The same command again: job 0 is skipped, job 1 resumes from its pieces (its
    # worker was stopped with the sweep: nothing holds its folder), jobs 2 and 3 fail
    # again without stopping the others, and the sweep exits 2 naming them.
    resumed = attnflow(*args, cwd=tmp_path)
    assert_failed_jobs_named(resumed, ["job 2", "job 3"], jobs=4)
    assert f"{sweep / '0' / 'results.nc'} already holds this run; skipping it." in resumed.stdout, resumed.stdout
    assert f"resuming from {kept} of 32 finished pieces in {pieces}" in resumed.stdout, resumed.stdout
    assert (sweep / "0" / "results.nc").stat().st_mtime_ns == finished
    assert not pieces.exists()
    for job in ("2", "3"):
        assert "every beta must be positive" in (sweep / job / "error.txt").read_text()
        assert not (sweep / job / "results.nc").exists()

    # Result for result, the numbers of the basic launcher's sweep (job 1's assembled
    # from the pieces of two processes).
    for job in ("0", "1"):
        ours, theirs = load(sweep / job / "results.nc"), load(basic / job / "results.nc")
        assert ours.attrs["config"] == theirs.attrs["config"]
        assert yaml.safe_load(ours.attrs["config"])["members"] == (2 if job == "0" else 4096)
        assert set(ours.data_vars) == set(theirs.data_vars) and ours["energy"].sizes["member"] > 1
        for name in ours.data_vars:
            np.testing.assert_array_equal(ours[name].values, theirs[name].values, err_msg=f"job {job}: {name}")
    assert not list(sweep.rglob("*.tmp"))


def test_submitit_local_sweep_runs_jobs_as_subprocesses_and_its_report_reads(tmp_path):
    sweep = tmp_path / "submitit"
    proc = attnflow("-m", "hydra/launcher=submitit_local", "d=2,3,0", "n=4", "members=2", "beta=[1,2]", "t1=1",
                    "dt=0.1", "saves=3", "plot=false", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    # The failed job's own line went to its submitit log: the sweep says it too.
    assert_failed_jobs_named(proc, ["job 2"], jobs=3)
    assert any("job 2 (d=0" in line and "d must be at least 1" in line for line in error_lines(proc)), proc.stderr
    assert "d must be at least 1" in (sweep / "2" / "error.txt").read_text()

    # Each job ran in its own submitit process, which logged it under .submitit/.
    logs = {path.read_text() for path in sweep.glob(".submitit/*/*_log.out")}
    for job in ("0", "1"):
        assert sum(f"wrote {sweep / job / 'results.nc'}" in log for log in logs) == 1, logs
        # And in its own folder's log, which holds its own lines only.
        log = (sweep / job / "attnflow.log").read_text().splitlines()
        assert log[1].startswith(f"attnflow: job {job} (d="), log
        assert log[2:] == [f"attnflow: wrote {sweep / job / 'results.nc'}"], log
    assert not (sweep / "2" / "attnflow.log").exists()  # a refused job writes none
    job_ids = {job: yaml.safe_load((sweep / job / ".hydra" / "hydra.yaml").read_text())["hydra"]["job"]["id"]
               for job in ("0", "1")}
    assert len(set(job_ids.values())) == 2
    assert all((sweep / ".submitit" / str(job_id)).is_dir() for job_id in job_ids.values())
    # The log's header and the history name the job's own submitit folder, not `.submitit/%j`.
    for job, job_id in job_ids.items():
        where = f"of submitit job {job_id} in {sweep / '.submitit' / str(job_id)})"
        header = (sweep / job / "attnflow.log").read_text().splitlines()[0]
        assert header.endswith(where) and "%j" not in header, header
        assert load(sweep / job / "results.nc").attrs["history"].endswith(where)

    # The report reads the runs and nothing of submitit's bookkeeping.
    table, swept = summary_table(sweep)
    assert swept == ["d"]
    assert sorted(set(table["run"])) == ["0", "1"] and len(table) == 2 * 2
    for job, d in (("0", 2), ("1", 3)):
        ds = load(sweep / job / "results.nc")
        rows = table[table["run"] == job].sort_values("beta")
        assert rows["d"].tolist() == [d, d] and rows["beta"].tolist() == [1.0, 2.0]
        np.testing.assert_allclose(rows["energy_mean"], ds["energy"].isel(time=-1).mean("member"), rtol=1e-6)
    assert [path.name for path in report(sweep)[0]] == ["report.csv", "report.nc", "report.png"]


@pytest.mark.parametrize(
    ("executor", "variables", "job_id"),
    [
        ("local", {"SUBMITIT_LOCAL_JOB_ID": "4242"}, "4242"),
        ("slurm", {"SLURM_JOB_ID": "9001", "SLURM_ARRAY_JOB_ID": "9000", "SLURM_ARRAY_TASK_ID": "1"}, "9000_1"),
    ],
)
def test_a_submitit_jobs_history_names_its_job_and_folder(monkeypatch, tmp_path, executor, variables, job_id):
    # A submitit job's process is `python -m submitit.core._submit SWEEP/.submitit/%j`,
    # with the job in its environment (faked here: no cluster).
    folder = tmp_path / ".submitit" / "%j"
    monkeypatch.setattr("sys.argv", ["/site-packages/submitit/core/_submit.py", str(folder)])
    hydra_cfg = OmegaConf.create({"mode": RunMode.MULTIRUN, "overrides": {"task": ["d=3"]}, "job": {"num": 1}})
    assert _history(hydra_cfg).endswith(f" attnflow d=3 (job 1 of attnflow {folder})")  # not a submitit job
    monkeypatch.setenv("SUBMITIT_EXECUTOR", executor)
    monkeypatch.setenv("SUBMITIT_FOLDER", str(folder))
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    history = _history(hydra_cfg)
    assert history.endswith(f" attnflow d=3 (job 1 of submitit job {job_id} in {tmp_path / '.submitit' / job_id})")
    assert "%j" not in history


def test_an_unknown_launcher_is_one_sentence_naming_the_extras(tmp_path):
    proc = attnflow("-m", "hydra/launcher=jobib", "n=4", f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert proc.returncode == 2
    lines = error_lines(proc)
    assert len(lines) == 1 and lines[0].startswith("attnflow: error: unknown hydra/launcher 'jobib' (did you mean "
                                                   "joblib?); choose one of"), proc.stderr
    assert "joblib" in lines[0] and "attnflow[joblib]" in lines[0] and "attnflow[slurm]" in lines[0]
    assert not (tmp_path / "sweep").exists()
