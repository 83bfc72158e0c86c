"""`attnflow report` and `attnflow plot` against a hostile user (issue 33, items 7 and 8):
a folder of runs that each change keys of their own, a results file whose config is a
YAML alias bomb, a failed job whose files are not attnflow's.

The report reads each results file lazily and keeps one row per run and beta (never an
array over the combinations of the swept keys); every config it reads back goes
through `attnflow.storage._store.read_config`, bounded. The runs here are copies of one real
run (`attnflow.run`) whose stored config is rewritten, so that a dozen runs cost one
JAX start-up.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import netCDF4
import numpy as np
import pandas as pd
import pytest
import xarray as xr
import yaml

import attnflow as af
from attnflow.storage import _store
from attnflow import write_results
from commands import ATTNFLOW, command  # noqa: F401 (command: a fixture)

CONFIG = {"n": 4, "d": 3, "members": 2, "t1": 0.5, "dt": 0.1, "saves": 3, "beta": 1.0}
# 9 levels of 9 aliases: 9^9 (387 million) entries once expanded, 200 bytes of text.
BOMB = "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
    f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]\n" for previous, name in zip("abcdefgh", "bcdefghi"))
MiB = 2**20


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """One real run's results.nc."""
    path = tmp_path_factory.mktemp("run") / "results.nc"
    write_results(af.run(CONFIG), path)
    return path


def copy_with_config(results: Path, to: Path, config: str) -> Path:
    """A copy of `results` at `to` whose stored config is `config`."""
    to.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(results, to)
    with netCDF4.Dataset(to, "a") as f:
        f.setncattr("config", config)
    return to


def one_error_line(code: int, lines: list[str]) -> str:
    assert code == 2 and len(lines) == 1 and lines[0].startswith("attnflow: error: "), (code, lines)
    return lines[0]


def _changed(value):
    """A value away from the default: another number, the other boolean, other text."""
    if isinstance(value, bool):
        return not value
    return value + 1 if isinstance(value, (int, float)) else f"{value}-x"


def _scalar_keys(config: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in config.items():
        if isinstance(value, dict) and value:
            keys += _scalar_keys(value, f"{prefix}{key}.")
        elif isinstance(value, (int, float, str, bool)) and key != "beta":
            keys.append(f"{prefix}{key}")
    return keys


@pytest.mark.skipif(sys.platform != "linux", reason="an address-space limit and ru_maxrss in KiB: Linux's")
def test_runs_that_each_change_keys_of_their_own_are_one_row_each_in_bounded_memory(results, tmp_path):
    """Issue 33, item 7: 12 runs, run k changing its own two keys away from their
    defaults (24 swept keys), and a failed job. The report built one array over every
    combination of the swept keys (2^24 cells per variable): under a 6 GiB cap it died
    with `_ArrayMemoryError` after writing report.csv; uncapped it reached 23.7 GB. Now
    report.nc holds the 13 rows of report.csv, in its order, and the command (run under
    a 2 GiB address-space limit, so that a report that grows fails fast) stays within
    512 MiB and says in one line what it reported."""
    config = yaml.safe_load(netCDF4.Dataset(results).getncattr("config"))
    keys = _scalar_keys(config)[:24]
    sweep = tmp_path / "sweep"
    for run in range(12):
        changed = yaml.safe_load(yaml.safe_dump(config))
        for key in keys[2 * run: 2 * run + 2]:
            *parents, last = key.split(".")
            node = changed
            for parent in parents:
                node = node[parent]
            node[last] = _changed(node[last])
        copy_with_config(results, sweep / str(run) / "results.nc", yaml.safe_dump(changed, sort_keys=True))
    failed = sweep / "12"
    (failed / ".hydra").mkdir(parents=True)
    (failed / ".hydra" / "overrides.yaml").write_text(f"- {keys[0]}={_changed(config[keys[0]])}\n".lower())
    (failed / "error.txt").write_text("the state became non-finite at t = 0.5.\n")

    # The command's peak resident memory, measured in a process of its own that starts it.
    wrapper = ("import resource, subprocess, sys\n"
               "resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))\n"
               "done = subprocess.run(sys.argv[1:], timeout=120)\n"
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)\n"
               "sys.exit(done.returncode)\n")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("HYDRA_FULL_ERROR", None)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", wrapper, str(ATTNFLOW), "report", str(sweep)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=180)
    seconds = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    *said, peak = proc.stdout.splitlines()
    assert int(peak) < 512 * MiB, f"{int(peak) / MiB:.0f} MiB"
    assert seconds < 60, seconds
    assert said[-1] == (f"attnflow: reported 12 runs in 13 rows (12 runs x 1 beta, 1 failed job; swept keys "
                        f"{', '.join(sorted(keys)[:6])} and 18 more)"), said

    table = pd.read_csv(sweep / "report.csv", keep_default_na=False, na_values=[""])
    with xr.open_dataset(sweep / "report.nc") as report:
        report.load()
    assert report.sizes == {"row": 13} and len(table) == 13
    assert list(report["run"].values) == [str(run) for run in range(13)] == [str(run) for run in table["run"]]
    assert report.attrs["swept_keys"] == ", ".join(sorted(keys))
    # Each run's row holds its own two keys changed and the others at their defaults.
    for run in range(12):
        row = report.isel(row=run)
        for key in keys:
            stored = row[key.replace(".", "_")].item()
            value = config
            for part in key.split("."):
                value = value[part]
            expected = _changed(value) if key in keys[2 * run: 2 * run + 2] else value
            expected = str(expected).lower() if isinstance(expected, bool) else expected
            assert stored == expected, (run, key, stored, expected)
        np.testing.assert_allclose(row["energy_mean"].item(), table["energy_mean"][run])
    with xr.open_dataset(results) as ds:
        np.testing.assert_allclose(report["energy_mean"].values[:12],
                                   float(ds["energy"].isel(time=-1).mean("member")), rtol=1e-6)
    # The failed job: its override known, its numbers NaN, its note naming it.
    job = report.isel(row=12)
    assert job["note"].item() == "job 12 failed: the state became non-finite at t = 0.5."
    assert np.isnan(job["energy_mean"].item()) and table["note"][12] == job["note"].item()
    assert (report["note"][:12] == "").all()


