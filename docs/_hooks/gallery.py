"""A mkdocs hook: the gallery's pages in the site's navigation, one per experiment
attnflow ships, from the one list of them (the names of `conf/experiment/*.yaml`, as
`attnflow.experiments.EXPERIMENTS` reads it), after the gallery's index. An experiment
is added by its module, its YAML, its page `docs/gallery/NAME.md` and its test; nothing
lists it a second time."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def on_config(config):
    names = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))
    for entry in config["nav"]:
        if isinstance(entry, dict) and "Gallery" in entry:
            entry["Gallery"] = ["gallery/index.md", *(f"gallery/{name}.md" for name in names)]
    return config
