"""No matrix: `weights.o.kind=none`, the heads' values summed as they are (needs d_v = d)."""

from __future__ import annotations

from .._errors import ConfigError
from ._kind import WeightKind


class NoMatrix(WeightKind):
    kind = "none"
    in_time = False

    @classmethod
    def check(cls, spec, matrix):
        if matrix.name != "o":
            raise ConfigError(f"{matrix.key} cannot be 'none'; use 'identity' for the identity.")
        if matrix.cols != matrix.rows:
            raise ConfigError(f"{matrix.key} must be given when d_v={matrix.cols} differs from d={matrix.rows}.")
        return False

    @classmethod
    def build(cls, spec, matrix, get, key, dtype, built, lib):
        return None

    @classmethod
    def describe(cls, label, stored, drawn):
        return f"no {label}"
