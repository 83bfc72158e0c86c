"""The newest features against a hostile user (issue 33): noise and its schedule, Sinkhorn
and hardmax attention, the mean-field experiment, the compilation cache on an ordinary
cluster node, the Python API and `attnflow train`.

Every case is one row of tests/README.md, section 17.5. Refusals are checked through the
command in this process (`command`, one line and exit 2, no traceback); the cache cases
run the command in a subprocess with the environment of the case (a read-only home, a
cache folder that is a file, truncated entries)."""

from __future__ import annotations

import os
import shutil
import subprocess

import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr
from commands import ATTNFLOW, command, load  # noqa: F401 (command: a fixture)

import attnflow as af
import attnflow.cli as cli_module
from attnflow.running._build import non_finite_advice, validate_config
from attnflow.schema._errors import ConfigError, RunNote, SolverFailure
from attnflow.numerics._geometry import Euclidean
from attnflow.numerics._noise import brownian_noise, tree_depth
from attnflow.analysis import meanfield
from attnflow.experiments import meanfield_circle

S = ["n=4", "d=3", "members=2", "t1=0.5", "dt=0.1", "saves=3", "beta=1", "plot=false"]
S_CONFIG = {"n": 4, "d": 3, "members": 2, "t1": 0.5, "dt": 0.1, "saves": 3, "beta": 1.0}
MF = ["experiment=meanfield_circle", "experiment.options.n=[8,16]", "experiment.options.members=2",
      "experiment.options.times=[0,0.25]", "experiment.options.grid=64", "plot=false"]


def refused(result: tuple[int, list[str]], *says: str) -> str:
    """Exit 2 with one `attnflow: error:` line saying each of `says`."""
    code, lines = result
    assert code == 2 and len(lines) == 1 and lines[0].startswith("attnflow: error: "), (code, lines)
    for part in says:
        assert part in lines[0], lines[0]
    return lines[0]


# --- 1. a Brownian tree coarser than the step ---------------------------------------------


def quadratic_variation(depth: int, steps: int = 64, tokens: int = 64) -> float:
    """The quadratic variation over [0, 1] of the increments of the step, per component:
    1 for Brownian motion, whatever the step."""
    noise = brownian_noise(jax.random.key(0), 1.0, (tokens, 3), t0=0.0, t1=1.0, kind="ambient", depth=depth,
                           dtype=jnp.float64)
    h = 1.0 / steps
    x = jnp.zeros((tokens, 3))
    increments = jnp.stack([noise.increment(Euclidean(), k * h, h, x) for k in range(steps)])
    return float(jnp.sum(increments**2) / (tokens * 3))


def test_a_brownian_tree_coarser_than_the_step_is_refused_naming_the_least_depth(command):
    # The failure it guards: a tree of depth 1 under steps of 1/64 gives a smooth path whose
    # quadratic variation is about 0.12 (the 0.123), against 1 at the least depth
    # that resolves dt (64 x 3 x 64 squared increments: standard deviation of the mean 0.02).
    assert tree_depth(0.0, 1.0, 1 / 64) == 6
    assert quadratic_variation(6) == pytest.approx(1.0, abs=0.1)
    assert quadratic_variation(1) < 0.3
    line = refused(command("n=4", "d=3", "members=2", "saves=3", "plot=false", "attention=false", "scheme=none",
                           "noise.sigma=1", "noise.depth=1", "dt=0.015625", "t1=1"),
                   "noise.depth=1", "dt=0.015625", "noise.depth >= 6")
    assert "null" in line
    # The least depth itself, and any deeper one, is accepted.
    validate_config({**S_CONFIG, "t1": 1.0, "dt": 1 / 64, "noise": {"sigma": 1.0, "depth": 6}})


# --- 4. hardmax does not read beta ---------------------------------------------------------


