"""The `attnflow` command, run as a subprocess the way a researcher runs it.

What it must do (DESIGN.md section 5, STYLE.md rule 11): write `results.nc` (an xarray
Dataset with the resolved config in its attributes) and `summary.png`; on bad input print
one `attnflow: error: ...` line, no traceback, exit non-zero and leave nothing
half-written; never overwrite a finished result silently; resume a sweep without
recomputing finished jobs. Each subprocess pays a few seconds of JAX import and
compilation, so the checks are grouped into few runs with tiny sizes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml

# The console script installed next to this interpreter (pip puts both in the same bin/).
ATTNFLOW = Path(sys.executable).with_name("attnflow")
if not ATTNFLOW.exists():
    ATTNFLOW = Path(shutil.which("attnflow") or ATTNFLOW)

SMALL = ["n=8", "d=3", "beta=[0.5,2]", "members=4", "t1=2", "dt=0.1", "saves=5"]


def attnflow(*args: str, cwd: Path, module: bool = False) -> subprocess.CompletedProcess:
    """Run the command (the console script, or `python -m attnflow.cli`) on the CPU."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("HYDRA_FULL_ERROR", None)  # it would turn the one-line error into a traceback
    command = [sys.executable, "-m", "attnflow.cli"] if module else [str(ATTNFLOW)]
    assert module or ATTNFLOW.exists(), f"the attnflow console script is not installed next to {sys.executable}"
    return subprocess.run(command + list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def load(path: Path) -> xr.Dataset:
    with xr.open_dataset(path, engine="netcdf4") as ds:
        return ds.load()


def assert_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"


def assert_one_error_line(proc: subprocess.CompletedProcess) -> str:
    """Non-zero exit, stderr is exactly one `attnflow: error: ...` line, no traceback."""
    assert proc.returncode != 0, f"expected failure\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("attnflow: error: "), proc.stderr
    return lines[0]


def assert_nothing_written(folder: Path) -> None:
    leftovers = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.name == "results.nc"
                       or p.suffix == ".tmp" or p.name == "summary.png")
    assert leftovers == [], leftovers


def test_run_writes_results_then_skips_refuses_and_overwrites(tmp_path):
    out = tmp_path / "run"
    results = out / "results.nc"

    # (a) A small run writes results.nc and summary.png.
    first = attnflow(*SMALL, "plot=true", f"hydra.run.dir={out}", cwd=tmp_path)
    assert_ok(first)
    ds = load(results)
    assert dict(ds.sizes) == {"beta": 2, "member": 4, "time": 5}
    assert ds["beta"].values.tolist() == [0.5, 2.0]
    np.testing.assert_allclose(ds["time"].values, np.linspace(0.0, 2.0, 5), rtol=1e-6)
    for name in ("energy", "pair_density", "clusters"):
        assert ds[name].dims == ("beta", "member", "time"), name
        assert np.isfinite(ds[name].values).all(), name
    assert ((ds["pair_density"] >= 0) & (ds["pair_density"] <= 1)).all()
    assert ((ds["clusters"] >= 1) & (ds["clusters"] <= 8)).all()
    assert "x" not in ds  # states only with save_states=true
    config = yaml.safe_load(ds.attrs["config"])
    assert config["n"] == 8 and config["d"] == 3 and config["members"] == 4
    assert config["beta"] == [0.5, 2.0] and config["saves"] == 5
    # (g) The figure is a real PNG.
    assert (out / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.rglob("*.tmp"))

    # (e) The same command in the same folder skips, says so, and leaves the file alone.
    stamp, content = results.stat().st_mtime_ns, results.read_bytes()
    again = attnflow(*SMALL, "plot=true", f"hydra.run.dir={out}", cwd=tmp_path)
    assert_ok(again)
    assert "skip" in again.stdout.lower(), again.stdout
    assert results.stat().st_mtime_ns == stamp and results.read_bytes() == content

    # A different config in the same folder is refused without touching the file...
    other = attnflow(*SMALL, "plot=true", "save_states=true", f"hydra.run.dir={out}", cwd=tmp_path)
    line = assert_one_error_line(other)
    assert "overwrite" in line, line
    assert results.read_bytes() == content

    # ...unless overwrite=true; (b) save_states=true adds the states x.
    forced = attnflow(*SMALL, "plot=false", "save_states=true", "overwrite=true", f"hydra.run.dir={out}",
                      cwd=tmp_path)
    assert_ok(forced)
    ds = load(results)
    assert ds["x"].dims == ("beta", "member", "time", "token", "dim")
    assert ds["x"].shape == (2, 4, 5, 8, 3)
    # On the sphere every saved state has unit rows.
    np.testing.assert_allclose(np.linalg.norm(ds["x"].values, axis=-1), 1.0, atol=1e-5)
    assert yaml.safe_load(ds.attrs["config"])["save_states"] is True
    assert not list(out.rglob("*.tmp"))


