r"""The equiangular start $x_i = e_i$: every inner product 0 (needs $n \le d$)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .._errors import ConfigError
from ._kind import InitialCondition


@dataclass
class Orthonormal(InitialCondition):
    kind: str = "orthonormal"
    title: ClassVar[str] = "x_i = e_i (needs n <= d): the equiangular start"

    def check(self, cfg):
        if cfg.n > cfg.d:
            raise ConfigError(f"the orthonormal initial condition needs n <= d, got n={cfg.n} > d={cfg.d}.")

    def build(self, get, dtype, lib):
        return lib.Orthonormal()