def test_hardmax_refuses_a_list_of_betas_that_nothing_reads(command):
    refused(command(*S[:-2], "plot=false", "attention_kind=hardmax", "beta=[1,100]", "metrics=[clusters,order_parameter]"),
            "attention_kind=hardmax", "beta=[1.0, 100.0]", "energy or log_energy")
    # With the energy recorded, beta is read: the betas solve the same flow (equal cluster
    # counts and order parameters, the states never depend on beta) and differ in the energy.
    ds = af.run({**S_CONFIG, "beta": [1.0, 100.0], "attention_kind": "hardmax",
                 "metrics": ["energy", "clusters", "order_parameter"]})
    np.testing.assert_array_equal(ds["clusters"].sel(beta=1.0), ds["clusters"].sel(beta=100.0))
    np.testing.assert_array_equal(ds["order_parameter"].sel(beta=1.0), ds["order_parameter"].sel(beta=100.0))
    assert not np.allclose(ds["energy"].sel(beta=1.0), ds["energy"].sel(beta=100.0))


# --- 5. the Sinkhorn tolerance is checked in every run ---------------------------------------


def sinkhorn_run(**settings):
    config = {**S_CONFIG, "n": 16, "beta": 4.0, "attention_kind": "sinkhorn", "sinkhorn": settings.pop("sinkhorn")}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RunNote)
        ds = af.run({**config, **settings})
    return ds, [str(w.message) for w in caught if issubclass(w.category, RunNote)]


def test_a_missed_sinkhorn_tolerance_is_said_and_stored_with_the_default_metrics():
    ds, notes = sinkhorn_run(sinkhorn={"iterations": 1, "tol": 1e-9})
    assert "marginal_error" not in ds  # recorded for the check, not kept: the config did not ask for it
    assert ds.attrs["sinkhorn_within_tol"] == 0
    assert 1e-3 < ds.attrs["sinkhorn_marginal_error"] < 1  # one alternation leaves the columns off (0.076)
    assert len(notes) == 1 and "sinkhorn.tol=1e-09" in notes[0] and "sinkhorn.iterations=1" in notes[0]
    assert ds.attrs["notes"] == notes[0]
    # Enough alternations reach the tolerance: nothing said.
    ds, notes = sinkhorn_run(sinkhorn={"iterations": 200, "tol": 1e-2})
    assert ds.attrs["sinkhorn_within_tol"] == 1 and notes == [] and "notes" not in ds.attrs
    # Kept when asked for: the attribute is the metric's own largest value.
    ds, notes = sinkhorn_run(sinkhorn={"iterations": 3, "tol": 1e-9},
                             metrics=["clusters", "marginal_error"])
    assert ds.attrs["sinkhorn_marginal_error"] == pytest.approx(float(ds["marginal_error"].max()))
    assert len(notes) == 1


def test_the_command_says_a_missed_sinkhorn_tolerance_after_writing_the_results(command, tmp_path):
    code, lines = command("n=16", "d=3", "members=2", "t1=0.5", "dt=0.1", "saves=3", "beta=4", "plot=false",
                          "attention_kind=sinkhorn", "sinkhorn.iterations=1", "sinkhorn.tol=1e-9",
                          f"hydra.run.dir={tmp_path / 'run'}")
    assert code == 0
    assert len(lines) == 1 and lines[0].startswith("attnflow: note: Sinkhorn attention missed sinkhorn.tol=1e-09")
    assert load(tmp_path / "run" / "results.nc").attrs["sinkhorn_within_tol"] == 0


# --- 6. a switch outside the run's interval -------------------------------------------------


def test_a_switch_outside_the_interval_is_said_once_and_stored(command, tmp_path):
    code, lines = command(*S, "noise.sigma=0.5", "noise.switch_times=[5]", "noise.factors=[1,0]",
                          f"hydra.run.dir={tmp_path / 'run'}")
    assert code == 0 and len(lines) == 1, lines
    assert lines[0].startswith("attnflow: note: noise.switch_times holds 5, outside the run's interval (t0, t1) "
                               "= (0, 0.5)")
    assert "never switches" in load(tmp_path / "run" / "results.nc").attrs["notes"]
    # The weights' schedules too, and a switch inside the interval says nothing.
    study = af.resolve_study({**S_CONFIG, "weights": {"v": {"switch_times": [0.25, 2.0], "factors": [1, -1, 1]}}})
    assert len(study.notes) == 1 and study.notes[0].startswith("weights.v.switch_times holds 2,")
    assert af.resolve_study({**S_CONFIG, "weights": {"v": {"switch_times": [0.25], "factors": [1, -1]}}}).notes == ()


