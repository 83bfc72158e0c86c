"""The degree of harmonic summation, in NumPy (no JAX: the schema decides it before a
run, `attnflow.numerics._harmonic` evaluates the expansion; see that module for the method).

The kernel $e^{r\\cos}$ (circle) or $e^{r\\,\\hat u \\cdot y}$ (sphere), scaled by $e^{-r}$, is
$\\sum_k w_k c_k(r) (\\dots)$ with $c_k = e^{-r} I_k(r)$ or $e^{-r} i_k(r)$; `degree` is the
smallest L whose coefficient tail $\\tau_L(r_{\\max}) = \\sum_{k > L} w_k c_k(r_{\\max})$ is at most
the tolerance, `error_bound` that tail.
"""

from __future__ import annotations

import math

import numpy as np

from ._errors import ConfigError

# The token dimensions served: the circle S^1 (d = 2) and the sphere S^2 (d = 3).
DIMS = (2, 3)
# The radius the degree is chosen at, over the largest one the weights give: queries of a
# Runge-Kutta stage lie off the sphere by O(dt^2).
RADIUS_MARGIN = 1.01
# Orders of the continued fraction beyond the degree: the ratio error shrinks by
# rho_k^2 < 0.35 per order above the degree (rho_k <= r / (k + sqrt(k^2 + r^2))), so 24
# orders leave it below 1e-11 at the degree.
_GUARD = 24


def _check_dim(d: int) -> None:
    if d not in DIMS:
        raise ConfigError(
            f"harmonic summation serves tokens on the circle (d=2) and the sphere (d=3), got d={d}; "
            "use summation=direct."
        )


def _weights(d: int, top: int) -> np.ndarray:
    """$w_k$, k = 0 ... top: the multiplicities of the kernel's expansion."""
    k = np.arange(top + 1, dtype=np.float64)
    return np.where(k == 0, 1.0, 2.0) if d == 2 else 2 * k + 1


def _backward_step(r):
    """One order of the backward run: $\\rho_k = r / (a_k + r \\rho_{k+1})$ and the nested sum
    $H_k = \\rho_k (w_k + H_{k+1})$, so that $H_1 = \\sum_{k \\ge 1} w_k c_k / c_0$."""

    def step(carry, order):
        rho, nested = carry
        a_k, w_k = order
        rho = r / (a_k + r * rho)
        return (rho, rho * (w_k + nested)), rho

    return step


def _forward(ratios, nested, degree: int, stack):
    """$c_0 = 1 / (1 + H_1)$ (the normalisation $\\sum_k w_k c_k = 1$), then $c_k = c_{k-1} \\rho_k$
    up to `degree`, stacked on the last axis."""
    c = [1 / (1 + nested)]
    for k in range(degree):
        c.append(c[-1] * ratios[k])
    return stack(c, -1)


def _orders_backward(d: int, top: int) -> tuple[np.ndarray, np.ndarray]:
    """$a_k$ and $w_k$ for k = top ... 1 (the order of the backward run)."""
    k = np.arange(top, 0, -1)
    return (2 * k + d - 2).astype(np.float64), _weights(d, top)[:0:-1]


def _coefficients_float64(r: float, top: int, d: int) -> np.ndarray:
    """$c_k(r)$ for k = 0 ... top in NumPy float64, the ratios run back from `top + _GUARD`."""
    step, carry, ratios = _backward_step(np.float64(r)), (0.0, 0.0), []
    for order in zip(*_orders_backward(d, top + _GUARD)):
        carry, rho = step(carry, order)
        ratios.append(rho)
    return _forward(ratios[::-1], carry[1], top, np.stack)


