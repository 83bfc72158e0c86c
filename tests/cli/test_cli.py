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

from commands import (  # noqa: F401 (command: a fixture)
    ATTNFLOW,
    assert_nothing_written,
    assert_ok,
    assert_one_error_line,
    attnflow,
    command,
    load,
)

SMALL = ["n=8", "d=3", "beta=[0.5,2]", "members=4", "t1=2", "dt=0.1", "saves=5"]


def test_run_writes_results_then_skips_refuses_and_overwrites(tmp_path):
    out = tmp_path / "run"
    results = out / "results.nc"

    # (a) A small run writes results.nc and summary.png, with the user's umask (022 here,
    # 077 in test_a_run_directory_in_use_is_refused_and_a_refused_run_leaves_the_record_alone).
    first = attnflow(*SMALL, "plot=true", f"hydra.run.dir={out}", cwd=tmp_path, umask=0o022)
    assert_ok(first)
    for path in (results, out / ".hydra" / "config.yaml"):
        assert path.stat().st_mode & 0o777 == 0o644, path
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

    # A different config in the same folder is refused without touching the file...
    content = results.read_bytes()
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

    # (e) A run asked for again in the same folder skips, says so, and leaves the file
    # alone. `overwrite` and `plot` say what to do with the output, not which run it is:
    # the run written with overwrite=true and plot=false, asked for again without
    # overwrite and with the default plot=true (say, to resume a sweep), is the same run
    # and is skipped rather than refused. (One run for both: the same command repeated
    # differs from this one only in leaving out the output options.)
    stamp, content = results.stat().st_mtime_ns, results.read_bytes()
    repeat = attnflow(*SMALL, "save_states=true", f"hydra.run.dir={out}", cwd=tmp_path)
    assert_ok(repeat)
    assert "skip" in repeat.stdout.lower(), repeat.stdout
    assert results.stat().st_mtime_ns == stamp and results.read_bytes() == content


# One case per stage at which a refusal is raised: Hydra's parser of the command line,
# the composition of the config groups, the validation of a value, the memory check.
# These run the console script: exit 2, one line, no traceback, nothing written. The
# config-group case runs `python -m attnflow.cli` instead (the module has its `if
# __name__ == "__main__"` block): its refusal names the options of the packaged config
# group `init`, so the module entry composes the same configs as the console script.
@pytest.mark.parametrize(
    "args, says, module",
    [
        pytest.param(["causal=maybe"], "causal must be true or false, got 'maybe'", False, id="not-a-boolean"),
        pytest.param(["init=foo"], "unknown init 'foo'; choose one of caps", True, id="unknown-group-option-module"),
        pytest.param(["beta=[1,"], "cannot parse the command line", False, id="syntax"),
        pytest.param(["n=40000", "members=100000", "attention_block=0"], "GiB", False, id="does-not-fit-in-memory"),
    ],
)
def test_bad_input_prints_one_error_line_and_writes_nothing(tmp_path, args, says, module):
    out = tmp_path / "run"
    proc = attnflow(*args, f"hydra.run.dir={out}", cwd=tmp_path, module=module)
    line = assert_one_error_line(proc)
    assert proc.returncode == 2
    assert says in line, line
    assert_nothing_written(tmp_path)
    assert not list(tmp_path.rglob("*.nc")) and not list(tmp_path.rglob(".hydra"))
    assert not out.exists()  # no empty folder either