def test_overwrite_and_plot_do_not_make_a_different_run(tmp_path):
    # `overwrite` and `plot` say what to do with the output, not which run it is: a run
    # written with overwrite=true, asked for again without it (say, to resume a sweep),
    # is the same run and is skipped rather than refused.
    out = tmp_path / "run"
    tiny = ["n=4", "d=3", "beta=1", "members=2", "t1=0.5", "dt=0.1", "saves=2", f"hydra.run.dir={out}"]
    assert_ok(attnflow(*tiny, "overwrite=true", "plot=false", cwd=tmp_path))
    content = (out / "results.nc").read_bytes()
    repeat = attnflow(*tiny, cwd=tmp_path)
    assert_ok(repeat)
    assert "skip" in repeat.stdout.lower(), repeat.stdout
    assert (out / "results.nc").read_bytes() == content


@pytest.mark.parametrize(
    "args, says",
    [
        pytest.param(["n=0"], "n must", id="n=0"),
        pytest.param(["solver=foo"], "solver", id="unknown-solver"),
        pytest.param(["init=orthonormal", "n=5", "d=3"], "orthonormal", id="orthonormal-n>d"),
        pytest.param(["dt=-0.1"], "dt", id="negative-dt"),
    ],
)
def test_bad_input_prints_one_error_line_and_writes_nothing(tmp_path, args, says):
    out = tmp_path / "run"
    proc = attnflow(*args, f"hydra.run.dir={out}", cwd=tmp_path)
    line = assert_one_error_line(proc)
    assert says in line, line
    assert_nothing_written(tmp_path)
    assert not list(tmp_path.rglob("*.nc"))


def test_non_finite_run_fails_and_keeps_what_was_computed_apart(tmp_path):
    # (d) USA at beta = 200 overflows exp in float32: the run is an error, no results.nc
    # is written, and the statistics computed so far go to incomplete.nc.
    out = tmp_path / "run"
    proc = attnflow("dynamics=usa", "beta=200", "dtype=float32", "n=4", "d=3", "members=2", "t1=0.5", "dt=0.1",
                    "saves=6", f"hydra.run.dir={out}", cwd=tmp_path)
    line = assert_one_error_line(proc)
    assert "non-finite" in line and "incomplete.nc" in line, line
    assert_nothing_written(tmp_path)
    kept = load(out / "incomplete.nc")
    assert np.isfinite(kept["log_energy"].values[..., 0]).all()  # t = 0 was fine
    assert not np.isfinite(kept["log_energy"].values[..., -1]).all()


def test_module_entry_point_finds_its_config(tmp_path):
    # `python -m attnflow.cli` (the module has its `if __name__ == "__main__"` block) must
    # compose the same configs as the console script.
    proc = attnflow("n=0", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, module=True)
    line = assert_one_error_line(proc)
    assert "n must" in line, line


def test_multirun_writes_one_result_per_job_and_resumes(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "beta=0.5,1", f"hydra.sweep.dir={sweep}", "n=4", "d=3", "members=2", "t1=1", "dt=0.1",
            "saves=3", "plot=false"]
    assert_ok(attnflow(*args, cwd=tmp_path))
    for job, beta in (("0", 0.5), ("1", 1.0)):
        ds = load(sweep / job / "results.nc")
        assert "beta" not in ds.dims  # a scalar beta per job
        assert ds["energy"].dims == ("member", "time")
        assert yaml.safe_load(ds.attrs["config"])["beta"] == beta

    # An interrupted sweep (job 1 never finished) resumes: job 0 is skipped, job 1 redone.
    kept = (sweep / "0" / "results.nc").read_bytes()
    (sweep / "1" / "results.nc").unlink()
    resumed = attnflow(*args, cwd=tmp_path)
    assert_ok(resumed)
    assert "skip" in resumed.stdout.lower(), resumed.stdout
    assert (sweep / "0" / "results.nc").read_bytes() == kept
    assert yaml.safe_load(load(sweep / "1" / "results.nc").attrs["config"])["beta"] == 1.0
    assert not list(sweep.rglob("*.tmp"))
