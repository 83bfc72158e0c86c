"""A mkdocs hook: the page `reference.md` gets the reference of every config key and
experiment option, rendered from the schema and the YAML values by
`attnflow._help.reference_markdown()` (the same source as `attnflow --help`), in
place of the marker `<!-- reference -->`. Nothing of it is written twice."""

from __future__ import annotations

MARKER = "<!-- reference -->"


def on_page_markdown(markdown, page, config, files):
    if MARKER not in markdown:
        return markdown
    from attnflow._help import reference_markdown

    return markdown.replace(MARKER, reference_markdown())
