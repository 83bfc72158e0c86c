"""The run folder and its pieces against a hostile user (issue 18): pieces of another run,
a damaged piece, a full disk, sizes beyond what int32 indices hold, foreign and corrupt
results files.

The command runs in this process (`attnflow.cli.main` with its arguments), so that a kill
or a full disk can be simulated by patching one function: a kill -9 is an exception that
nothing catches (`Killed`, a BaseException), a full disk an `OSError(ENOSPC)` from NumPy's
writer or netCDF's `RuntimeError("NetCDF: HDF error")`.
"""

from __future__ import annotations

import errno
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml

import attnflow as af
import attnflow.cli as cli_module
from attnflow.running import _build, _study
from attnflow.storage import _store
from attnflow.running._ensemble import EnsemblePlan
from attnflow.schema._errors import ConfigError, NonFiniteStateError

# 8 members, 2 per piece: 4 pieces.
TINY = ["n=4", "d=3", "beta=1", "members=8", "chunk_size=2", "t1=0.5", "dt=0.1", "saves=2", "plot=false"]
TINY_CONFIG = {"n": 4, "d": 3, "beta": 1.0, "members": 8, "chunk_size": 2, "t1": 0.5, "dt": 0.1, "saves": 2}


class Killed(BaseException):
    """A kill -9: nothing in attnflow catches it."""


@pytest.fixture
def attnflow(monkeypatch, capsys):
    """`attnflow(*args)` runs the command in this process: (exit code, stdout, stderr)."""
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")  # main() sets it; undone after the test
    previous = signal.getsignal(signal.SIGTERM)

    def call(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["attnflow", *args])
        cli_module._FAILED.clear()
        cli_module._JOBS.clear()
        cli_module._CURRENT.clear()
        capsys.readouterr()
        try:
            cli_module.main()
            code = 0
        except SystemExit as exit:
            code = exit.code
        out, err = capsys.readouterr()
        return code, out, err

    yield call
    signal.signal(signal.SIGTERM, previous)


def kill_after(monkeypatch, solved: int) -> None:
    """The next run is killed when it starts its piece number `solved + 1`."""
    real = EnsemblePlan.solve
    count = [0]

    def solve(self, i):
        if count[0] >= solved:
            raise Killed
        count[0] += 1
        return real(self, i)

    monkeypatch.setattr(EnsemblePlan, "solve", solve)


def interrupted_run(attnflow, monkeypatch, out: Path, solved: int, *args: str) -> dict[str, bytes]:
    """Run TINY (and `args`) in `out`, killed after `solved` pieces; the pieces it left."""
    with monkeypatch.context() as patch:
        kill_after(patch, solved)
        with pytest.raises(Killed):
            attnflow(*TINY, *args, f"hydra.run.dir={out}")
    return pieces_in(out)


def pieces_in(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (out / ".attnflow-pieces").rglob("piece-*.npz")}


def one_error_line(code: int, err: str) -> str:
    assert code == 2, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("attnflow: error: "), err
    return lines[0]


def no_temporary_files(out: Path) -> bool:
    return not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


# --- case 4: pieces of an interrupted run -----------------------------------------------------


def test_a_different_config_is_refused_where_an_interrupted_run_left_pieces(tmp_path, attnflow, monkeypatch):
    out = tmp_path / "run"
    kept = interrupted_run(attnflow, monkeypatch, out, 2)
    assert len(kept) == 2
    # Another config in the same folder: refused, naming the setting that differs; the
    # pieces are untouched and nothing is written.
    line = one_error_line(*attnflow(*TINY[1:], "n=5", f"hydra.run.dir={out}")[::2])
    assert "2 finished pieces" in line and "n=4" in line and "n=5" in line and "overwrite=true" in line, line
    assert str(out / ".attnflow-pieces") in line, line
    assert pieces_in(out) == kept and not (out / "results.nc").exists()
    # The interrupted config resumes from them.
    code, stdout, err = attnflow(*TINY, f"hydra.run.dir={out}")
    assert code == 0, err
    assert "resuming from 2 of 4 finished pieces" in stdout, stdout
    assert yaml.safe_load(xr.open_dataset(out / "results.nc").attrs["config"])["n"] == 4

    # overwrite=true discards another run's pieces, and says so.
    other = tmp_path / "other"
    interrupted_run(attnflow, monkeypatch, other, 1)
    code, stdout, err = attnflow(*TINY[1:], "n=5", "overwrite=true", f"hydra.run.dir={other}")
    assert code == 0, err
    assert "discarding 1 finished piece" in stdout and "n=4" in stdout, stdout
    assert "resuming" not in stdout
    with xr.open_dataset(other / "results.nc") as ds:
        assert yaml.safe_load(ds.attrs["config"])["n"] == 5 and ds.sizes["member"] == 8


