"""The built site in headless Chromium with the network shut off, opened as file://:
the equations are typeset (by the site's own MathJax), search finds pages, and a
gallery's interactive view draws its plot (with the site's own plotly.js). Skipped where
no Chromium is installed (`apt-get install chromium`); tests/docs/test_site.py checks
without a browser that nothing is loaded from another host."""

import re
import shutil
import subprocess

import pytest

CHROMIUM = next((found for name in ("chromium", "chromium-browser", "google-chrome")
                 if (found := shutil.which(name))), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium to open the site in")


def rendered(url: str) -> str:
    """The page's DOM after its scripts ran, every host unreachable (a proxy that refuses,
    names that resolve to nothing)."""
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--proxy-server=127.0.0.1:9",
                           "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=20000", "--dump-dom", url],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_the_equations_are_typeset_offline(site):
    page = site / "model.html"
    equations = page.read_text().count('class="arithmatex"')
    dom = rendered(page.as_uri())
    assert equations > 50
    assert dom.count("<mjx-container") >= equations   # every one typeset (as SVG)
    assert '<g data-mml-node="merror"' not in dom     # and none of them a TeX error


def test_search_works_from_file(site):
    dom = rendered((site / "index.html").as_uri() + "?q=phase+diagram")
    found = re.search(r'md-search-result__meta">(\d+) matching documents', dom)
    assert found and int(found[1]) >= 3, "search found nothing"
    assert "phase_diagram" in dom.split("md-search-result__meta", 1)[1]


def test_the_interactive_views_draw_offline(site):
    views = sorted((site / "figures").glob("*/*.html"))
    assert views
    for view in views:
        dom = rendered(view.as_uri())
        assert 'class="main-svg"' in dom, f"{view.name}: plotly drew nothing"