def test_an_alias_bomb_in_a_results_config_is_one_sentence_for_report_and_plot(results, tmp_path, command):
    """Issue 33, item 8: a results.nc whose config is a YAML alias bomb (387 million
    entries once expanded): `attnflow report` ran 44 s and died with MemoryError at 2.8
    GiB, `attnflow plot` drew it. Now both exit 2 with one sentence naming the file, at
    once."""
    bomb = copy_with_config(results, tmp_path / "sweep" / "0" / "results.nc", BOMB)
    copy_with_config(results, tmp_path / "sweep" / "1" / "results.nc", netCDF4.Dataset(results).getncattr("config"))
    for name, target in (("report", bomb.parent.parent), ("plot", bomb)):
        start = time.perf_counter()
        line = one_error_line(*command(name, str(target)))
        assert time.perf_counter() - start < 5, name
        assert line == (f"attnflow: error: {bomb} holds a config that expands beyond {_store.CONFIG_ENTRIES} "
                        "entries (a YAML alias bomb?); it is not attnflow's."), line
    assert not list((tmp_path / "sweep").glob("report.*")) and not list((tmp_path / "sweep").rglob("*.png"))


def test_a_failed_jobs_files_that_are_not_attnflows_are_read_with_bounded_work(results, tmp_path, command):
    """A failed job's `.hydra/overrides.yaml` holding an alias bomb (the report expanded
    it, printing each override as text) and its `error.txt` of 100 MB (read whole into
    the note): its row is reported without overrides and with the first 4 KiB of its
    error; a finished run whose own overrides.yaml is a bomb is reported as usual."""
    sweep = tmp_path / "sweep"
    copy_with_config(results, sweep / "0" / "results.nc", netCDF4.Dataset(results).getncattr("config"))
    (sweep / "0" / ".hydra").mkdir()
    (sweep / "0" / ".hydra" / "overrides.yaml").write_text(BOMB)
    job = sweep / "1"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {line.split(': ', 1)[1]}\n"
                                                           for line in BOMB.splitlines()))  # a list of them
    with open(job / "error.txt", "wb") as file:
        file.write(b"the state became non-finite. " * 1000)
        file.truncate(100 * MiB)  # (sparse: no disk is spent on it)
    start = time.perf_counter()
    code, lines = command("report", str(sweep))
    assert code == 0 and time.perf_counter() - start < 10, lines
    assert command.stdout.splitlines()[-1] == "attnflow: reported 1 run in 2 rows (1 run x 1 beta, 1 failed job; " \
                                              "nothing swept)"
    with xr.open_dataset(sweep / "report.nc") as report:
        note = report["note"].values[1]
    assert note.startswith("job 1 failed: the state became non-finite. the state") and note.endswith(" ...")
    assert len(note) < 4200
