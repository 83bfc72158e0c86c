"""Random matrices of a law (`law`, times `scale`; square laws for square matrices only),
drawn once or anew every `redraw_every` units of time: `weights.M.kind=random`."""

from __future__ import annotations

import math

import numpy as np

from .._checks import number
from .._errors import ConfigError
from .._words import number_text
from ._kind import WeightKind

# The laws of square matrices only (`attnflow.numerics._random_matrices.SQUARE_LAWS`, spelt out
# here so that the check imports no JAX).
SQUARE_LAWS = ("product", "goe", "wishart", "orthogonal")
# At most this many draws over [t0, t1].
MOST_REDRAWS = 10_000


class Random(WeightKind):
    kind = "random"
    uses = ("law", "scale", "redraw_every", "transpose")

    @classmethod
    def check(cls, spec, matrix):
        if spec.law in SQUARE_LAWS and matrix.rows != matrix.cols:
            raise ConfigError(
                f"the {spec.law} law needs square matrices, {matrix.key} is {(matrix.rows, matrix.cols)}."
            )
        if spec.redraw_every is not None:
            cfg = matrix.cfg
            number(f"{matrix.key}.redraw_every", spec.redraw_every, positive=True)
            if (cfg.t1 - cfg.t0) / spec.redraw_every > MOST_REDRAWS:
                raise ConfigError(
                    f"{matrix.key}.redraw_every is too small: more than {MOST_REDRAWS} redraws over [t0, t1]."
                )
        return False

    @classmethod
    def build(cls, spec, matrix, get, key, dtype, built, lib):
        cfg, shape, scale = matrix.cfg, (matrix.heads, matrix.rows, matrix.cols), get(f"{matrix.key}.scale")
        if spec.redraw_every is None:
            return lib.Constant(lib.draw_matrix(spec.law.value, key, shape, scale, dtype))
        count = int(math.ceil((cfg.t1 - cfg.t0) / spec.redraw_every))
        times = lib.jnp.asarray(cfg.t0 + spec.redraw_every * np.arange(1, count + 1), dtype)
        return lib.PiecewiseConstant(times, lib.draw_matrix(spec.law.value, key, (count + 1,) + shape, scale, dtype))

    @classmethod
    def describe(cls, label, stored, drawn):
        text = f"{label} random ({stored.get('law', '?')}, scale {number_text(stored.get('scale'))}, {drawn})"
        if stored.get("redraw_every") is not None:
            text += f", redrawn every {number_text(stored['redraw_every'])}"
        return text
