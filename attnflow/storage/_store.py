"""The results store: NetCDF files written whole or not at all, finished pieces of a run
kept until its results are written, and the run directory (checked and locked before
any computing starts).

Every file attnflow writes (results, pieces, figures, tables, checkpoints, exported
programs) and every folder it replaces whole (a trained model, a training state) goes
through one writer, `replacing`: written under a temporary name in its own folder and
renamed into place. The temporary names in flight are known (`discard_partial_files`),
so an interrupted run leaves none behind. A file that cannot be written (a full disk)
raises `StorageError` naming it. Files get the mode the user's umask gives.

Every file attnflow reads back is read with bounded work, and one that is damaged or not
attnflow's is refused in one sentence naming it (or, for a piece, computed again): a
stored config (a results file's `config`, a pieces folder's `plan.txt`, a job's
`.hydra/overrides.yaml`) goes through `read_config`, which refuses more than
`CONFIG_BYTES` of text, nesting deeper than `CONFIG_DEPTH` and YAML aliases that
expand beyond `CONFIG_ENTRIES` entries (an alias bomb), counted without expanding them;
a piece's arrays are checked against their `.npy` headers before any is read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import math
import os
import secrets
import shutil
import signal
import threading
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ..schema._config import current_config
from ..schema._errors import ConfigError, StorageError
from ._cf import netcdf_layout

_PARTIAL: set[Path] = set()
_PARTIAL_LOCK = threading.Lock()
_TMP_SUFFIX = ".tmp"

# The bounds of a stored config read back (`read_config`). attnflow's own are a few KiB
# (a matrix given as a value, 256 x 256: 1.8 MiB and 66000 entries), nest a few levels
# deep and hold no YAML alias; within the bounds, reading one back takes at most a few
# seconds and a few hundred MiB (PyYAML builds 1000000 entries in about 5 s).
CONFIG_BYTES = 32 * 2**20
CONFIG_ENTRIES = 1_000_000
CONFIG_DEPTH = 64
_YAML_LOADER = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader


def in_background(work: Callable[[], Any]) -> Any:
    """Run `work()` in a worker thread and wait for it.

    A compiled computation or a NetCDF write cannot be interrupted from Python, but the
    wait can: Ctrl-C raises `KeyboardInterrupt` here, while the abandoned worker runs on
    (its results unused) until the process ends. It does so at once while the worker is
    in a call that releases Python's GIL (a compiled JAX computation); the netCDF
    library's write of one variable holds it, so there the interrupt lands when that
    call returns.
    """
    box: dict[str, Any] = {}

    def target():
        try:
            box["value"] = work()
        except BaseException as error:  # re-raised in the caller's thread
            box["error"] = error

    thread = threading.Thread(target=target, name="attnflow-worker", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.25)
    if "error" in box:
        raise box["error"]
    return box["value"]


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}{_TMP_SUFFIX}")


def _alive(tmp: Path) -> bool:
    """Whether the process that named the temporary file `tmp` (`_temporary`) still runs."""
    try:
        pid = int(tmp.name[: -len(_TMP_SUFFIX)].rsplit(".", 1)[1].split("-")[0])
        os.kill(pid, 0)
    except (ValueError, IndexError, ProcessLookupError):
        return False
    except PermissionError:
        return True  # another user's
    return True


def _previous(path: Path) -> Path:
    """Where a folder being replaced waits while its replacement is renamed in."""
    return path.with_name(f".{path.name}.old")


def _remove(path: Path) -> None:
    """Remove a file or a folder (a temporary one, a replaced one); gone already is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def replacing(path: str | os.PathLike, *, folder: bool = False) -> Iterator[Path]:
    """`with replacing(path) as tmp:` write `tmp` (a file, or with `folder` a folder of
    files, its parent folder created if need be); when the block ends `tmp` replaces
    `path`, whole or not at all.

    `tmp` is a temporary name in the same folder, known while it is written
    (`discard_partial_files`); it gets the mode the umask gives (some writers, such as
    safetensors, make their files readable by their owner only) and is renamed into
    place; the temporary files of writers no longer running are removed first. A
    folder replaces its previous self by two renames that no interrupt
    separates; a crash between them leaves the previous folder beside it, which
    `recover` puts back. When the block fails `tmp` is removed, `path` is untouched, and
    a write that failed for want of room (a full disk, a quota, a folder made read-only)
    raises `StorageError` naming `path`.
    """
    path = Path(path)
    if folder:
        _make_folder(path.parent)
        recover(path)
    for stale in path.parent.glob(f".{path.name}.*{_TMP_SUFFIX}"):
        if folder or not _alive(stale):
            _remove(stale)  # left by a writer that was killed, or exited on Ctrl-C
    tmp = _temporary(path)
    with _PARTIAL_LOCK:
        _PARTIAL.add(tmp)
    try:
        if folder:
            tmp.mkdir()
            mode = tmp.stat().st_mode & 0o666  # the umask's, less the execute bits
        else:
            os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            mode = tmp.stat().st_mode & 0o777
        yield tmp
        for file in [*tmp.rglob("*")] if folder else [tmp]:
            if file.is_file() and file.stat().st_mode & 0o777 != mode:
                file.chmod(mode)
        # Under the lock: an interrupt handler that discards partial files either runs
        # before the rename (and removes tmp) or after it (nothing to remove).
        with _interrupts_deferred(), _PARTIAL_LOCK:
            if folder and path.exists():
                _remove(_previous(path))
                os.replace(path, _previous(path))
            os.replace(tmp, path)
            _PARTIAL.discard(tmp)
    except BaseException as error:
        with _PARTIAL_LOCK, contextlib.suppress(OSError):
            _PARTIAL.discard(tmp)
            _remove(tmp)
        reason = _write_failure(error)
        if reason is not None:
            failure = StorageError(f"cannot write {path} ({reason})")
            failure.strerror = reason  # what `error.strerror` says of an OSError
            raise failure from error
        raise
    if folder:
        _remove(_previous(path))