def test_an_experiments_panel_pieces_are_not_discarded_by_a_study(tmp_path, attnflow, monkeypatch):
    # An experiment keeps its pieces per panel (`.attnflow-pieces/<panel>/`); a study
    # started in its folder must not remove them either.
    out = tmp_path / "run"
    pieces = out / ".attnflow-pieces" / "main"
    pieces.mkdir(parents=True)
    identity = _study.config_yaml(_build.validate_config(TINY_CONFIG)) + "\npieces: 4 of 2\n"
    (pieces / "plan.txt").write_text(identity)
    np.savez(pieces / "piece-00000.npz", energy=np.zeros((2, 2)))
    kept = pieces_in(out)
    line = one_error_line(*attnflow(*TINY, f"hydra.run.dir={out}")[::2])
    assert "1 finished piece of panel main" in line, line
    assert pieces_in(out) == kept


def test_the_python_api_keeps_pieces_of_another_run_and_files_that_are_not_its_own(tmp_path):
    folder = tmp_path / "pieces"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")  # a folder that holds something else too
    af.run(TINY_CONFIG, pieces=folder)
    assert (folder / "notes.txt").read_text() == "mine"
    kept = sorted(folder.glob("piece-*.npz"))
    assert len(kept) == 4
    with pytest.raises(ConfigError, match=r"seed=0.*seed=1"):
        af.run({**TINY_CONFIG, "seed": 1}, pieces=folder)
    assert sorted(folder.glob("piece-*.npz")) == kept
    af.run({**TINY_CONFIG, "seed": 1, "overwrite": True}, pieces=folder)
    assert (folder / "notes.txt").read_text() == "mine"


# --- case 5: a damaged piece ----------------------------------------------------------------


def test_a_damaged_piece_is_computed_again_and_said_in_one_line(tmp_path, attnflow, monkeypatch):
    out = tmp_path / "run"
    interrupted_run(attnflow, monkeypatch, out, 3)
    damaged = out / ".attnflow-pieces" / "piece-00001.npz"
    damaged.write_bytes(damaged.read_bytes()[:100])  # cut short, as by a kill during a copy
    (out / ".attnflow-pieces" / "piece-00002.npz").write_bytes(b"")  # empty
    code, stdout, err = attnflow(*TINY, f"hydra.run.dir={out}")
    assert code == 0, err
    lines = [line for line in stdout.splitlines() if "could not be read" in line]
    assert len(lines) == 2 and "piece-00001.npz" in lines[0] and "again" in lines[0], stdout
    assert "resuming from 1 of 4 finished pieces" in stdout, stdout
    with xr.open_dataset(out / "results.nc") as ds:
        np.testing.assert_array_equal(ds["energy"].values, af.run(TINY_CONFIG)["energy"].values)


# --- case 6: a full disk ----------------------------------------------------------------------


def test_a_full_disk_is_one_sentence_that_keeps_the_pieces_and_the_rerun_resumes(tmp_path, attnflow, monkeypatch):
    out = tmp_path / "run"
    pieces = out / ".attnflow-pieces"
    writes = [0]
    real_savez = np.savez

    def savez(file, **arrays):
        writes[0] += 1
        if writes[0] == 3:
            file.write(b"PK\x03\x04 half a piece")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_savez(file, **arrays)

    with monkeypatch.context() as patch:
        patch.setattr(np, "savez", savez)
        line = one_error_line(*attnflow(*TINY, f"hydra.run.dir={out}")[::2])
    assert "No space left on device" in line and "2 finished pieces are kept" in line, line
    assert str(pieces) in line and "resumes" in line, line
    assert len(pieces_in(out)) == 2 and no_temporary_files(out)

    # The results file cannot be written (netCDF says only "HDF error").
    def hdf_error(self, path, **options):
        Path(path).write_bytes(b"\x89HDF half a file")
        raise RuntimeError("NetCDF: HDF error")

    with monkeypatch.context() as patch:
        patch.setattr(xr.Dataset, "to_netcdf", hdf_error)
        line = one_error_line(*attnflow(*TINY, f"hydra.run.dir={out}")[::2])
    assert "results.nc" in line and "NetCDF: HDF error" in line and "4 finished pieces are kept" in line, line
    assert len(pieces_in(out)) == 4 and no_temporary_files(out) and not (out / "results.nc").exists()

    # With room again, the same command resumes and computes nothing.
    with monkeypatch.context() as patch:
        kill_after(patch, 0)  # any solve would be a recomputation
        code, stdout, err = attnflow(*TINY, f"hydra.run.dir={out}")
    assert code == 0, err
    assert "resuming from 4 of 4 finished pieces" in stdout and (out / "results.nc").exists(), stdout


