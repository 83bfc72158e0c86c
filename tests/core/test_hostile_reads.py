"""Every file attnflow reads back is read with bounded work (issue 33, "Done means"):
stored configs (`attnflow.storage._store.read_config`: results, a pieces folder's plan, a job's
overrides), pieces (their `.npy` headers checked before any array is read), the solve
time kept beside a cached program, a sweep's job records.

Bytes read are counted by the kernel (`/proc/self/io`'s `rchar`), so that a bound on
reading is checked as such, not as a time.
"""

from __future__ import annotations

import io
import json
import struct
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml
from omegaconf import OmegaConf

import attnflow as af
from attnflow.storage import _store
from attnflow.running._ensemble import EnsemblePlan
from attnflow.schema._errors import ConfigError
from commands import command  # noqa: F401 (a fixture)

# 9 levels of 9 aliases: 9^9 (387 million) entries once expanded, 200 bytes of text.
BOMB = "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
    f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]\n" for previous, name in zip("abcdefgh", "bcdefghi"))
MiB = 2**20
linux = pytest.mark.skipif(sys.platform != "linux", reason="counts the bytes read in /proc/self/io")


class Killed(BaseException):
    """A kill -9: nothing in attnflow catches it."""


def bytes_read() -> int:
    """The bytes this process has read so far (the kernel's count, any file)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


# --- stored configs ----------------------------------------------------------------------------


def test_a_config_alias_bomb_is_refused_at_once_and_small_aliases_are_read():
    start = time.perf_counter()
    with pytest.raises(ConfigError) as refused:
        _store.read_config("x/results.nc", BOMB)
    assert time.perf_counter() - start < 1
    assert str(refused.value) == (f"x/results.nc holds a config that expands beyond {_store.CONFIG_ENTRIES} "
                                  "entries (a YAML alias bomb?); it is not attnflow's.")
    # A small alias is YAML as any: read, expanded as PyYAML expands it.
    assert _store.read_config("f", "a: &x [1, 2]\nb: *x\n") == {"a": [1, 2], "b": [1, 2]}
    # 3 levels of the bomb: 820 entries.
    small = "".join(BOMB.splitlines(keepends=True)[:3])
    assert len(_store.read_config("f", small)["c"]) == 9


@pytest.mark.parametrize("text, why", [
    (lambda: "a: &a [1, *a]\n", "that contains itself (a recursive YAML alias)"),
    (lambda: "[" * 200 + "]" * 200, "nested deeper than {CONFIG_DEPTH} levels"),
    (lambda: "a: " + "x" * (_store.CONFIG_BYTES + 1), "of more than 32 MiB, larger than any attnflow writes"),
], ids=["recursive", "deep", "large"])
def test_a_config_attnflow_never_writes_is_one_sentence(text, why):
    with pytest.raises(ConfigError) as refused:
        _store.read_config("f.nc", text())
    assert str(refused.value) == f"f.nc holds a config {why.format(**vars(_store))}; it is not attnflow's."


@linux
def test_a_config_file_is_read_no_further_than_the_cap(tmp_path):
    path = tmp_path / "plan.txt"
    with open(path, "wb") as file:
        file.write(b"n: 4\n")
        file.truncate(1024 * MiB)  # sparse: a GiB of nothing on no disk
    before = bytes_read()
    with pytest.raises(ConfigError, match="more than 32 MiB"):
        _store.read_config(path)
    assert bytes_read() - before < _store.CONFIG_BYTES + MiB


def test_attnflows_own_configs_read_back_as_they_were_written():
    from attnflow.running._build import resolve_study
    from attnflow.running._study import config_yaml

    text = config_yaml(resolve_study({"n": 4, "weights": {"v": {"kind": "matrix", "value": np.eye(3).tolist()}}})
                       .config)
    assert _store.read_config("results.nc", text) == yaml.safe_load(text)
    with pytest.raises(yaml.YAMLError):  # not plain YAML: as before, the callers' own sentence
        _store.read_config("f", "!!python/object/apply:os.system ['echo hi']")


def test_every_reader_of_a_stored_config_refuses_a_bomb():
    """The summary figure, the experiments' `config_of` (the config and a panel's) and
    the plateau detector's time origin read a Dataset's config through `read_config`:
    the bomb is one `ConfigError` naming the file, not a dict of shared lists that a
    later step expands."""
    from attnflow.presentation._plots import summary_figure
    from attnflow.analysis.plateaus import detect_metastability
    from attnflow.experiments._common import config_of

    ds = xr.Dataset({"energy": (("member", "time"), np.ones((2, 3)))}, coords={"time": [0.0, 1.0, 2.0]},
                    attrs={"config": BOMB, "panel_configs": f"sphere:\n{BOMB}".replace("\n", "\n  ").rstrip()})
    ds.encoding["source"] = "/runs/0/results.nc"
    for read in (summary_figure, config_of, lambda ds: config_of(ds, "sphere"),
                 lambda ds: detect_metastability(ds, ["energy"], clusters=None, sizes=None)):
        with pytest.raises(ConfigError, match=r"^/runs/0/results.nc holds a config that expands beyond"):
            read(ds)


def test_a_pieces_plan_holding_a_bomb_is_a_plan_of_no_known_config(tmp_path):
    """`plan.txt` names the config of a pieces folder; a bomb there was expanded while
    naming the settings that differ. Now it names no config: its pieces are refused in
    one sentence (or discarded with `discard`/overwrite)."""
    folder = tmp_path / "pieces"
    folder.mkdir()
    (folder / "plan.txt").write_text(BOMB)
    np.savez(folder / "piece-00000.npz", result=np.zeros(2, np.int32))
    start = time.perf_counter()
    with pytest.raises(ConfigError) as refused:
        _store.PieceStore(folder, "n: 4\npieces: 1 of 2\n")
    assert time.perf_counter() - start < 2
    assert str(refused.value).startswith(f"{folder} holds 1 finished piece of a run whose config they do not name;")
    store = _store.PieceStore(folder, "n: 4\npieces: 1 of 2\n", discard=True)
    assert store.count() == 0 and (folder / "plan.txt").read_text() == "n: 4\npieces: 1 of 2\n"


# --- pieces --------------------------------------------------------------------------------------


def npy(array: np.ndarray, shape: tuple | None = None, descr: str | None = None) -> bytes:
    """`array` as a .npy file whose header may declare another shape or dtype."""
    out = io.BytesIO()
    header = np.lib.format.header_data_from_array_1_0(array)
    header.update({} if shape is None else {"shape": shape}, **({} if descr is None else {"descr": descr}))
    np.lib.format.write_array_header_1_0(out, header)
    out.write(array.tobytes())
    return out.getvalue()


def piece(path: Path, members: dict[str, bytes]) -> None:
    """A piece written as np.savez writes one (stored, uncompressed) from .npy bytes."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name, data in members.items():
            archive.writestr(f"{name}.npy", data)


