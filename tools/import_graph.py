"""The import graph of attnflow, from the code, as a mermaid diagram for docs/architecture.md.

grimp (which import-linter uses) reads every import of the package, those inside
functions too. Each subpackage is drawn as one node (its modules import only within it and
downward), each folder of the core (`attnflow/schema/`, ...) too, inside one subgraph; an
arrow `a --> b` says that a imports b. The script fails if an arrow points up a layer
(the order of pyproject.toml's layered contract), so the picture it prints has none.

    python tools/import_graph.py            # the mermaid diagram
    python tools/import_graph.py --lazy     # the imports left inside functions, and why
"""

from __future__ import annotations

import argparse
import ast
import sys
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]


# The folders of the core (the bottom layers of the contract), drawn in one subgraph.
CORE = ("presentation", "running", "storage", "numerics", "schema")


def layers() -> list[list[str]]:
    """The modules of each layer, top first (pyproject.toml's layered contract)."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layered,) = [c for c in contracts if c["type"] == "layers"]
    return [[m.strip() for m in layer.replace("|", ":").split(":")] for layer in layered["layers"]]


def node(module: str, named: list[str]) -> str:
    """The drawn node of a module: the module or package a layer of the contract names that
    holds it (a subpackage, a folder of the core), else its subpackage (the root
    package's `__init__` is the package itself)."""
    holders = [name for name in named if module == name or module.startswith(name + ".")]
    if holders:
        return max(holders, key=len)
    parts = module.split(".")
    return ".".join(parts[:2])


def mermaid() -> str:
    order = layers()
    named = [m for layer in order for m in layer]
    rank = {m: i for i, layer in enumerate(order) for m in layer}
    graph = grimp.build_graph("attnflow", cache_dir=None)
    edges = set()
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            a, b = node(importer, named), node(imported, named)
            if a != b and a != "attnflow" and b != "attnflow":
                edges.add((a, b))
    upward = sorted((a, b) for a, b in edges if rank[a] > rank[b])
    ignored = {("attnflow.analysis", "attnflow.checkpoints")}  # pyproject.toml: removed by the time-loop change
    if set(upward) - ignored:
        sys.exit(f"imports up a layer: {sorted(set(upward) - ignored)}")
    label = lambda m: m.removeprefix("attnflow.")
    ident = lambda m: "m" + label(m).replace(".", "_")  # mermaid ids: no leading underscore
    core = [f"attnflow.{folder}" for folder in CORE]
    lines = ["flowchart TD"]
    lines.extend(f'    {ident(m)}["{label(m)}"]' for m in named if m not in core)
    lines.append("    subgraph core")
    lines.extend(f'        {ident(m)}["{label(m)}"]' for m in named if m in core)
    lines.append("    end")
    for a, b in sorted(edges, key=lambda e: (rank[e[0]], e[0], rank[e[1]], e[1])):
        arrow = "-.->" if (a, b) in upward else "-->"  # dotted: the one ignored upward import
        lines.append(f"    {ident(a)} {arrow} {ident(b)}")
    return "\n".join(lines)


def lazy() -> str:
    """A markdown table: each import left inside a function, and the comment or module
    docstring line that says why."""
    rows = ["| module | line | import | why |", "|---|---|---|---|"]
    for path in sorted((ROOT / "attnflow").rglob("*.py")):
        source = path.read_text()
        lines = source.splitlines()
        for statement in ast.walk(ast.parse(source)):
            if isinstance(statement, (ast.Import, ast.ImportFrom)) and statement.col_offset > 0:
                text = " ".join(line.strip() for line in lines[statement.lineno - 1: statement.end_lineno])
                code, _, why = text.partition("#")
                rows.append(f"| {path.relative_to(ROOT)} | {statement.lineno} | `{code.strip()}` | {why.strip()} |")
    return "\n".join(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lazy", action="store_true", help="list the imports inside functions instead")
    args = parser.parse_args()
    print(lazy() if args.lazy else mermaid())


if __name__ == "__main__":
    main()
