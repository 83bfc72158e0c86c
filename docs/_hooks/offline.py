"""A mkdocs hook: the built site needs no network. Opened from a web server or as
`file://` on a machine with no internet, every script, stylesheet and font it loads is
its own:

- MathJax 3 renders the equations (its TeX input and SVG output: the SVG output needs no
  web fonts, which a browser refuses to load from `file://`). Its files come from the
  `django-static-mathjax` wheel (MathJax's own release, packaged for PyPI; the docs extra
  installs it) and are copied under `javascripts/mathjax/`.
- plotly.js for the gallery's interactive views: a view written with
  `plotly_js=directory` loads `plotly.min.js` from its own folder, and the installed
  plotly package's copy is put there (the repository keeps none).
- A ```mermaid block (the architecture's import graph) is drawn at build time as an SVG
  image beside its page (matplotlib), so no mermaid.js is fetched; the markdown keeps the
  mermaid text, which a test compares with the code and GitHub draws.

The theme's web fonts are off (`theme.font: false` in mkdocs.yml) and mkdocs-material's
`offline` plugin makes search work from `file://`."""

from __future__ import annotations

import importlib.resources
import io
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import plotly  # noqa: E402
from mkdocs.structure.files import File  # noqa: E402

# The parts of MathJax's `es5/` folder the site ships: the TeX-to-SVG component, the
# TeX extensions it loads on demand (`\boldsymbol`, `\mathtools`, ...) and the menu's.
MATHJAX_PARTS = ("tex-svg.js", "input/tex/extensions", "ui", "a11y")
# how a view written with plotly's include_plotlyjs="directory" loads plotly.js
PLOTLY_BESIDE = 'src="plotly.min.js"'
MERMAID = re.compile(r"^```mermaid\n(.*?)^```\n", re.S | re.M)


def mathjax_folder() -> Path:
    return Path(str(importlib.resources.files("mathjax") / "static" / "mathjax" / "es5"))


def on_files(files, config):
    es5 = mathjax_folder()
    for part in MATHJAX_PARTS:
        path = es5 / part
        for found in [path] if path.is_file() else sorted(path.rglob("*.js")):
            uri = f"javascripts/mathjax/{found.relative_to(es5).as_posix()}"
            files.append(File.generated(config, uri, abs_src_path=str(found)))
    plotly_js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    for view in [f for f in files if f.src_uri.endswith(".html") and f.abs_src_path]:
        if PLOTLY_BESIDE in Path(view.abs_src_path).read_text(errors="replace"):
            uri = f"{view.src_uri.rpartition('/')[0]}/plotly.min.js".removeprefix("/")
            if files.get_file_from_path(uri) is None:
                files.append(File.generated(config, uri, abs_src_path=str(plotly_js)))
    for page in list(files.documentation_pages()):
        for k, block in enumerate(MERMAID.findall(Path(page.abs_src_path).read_text())):
            files.append(File.generated(config, _graph_uri(page.src_uri, k), content=draw_flowchart(block)))
    return files


def _graph_uri(page_uri: str, k: int) -> str:
    return f"{page_uri.removesuffix('.md')}-graph-{k}.svg"


def on_page_markdown(markdown, page, config, files):
    blocks = iter(range(len(MERMAID.findall(markdown))))
    name = Path(page.file.src_uri).name.removesuffix(".md")

    def image(_):
        k = next(blocks)
        return f"![the graph drawn from this page's mermaid text]({name}-graph-{k}.svg)\n"

    return MERMAID.sub(image, markdown)


def parse_flowchart(text: str) -> tuple[dict[str, str], list[tuple[str, str]], dict[str, str]]:
    """The nodes (id -> label), edges and subgraph membership of a mermaid `flowchart TD`."""
    labels, edges, group = {}, [], {}
    current = None
    for line in (line.strip() for line in text.splitlines()):
        if line.startswith("subgraph "):
            current = line.split(None, 1)[1]
        elif line == "end":
            current = None
        elif "-->" in line:
            a, b = (side.strip() for side in line.split("-->"))
            edges.append((a, b))
        elif node := re.fullmatch(r'(\w+)\["(.*)"\]', line):
            labels[node[1]] = node[2]
            if current is not None:
                group[node[1]] = current
    return labels, edges, group


def layers(labels: dict[str, str], edges: list[tuple[str, str]]) -> list[list[str]]:
    """Nodes in layers (each below everything that points to it), ordered within a layer
    by the mean position of their parents, to keep edges short and crossings few."""
    depth = dict.fromkeys(labels, 0)
    for _ in labels:
        for a, b in edges:
            depth[b] = max(depth[b], depth[a] + 1)
    rows = [[n for n in labels if depth[n] == level] for level in range(max(depth.values()) + 1)]
    placed: dict[str, float] = {}  # a node's place across its row, from 0 to 1
    for row in rows:
        def mean_parent(n: str) -> float:
            above = [placed[a] for a, b in edges if b == n and a in placed]
            return sum(above) / len(above) if above else 0.5

        row.sort(key=mean_parent)
        placed.update({n: (i + 0.5) / len(row) for i, n in enumerate(row)})
    return rows


def draw_flowchart(text: str) -> str:
    """An SVG of a mermaid `flowchart TD`: boxes in layers, arrows downward, the nodes of
    a subgraph shaded and named in a legend."""
    labels, edges, group = parse_flowchart(text)
    rows = layers(labels, edges)
    width = max(len(row) for row in rows)
    at = {n: ((i + 0.5) * width / len(row), -level) for level, row in enumerate(rows) for i, n in enumerate(row)}
    fig, ax = plt.subplots(figsize=(max(7.0, 2.2 * width), 0.9 * len(rows) + 0.6))
    for a, b in edges:
        # an edge over several layers bends, the more the longer, away from the boxes between
        span = at[a][1] - at[b][1] - 1
        bend = 0.12 * span * (1 if at[b][0] >= at[a][0] else -1)
        ax.annotate("", xy=at[b], xytext=at[a], arrowprops=dict(
            arrowstyle="-|>", color="0.5", lw=0.7, shrinkA=10, shrinkB=10, connectionstyle=f"arc3,rad={bend:.2f}"))
    shades = {name: colour for name, colour in zip(sorted(set(group.values())), ("#dbe8f6", "#f6e6d0", "#e0f0dc"),
                                                   strict=False)}
    for n, (x, y) in at.items():
        ax.text(x, y, labels[n], ha="center", va="center", fontsize=10, family="monospace",
                bbox=dict(boxstyle="round,pad=0.35", fc=shades.get(group.get(n), "white"), ec="0.3", lw=0.8))
    for name, colour in shades.items():
        ax.scatter([], [], marker="s", s=120, color=colour, edgecolor="0.3", label=name)
    if shades:
        ax.legend(loc="lower left", frameon=False)
    ax.set_xlim(-0.2, width + 0.2)
    ax.set_ylim(-len(rows) + 0.5, 0.5)
    ax.axis("off")
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return buffer.getvalue()
