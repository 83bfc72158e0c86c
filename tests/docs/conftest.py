"""The documentation site, built once for the tests that read it (tests/docs/test_site.py
and the browser's checks in tests/docs/test_site_browser.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    """`mkdocs build --strict` into a temporary folder, once for the session: any warning
    (a link to a missing page or anchor, an API entry that names nothing) fails the build."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    pytest.importorskip("mathjax")  # MathJax's files (the django-static-mathjax wheel of the docs extra)
    folder = tmp_path_factory.mktemp("docs") / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return folder