# The other refusals, with the same assertions, through `attnflow.cli.main` in this
# process (the subprocess cases above show what the process does with such a refusal).
@pytest.mark.parametrize(
    "args, says",
    [
        pytest.param(["n=0"], "n must", id="n=0"),
        pytest.param(["solver=foo"], "solver", id="unknown-solver"),
        pytest.param(["init=orthonormal", "n=5", "d=3"], "orthonormal", id="orthonormal-n>d"),
        pytest.param(["dt=-0.1"], "dt", id="negative-dt"),
        pytest.param(["dt=100"], "longer than t1 - t0", id="dt-longer-than-the-run"),
        pytest.param(["dt=0.7"], "does not divide", id="dt-does-not-divide"),
        pytest.param(["mlp.activation=relu"], "does not apply with mlp.enabled=false", id="key-does-not-apply"),
        pytest.param(["betta=1"], "unknown config key betta", id="typo"),
        pytest.param(["init=caps", "init.kk=3"], "init (caps) takes kind, k, radius, centres", id="typo-in-group"),
        pytest.param(["t1=${foo}"], "t1 holds an interpolation that cannot be resolved", id="interpolation"),
    ],
)
def test_bad_input_is_one_error_line_in_process(command, tmp_path, args, says):
    out = tmp_path / "run"
    code, lines = command(*args, f"hydra.run.dir={out}")
    assert code == 2 and len(lines) == 1 and lines[0].startswith("attnflow: error: "), (code, lines)
    assert says in lines[0], lines[0]
    assert_nothing_written(tmp_path)
    assert not list(tmp_path.rglob("*.nc")) and not list(tmp_path.rglob(".hydra"))
    assert not out.exists()  # no empty folder either


def test_non_finite_run_fails_and_keeps_what_was_computed_apart(tmp_path):
    # (d) USA at beta = 200 overflows exp in float32: the run is an error, no results.nc
    # is written, and the statistics computed so far go to incomplete.nc.
    out = tmp_path / "run"
    proc = attnflow("attention_kind=usa", "beta=200", "dtype=float32", "n=4", "d=3", "members=2", "t1=0.5", "dt=0.1",
                    "saves=6", f"hydra.run.dir={out}", cwd=tmp_path)
    line = assert_one_error_line(proc)
    assert "non-finite" in line and "incomplete.nc" in line, line
    assert_nothing_written(tmp_path)
    kept = load(out / "incomplete.nc")
    assert np.isfinite(kept["log_energy"].values[..., 0]).all()  # t = 0 was fine
    assert not np.isfinite(kept["log_energy"].values[..., -1]).all()


def test_multirun_writes_one_result_per_job_and_resumes(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "beta=0.5,-1,1", f"hydra.sweep.dir={sweep}", "n=4", "d=3", "members=2", "t1=1", "dt=0.1",
            "saves=3", "plot=false"]
    proc = attnflow(*args, cwd=tmp_path)
    # One bad job does not stop the others: every job runs, the failure is reported with
    # its job and recorded in its folder, and the sweep exits non-zero.
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert errors[0].startswith("attnflow: error: job 1 (beta=-1") and "every beta must be positive" in errors[0]
    assert errors[-1].startswith("attnflow: error: 1 of 3 jobs failed: job 1 (beta=-1")
    assert "every beta must be positive" in (sweep / "1" / "error.txt").read_text()
    for job, beta in (("0", 0.5), ("2", 1.0)):
        ds = load(sweep / job / "results.nc")
        assert "beta" not in ds.dims  # a scalar beta per job
        assert ds["energy"].dims == ("member", "time")
        assert yaml.safe_load(ds.attrs["config"])["beta"] == beta

    # An interrupted sweep (job 2 never finished) resumes: job 0 is skipped, job 2 redone.
    kept = (sweep / "0" / "results.nc").read_bytes()
    (sweep / "2" / "results.nc").unlink()
    resumed = attnflow(*args, cwd=tmp_path)
    assert resumed.returncode == 2
    assert "skip" in resumed.stdout.lower(), resumed.stdout
    assert (sweep / "0" / "results.nc").read_bytes() == kept
    assert yaml.safe_load(load(sweep / "2" / "results.nc").attrs["config"])["beta"] == 1.0
    assert not list(sweep.rglob("*.tmp"))