def test_a_sweep_of_t1_with_a_switch_beyond_the_shorter_runs_still_runs(command, tmp_path):
    sweep = tmp_path / "sweep"
    code, lines = command("-m", "n=4", "d=3", "members=2", "dt=0.1", "saves=3", "beta=1", "plot=false", "t1=0.5,6",
                          "noise.sigma=0.5",
                          "noise.switch_times=[5]", "noise.factors=[1,0]", f"hydra.sweep.dir={sweep}")
    assert code == 0, lines
    assert [line for line in lines if "note:" in line] == [
        "attnflow: note: noise.switch_times holds 5, outside the run's interval (t0, t1) = (0, 0.5), so the run "
        "never switches there and the factors of the pieces it skips are unused."]
    assert "notes" not in load(sweep / "1" / "results.nc").attrs
    assert "notes" in load(sweep / "0" / "results.nc").attrs


# --- 9, 10, 11. the compilation cache on an ordinary cluster node ---------------------------


def bare_run(folder: Path, env: dict, wrap: list[str] | None = None) -> subprocess.CompletedProcess:
    """The command in a subprocess with exactly the cache settings of `env` (neither the
    tests' cache folder nor XDG_CACHE_HOME unless `env` gives them)."""
    environment = {k: v for k, v in os.environ.items() if k not in ("ATTNFLOW_CACHE_DIR", "XDG_CACHE_HOME",
                                                                     "HYDRA_FULL_ERROR")}
    environment.update(JAX_PLATFORMS="cpu", **env)
    command = [str(ATTNFLOW), *S, f"hydra.run.dir={folder}"]
    return subprocess.run((wrap or []) + command, env=environment, capture_output=True, text=True, timeout=300)


def read_only_home(tmp_path: Path) -> tuple[Path, list[str]]:
    """A home folder that cannot be written: a read-only bind mount where this machine
    lets a new mount namespace have one (as root in a container), else a folder under
    /sys, where nothing can be created."""
    home = tmp_path / "home"
    home.mkdir()
    unshare = shutil.which("unshare")
    if unshare:
        mount = f"mount --bind {home} {home} && mount -o remount,bind,ro {home} && exec \"$@\""
        wrap = [unshare, "-m", "sh", "-c", mount, "sh"]
        probe = subprocess.run(wrap + ["sh", "-c", f"touch {home}/x"], capture_output=True, text=True)
        if "Read-only file system" in probe.stderr:
            return home, wrap
    return Path("/sys/attnflow-test-home"), []


def test_a_read_only_home_runs_without_the_cache_and_says_so_in_one_line(tmp_path):
    home, wrap = read_only_home(tmp_path)
    out = tmp_path / "run"
    proc = bare_run(out, {"HOME": str(home)}, wrap)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"attnflow: note: the compilation cache cannot be kept in "
                                                    f"{home}/.cache/attnflow/jax"), proc.stderr
    assert "ATTNFLOW_CACHE_DIR" in lines[0]
    assert (out / "results.nc").is_file() and not (out / ".attnflow-pieces").exists()


def test_a_cache_folder_that_is_a_file_runs_without_the_cache(tmp_path):
    cache = tmp_path / "cache"
    cache.write_text("not a folder")
    out = tmp_path / "run"
    proc = bare_run(out, {"ATTNFLOW_CACHE_DIR": str(cache)})
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "it is a file, not a folder" in lines[0], proc.stderr
    assert cache.read_text() == "not a folder" and (out / "results.nc").is_file()


