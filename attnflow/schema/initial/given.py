"""The user's own tokens: an array of shape (n, d), the same for every member."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from omegaconf import MISSING

from .._checks import array
from .._errors import ConfigError
from .._metric_registry import reading
from .._schema import setting
from ._kind import InitialCondition


@dataclass
class Given(InitialCondition):
    kind: str = "given"
    title: ClassVar[str] = "a user array of shape (n, d), the same for every member"
    value: Any = setting(MISSING, "the tokens: a nested list of shape (n, d)")
    data: ClassVar[tuple[str, ...]] = ("value",)

    def check(self, cfg):
        value = array("init.value", self.value, cfg.dtype)
        if value.shape != (cfg.n, cfg.d):
            raise ConfigError(f"init.value must have shape (n={cfg.n}, d={cfg.d}), got {value.shape}.")
        zero = np.flatnonzero(np.linalg.norm(value, axis=-1) == 0)
        needs_direction = cfg.scheme in ("sphere", "pre", "peri") or bool(reading("cosines", cfg.metrics))
        if zero.size and needs_direction:
            raise ConfigError(
                f"init.value row {zero[0]} is zero, which has no direction on the sphere and no "
                "cosine with the other tokens; move it off the origin."
            )

    def build(self, get, dtype, lib):
        return lib.Given(lib.jnp.asarray(get("value"), dtype))
