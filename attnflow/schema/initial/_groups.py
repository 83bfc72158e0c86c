"""The settings shared by the initial conditions that put tokens in `k` groups (caps and
mixture): the count and the given centres."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._checks import array, number
from .._errors import ConfigError


def check_groups(init: Any, cfg: Any) -> np.ndarray | None:
    """`init.k` (at most one group per token) and `init.centres` (k rows of d numbers)
    checked; the centres as an array, or None when they are drawn."""
    number("init.k", init.k, minimum=1)
    if init.k > cfg.n:
        # More groups than tokens: some are empty, and their centres are drawn for nothing.
        raise ConfigError(
            f"init.k={init.k} {init.kind} for n={cfg.n} tokens leaves some of them empty; give init.k <= n."
        )
    if init.centres is None:
        return None
    centres = array("init.centres", init.centres, cfg.dtype)
    if centres.shape != (init.k, cfg.d):
        raise ConfigError(f"init.centres must have shape (k={init.k}, d={cfg.d}), got {centres.shape}.")
    return centres
