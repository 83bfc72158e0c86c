"""A given matrix (times `scale`): `weights.M.kind=matrix` with `value` one matrix, one per
head, or one (per head) for each piece of `switch_times`."""

from __future__ import annotations

import numpy as np

from .._checks import array
from .._errors import ConfigError
from ._kind import WeightKind


def per_piece(switches: int, heads: int, shape: tuple[int, ...]) -> bool:
    """Whether a value of this shape holds one matrix per piece of its switch times
    (`(pieces, rows, cols)` with one head, or `(pieces, heads, rows, cols)`) rather than
    one matrix (per head) for all times."""
    return switches > 0 and (len(shape) == 4 or (len(shape) == 3 and heads == 1)) and shape[0] == switches + 1


class Matrix(WeightKind):
    kind = "matrix"
    uses = ("value", "scale", "transpose")

    @classmethod
    def check(cls, spec, matrix):
        key, rows, cols, heads, dtype = matrix.key, matrix.rows, matrix.cols, matrix.heads, matrix.cfg.dtype
        if spec.value is None:
            raise ConfigError(f"{key}.kind=matrix needs {key}.value (a nested list).")
        value = array(f"{key}.value", spec.value, dtype)
        pieces = len(spec.switch_times) + 1
        allowed = [(rows, cols), (heads, rows, cols)]
        if pieces > 1:
            allowed += ([(pieces, rows, cols)] if heads == 1 else []) + [(pieces, heads, rows, cols)]
        if value.shape not in allowed:
            one_per_piece = (
                (f", or one matrix per piece of {key}.switch_times: {' or '.join(map(str, allowed[2:]))}")
                if pieces > 1
                else ""
            )
            raise ConfigError(
                f"{key}.value must have shape {(rows, cols)} or {(heads, rows, cols)}{one_per_piece}, "
                f"got {value.shape}."
            )
        if np.abs(value).max() * abs(spec.scale) > float(np.finfo(str(dtype)).max):
            raise ConfigError(f"{key}.value times {key}.scale overflows {dtype}.")
        return per_piece(len(spec.switch_times), heads, value.shape)

    @classmethod
    def build(cls, spec, matrix, get, key, dtype, built, lib):
        jnp = lib.jnp
        shape = (matrix.heads, matrix.rows, matrix.cols)
        value = get(f"{matrix.key}.scale") * jnp.asarray(get(f"{matrix.key}.value"), dtype)
        if per_piece(len(spec.switch_times), matrix.heads, value.shape):
            times = jnp.asarray(get(f"{matrix.key}.switch_times"), dtype)
            return lib.PiecewiseConstant(times, value.reshape((value.shape[0],) + shape))
        return lib.Constant(jnp.broadcast_to(value, shape))

    @classmethod
    def largest_norm(cls, spec, matrix):
        # The value's last two axes are one matrix (of a head, of a piece): the largest of their norms.
        value = np.asarray(spec.value, np.float64)
        return abs(float(spec.scale)) * float(np.max(np.linalg.norm(value, ord=2, axis=(-2, -1))))

    @classmethod
    def describe(cls, label, stored, drawn):
        return f"{label} = given matrix"
