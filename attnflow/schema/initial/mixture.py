r"""A Gaussian mixture: token i drawn from $N(c_{i \bmod k}, \sigma^2 I)$, the `k` centres
given (`centres`) or drawn from $N(0, s^2 I)$ (`spread` s)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from omegaconf import MISSING

from .._checks import number
from .._schema import setting
from ._groups import check_groups
from ._kind import InitialCondition


@dataclass
class Mixture(InitialCondition):
    kind: str = "mixture"
    title: ClassVar[str] = "token i ~ N(c_{i mod k}, sigma^2 I), centres ~ N(0, spread^2 I) unless given"
    k: int = setting(MISSING, "number of Gaussian components")
    sigma: float = setting(MISSING, "standard deviation of the tokens about their centre")
    spread: float = setting(MISSING, "standard deviation of the random centres")
    centres: Any = setting(MISSING, "(k, d) list, or null for random centres")
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