def test_a_full_disk_while_drawing_says_the_results_are_safe(tmp_path, attnflow, monkeypatch):
    out = tmp_path / "run"

    def no_room(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr("matplotlib.figure.Figure.savefig", no_room)
        line = one_error_line(*attnflow(*TINY[:-1], "plot=true", f"hydra.run.dir={out}")[::2])
        assert "summary.png" in line and "results.nc" in line and "attnflow plot" in line, line
        assert (out / "results.nc").exists() and no_temporary_files(out)
        # ...and `attnflow plot` itself, still without room.
        line = one_error_line(*attnflow("plot", str(out))[::2])
        assert "summary.png" in line and "No space left on device" in line, line
    assert no_temporary_files(out)


def test_a_pieces_folder_that_cannot_be_created_is_one_sentence(tmp_path, attnflow, monkeypatch):
    out = tmp_path / "run"
    real_mkdir = Path.mkdir

    def mkdir(self, *args, **kwargs):
        if self.name == ".attnflow-pieces":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    line = one_error_line(*attnflow(*TINY, f"hydra.run.dir={out}")[::2])
    assert "cannot create" in line and ".attnflow-pieces" in line and "nothing was finished" in line, line


def test_a_failed_studys_pieces_go_with_its_incomplete_nc_and_an_experiments_panels_keep_theirs(
    tmp_path, attnflow, monkeypatch
):
    # A solve that turned non-finite (here the check of its panel's ensemble, made to
    # fail): its statistics go to incomplete.nc. A study's incomplete.nc holds all it
    # computed, and its pieces go; an experiment's holds the failed panel's only, and
    # every panel keeps its pieces (the same command resumes from them).
    real = _study.check_ensemble

    def failing(at: int):
        checked = []

        def check_ensemble(*args, **kwargs):
            checked.append(args)
            if len(checked) == at:
                raise NonFiniteStateError("a state became non-finite.")
            return real(*args, **kwargs)

        return check_ensemble

    study = tmp_path / "study"
    monkeypatch.setattr(_study, "check_ensemble", failing(1))
    line = one_error_line(*attnflow(*TINY, f"hydra.run.dir={study}")[::2])
    assert line.endswith(f"a state became non-finite; what was computed is in {study / 'incomplete.nc'}."), line
    assert (study / "incomplete.nc").is_file() and not (study / ".attnflow-pieces").exists()
    experiment = tmp_path / "experiment"
    args = ["experiment=phase_diagram", TINY[0], "d=[2,3]", "beta=[1.0]", *TINY[3:], f"hydra.run.dir={experiment}"]
    monkeypatch.setattr(_study, "check_ensemble", failing(2))  # the second panel, d=3
    line = one_error_line(*attnflow(*args)[::2])
    assert line.startswith("attnflow: error: panel d=3: a state became non-finite;"), line
    assert (experiment / "incomplete.nc").is_file()
    kept = [len(list((experiment / ".attnflow-pieces" / panel).glob("piece-*.npz"))) for panel in ("d=2", "d=3")]
    assert kept == [4, 4], kept
    monkeypatch.setattr(_study, "check_ensemble", real)
    code, stdout, err = attnflow(*args)
    assert code == 0, err
    for panel in ("d=2", "d=3"):
        assert f"resuming from 4 of 4 finished pieces in {experiment / '.attnflow-pieces' / panel}" in stdout, stdout
    assert (experiment / "results.nc").is_file() and not (experiment / "incomplete.nc").exists()


def test_an_interrupted_experiment_names_the_pieces_it_keeps(tmp_path, monkeypatch, capsys):
    # Ctrl-C in an experiment: its pieces are kept per panel, and the line says so.
    out = tmp_path / "run"
    (out / ".attnflow-pieces" / "main").mkdir(parents=True)
    (out / ".attnflow-pieces" / "main" / "piece-00000.npz").write_bytes(b"")
    monkeypatch.setitem(cli_module._CURRENT, "dir", out)

    def exit(code):
        raise SystemExit(code)

    monkeypatch.setattr(cli_module.os, "_exit", exit)
    with pytest.raises(SystemExit):
        cli_module._interrupted()
    err = capsys.readouterr().err
    assert "1 finished piece is kept" in err, err
    # The folder to resume in (the same command alone would start over in a new one).
    assert err.strip().endswith(f"the same command with hydra.run.dir={out} resumes from there."), err


# --- case 14: sizes ---------------------------------------------------------------------------


@pytest.fixture
def without_x64():
    """JAX as a float32 run has it (the tests switch float64 on for the whole process):
    integers are int32, as in the command's own process."""
    import jax

    jax.config.update("jax_enable_x64", False)
    yield
    jax.config.update("jax_enable_x64", True)


@pytest.mark.parametrize(
    "settings, says",
    [
        ({"n": 100_000_000}, "pairs of tiles"),  # 1.9e10 pairs of tiles of 512
        ({"n": 3_000_000_000}, "2^31 - 1"),
        ({"n": 2**31}, "2^31 - 1"),
        ({"n": 10**19}, "2^31 - 1"),
        ({"n": 100_000_000, "attention_block": 0}, "GiB"),
        ({"members": 2**31}, "2^31 - 1"),
        ({"t1": 1e12, "dt": 1.0}, "2^31 - 1"),  # steps (the grid was formed whole: 8 TB)
        ({"adaptive": True, "solver": "tsit5", "max_steps": 10**12}, "2^31 - 1"),
        ({"exact_times": True, "saves": 10**12}, "GiB"),  # output times (formed whole: 8 TB)
    ],
)
def test_sizes_beyond_int32_indices_are_refused_before_anything_is_formed(settings, says, without_x64):
    config = {**TINY_CONFIG, "members": 2, **settings}
    with pytest.raises(ConfigError, match=says.replace("^", r"\^")):
        _study.plan_study(_build.resolve_study(config))


def test_sizes_are_refused_on_the_command_line_in_one_line(tmp_path, attnflow, without_x64):
    for n in ("100000000", "3000000000"):
        line = one_error_line(*attnflow(*TINY[1:], f"n={n}", f"hydra.run.dir={tmp_path / n}")[::2])
        assert n in line and "given twice" not in line, line  # (TINY[0] is n=4)
        assert not (tmp_path / n).exists()  # no empty run folder left behind


def test_a_tile_larger_than_the_tokens_is_one_tile():
    # attention_block beyond n: the tokens are one tile (not padded to the block size,
    # which the memory check refused at 29 million GiB).
    plan = _study.plan_study(_build.resolve_study({**TINY_CONFIG, "n": 2000, "attention_block": 10**12}))
    assert plan.footprint.pairwise < 2**30


# --- results files from elsewhere -------------------------------------------------------------


def test_plot_and_report_name_a_results_file_they_cannot_use(tmp_path, attnflow):
    # A NetCDF file whose config is not YAML (or holds a Python tag), and one that says it
    # is an experiment's but lacks what the experiment draws.
    for name, config in [("bad_yaml", "a: ["), ("python_tag", "!!python/object/apply:os.system ['echo hi']")]:
        xr.Dataset({"energy": (("member", "time"), np.ones((2, 3)))}, attrs={"config": config}).to_netcdf(
            tmp_path / f"{name}.nc")
    xr.Dataset({"energy": (("member", "time"), np.ones((2, 3)))},
               attrs={"config": "n: 4", "experiment": "circle"}).to_netcdf(tmp_path / "circle.nc")
    line = one_error_line(*attnflow("plot", str(tmp_path / "circle.nc"))[::2])
    assert "circle.nc" in line and "circle" in line, line
    sweep = tmp_path / "sweep"
    for name in ("bad_yaml", "python_tag"):
        (sweep / name).mkdir(parents=True)
        (tmp_path / f"{name}.nc").rename(sweep / name / "results.nc")
        line = one_error_line(*attnflow("report", str(sweep))[::2])
        assert f"{name}/results.nc" in line, line
        (sweep / name / "results.nc").unlink()
    # A corrupt results file is named without the run's own advice (hydra.run.dir, overwrite).
    (tmp_path / "corrupt.nc").write_bytes(b"\x89HDF\r\n\x1a\n cut short")
    line = one_error_line(*attnflow("plot", str(tmp_path / "corrupt.nc"))[::2])
    assert "corrupt.nc" in line and "hydra.run.dir" not in line and "overwrite" not in line, line


def test_a_second_sweep_into_a_sweep_folder_in_use_is_refused(tmp_path, attnflow):
    """A sweep's outcomes are collected from its folder (`.attnflow-jobs`), which a second
    sweep started there cleared: the folder is locked while a sweep runs, and the
    second one is refused in one line before any job runs; the lock goes with the sweep."""
    sweep = tmp_path / "sweep"
    with _store.RunDirectory(sweep):  # the lock a running sweep holds
        line = one_error_line(*attnflow("-m", *TINY[1:], "n=3,4", f"hydra.sweep.dir={sweep}")[::2])
    assert f"another attnflow run is working in {sweep}" in line and "hydra.sweep.dir" in line, line
    assert not (sweep / "0").exists() and not (sweep / "1").exists()
    code, _, err = attnflow("-m", *TINY[1:], "n=3,4", f"hydra.sweep.dir={sweep}")
    assert code == 0, err
    assert (sweep / "0" / "results.nc").is_file() and (sweep / "1" / "results.nc").is_file()
