r"""Tokens i.i.d. uniform in the cube $[\mathrm{low}, \mathrm{high}]^d$ (off the sphere: the
`none`, `pre` and `peri` schemes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from omegaconf import MISSING

from .._checks import number
from .._errors import ConfigError
from .._schema import setting
from ._kind import InitialCondition


@dataclass
class Cube(InitialCondition):
    kind: str = "cube"
    title: ClassVar[str] = "i.i.d. uniform in [low, high]^d"
    low: float = setting(MISSING, "lower end of every coordinate")
    high: float = setting(MISSING, "upper end of every coordinate")
    data: ClassVar[tuple[str, ...]] = ("low", "high")

    def check(self, cfg):
        number("init.low", self.low)
        number("init.high", self.high)
        if self.high <= self.low:
            raise ConfigError(f"init.low must be below init.high, got low={self.low} and high={self.high}.")

    def build(self, get, dtype, lib):
        return lib.UniformCube(lib.jnp.asarray(get("low"), dtype), lib.jnp.asarray(get("high"), dtype))