def _tails(r_max: float, d: int, tol: float) -> np.ndarray:
    """$\\tau_L(r_{\\max})$ for L = 0, 1, ... until it is below `tol` (float64)."""
    top = int(r_max + 12 * math.sqrt(r_max) + 64)
    while True:
        terms = _weights(d, top) * _coefficients_float64(r_max, top, d)
        # tail[L] = sum_{k > L} terms[k], summed from the small end.
        tail = np.concatenate([np.cumsum(terms[::-1])[::-1][1:], [0.0]])
        if tail[-2] <= tol:
            return tail
        top *= 2


def _check_radius(r_max: float, tol: float, d: int) -> None:
    _check_dim(d)
    if not (isinstance(tol, (int, float)) and 0 < tol < 1):
        raise ConfigError(f"summation_tol must be a number in (0, 1), got {tol!r}.")
    if not (math.isfinite(r_max) and r_max >= 0):
        raise ConfigError(f"the largest radius beta * |K^T Q| must be finite and >= 0, got {r_max!r}.")


def degree(r_max: float, tol: float, d: int) -> int:
    """The smallest degree L whose coefficient tail $\\tau_L(r_{\\max}) = \\sum_{k > L} w_k
    c_k(r_{\\max})$ is at most `tol`: the largest change truncation makes to any scaled pair
    term $e^{\\langle u_i, x_j\\rangle - r_i}$ with $r_i \\le r_{\\max}$."""
    _check_radius(r_max, tol, d)
    tail = _tails(float(r_max), d, tol)
    return int(np.argmax(tail <= tol))


def error_bound(r_max: float, degree: int, d: int) -> float:
    """The coefficient tail $\\tau_L(r_{\\max})$ at degree L = `degree` (see `degree`)."""
    _check_radius(r_max, 0.5, d)
    top = max(degree + 1, int(r_max + 12 * math.sqrt(r_max) + 64))
    terms = _weights(d, top) * _coefficients_float64(float(r_max), top, d)
    return float(np.sum(terms[degree + 1 :][::-1]))


def largest_radius(beta: float, query: np.ndarray | None, key: np.ndarray | None) -> float:
    """$r_{\\max} = |\\beta| \\max_h \\|K_h^\\top Q_h\\|_2$ for unit tokens: `query` and
    `key` of shape `(heads, d_k, d)`, None for the identity."""
    if query is not None and key is not None:
        products = np.einsum("hed,hef->hdf", np.asarray(key, np.float64), np.asarray(query, np.float64))
    elif query is not None or key is not None:
        products = np.asarray(query if key is None else key, np.float64)  # |Q|, or |K^T| = |K|
    else:
        return abs(float(beta))
    return abs(float(beta)) * float(np.max(np.linalg.norm(products, ord=2, axis=(-2, -1))))


def basis_size(degree: int, d: int) -> int:
    """The number of basis functions up to `degree`: 2L + 1 on the circle, (L + 1)^2 on the sphere."""
    return 2 * degree + 1 if d == 2 else (degree + 1) ** 2


def harmonic_degree(beta: float, d: int, tol: float = 1e-7, *, query=None, key=None) -> int:
    """The degree L of harmonic summation for a field built by hand (`SelfAttention(...,
    summation="harmonic", degree=L)`), as a study's `summation_tol` chooses it: the smallest
    whose coefficient tail at the largest logit radius $1.01\\,|\\beta|\\,\\max_h\\|K_h^\\top Q_h\\|$
    is at most `tol`, relative to the largest attention sum. `query` and `key` are the
    matrices Q and K, `(d_k, d)` or `(heads, d_k, d)`, None for the identity; d is 2 (the
    circle) or 3 (the sphere). For example, `harmonic_degree(4.0, 2)` is 12.

    The 1% margin covers the Runge-Kutta stages, whose tokens leave the sphere by O(dt^2)."""
    if query is not None and np.ndim(query) == 2:
        query = np.asarray(query)[None]
    if key is not None and np.ndim(key) == 2:
        key = np.asarray(key)[None]
    return degree(RADIUS_MARGIN * largest_radius(beta, query, key), tol, d)
