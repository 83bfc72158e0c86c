"""Placeholder of the reference of the command line (replaced by the full `_help` module).

`reference_markdown()` renders the top-level keys of `conf/config.yaml` with their
defaults and the comments beside them, as a Markdown table.
"""

from __future__ import annotations

from pathlib import Path

import yaml


def reference_markdown() -> str:
    """The config keys of `conf/config.yaml` (top level) as a Markdown table."""
    path = Path(__file__).resolve().parent.parent / "conf" / "config.yaml"
    text = path.read_text()
    values = yaml.safe_load(text)
    comments = {}
    for line in text.splitlines():
        if line and not line[0].isspace() and ":" in line and not line.startswith("#"):
            key, _, rest = line.partition(":")
            comments[key.strip()] = rest.partition("#")[2].strip()
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for key, value in values.items():
        if key in ("defaults", "hydra"):
            continue
        shown = "(a group of keys)" if isinstance(value, dict) else f"`{value}`"
        meaning = comments.get(key, "").replace("|", "\\|")
        rows.append(f"| `{key}` | {shown} | {meaning} |")
    return "\n".join(rows) + "\n"
