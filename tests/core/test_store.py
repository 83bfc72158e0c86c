"""The results store: whole-or-nothing writes, even when interrupted."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
import xarray as xr

import attnflow as af
from attnflow.storage._store import PieceStore


def _large_dataset(megabytes: int) -> xr.Dataset:
    values = np.random.default_rng(0).standard_normal(megabytes * 2**20 // 8)
    return xr.Dataset({"x": (("i",), values)}, attrs={"config": "n: 1\n"})


def test_ctrl_c_during_a_write_leaves_nothing_and_does_not_deadlock(tmp_path, ctrl_c, monkeypatch):
    """Ctrl-C while NetCDF is being written: the wait returns (no deadlock: the audit saw
    xarray's file lock deadlock here), no results file appears, no temporary file is
    left once the abandoned writer ends (it may (re)create its file after the
    interrupt's clean-up), and the next write works. The interrupt is sent from inside
    the write, as it starts, so that it falls in the write on any machine, however fast
    its disk. It lands when the netCDF library's call returns, as that call holds
    Python's GIL, so the bound is the uninterrupted write's time, measured here."""
    path = tmp_path / "results.nc"
    ds = _large_dataset(100)
    start = time.monotonic()
    af.write_results(ds, tmp_path / "whole.nc")
    whole = time.monotonic() - start
    (tmp_path / "whole.nc").unlink()
    write = xr.Dataset.to_netcdf

    def interrupted(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        return write(self, *args, **kwargs)

    monkeypatch.setattr(xr.Dataset, "to_netcdf", interrupted)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        af.write_results(ds, path)
    assert time.monotonic() - start < 2 * whole + 5, whole
    monkeypatch.undo()
    for worker in [t for t in threading.enumerate() if t.name == "attnflow-worker"]:
        worker.join(2 * whole + 5)
        assert not worker.is_alive(), "the abandoned writer never ended"
    assert not path.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    small = _large_dataset(1)
    af.write_results(small, path)
    np.testing.assert_array_equal(af.load_results(path)["x"].values, small["x"].values)


def test_a_killed_writer_leaves_an_existing_result_whole(tmp_path):
    # A write that fails half-way replaces nothing: the old file is still readable.
    path = tmp_path / "results.nc"
    af.write_results(_large_dataset(1), path)
    before = path.read_bytes()
    broken = xr.Dataset({"x": (("i",), np.array([object()], dtype=object))})
    with pytest.raises(Exception):
        af.write_results(broken, path)
    assert path.read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_dead_writers_temporary_file_is_removed_a_live_ones_kept(tmp_path):
    # A writer killed (or exited on Ctrl-C) mid-write leaves its temporary file; the
    # next write of the same file removes it, but not one that a running process writes.
    dead = tmp_path / ".results.nc.4194305-0badcafe.tmp"  # above any Linux pid_max
    live = tmp_path / f".results.nc.{os.getpid()}-0badcafe.tmp"
    dead.write_bytes(b"half")
    live.write_bytes(b"half")
    af.write_results(_large_dataset(1), tmp_path / "results.nc")
    assert not dead.exists() and live.exists()


def test_pieces_are_read_without_pickle_and_damaged_ones_are_recomputed(tmp_path):
    store = PieceStore(tmp_path, "plan A")
    store.save(0, {"stats/energy": np.arange(3.0), "result": np.zeros(3, np.int32)})
    loaded = store.load(0)
    np.testing.assert_array_equal(loaded["stats/energy"], np.arange(3.0))
    (tmp_path / "piece-00001.npz").write_bytes(b"truncated")
    assert store.load(1) is None and not (tmp_path / "piece-00001.npz").exists()
    np.savez(tmp_path / "piece-00002.npz", bad=np.array([{"a": 1}], dtype=object))  # would need pickle
    assert store.load(2) is None
    assert [path.name for path in store.damaged] == ["piece-00001.npz", "piece-00002.npz"]
    # another plan's pieces in the same folder are refused, or discarded when asked
    with pytest.raises(af.ConfigError, match="1 finished piece"):
        PieceStore(tmp_path, "plan B")
    assert PieceStore(tmp_path, "plan B", discard=True).count() == 0


@pytest.mark.parametrize("beta", [1.0, [0.5, 2.0]], ids=["scalar-beta", "beta-list"])
def test_written_results_read_back_as_xarrays_own_file(tmp_path, beta):
    """The command line writes `Results` (`write_results`); the file must read back
    exactly as the file xarray writes for the same Dataset, also with failed solves (NaN
    floats, integer statistics with a fill value)."""
    from attnflow.running._build import resolve_study
    from attnflow.running._study import plan_study, solve_study

    config = {"n": 4, "d": 3, "members": 3, "t1": 0.5, "dt": 0.1, "saves": 6, "beta": beta, "attention_kind": "usa",
              "dtype": "float32", "metrics": ["energy", "pair_density", "clusters", "cluster_sizes"],
              "compilation_cache": False}
    study = resolve_study(config)
    try:
        results = solve_study(study, plan_study(study))
    except af.NonFiniteStateError as error:  # at beta=2 the USA field blows up in float32
        results = error.results
    ours, theirs = tmp_path / "ours.nc", tmp_path / "theirs.nc"
    af.write_results(results, ours)
    results.to_xarray().to_netcdf(theirs)
    with xr.open_dataset(ours) as a, xr.open_dataset(theirs) as b:
        xr.testing.assert_identical(a.load(), b.load())
        assert dict(a.attrs) == dict(b.attrs)
        for name in a.variables:
            assert a[name].encoding.get("dtype") == b[name].encoding.get("dtype"), name


def test_the_one_writer_gives_files_and_folders_the_umasks_mode_and_names_a_full_disk(tmp_path):
    """`replacing` writes every file of attnflow (results, pieces, figures, checkpoints,
    model and training-state folders): a file or a folder replaces its previous self
    whole, with the mode the umask gives even when the writer makes its file readable by
    its owner only (safetensors does); a full disk raises StorageError naming the target,
    with the reason as `strerror`, and leaves the previous version and no temporary."""
    import errno

    from safetensors.numpy import save_file

    from attnflow.schema._errors import StorageError
    from attnflow.storage._store import write_atomically, recover, replacing

    previous = os.umask(0o027)
    try:
        single = write_atomically(tmp_path / "one.safetensors", lambda tmp: save_file({"a": np.ones(2)}, str(tmp)))
        for text in ("old", "new"):
            with replacing(tmp_path / "model", folder=True) as partial:
                save_file({"a": np.ones(2)}, str(partial / "weights.safetensors"))
                (partial / "note.txt").write_text(text)
    finally:
        os.umask(previous)
    assert oct(single.stat().st_mode & 0o777) == oct(0o640)
    assert {oct(p.stat().st_mode & 0o777) for p in (tmp_path / "model").iterdir()} == {oct(0o640)}
    assert (tmp_path / "model" / "note.txt").read_text() == "new"

    def full(tmp):
        tmp.write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    for target in (tmp_path / "one.safetensors", tmp_path / "model"):
        with pytest.raises(StorageError, match=f"cannot write {target} \\(No space left on device\\)") as error:
            if target.suffix:
                write_atomically(target, full)
            else:
                with replacing(target, folder=True) as partial:
                    (partial / "note.txt").write_text("half")
                    write_atomically(partial / "weights.safetensors", full)  # a file of the folder
        assert error.value.strerror == "No space left on device"
    assert (tmp_path / "model" / "note.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "one.safetensors"]
    (tmp_path / "model").rename(tmp_path / ".model.old")  # a crash between a folder's two renames
    recover(tmp_path / "model")
    assert (tmp_path / "model" / "note.txt").read_text() == "new"