ROWS = {"result": np.zeros(2, np.int32), "stats__energy": np.arange(6, dtype=np.float32).reshape(2, 3)}


def test_a_piece_is_checked_against_its_headers_before_any_array_is_read(tmp_path):
    """Damaged (removed, listed, computed again) when an array's header declares 10^12
    rows (NumPy allocated them before reading: a 7 TiB MemoryError), a structured dtype
    (read, then mixed into the results), an object dtype, another row count than the
    plan's, or sizes in the archive's directory beyond the file (4 GB for an array
    declared to fill them); a sound piece is read."""
    store = _store.PieceStore(tmp_path / "pieces", "n: 4\npieces: 6 of 2\n")
    sound = {name: npy(array) for name, array in ROWS.items()}
    piece(store._path(0), sound)
    piece(store._path(1), {**sound, "stats__energy": npy(ROWS["stats__energy"], shape=(10**12, 3))})
    piece(store._path(2), {**sound, "result": npy(np.zeros(2, [("a", "<i4")]))})
    piece(store._path(3), {**sound, "result": npy(np.zeros(2, np.int32), descr="|O")})
    piece(store._path(4), {**sound, "result": npy(np.zeros(1, np.int32))})
    piece(store._path(5), {**sound, "result": npy(np.zeros(2, np.int32), shape=(10**9,))})
    lying = bytearray(store._path(5).read_bytes())
    # The sizes of the first member, in its local header and its directory entry.
    for signature, offset in ((b"PK\x03\x04", 18), (b"PK\x01\x02", 20)):
        struct.pack_into("<II", lying, lying.index(signature) + offset, 2**32 - 2, 2**32 - 2)
    store._path(5).write_bytes(bytes(lying))
    loaded = [store.load(i, rows=2) for i in range(6)]
    assert loaded[1:] == [None] * 5
    assert store.damaged == [store._path(i) for i in range(1, 6)]
    assert not any(store._path(i).exists() for i in range(1, 6))
    np.testing.assert_array_equal(loaded[0]["stats/energy"], ROWS["stats__energy"])
    assert store.load(0) is not None  # without rows: the headers alone


TINY = ["n=4", "d=3", "beta=1", "members=8", "chunk_size=2", "t1=0.5", "dt=0.1", "saves=2", "plot=false"]
TINY_CONFIG = {"n": 4, "d": 3, "beta": 1.0, "members": 8, "chunk_size": 2, "t1": 0.5, "dt": 0.1, "saves": 2}


def _interrupted(command, monkeypatch, out: Path, solved: int) -> Path:
    """Run TINY in `out`, killed after `solved` of its 4 pieces; its pieces folder."""
    real, count = EnsemblePlan.solve, [0]

    def solve(self, i):
        if count[0] >= solved:
            raise Killed
        count[0] += 1
        return real(self, i)

    with monkeypatch.context() as patch:
        patch.setattr(EnsemblePlan, "solve", solve)
        with pytest.raises(Killed):
            command(*TINY, f"hydra.run.dir={out}")
    return out / ".attnflow-pieces"


