"""The terms of the vector field that the study's own keys switch on (`attention`,
`mlp.enabled`, `cross.enabled`), one file each: the keys they own, their checks, their description in a
caption and how each member's term is built (`Part`). Adding one is its file and one
line in `PARTS`; `_build`, the captions and the checks iterate over `PARTS`. Nothing
here imports JAX."""

from __future__ import annotations

from .._plugins import components
from ._part import Part

# name -> module.Class: one line per part, in the order of the field's terms.
_PATHS = {
    "attention": "attention.Attention",
    "mlp": "mlp.MLP",
    "cross": "cross.Cross",
}


PARTS: dict[str, type[Part]] = components(__name__, _PATHS, Part, required=("enabled", "build"))

__all__ = ["PARTS", "Part"]
