"""The one-sentence checks of a config's values that every component uses: a finite
number in a range, and an array given as nested lists. Nothing here imports JAX (the
components that call them are read by the schema and the help)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._errors import ConfigError


def number(name: str, value: Any, *, positive: bool = False, minimum: int | float | None = None) -> None:
    """`value` is a finite number (positive, or at least `minimum`), else a
    `ConfigError` naming `name`."""
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)):
        raise ConfigError(f"{name} must be a finite number, got {value!r}.")
    if positive and value <= 0:
        raise ConfigError(f"{name} must be positive, got {value!r}.")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value!r}.")


def array(name: str, value: Any, dtype: Any) -> np.ndarray:
    """A user array given as nested lists, as float64; ragged, non-numeric or non-finite
    input, and values that the run's dtype cannot hold, are refused."""
    try:
        values = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a rectangular array of numbers (nested lists of equal length).") from None
    if not np.isfinite(values).all():
        raise ConfigError(f"{name} must hold finite numbers only, got a NaN or an infinity.")
    largest = float(np.finfo(str(dtype)).max)
    if values.size and np.abs(values).max() > largest:
        raise ConfigError(f"{name} holds {np.abs(values).max():.3g}, beyond the largest {dtype} ({largest:.3g}).")
    return values


def as_floats(value: Any) -> Any:
    """Nested lists of numbers as floats (so that `[1, 2]` and `[1.0, 2.0]` are one
    config); None stays None."""
    if value is None:
        return None
    return np.asarray(value, dtype=np.float64).tolist()
