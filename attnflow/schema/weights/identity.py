"""The identity (times `scale`): `weights.M.kind=identity`, for square matrices."""

from __future__ import annotations

from .._errors import ConfigError
from ._kind import WeightKind


class Identity(WeightKind):
    kind = "identity"
    uses = ("scale",)

    @classmethod
    def check(cls, spec, matrix):
        if matrix.rows != matrix.cols:
            raise ConfigError(f"{matrix.key} cannot be the identity with shape {(matrix.rows, matrix.cols)}.")
        return False

    @classmethod
    def build(cls, spec, matrix, get, key, dtype, built, lib):
        jnp = lib.jnp
        base = lib.Identity(matrix.heads, matrix.cols, jnp.dtype(dtype).name)
        scale = get(f"{matrix.key}.scale")
        if not (isinstance(scale, (int, float)) and scale == 1):
            base = lib.Scaled(jnp.reshape(jnp.asarray(scale, dtype), (1,)), base)
        return base

    @classmethod
    def largest_norm(cls, spec, matrix):
        return abs(float(spec.scale))

    @classmethod
    def describe(cls, label, stored, drawn):
        return f"{label} = I"
