"""attnflow/ reads as the field's code does: ruff's rules (pycodestyle, pyflakes, isort,
bugbear, pyupgrade; pyproject.toml's `[tool.ruff]`) find nothing, `ruff format` would
change nothing, and pyright in basic mode (`[tool.pyright]`, as equinox and diffrax run
it) finds no type error. Fix a failure with `ruff check --fix attnflow`,
`ruff format attnflow` and `pyright`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUFF = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
PYRIGHT = shutil.which("pyright", path=str(Path(sys.executable).parent)) or shutil.which("pyright")


def _ruff(*args: str) -> subprocess.CompletedProcess:
    assert RUFF is not None, "ruff comes with the test extra: pip install '.[test]'"
    return subprocess.run([RUFF, *args, "attnflow"], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_finds_nothing():
    done = _ruff("check", "--output-format", "concise")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_the_code_is_formatted():
    done = _ruff("format", "--check")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_pyright_finds_no_type_error():
    assert PYRIGHT is not None, "pyright comes with the test extra: pip install '.[test]'"
    done = subprocess.run([PYRIGHT, "--pythonpath", sys.executable], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0 and "0 errors" in done.stdout, done.stdout[-4000:] + done.stderr[-2000:]
