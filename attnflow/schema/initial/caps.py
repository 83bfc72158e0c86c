"""`k` spherical caps of geodesic radius `radius`, token i in cap i mod k; the caps'
centres given (`centres`, k unit vectors) or drawn uniformly on the sphere."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from omegaconf import MISSING

from .._checks import number
from .._errors import ConfigError
from .._schema import setting
from ._groups import check_groups
from ._kind import InitialCondition


@dataclass
class Caps(InitialCondition):
    kind: str = "caps"
    title: ClassVar[str] = "k spherical caps of geodesic radius `radius`; token i in cap i mod k"
    k: int = setting(MISSING, "number of caps")
    radius: float = setting(MISSING, "geodesic radius of each cap")
    centres: Any = setting(MISSING, "(k, d) list, or null for uniform random centres")
    data: ClassVar[tuple[str, ...]] = ("radius", "centres")

    def check(self, cfg):
        centres = check_groups(self, cfg)
        if centres is not None and (np.linalg.norm(centres, axis=-1) == 0).any():
            raise ConfigError("init.centres has a zero row, which gives a cap no direction; give unit vectors.")
        number("init.radius", self.radius, minimum=0)

    def build(self, get, dtype, lib):
        jnp = lib.jnp
        centres = None if self.centres is None else jnp.asarray(get("centres"), dtype)
        return lib.SphericalCaps(int(self.k), jnp.asarray(get("radius"), dtype), centres)
