"""The shape of the package: its layers only import downward, with no import circle
(the import-linter contracts of pyproject.toml), and its public names, loaded lazily,
are the names of its `.pyi` stubs, which editors and type checkers read."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "attnflow"
STUBBED = ("attnflow", "attnflow.checkpoints", "attnflow.diffeqformer", "attnflow.experiments")


# The core: the folders of its jobs, the bottom layers of the contract (top to bottom:
# presentation > running > storage | numerics > schema). Each core module is a file of one of them.
CORE = ("presentation", "running", "storage", "numerics", "schema")


def _contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _layers() -> list[set[str]]:
    (layered,) = [c for c in _contracts() if c["type"] == "layers"]
    return [{part.strip() for part in layer.replace("|", ":").split(":")} for layer in layered["layers"]]


def test_import_contracts_are_kept():
    """`lint-imports`: no layer imports one above it, no module imports the package's
    lazy front door, no two modules of a package import each other (in a circle)."""
    command = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(command), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


def test_every_module_has_a_layer():
    """Each module and subpackage at the top of attnflow (a new one too) is in a layer of
    the contract, so the contract constrains all of them; the core is the folders of its
    jobs, the bottom layers, which hold every core module:
    `presentation/`, `running/`, `storage/`, `numerics/`, `schema/`."""
    layered = set().union(*_layers())
    modules = {f"attnflow.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    modules |= {f"attnflow.{p.parent.name}" for p in PACKAGE.glob("*/__init__.py")}
    assert modules - layered == set(), "add these modules to a layer in pyproject.toml's [tool.importlinter]"
    assert layered - modules == set(), "these layers name modules that do not exist"
    assert set().union(*_layers()[-4:]) == {f"attnflow.{folder}" for folder in CORE}


def _stub_names(package: str) -> dict[str, str]:
    """name -> the module the package's `__init__.pyi` imports it from."""
    stub = Path(importlib.import_module(package).__file__).with_suffix(".pyi")
    names = {}
    for node in ast.parse(stub.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            assert node.level == 1 and node.module, f"{stub}: only `from .module import name as name`"
            for alias in node.names:
                assert alias.asname in (None, alias.name), f"{stub}: {alias.name} is renamed"
                names[alias.name] = f"{package}.{node.module}"
        elif isinstance(node, ast.Assign) and node.targets[0].id == "__all__":
            listed = ast.literal_eval(node.value)
    assert sorted(listed) == sorted(names), f"{stub}: __all__ is not the list of the names it imports"
    return names


@pytest.mark.parametrize("package", STUBBED)
def test_stub_names_are_the_public_names(package):
    """Every name of the stub resolves, to the object of the module it names, and the
    stub's names are the package's `__all__` and `dir()`."""
    module = importlib.import_module(package)
    names = _stub_names(package)
    assert sorted(names) == sorted(module.__all__) == sorted(dir(module))
    for name, where in names.items():
        assert getattr(module, name) is getattr(importlib.import_module(where), name), name
    with pytest.raises(AttributeError):
        getattr(module, "no_such_name")


def test_typed_package_data():
    """The wheel carries py.typed and the stubs (PEP 561)."""
    assert (PACKAGE / "py.typed").is_file()
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert {"py.typed", "*.pyi"} <= set(data["attnflow"])
    for package in STUBBED[1:]:
        assert "*.pyi" in data[package]


def test_import_attnflow_loads_no_dependency():
    """`import attnflow` imports none of its heavy dependencies: they load with the
    first name that needs them."""
    heavy = ("jax", "equinox", "diffrax", "xarray", "matplotlib", "hydra", "omegaconf", "optax", "tokenizers")
    code = ("import sys, attnflow, attnflow.checkpoints, attnflow.diffeqformer; "
            f"print(' '.join(m for m in {heavy!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == []


def test_the_pictured_import_graph_is_the_codes():
    """docs/architecture.md draws the import graph that tools/import_graph.py reads from
    the code today (regenerate it with that script when this fails)."""
    graph = subprocess.run([sys.executable, str(ROOT / "tools" / "import_graph.py")], capture_output=True, text=True,
                           check=True).stdout.strip()
    page = (ROOT / "docs" / "architecture.md").read_text()
    drawn = page.split("```mermaid\n", 1)[1].split("```", 1)[0].strip()
    assert drawn == graph


def test_every_subpackage_is_shipped():
    """pyproject.toml lists the packages a wheel holds: a subpackage missing there is
    missing from every non-editable install."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.relative_to(ROOT).parent.parts) for p in (ROOT / "attnflow").rglob("__init__.py")}
    assert found <= listed, sorted(found - listed)


def test_every_core_module_has_a_test_file_of_its_own():
    """`attnflow/FOLDER/_name.py` (a folder of the core) and `attnflow/_name.py` are tested by
    a file `tests/<folder>/test_name.py` (issue 35)."""
    tests = {path.stem for path in (ROOT / "tests").glob("*/test_*.py")}
    paths = [*PACKAGE.glob("_*.py"), *(path for folder in CORE for path in (PACKAGE / folder).glob("_*.py"))]
    modules = {path.stem.lstrip("_") for path in paths if path.stem != "__init__"}
    assert {f"test_{m}" for m in modules} <= tests, sorted(m for m in modules if f"test_{m}" not in tests)