def test_truncated_cache_entries_are_dropped_and_written_anew(tmp_path):
    cache = tmp_path / "cache"
    first = bare_run(tmp_path / "a", {"ATTNFLOW_CACHE_DIR": str(cache)})
    assert first.returncode == 0, first.stderr
    entries = sorted(cache.glob("*-cache"))
    assert entries
    for entry in entries:
        os.truncate(entry, entry.stat().st_size // 2)
    second = bare_run(tmp_path / "b", {"ATTNFLOW_CACHE_DIR": str(cache)})
    assert second.returncode == 0, second.stderr
    assert "Error reading persistent compilation cache entry" not in second.stderr
    notes = [line for line in second.stderr.splitlines() if line.strip()]
    assert len(notes) == 1 and "a damaged entry of the compilation cache" in notes[0], second.stderr
    # Repaired: the next run reads every entry without a word, and the numbers never changed.
    third = bare_run(tmp_path / "c", {"ATTNFLOW_CACHE_DIR": str(cache)})
    assert third.returncode == 0 and third.stderr.strip() == "", third.stderr
    reference = load(tmp_path / "a" / "results.nc")
    for run in ("b", "c"):
        xr.testing.assert_equal(load(tmp_path / run / "results.nc")["energy"], reference["energy"])


# --- 12, 13, 18. the mean-field experiment ---------------------------------------------------


def test_the_mean_field_experiment_refuses_what_overflows_or_cannot_fit_before_computing(command, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("computed before the refusal")

    monkeypatch.setattr(meanfield, "meanfield_circle", never)
    refused(command(*MF, "experiment.options.kind=usa", "experiment.options.beta=800"),
            "experiment.options.beta=800", "kind=usa", "700")
    line = refused(command(*MF, "experiment.options.beta=1e12"), "experiment.options.beta=1e+12", "GiB")
    assert "available" in line
    monkeypatch.undo()  # the function itself (patched above where the experiment reads it)
    with pytest.raises(ConfigError, match="GiB"):  # the function itself, before it allocates
        af.meanfield_circle(np.ones(64) / (2 * np.pi), [0.0, 0.25], beta=1e12)


def test_a_failed_mean_field_solve_is_one_sentence_keeping_the_finished_pieces(command, monkeypatch, tmp_path):
    def fails(*args, **kwargs):
        raise SolverFailure("the tsit5 solver stopped before t = 0.25 (at most 200000 steps): raise max_steps.")

    monkeypatch.setattr(meanfield, "meanfield_circle", fails)
    line = refused(command(*MF, f"hydra.run.dir={tmp_path / 'run'}"), "the tsit5 solver stopped before t = 0.25")
    assert not (tmp_path / "run" / "results.nc").exists()
    assert line.endswith("raise max_steps.")  # nothing was finished before the PDE: no pieces named


def test_an_interrupted_mean_field_run_keeps_its_finished_parts_and_resumes_from_them(command, monkeypatch,
                                                                                     tmp_path):
    reference = tmp_path / "reference"
    assert command(*MF, f"hydra.run.dir={reference}")[0] == 0
    out = tmp_path / "run"
    particles = meanfield_circle._particles
    solved = []

    def interrupted_at_16(options, n, block, degree=0):
        if n == 16:
            raise KeyboardInterrupt
        solved.append(n)
        return particles(options, n, block, degree)

    monkeypatch.setattr(meanfield_circle, "_particles", interrupted_at_16)
    monkeypatch.setattr(cli_module.os, "_exit", lambda code: (_ for _ in ()).throw(SystemExit(code)))
    code, lines = command(*MF, f"hydra.run.dir={out}")
    assert code == 130 and solved == [8]
    assert lines[-1] == (f"attnflow: interrupted; 2 finished pieces are kept in {out / '.attnflow-pieces'}; the same "
                         f"command with hydra.run.dir={out} resumes from there.")
    # The rerun reads the PDE and n = 8 back (solving them again fails here) and solves n = 16.
    solved.clear()
    monkeypatch.setattr(meanfield_circle, "_particles",
                        lambda options, n, block, degree=0: solved.append(n) or particles(options, n, block, degree))
    monkeypatch.setattr(meanfield, "meanfield_circle",
                        lambda *args, **kwargs: (_ for _ in ()).throw(AssertionError("the PDE solved again")))
    code, lines = command(*MF, f"hydra.run.dir={out}")
    assert code == 0 and solved == [16], lines
    assert "resuming from 2 of 3 finished pieces" in command.stdout
    assert not (out / ".attnflow-pieces").exists()
    resumed, whole = load(out / "results.nc"), load(reference / "results.nc")
    for name in ("w1", "density", "particle_clusters", "angles"):
        xr.testing.assert_equal(resumed[name], whole[name])


# --- 14, 16, 17. sizes and strengths beyond what a run can hold ------------------------------


def test_sinkhorn_iterations_beyond_the_loop_counter_are_refused_leaving_no_folder(command, tmp_path):
    out = tmp_path / "run"
    refused(command(*S, "attention_kind=sinkhorn", "sinkhorn.iterations=3000000000", f"hydra.run.dir={out}"),
            "sinkhorn.iterations=3000000000", "2^31 - 1")
    assert not out.exists()
    refused(command(*S, "init=caps", "init.k=3000000000"), "init.k=3000000000", "init.k <= n")


def test_a_noise_strength_beyond_the_dtype_is_refused_and_no_refused_remedy_is_advised(command):
    refused(command(*S, "noise.sigma=1e39"), "noise.sigma=1e+39", "float32", "dtype=float64")
    refused(command(*S, "noise.sigma=2e19"), "noise.sigma=2e+19")
    validate_config({**S_CONFIG, "noise": {"sigma": 1e18}})  # below sqrt(3.4e38) = 1.8e19
    validate_config({**S_CONFIG, "dtype": "float64", "noise": {"sigma": 1e39}})
    # The advice of a run that turned non-finite names only what its config accepts.
    noisy = non_finite_advice(validate_config({**S_CONFIG, "noise": {"sigma": 0.5}}))
    assert "adaptive" not in noisy and "noise.sigma" in noisy
    assert "an adaptive solver" in non_finite_advice(validate_config(S_CONFIG))
    assert "dt" in non_finite_advice(validate_config({**S_CONFIG, "dtype": "float64"}))
    with pytest.raises(ConfigError):  # what the noisy advice leaves out is indeed refused
        validate_config({**S_CONFIG, "adaptive": True, "solver": "tsit5", "noise": {"sigma": 0.5}})


def test_a_memory_refusal_names_what_needs_the_memory(command):
    line = refused(command(*S, "heads=1000000000", "weights.q.kind=random"), "heads=1000000000", "GiB")
    assert "lower heads" in line
    line = refused(command(*S, "mlp.enabled=true", "mlp.hidden=3000000000"), "GiB")
    assert "mlp.hidden" in line and "lower n," not in line
    line = refused(command(*S[1:], "n=200000", "attention_block=0"), "n=200000", "GiB")
    assert "lower n" in line


# --- 19, 20. the Python API and attnflow train ------------------------------------------------


def test_the_python_api_answers_bad_arguments_with_one_config_error():
    system = af.build_system({"n": 4})  # a mapping is composed and checked, as run() does
    assert system.config.n == 4
    with pytest.raises(ConfigError, match="n must be at least 1"):
        af.build_system({"n": -1})
    for call, says in ((lambda: af.critical_sigma(-1, 3), "beta=-1"),
                       (lambda: af.critical_sigma(float("nan"), 3), "beta=nan"),
                       (lambda: af.critical_sigma(1, 2.5), "d=2.5"),
                       (lambda: af.attention_mode(1, 1), "d=1"),
                       (lambda: af.attention_mode(1e6, 3), "beyond the largest float64")):
        with pytest.raises(ConfigError, match=says):
            call()
    # In range the values are finite and the closed form's: A(0) = 1/d, sigma_c = sqrt(2 A).
    assert af.attention_mode(0, 3) == pytest.approx(1 / 3)
    assert af.critical_sigma(500.0, 3) == pytest.approx(np.sqrt(2 * af.attention_mode(500.0, 3)), rel=1e-12)
    assert np.isfinite(af.critical_sigma(1000.0, 3))  # sigma_c = sqrt(2 A) is formed in log space: finite past A


def test_a_word_without_a_value_is_refused_as_key_value_settings(command):
    refused(command("train", "fast"), "key=value", "'fast'")
    refused(command("fast"), "key=value", "'fast'")
    refused(command("n=3", "fast"), "'fast'")
