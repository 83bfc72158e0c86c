"""A mkdocs hook: the gallery's figures live in the repository's top-level `figures/`
(one folder per experiment, where `sh experiments/all_figures.sh` draws them), outside
`docs/`, and the site shows them at the same paths, `figures/NAME/...`: the images, PDF
files, animations and interactive views of that folder join mkdocs' files under
`figures/`, so that the pages' links to them (`../figures/NAME/NAME.png` from
`docs/gallery/`) are checked by `mkdocs build --strict` and the files are copied into
the site. The tables the figures were drawn with (`.md`, `.csv`) and the data that
redraws them (`results.nc`, `.hydra/`) stay files of the repository, not of the site;
`mkdocs serve` reloads when a figure is redrawn."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "figures"
# what the pages show: images, PDF files, animations, the interactive (plotly) views
SHOWN = {".png", ".svg", ".jpg", ".jpeg", ".gif", ".pdf", ".html"}


def on_files(files, config):
    for path in sorted(FIGURES.rglob("*")):
        if path.suffix.lower() in SHOWN and path.is_file():
            relative = path.relative_to(ROOT).as_posix()
            files.append(File(relative, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files


def on_serve(server, config, builder):
    server.watch(str(FIGURES))
    return server
