"""Tokens with i.i.d. uniform directions on the sphere $S^{d-1}$ (unit vectors, whatever
the scheme): the start of most theorems."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ._kind import InitialCondition


@dataclass
class Uniform(InitialCondition):
    kind: str = "uniform"
    title: ClassVar[str] = "i.i.d. uniform on the sphere (unit vectors with uniform directions)"

    def build(self, get, dtype, lib):
        return lib.UniformSphere()
