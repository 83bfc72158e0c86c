"""Running the `attnflow` command from the tests: as a subprocess (the console script,
or `python -m attnflow.cli`), or in this process (the `command` fixture), and the
checks of what a run printed and wrote. Shared by the tests of every folder."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import netCDF4
import pytest
import xarray as xr

from attnflow.storage._cf import CONVENTIONS, LONG_NAME_LIMIT

# The console script installed next to this interpreter (pip puts both in the same bin/).
ATTNFLOW = Path(sys.executable).with_name("attnflow")
if not ATTNFLOW.exists():
    ATTNFLOW = Path(shutil.which("attnflow") or ATTNFLOW)

def environment(**extra: str) -> dict:
    """The environment a command runs in: this one on the CPU, without HYDRA_FULL_ERROR
    (it would turn the one-line errors into tracebacks), with `extra` on top."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", **extra)
    env.pop("HYDRA_FULL_ERROR", None)
    return env


def one_sentence(error: pytest.ExceptionInfo) -> str:
    """The message of a raised error, checked to be one sentence: one line, ending with a
    full stop, short."""
    message = str(error.value)
    assert "\n" not in message and message.endswith(".") and len(message) < 400, message
    return message


def attnflow(*args: str, cwd: Path, module: bool = False, env: dict | None = None,
             umask: int | None = None) -> subprocess.CompletedProcess:
    """Run the command (the console script, or `python -m attnflow.cli`) on the CPU."""
    env = environment(**(env or {}))
    command = [sys.executable, "-m", "attnflow.cli"] if module else [str(ATTNFLOW)]
    assert module or ATTNFLOW.exists(), f"the attnflow console script is not installed next to {sys.executable}"
    return subprocess.run(command + list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
                          preexec_fn=None if umask is None else lambda: os.umask(umask))


@pytest.fixture
def command(monkeypatch, capsys, tmp_path):
    """`attnflow ARGS` run in this process (`attnflow.cli.main`, as the console script
    calls it): returns its exit code and its stderr lines (its stdout is then `run.out`, also `run.stdout`).
    For refusals whose process behaviour (exit 2, one line, no traceback) a subprocess
    test already shows: the message itself is checked here without paying a Python and
    JAX start-up each."""
    import signal

    from attnflow import cli

    def run(*args: str) -> tuple[int, list[str]]:
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("HYDRA_FULL_ERROR", "0")  # main sets it; restored afterwards
        monkeypatch.setattr(sys, "argv", ["attnflow", *args])
        for name, empty in (("_FAILED", []), ("_JOBS", []), ("_CURRENT", {})):
            monkeypatch.setattr(cli, name, empty)
        previous = signal.getsignal(signal.SIGTERM)
        try:
            cli.main()
            code = 0
        except SystemExit as exit:
            code = exit.code
        finally:
            signal.signal(signal.SIGTERM, previous)
        captured = capsys.readouterr()
        run.out, err = captured.out, captured.err
        run.stdout = run.out
        assert "Traceback" not in err, err
        return code, [line for line in err.splitlines() if line.strip()]

    run.stdout = ""  # what the last command printed on stdout
    return run


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


# The CF checker (cfchecker 4.1.0, pinned in the test extra; it needs the udunits2
# library, which .ci/run installs) and its tables: they would be downloaded, so small
# offline ones ship in tests/cf_tables (attnflow uses no standard name, area type or region).
CFCHECKS = Path(sys.executable).with_name("cfchecks")
CF_TABLES = Path(__file__).parent / "cf_tables"
CF_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def cf_counts(paths: list[Path], tmp_path: Path) -> list[tuple[int, int, str]]:
    """`cfchecks -v 1.8` on copies of `paths` that declare CF-1.8 (the files declare
    the version they follow, `CONVENTIONS`, which no checker knows yet), all in one call
    of the checker, with the offline tables: each file's errors, warnings and what the
    checker printed of it. A crash of the checker fails."""
    assert CFCHECKS.exists(), "cfchecks is not installed: pip install '.[test]' (cfchecker==4.1.0)"
    copies = []
    for number, path in enumerate(paths):
        copy = tmp_path / f"cf18-{number}-{path.parent.name}-{path.name}"
        shutil.copyfile(path, copy)
        with netCDF4.Dataset(copy, "a") as f:
            assert f.getncattr("Conventions") == CONVENTIONS, path  # what the file follows, declared as written
            f.setncattr("Conventions", "CF-1.8")
        copies.append(copy)
    tables = ["-s", CF_TABLES / "standard-name-table.xml", "-a", CF_TABLES / "area-type-table.xml",
              "-r", CF_TABLES / "region-list.xml"]
    proc = subprocess.run([str(CFCHECKS), "-v", "1.8", *map(str, tables), *map(str, copies)], capture_output=True,
                          text=True, timeout=120)
    out = proc.stdout + proc.stderr
    if "udunits" in out.lower() and "Traceback" in out:
        pytest.fail("cfchecker needs the udunits2 library: apt-get install libudunits2-0 (.ci/run installs it)")
    assert "Traceback" not in out, out
    reports = out.split("CHECKING NetCDF FILE: ")[1:]
    assert len(reports) == len(copies), out
    counts = []
    for copy, text in zip(copies, reports):
        assert text.startswith(str(copy)), (copy, out)
        errors = re.search(r"ERRORS detected: (\d+)", text)
        warnings = re.search(r"WARNINGS given: (\d+)", text)
        assert errors and warnings, text
        counts.append((int(errors.group(1)), int(warnings.group(1)), text))
    return counts


def assert_cf(tmp_path: Path, *paths: Path) -> list[xr.Dataset]:
    """Each results file passes the CF checker (0 errors, 0 warnings; one call of the
    checker for them all), its names are CF names and its long names short (at most
    `LONG_NAME_LIMIT` characters, the prose in `description`). Returns the files, read."""
    read = []
    for path, (errors, warnings, out) in zip(paths, cf_counts(list(paths), tmp_path)):
        assert (errors, warnings) == (0, 0), f"{path}:\n{out}"
        ds = load(path)
        assert all(CF_NAME.fullmatch(str(name)) for name in [*ds.attrs, *ds.variables]), (path, list(ds.attrs))
        for name, da in ds.variables.items():
            assert len(da.attrs["long_name"]) <= LONG_NAME_LIMIT, (path, name, da.attrs["long_name"])
            if "description" in da.attrs:
                assert len(da.attrs["description"]) > len(da.attrs["long_name"]), (path, name)
        read.append(ds)
    return read