def _rewritten(path: Path, name: str, data: bytes) -> None:
    """Replace the member `name` of the piece at `path` by the .npy bytes `data`."""
    with zipfile.ZipFile(path) as archive:
        members = {info.filename[:-4]: archive.read(info) for info in archive.infolist()}
    members[name] = data
    piece(path, members)


def test_a_piece_declaring_more_than_it_holds_is_computed_again_in_one_line(command, monkeypatch, tmp_path):
    """A piece whose `result` declares 10^12 rows (the run died with a MemoryError
    traceback) and one of a structured dtype: each is computed again with its one line,
    and the results are those of a clean run."""
    out = tmp_path / "run"
    pieces = _interrupted(command, monkeypatch, out, 3)
    _rewritten(pieces / "piece-00001.npz", "result", npy(np.zeros(2, np.int32), shape=(10**12,)))
    _rewritten(pieces / "piece-00002.npz", "result", npy(np.zeros(2, [("a", "<i4")])))
    code, lines = command(*TINY, f"hydra.run.dir={out}")
    assert code == 0, lines
    said = [line for line in command.stdout.splitlines() if "could not be read" in line]
    assert len(said) == 2 and "piece-00001.npz" in said[0] and "piece-00002.npz" in said[1], command.stdout
    with xr.open_dataset(out / "results.nc") as ds:
        np.testing.assert_array_equal(ds["energy"].values, af.run(TINY_CONFIG)["energy"].values)


def test_a_piece_of_another_row_count_is_computed_again_in_one_line(command, monkeypatch, tmp_path):
    """A sound piece of 1 member where the plan's pieces hold 2 (a piece of another cut
    copied in): computed again (`solve_study` passes each piece's rows to
    `PieceStore.load`), the results those of a clean run."""
    out = tmp_path / "run"
    pieces = _interrupted(command, monkeypatch, out, 3)
    with np.load(pieces / "piece-00001.npz") as data:
        halves = {name: npy(data[name][:1]) for name in data.files}
    piece(pieces / "piece-00001.npz", halves)
    code, lines = command(*TINY, f"hydra.run.dir={out}")
    assert code == 0, lines
    said = [line for line in command.stdout.splitlines() if "could not be read" in line]
    assert len(said) == 1 and "piece-00001.npz" in said[0], command.stdout
    with xr.open_dataset(out / "results.nc") as ds:
        np.testing.assert_array_equal(ds["energy"].values, af.run(TINY_CONFIG)["energy"].values)


# --- the solve time of a cached program, a sweep's job records ---------------------------------


@linux
def test_the_solve_time_beside_a_cached_program_is_read_in_a_few_bytes(tmp_path):
    """`measured_seconds` read the `.seconds` file whole: 100 MB of it were read (and
    refused as a number). Now at most 65 bytes are read, and a file longer than 64
    bytes is not a time."""
    plan = EnsemblePlan.__new__(EnsemblePlan)  # only its file is read
    plan._timing = tmp_path / "program.seconds"
    with open(plan._timing, "wb") as file:
        file.write(b"12.5\n")
        file.truncate(100 * MiB)  # sparse
    before = bytes_read()
    assert plan.measured_seconds is None
    assert bytes_read() - before < 64 * 1024  # (reading /proc/self/io counts too)
    plan._timing.write_text("12.5\n")
    assert plan.measured_seconds == 12.5


@linux
def test_a_sweeps_job_record_that_is_not_a_jobs_is_skipped_unread(tmp_path, monkeypatch):
    """The sweep's process reads its jobs' outcomes from `.attnflow-jobs/*.json`: one of 8
    MiB was read and parsed whole, one of another shape (a list, a number for a name, a
    nesting 100000 deep) stopped the sweep's end with a traceback. Now a record over 1
    MiB is skipped after reading 1 MiB of it, and one of another shape is skipped."""
    from attnflow import cli

    for name, empty in (("_FAILED", []), ("_JOBS", []), ("_CURRENT", {})):
        monkeypatch.setattr(cli, name, empty)
    records = tmp_path / ".attnflow-jobs"
    records.mkdir()
    (records / "0.json").write_text(json.dumps({"num": 0, "job": "job 0 (n=3)", "error": None, "stderr": "x"}))
    (records / "1.json").write_text(json.dumps({"num": 1, "job": "job 1 (n=4)", "error": "boom", "stderr": "x"})
                                    + " " * (8 * MiB))
    (records / "2.json").write_text("[]")
    (records / "3.json").write_text(json.dumps({"num": "3", "job": "job 3", "error": None}))
    (records / "4.json").write_text("[" * 100_000 + "]" * 100_000)
    before = bytes_read()
    cli._SweepRecord().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    assert bytes_read() - before < 2 * MiB
    assert cli._JOBS == ["job 0 (n=3)"] and cli._FAILED == []