def recover(path: str | os.PathLike) -> None:
    """Put back the previous folder of a `replacing(path, folder=True)` that died
    between its two renames."""
    path = Path(path)
    if not path.exists() and _previous(path).is_dir():
        os.replace(_previous(path), path)


@contextlib.contextmanager
def _interrupts_deferred():
    """Hold Ctrl-C and SIGTERM back while a rename or two run, then hand the signals that
    came to the handlers they were meant for (main thread only: no other thread gets
    signals)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    previous = {
        s: signal.signal(s, lambda number, frame: caught.append(number)) for s in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    for number in dict.fromkeys(caught):
        signal.raise_signal(number)


def write_atomically(path: str | os.PathLike, write: Callable[[Path], object]) -> Path:
    """`write(tmp)` a file that then replaces `path` (see `replacing`); the write runs in
    a worker thread, so that Ctrl-C stops the wait (`in_background`). A worker abandoned
    that way removes, when its write returns, the file it was writing: the interrupt
    may come before the writer (re)creates it, after `replacing` has cleaned up."""
    with replacing(path) as tmp:

        def work():
            try:
                write(tmp)
            finally:
                with _PARTIAL_LOCK:
                    if tmp not in _PARTIAL:  # abandoned (Ctrl-C): what the writer made since goes too
                        _remove(tmp)

        in_background(work)
    return Path(path)


def _make_folder(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise StorageError(f"cannot create {folder} ({error.strerror or error})") from error


def _write_failure(error: BaseException) -> str | None:
    """Why a file could not be written, for the errors that say so: an `OSError` (a full
    disk, a quota, a folder made read-only or removed) and the netCDF library's own
    errors (it reports a full disk as "NetCDF: HDF error")."""
    if isinstance(error, OSError):
        return error.strerror or str(error) or type(error).__name__
    if isinstance(error, RuntimeError) and str(error).startswith("NetCDF:"):
        return str(error)
    return None


def discard_partial_files() -> None:
    """Remove every temporary file still being written (for an interrupt handler)."""
    with _PARTIAL_LOCK:
        for tmp in list(_PARTIAL):
            _remove(tmp)
            _PARTIAL.discard(tmp)


@dataclasses.dataclass
class Results:
    """A study's results as NetCDF lays them out: coordinates and variables (named
    dimensions, values, attributes), global attributes, and the encoding of integer
    variables with missing entries (stored as floats with NaN here, written as int32
    with a `_FillValue`). `to_xarray` gives the Dataset that `write_results` writes and
    reading the file back with xarray gives.
    """

    coords: dict[str, tuple[tuple[str, ...], Any, dict]]
    data_vars: dict[str, tuple[tuple[str, ...], Any, dict]]
    attrs: dict[str, str]
    encoding: dict[str, dict] = dataclasses.field(default_factory=dict)

    def to_xarray(self):
        import xarray as xr  # lazy: start-up (xarray and pandas, when a file is read or written)

        ds = xr.Dataset(
            {name: (dims, values, attrs) for name, (dims, values, attrs) in self.data_vars.items()},
            coords={name: (dims, values, attrs) for name, (dims, values, attrs) in self.coords.items()},
            attrs=dict(self.attrs),
        )
        for name, encoding in self.encoding.items():
            ds[name].encoding.update(encoding)
        return ds


def write_results(results, path: str | os.PathLike) -> Path:
    """Write `Results` (or an xarray Dataset) to NetCDF with xarray, whole or not at all:
    a temporary file in the same folder, then a rename. An existing file is only ever
    replaced by a complete one. A Dataset's variables are written with their
    `encoding`, and laid out as CF-1.8 asks (`attnflow.storage._cf.netcdf_layout`: text
    as characters, read back as text)."""
    path = Path(path)
    _make_folder(path.parent)
    if isinstance(results, Results):
        results = results.to_xarray()
    laid_out = netcdf_layout(results)
    return write_atomically(path, lambda tmp: laid_out.to_netcdf(tmp, engine="netcdf4"))


def load_results(path: str | os.PathLike):
    """Read a `results.nc` written by attnflow (its config is `ds.attrs['config']`). The
    config of a file written before keys were renamed (and its panels' configs,
    `panel_configs`) is given with the new names (`attnflow.schema._config.current_config`);
    the other attributes and the variables are as stored."""
    import xarray as xr  # lazy: start-up (xarray and pandas, when a file is read or written)

    with xr.open_dataset(path, engine="netcdf4") as ds:
        ds = ds.load()
    for name in ("config", "panel_configs"):
        text = ds.attrs.get(name)
        try:
            stored = read_config(path, text) if isinstance(text, str) else None
        except (yaml.YAMLError, ConfigError):  # not attnflow's: given as it is
            continue
        if not isinstance(stored, dict):
            continue
        current = current_config(stored) if name == "config" else {k: current_config(v) for k, v in stored.items()}
        if current != stored:
            ds.attrs[name] = yaml.safe_dump(current, sort_keys=True)
    return ds


_RUN_ADVICE = "remove it, choose another hydra.run.dir, or set overwrite=true to replace it"


def stored_config(path: Path, advice: str = _RUN_ADVICE, *, identity: bool = False) -> str:
    """The config YAML stored in a results file; raises `ConfigError` (ending with
    `advice`, by default a run's) if the file is not a readable attnflow results file.
    With `identity`, the run's identity as `attnflow.running._study.run_identity` writes it: the
    config and the digest of the researcher's code it named (`code_digest`), if any."""
    import netCDF4  # lazy: start-up

    try:
        with netCDF4.Dataset(path) as f:  # only the attributes are read
            config = f.getncattr("config") if "config" in f.ncattrs() else None
            digest = f.getncattr("code_digest") if "code_digest" in f.ncattrs() else None
    except (OSError, ValueError, RuntimeError) as error:
        raise ConfigError(
            f"{path} exists but is not a readable NetCDF file ({type(error).__name__}); {advice}."
        ) from None
    if not isinstance(config, str):
        raise ConfigError(f"{path} is not an attnflow results file (it stores no config); {advice}.")
    return config + (f"code_digest: {digest}\n" if identity and isinstance(digest, str) else "")


def read_config(source: str | os.PathLike, text: str | bytes | None = None) -> Any:
    """The value of config YAML that attnflow wrote, read back with bounded work: `text`,
    stored in `source` (a results file's `config` attribute), or the file `source`
    itself when `text` is None (a pieces folder's `plan.txt`, a job's
    `.hydra/overrides.yaml`; at most `CONFIG_BYTES` of it are read).

    Raises `ConfigError`, in one sentence naming `source`, for more than `CONFIG_BYTES`
    of text, nesting deeper than `CONFIG_DEPTH`, or YAML aliases that expand beyond
    `CONFIG_ENTRIES` entries or into themselves: the entries are counted over the
    parser's events, an alias by the count remembered for its anchor, so that nothing is
    expanded or even composed before the count is known. Text that is not plain YAML (a
    Python tag included) raises `yaml.YAMLError`, a file that cannot be read `OSError`.
    """
    if text is None:
        with open(source, "rb") as file:
            text = file.read(CONFIG_BYTES + 1)
    if len(text) > CONFIG_BYTES:
        raise ConfigError(
            f"{source} holds a config of more than {CONFIG_BYTES // 2**20} MiB, larger than any "
            "attnflow writes; it is not attnflow's."
        )
    counted = 0  # entries (scalars, lists, mappings) with every alias expanded, so far
    opened: list[tuple[str | None, int]] = []  # the open lists and mappings: anchor, count at their start
    sizes: dict[str, int] = {}  # the expanded entries of each anchored node
    for event in yaml.parse(text, Loader=_YAML_LOADER):
        if isinstance(event, yaml.AliasEvent):
            if any(anchor == event.anchor for anchor, _ in opened):
                raise ConfigError(
                    f"{source} holds a config that contains itself (a recursive YAML alias); it is not attnflow's."
                )
            counted += sizes.get(event.anchor, 1)  # an unknown anchor: the loader names it below
        elif isinstance(event, yaml.ScalarEvent):
            counted += 1
            if event.anchor is not None:
                sizes[event.anchor] = 1
        elif isinstance(event, yaml.CollectionStartEvent):
            opened.append((event.anchor, counted))
            counted += 1
            if len(opened) > CONFIG_DEPTH:
                raise ConfigError(
                    f"{source} holds a config nested deeper than {CONFIG_DEPTH} levels; it is not attnflow's."
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, start = opened.pop()
            if anchor is not None:
                sizes[anchor] = counted - start
        if counted > CONFIG_ENTRIES:
            raise ConfigError(
                f"{source} holds a config that expands beyond {CONFIG_ENTRIES} entries (a YAML "
                "alias bomb?); it is not attnflow's."
            )
    return yaml.load(text, Loader=_YAML_LOADER)


class PieceStore:
    """The finished pieces of one run, each an `.npz` file (read without pickle), kept
    in a folder whose `plan.txt` names the config and the cut into pieces.

    Pieces of another config in the folder are refused with a `ConfigError` naming the
    settings that differ, unless `discard`; pieces of the same config cut otherwise are
    computed again. Nothing but the store's own files (pieces, plan, temporary files) is
    ever removed from the folder. A piece that cannot be read (cut short by a kill, or
    whose arrays' headers declare what it cannot hold: see `load`) is removed and
    computed again; `damaged` lists them."""

    def __init__(self, folder: Path, identity: str, *, discard: bool = False):
        self.folder = Path(folder)
        self.damaged: list[Path] = []
        marker = self.folder / "plan.txt"
        planned = _text(marker)
        if self.folder.is_dir() and planned != identity and not _renamed_only(planned, identity, marker):
            foreign = _foreign(self.folder, _planned(identity))
            if foreign is not None and not discard:
                raise ConfigError(
                    f"{self.folder} holds {foreign}; run that config again to resume them, give "
                    "another pieces folder, or set overwrite=true to discard them."
                )
            _clear(self.folder)
        _make_folder(self.folder)
        for stale in self.folder.glob(f"*{_TMP_SUFFIX}"):
            _remove(stale)  # a killed writer's leftovers
        if _text(marker) != identity:  # none yet, or this run's plan under the keys' old names
            write_atomically(marker, lambda tmp: tmp.write_text(identity))

    def _path(self, index: int) -> Path:
        return self.folder / f"piece-{index:05d}.npz"

    def load(self, index: int, rows: int | None = None) -> dict[str, np.ndarray] | None:
        """The arrays of piece `index`, None when it is not there or damaged (then it is
        removed and listed in `damaged`). Each array's `.npy` header is read first: a
        piece is damaged when an array is of an object or structured type, declares
        more bytes than the piece stores for it (nothing is allocated for it), or, with
        `rows`, does not hold `rows` rows (its leading dimension)."""
        path = self._path(index)
        if not path.exists():
            return None
        try:
            size = path.stat().st_size
            with zipfile.ZipFile(path) as archive:
                for member in archive.infolist():
                    _check_member(archive, member, rows, size)
            with np.load(path, allow_pickle=False) as data:
                return {name.replace("__", "/"): data[name] for name in data.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile):
            path.unlink(missing_ok=True)  # a damaged piece is recomputed
            self.damaged.append(path)
            return None

    def save(self, index: int, out: dict[str, np.ndarray]) -> None:
        def write(tmp: Path):
            with open(tmp, "wb") as f:
                np.savez(f, **{name.replace("/", "__"): value for name, value in out.items()})  # pyright: ignore[reportArgumentType] numpy's stubs take the arrays for allow_pickle

        write_atomically(self._path(index), write)

    def count(self) -> int:
        return len(list(self.folder.glob("piece-*.npz")))


def _check_member(archive: zipfile.ZipFile, member: zipfile.ZipInfo, rows: int | None, size: int) -> None:
    """Raise `ValueError` unless `member` of a piece (a file of `size` bytes) is an array
    as `PieceStore.save` writes it: stored uncompressed, as `np.savez` stores, within
    the file (its sizes in the archive's directory are data too), of a plain dtype, its
    declared shape filling no more than the bytes stored for it, with `rows` rows when
    given. Only its header is read."""
    if member.compress_type != zipfile.ZIP_STORED or member.file_size != member.compress_size:
        raise ValueError(f"{member.filename} is not stored as np.savez stores it")
    if member.header_offset + member.compress_size > size:
        raise ValueError(f"{member.filename} runs past the end of the piece")
    with archive.open(member) as file:
        version = np.lib.format.read_magic(file)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(file)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(file)
        else:
            raise ValueError(f"{member.filename} has .npy format {version}")
    if dtype.hasobject or dtype.fields is not None:
        raise ValueError(f"{member.filename} holds {dtype}, not numbers")
    if math.prod(shape) * dtype.itemsize > member.file_size:
        raise ValueError(f"{member.filename} declares shape {shape} of {dtype}, more than its {member.file_size} bytes")
    if rows is not None and (not shape or shape[0] != rows):
        raise ValueError(f"{member.filename} has shape {shape}, not {rows} rows")


def finished_pieces(folder: Path) -> int:
    """How many finished pieces a run's pieces folder holds (its panels' included)."""
    return sum(1 for _ in Path(folder).rglob("piece-*.npz"))


def _text(path: Path) -> str | None:
    """A pieces folder's `plan.txt`, None when it cannot be read or is larger than any
    config (`CONFIG_BYTES`: no more is read)."""
    try:
        with open(path, "rb") as file:
            data = file.read(CONFIG_BYTES + 1)
        return data.decode() if len(data) <= CONFIG_BYTES else None
    except (OSError, UnicodeDecodeError):
        return None


def _renamed_only(planned: str | None, identity: str, source: str | os.PathLike) -> bool:
    """Whether a pieces folder's plan (`planned`, its `plan.txt`) is `identity` but for
    the names of keys renamed since (a run of an attnflow before them): its pieces are
    this run's."""
    try:
        there = read_config(source, planned) if planned is not None else None
    except (yaml.YAMLError, ConfigError):
        return False
    return isinstance(there, dict) and current_config(there) == read_config(source, identity)


def _current_identity(identity: str, source: str | os.PathLike) -> str:
    """A stored identity (`attnflow.running._study.run_identity`: the config's YAML, then the
    line of its code digest) with the keys renamed since under their new names, as this
    attnflow writes it; the text itself when nothing was renamed (or it is not YAML)."""
    try:
        stored = read_config(source, identity)
    except (yaml.YAMLError, ConfigError):
        return identity
    current = current_config(stored)
    if current == stored or not isinstance(current, dict):
        return identity
    digest = current.pop("code_digest", None)
    return yaml.safe_dump(current, sort_keys=True) + (f"code_digest: {digest}\n" if digest is not None else "")


def _planned(identity: str | None, source: str | os.PathLike = "plan.txt") -> dict | None:
    """The config of a pieces folder's plan (its `plan.txt`, `source`: the config's YAML
    and the line `pieces: N of M`), with the keys renamed since under their new names;
    None when it names none (or is not attnflow's)."""
    try:
        plan = read_config(source, identity) if identity is not None else None
    except (yaml.YAMLError, ConfigError):
        return None
    if not isinstance(plan, dict):
        return None
    plan.pop("pieces", None)
    return current_config(plan)


def _foreign(folder: Path, config: dict | None) -> str | None:
    """What the finished pieces in `folder` (not its subfolders) are, when they belong to
    another config than `config`: `2 finished pieces of a run with n=4 (this one has n=5)`."""
    count = len(list(folder.glob("piece-*.npz")))
    there = _planned(_text(folder / "plan.txt"), folder / "plan.txt")
    if not count or (there is not None and there == config):
        return None
    pieces = f"{count} finished piece{'s' if count > 1 else ''}"
    if there is None:
        return f"{pieces} of a run whose config they do not name"
    changes = _differences(there, config or {})
    if not changes:
        return f"{pieces} of another run"
    shown = changes[:3]
    more = f" and {len(changes) - 3} more settings" if len(changes) > 3 else ""
    return (
        f"{pieces} of a run with {', '.join(f'{key}={a}' for key, a, _ in shown)}{more} (this one has "
        f"{', '.join(f'{key}={b}' for key, _, b in shown)})"
    )


def _differences(there: Mapping, here: Mapping, prefix: str = "") -> list[tuple[str, str, str]]:
    """The settings (dotted names) whose values differ, with both values as typed."""
    changes = []
    for key in sorted(set(there) | set(here), key=str):
        a, b = there.get(key, "(absent)"), here.get(key, "(absent)")
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            changes += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            changes.append((f"{prefix}{key}", _shown(a), _shown(b)))
    return changes


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _clear(folder: Path) -> None:
    """Remove a pieces folder's own files (not its subfolders, nor anything else)."""
    for path in [*folder.glob("piece-*.npz"), folder / "plan.txt"]:
        path.unlink(missing_ok=True)


class RunDirectory:
    """The folder of one run, checked and locked before anything is computed.

    Entering it creates the folder, checks that files can be written there, takes an
    exclusive lock (a second run in the same folder is refused at once, not allowed to
    replace the first one's results), and removes temporary files that a killed run
    left. `results` says what is already there. `setting` is what the user gave the
    folder with, named in the refusals (`hydra.run.dir`; `out` for `attnflow train`).
    """

    PIECES = ".attnflow-pieces"

    def __init__(self, path: str | os.PathLike, setting: str = "hydra.run.dir"):
        self.path = Path(path)
        self.setting = setting
        self._fd: int | None = None

    def __enter__(self) -> RunDirectory:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ConfigError(
                f"cannot create the run directory {self.path} ({error.strerror}); choose another {self.setting}."
            ) from None
        if not self.path.is_dir():
            raise ConfigError(f"the run directory {self.path} is not a directory; choose another {self.setting}.")
        self._fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(self._fd)
            self._fd = None
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise ConfigError(
                    f"another attnflow run is working in {self.path}; wait for it to finish or "
                    f"choose another {self.setting}."
                ) from None
            raise
        try:
            probe = _temporary(self.path / "probe")
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as error:
            self.__exit__(None, None, None)
            raise ConfigError(
                f"cannot write in the run directory {self.path} ({error.strerror}); choose another {self.setting}."
            ) from None
        for stale in self.path.glob(f".*{_TMP_SUFFIX}"):
            _remove(stale)
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None

    @property
    def results_path(self) -> Path:
        return self.path / "results.nc"

    def finished_config(self, overwrite: bool) -> str | None:
        """The identity (config, and code digest) stored by a finished run here, or None
        when there is none (or it will be overwritten), with the keys renamed since under
        their new names. A `results.nc` that is a folder is refused, and so is an
        unreadable one unless `overwrite`."""
        path = self.results_path
        if path.is_dir():
            raise ConfigError(f"{path} is a directory, not a results file; remove it or choose another hydra.run.dir.")
        if not path.exists():
            return None
        if overwrite:
            try:
                return _current_identity(stored_config(path, identity=True), path)
            except ConfigError:
                return None
        return _current_identity(stored_config(path, identity=True), path)

    def claim_pieces(self, configs: Mapping[str, str], overwrite: bool) -> str | None:
        """Check that the finished pieces here belong to this run, whose pieces folders
        (`.` for a study, a panel's label for an experiment) have the configs `configs`
        (YAML). Pieces of another run are refused with a `ConfigError` naming the settings
        that differ, or removed with `overwrite`: then the returned line says what was
        discarded."""
        root = self.path / self.PIECES
        wanted = {label: _planned(config) for label, config in configs.items()}
        found = []
        for store in sorted({piece.parent for piece in root.rglob("piece-*.npz")}):
            label = store.relative_to(root).as_posix()
            if label in wanted:
                foreign = _foreign(store, wanted[label])
            else:
                count = len(list(store.glob("piece-*.npz")))
                foreign = (
                    f"{count} finished piece{'s' if count > 1 else ''} of "
                    f"{'a study' if label == '.' else f'panel {label}'}, which this run does not have"
                )
            if foreign is not None:
                found.append((store, foreign))
        if not found:
            return None
        description = found[0][1] + (f", and more in {len(found) - 1} other folders" if len(found) > 1 else "")
        if not overwrite:
            raise ConfigError(
                f"{root} holds {description}; run that config again to resume them, choose another "
                "hydra.run.dir, or set overwrite=true to discard them."
            )
        for store, _ in found:
            _clear(store)
        return f"discarding {description} in {root} (overwrite=true)."

    def write_text(self, relative: str, text: str) -> Path:
        target = self.path / relative
        _make_folder(target.parent)
        return write_atomically(target, lambda tmp: tmp.write_text(text))
