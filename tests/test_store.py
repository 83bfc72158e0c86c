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
from attnflow._store import PieceStore


def _large_dataset(megabytes: int) -> xr.Dataset:
    values = np.random.default_rng(0).standard_normal(megabytes * 2**20 // 8)
    return xr.Dataset({"x": (("i",), values)}, attrs={"config": "n: 1\n"})


def test_ctrl_c_during_a_write_leaves_nothing_and_does_not_deadlock(tmp_path):
    """Ctrl-C while NetCDF is being written: the wait returns at once, the temporary
    file is gone, no results file appears, and the next write works (the audit saw
    xarray's file lock deadlock here)."""
    path = tmp_path / "results.nc"
    ds = _large_dataset(400)
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        af.write_results(ds, path)
    assert time.monotonic() - start < 3
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


def test_pieces_are_read_without_pickle_and_damaged_ones_are_recomputed(tmp_path):
    store = PieceStore(tmp_path, "plan A")
    store.save(0, {"stats/energy": np.arange(3.0), "result": np.zeros(3, np.int32)})
    loaded = store.load(0)
    np.testing.assert_array_equal(loaded["stats/energy"], np.arange(3.0))
    (tmp_path / "piece-00001.npz").write_bytes(b"truncated")
    assert store.load(1) is None and not (tmp_path / "piece-00001.npz").exists()
    np.savez(tmp_path / "piece-00002.npz", bad=np.array([{"a": 1}], dtype=object))  # would need pickle
    assert store.load(2) is None
    # another plan in the same folder starts from nothing
    assert PieceStore(tmp_path, "plan B").count() == 0
