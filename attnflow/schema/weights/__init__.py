"""The kinds of weight matrix a config names with `weights.M.kind=KIND` (M one of q, k,
v, o), one file each: the settings it reads, their check, its description and the
schedule it builds (`WeightKind`). Adding one is its file and one line in `_PATHS`; the
schema's choices, the attention part and the captions read `KINDS`. Nothing here
imports JAX."""

from __future__ import annotations

from .._plugins import components
from ._kind import SETTINGS, Matrix, WeightKind

# weights.M.kind=KIND -> module.Class: one line per kind.
_PATHS = {
    "identity": "identity.Identity",
    "matrix": "matrix.Matrix",
    "random": "random.Random",
    "tied": "tied.Tied",
    "none": "none.NoMatrix",
}


KINDS: dict[str, type[WeightKind]] = components(__name__, _PATHS, WeightKind, required=("build",))

__all__ = ["KINDS", "SETTINGS", "Matrix", "WeightKind"]
