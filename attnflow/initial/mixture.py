r"""A Gaussian mixture: token i drawn from $N(c_{i \bmod k}, \sigma^2 I)$, the `k` centres
given (`centres`) or drawn from $N(0, s^2 I)$ (`spread` s)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from omegaconf import MISSING

from .._checks import number
from ._groups import check_groups
from ._kind import InitialCondition


@dataclass
class Mixture(InitialCondition):
    kind: str = "mixture"
    k: int = MISSING
    sigma: float = MISSING
    spread: float = MISSING
    centres: Any = MISSING
    data: ClassVar[tuple[str, ...]] = ("sigma", "spread", "centres")

    def check(self, cfg):
        check_groups(self, cfg)
        number("init.sigma", self.sigma, minimum=0)
        number("init.spread", self.spread, minimum=0)

    def build(self, get, dtype, lib):
        jnp = lib.jnp
        centres = None if self.centres is None else jnp.asarray(get("centres"), dtype)
        return lib.GaussianMixture(
            int(self.k), jnp.asarray(get("sigma"), dtype), jnp.asarray(get("spread"), dtype), centres
        )
