"""The polynomial weight magnitudes of "Neural ODE Transformers" (app. C.8, fig. 14),
$f_0 = \\tfrac12$, $f_k = \\tfrac12 (t/T)^k$ ($k = 1, \\dots, 4$), $f_5 = \\tfrac12 (1 - t/T)^2$,
as the coefficients of the core's polynomial factor `weights.*.poly`, and the
dispersion index that measures how clustered tokens are: what experiments polynomial
and lyapunov_polynomial both use."""

from __future__ import annotations

import numpy as np

# name -> (formula, coefficients of f(t) = sum_k c_k t^k for a horizon T)
SCHEDULES = {
    "f0": ("1/2", lambda T: [0.5]),
    "f1": ("(t/T)/2", lambda T: [0.0, 0.5 / T]),
    "f2": ("(t/T)^2/2", lambda T: [0.0, 0.0, 0.5 / T**2]),
    "f3": ("(t/T)^3/2", lambda T: [0.0, 0.0, 0.0, 0.5 / T**3]),
    "f4": ("(t/T)^4/2", lambda T: [0.0, 0.0, 0.0, 0.0, 0.5 / T**4]),
    "f5": ("(1-t/T)^2/2", lambda T: [0.5, -1.0 / T, 0.5 / T**2]),
}
_LENGTH = 5  # every panel's coefficients padded to this length: one compiled program


def coefficients(name: str, horizon: float) -> list[float]:
    """The coefficients $c_0, \\dots, c_4$ of schedule `name` over $[0, T]$, $T$ = `horizon`."""
    values = SCHEDULES[name][1](float(horizon))
    return values + [0.0] * (_LENGTH - len(values))


def dispersion_index(x: np.ndarray) -> np.ndarray:
    """Mean nearest-neighbour distance over mean pairwise distance of tokens `x` (..., n, d)."""
    n = x.shape[-2]
    coordinates = np.ascontiguousarray(np.moveaxis(x, -1, 0))  # one contiguous (..., n) array per axis
    squared = sum((c[..., :, None] - c[..., None, :]) ** 2 for c in coordinates)
    distance = np.sqrt(squared)
    mean_pair = distance.sum((-1, -2)) / (n * (n - 1))
    distance[..., np.arange(n), np.arange(n)] = np.inf
    return np.asarray(distance.min(-1).mean(-1) / mean_pair)