def test_the_summary_plot_draws_whatever_was_recorded(tmp_path):
    """Valid metric choices that used to crash the plot after results.nc was written."""
    sweep = tmp_path / "sweep"
    proc = attnflow("-m", "metrics=[energy],[],[attention]", f"hydra.sweep.dir={sweep}", "n=4", "d=3", "members=2",
                    "beta=1", "t1=0.5", "dt=0.1", "saves=3", "save_states=true", cwd=tmp_path)
    assert_ok(proc)
    for job in ("0", "1", "2"):
        assert (sweep / job / "results.nc").exists()
        assert (sweep / job / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_sweep_asked_for_by_hydra_mode_is_a_sweep(tmp_path):
    """The command line reads a run's mode from its flags (`-m`) without composing the
    config for it, unless an override names `hydra.mode`: then Hydra's own reading."""
    sweep = tmp_path / "sweep"
    proc = attnflow("hydra.mode=MULTIRUN", "seed=1,2", f"hydra.sweep.dir={sweep}", "n=4", "d=3", "members=2",
                    "beta=1", "t1=0.2", "dt=0.1", "saves=2", "plot=false", cwd=tmp_path)
    assert_ok(proc)
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1"]


# --- one pipeline: a study is the experiment of one panel ----------------------------------


def test_a_study_and_an_experiment_are_run_and_redrawn_by_the_same_functions(command, monkeypatch, tmp_path):
    """The command line checks, plans, solves and draws a study (`attnflow KEY=VALUE`)
    and an experiment through the same functions of `attnflow.experiments`, and
    `attnflow plot` redraws both with one call: the study's summary.png with the title the
    run gave it."""
    import attnflow.experiments as experiments
    from attnflow.presentation._plots import plot_summary

    calls = []

    def recorded(name):
        real = getattr(experiments, name)

        def record(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)

        return record

    for name in ("check_experiment", "plan_checked", "solve_experiment", "draw_experiment"):
        monkeypatch.setattr(experiments, name, recorded(name))
    small = ["n=4", "members=2", "t1=0.5", "dt=0.1", "saves=3", "compilation_cache=false"]
    study, experiment = tmp_path / "study", tmp_path / "experiment"
    assert command(*small, "d=3", "beta=1", f"hydra.run.dir={study}")[0] == 0
    assert command("experiment=phase_diagram", *small, "d=[2,3]", "beta=[1.0]", f"hydra.run.dir={experiment}")[0] == 0
    assert calls == ["check_experiment", "plan_checked", "solve_experiment", "draw_experiment"] * 2
    # The study's results are the study's own: no experiment's attributes.
    assert not {"experiment", "panel_configs"} & set(load(study / "results.nc").attrs)
    assert load(study / "results.nc").attrs["title"].startswith("attnflow study: SA dynamics")
    assert sorted(p.name for p in study.glob("*.png")) == ["summary.png"]
    assert sorted(p.name for p in experiment.glob("*.p*")) == ["phase_diagram.pdf", "phase_diagram.png"]
    drawn = (study / "summary.png").read_bytes()
    calls.clear()
    (study / "summary.png").unlink()
    (experiment / "phase_diagram.png").unlink()
    assert command("plot", str(study), str(experiment))[0] == 0
    assert calls == ["draw_experiment"] * 2
    assert (study / "summary.png").read_bytes() == drawn and (experiment / "phase_diagram.png").is_file()
    # The run's own title (its system and solver), on the run's and on the redrawn figure.
    title = "SA on scheme=sphere, n=4, d=3, 2 members, euler_renorm dt=0.1"
    assert plot_summary(load(study / "results.nc"), tmp_path / "titled.png", title=title).read_bytes() == drawn
    (summary,) = experiments.experiment_figures(load(study / "results.nc")).values()
    assert summary.get_suptitle() == title


def test_plot_draws_a_studys_summary_without_loading_jax(tmp_path):
    """`attnflow plot` of a study reads and draws its results.nc without importing JAX
    (the experiments package loads the module that draws on first use)."""
    import attnflow as af

    af.write_results(af.run({"n": 4, "d": 3, "members": 2, "beta": 1.0, "t1": 0.5, "dt": 0.1, "saves": 2}),
                     tmp_path / "results.nc")
    code = ("import sys; from attnflow.cli import _command; code = _command('plot', [sys.argv[1]]); "
            "assert code == 0; print(sorted(m for m in ('jax', 'jaxlib', 'diffrax') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]", done.stdout
    assert (tmp_path / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- where the results go: checked and locked before any computing ----------------------


TINY = ["n=4", "d=3", "members=2", "beta=1", "t1=0.5", "dt=0.1", "saves=2", "plot=false"]


def test_the_output_location_is_checked_before_computing(tmp_path, command):
    # The refusals of the location through `attnflow.cli.main` in this process: exit 2
    # and one line (what the process does with such a refusal, the console script's one
    # line, is in test_a_run_directory_in_use_is_refused_and_a_refused_run_leaves_the_record_alone).
    def refused(*args: str) -> str:
        code, lines = command(*TINY, *args)
        assert code == 2 and len(lines) == 1 and lines[0].startswith("attnflow: error: "), (code, lines)
        return lines[0]

    # results.nc is a folder
    folder = tmp_path / "folder"
    (folder / "results.nc").mkdir(parents=True)
    line = refused(f"hydra.run.dir={folder}")
    assert "is a directory" in line, line
    # A corrupt results.nc is named as such (not "a different run") and left alone...
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "results.nc").write_bytes(b"not a netcdf file")
    line = refused(f"hydra.run.dir={corrupt}")
    assert "not a readable NetCDF file" in line and "overwrite=true" in line, line
    assert (corrupt / "results.nc").read_bytes() == b"not a netcdf file"
    # a run directory that cannot be written to
    if os.geteuid() == 0:
        readonly = Path("/proc/sys")  # root writes anywhere but here
    else:
        readonly = tmp_path / "readonly"
        readonly.mkdir()
        readonly.chmod(0o555)
    line = refused(f"hydra.run.dir={readonly}")
    assert "cannot write in the run directory" in line, line
    # a run directory below a file
    (tmp_path / "plain").write_text("")
    line = refused(f"hydra.run.dir={tmp_path / 'plain' / 'run'}")
    assert "plain" in line, line
    # ...and the corrupt results.nc is replaced with overwrite=true (the console script;
    # the same run shows that compilation_cache=false writes nothing into the cache
    # folder: see compiled_programs_are_cached_across_runs, part of
    # test_a_run_directory_in_use_is_refused_and_a_refused_run_leaves_the_record_alone)
    off = tmp_path / "off"
    assert_ok(attnflow(*TINY, "overwrite=true", "compilation_cache=false", f"hydra.run.dir={corrupt}", cwd=tmp_path,
                       env={"ATTNFLOW_CACHE_DIR": str(off)}))
    assert load(corrupt / "results.nc")["energy"].shape == (2, 2)
    assert not off.exists() or not list(off.iterdir())


def test_a_run_directory_in_use_is_refused_and_a_refused_run_leaves_the_record_alone(tmp_path, command):
    import fcntl

    out = tmp_path / "run"
    cache = tmp_path / "cache"
    # Files are created with the user's umask: 077 gives 600 (and 022 gives 644: the first
    # run of test_run_writes_results_then_skips_refuses_and_overwrites). The same run fills
    # the compiled-program cache of the test below.
    assert_ok(attnflow(*TINY, f"hydra.run.dir={out}", cwd=tmp_path, umask=0o077,
                       env={"ATTNFLOW_CACHE_DIR": str(cache)}))
    for path in (out / "results.nc", out / ".hydra" / "config.yaml"):
        assert path.stat().st_mode & 0o777 == 0o600, path
    record = {p.name: p.read_bytes() for p in (out / ".hydra").iterdir()}
    results = (out / "results.nc").read_bytes()
    # another run holds the folder: refused at once (not allowed to replace its results)
    fd = os.open(out, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        line = assert_one_error_line(attnflow(*TINY, "overwrite=true", f"hydra.run.dir={out}", cwd=tmp_path))
        assert "another attnflow run is working in" in line, line
    finally:
        os.close(fd)
    # a different run is refused, and neither the results nor .hydra/ are touched (in this
    # process: the console script's refusal of a different run is in
    # test_run_writes_results_then_skips_refuses_and_overwrites)
    code, lines = command(*TINY, "seed=3", f"hydra.run.dir={out}")
    assert code == 2 and len(lines) == 1 and lines[0].startswith("attnflow: error: "), (code, lines)
    assert "holds a different run" in lines[0], lines[0]
    assert (out / "results.nc").read_bytes() == results
    assert {p.name: p.read_bytes() for p in (out / ".hydra").iterdir()} == record
    compiled_programs_are_cached_across_runs(tmp_path, cache)


# --- interrupting a run -------------------------------------------------------------------


# Eight pieces of 128 members (one CPU device: a piece is one chunk), each a few tenths
# of a second: the run is interrupted once two are written, with the others still to come.
LONG = ["n=32", "d=16", "members=1024", "beta=1", "t1=20", "dt=0.1", "saves=5", "chunk_size=128", "plot=false",
        "metrics=[energy]", "cpu_devices=1"]


def test_ctrl_c_stops_at_once_keeps_finished_pieces_and_the_run_resumes(tmp_path, ctrl_c):
    import signal
    import time

    out = tmp_path / "run"
    pieces = out / ".attnflow-pieces"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.Popen([str(ATTNFLOW), *LONG, f"hydra.run.dir={out}"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(list(pieces.glob("piece-*.npz"))) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    start = time.monotonic()
    _, stderr = proc.communicate(timeout=60)
    assert time.monotonic() - start < 5, "Ctrl-C did not stop the run within seconds"
    assert proc.returncode == 130
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("attnflow: interrupted;") and "resumes" in lines[0], stderr
    assert f"the same command with hydra.run.dir={out} resumes" in lines[0], stderr
    assert "Traceback" not in stderr
    kept = len(list(pieces.glob("piece-*.npz")))
    assert kept >= 2 and not (out / "results.nc").exists()
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]

    resumed = attnflow(*LONG, f"hydra.run.dir={out}", cwd=tmp_path)
    assert_ok(resumed)
    assert f"resuming from {kept} of 8 finished pieces" in resumed.stdout, resumed.stdout
    assert not pieces.exists()
    import attnflow as af

    clean = af.run({"n": 32, "d": 16, "members": 1024, "beta": 1.0, "t1": 20.0, "dt": 0.1, "saves": 5,
                    "chunk_size": 128, "metrics": ["energy"]})
    np.testing.assert_array_equal(load(out / "results.nc")["energy"].values, clean["energy"].values)


# --- start-up -------------------------------------------------------------------------------


def compiled_programs_are_cached_across_runs(tmp_path, cache):
    """(Part of the test above, whose first run filled `cache`: one start-up fewer.)"""
    entries = sorted(p.name for p in cache.iterdir())
    assert entries
    # the same structure with another beta compiles nothing new
    again = attnflow(*[a if not a.startswith("beta=") else "beta=3" for a in TINY], f"hydra.run.dir={tmp_path / 'b'}",
                     cwd=tmp_path,
                     env={"ATTNFLOW_CACHE_DIR": str(cache)})
    assert_ok(again)
    assert sorted(p.name for p in cache.iterdir()) == entries
    # compilation_cache=false writes nothing there: the console script's run with an empty
    # cache folder that replaces the corrupt results.nc in
    # test_the_output_location_is_checked_before_computing.
