"""Fixed-step time stepping: explicit Runge-Kutta methods and the retraction onto the sphere.

A fixed-step run takes its Butcher tableau from the diffrax solver of the same name
(Euler and the classical RK4 are written here) and steps it in a plain `lax.scan`
with every stage unrolled: there is no error estimate to compute, no solver state to
carry, and forward- and reverse-mode differentiation both pass through. Adaptive runs
use `diffrax.diffeqsolve` (see `_adaptive.py`).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import NamedTuple

from jaxtyping import Array, Float, ScalarLike

from ..schema._errors import ConfigError
from ..schema._methods import ADAPTIVE, SOLVERS


class Tableau(NamedTuple):
    """An explicit Runge-Kutta method: stage $i$ is evaluated at $t + c_i h$ and
    $y + h \\sum_{j<i} a_{ij} k_j$; the step is $y + h \\sum_i b_i k_i$."""

    a: tuple[tuple[float, ...], ...]
    b: tuple[float, ...]
    c: tuple[float, ...]


def no_error_estimate(what: str) -> ConfigError:
    """The error for adaptive stepping asked of a solver that cannot estimate its error."""
    return ConfigError(
        f"{what} has no error estimate, so it cannot adapt its step (adaptive=true); use one of {', '.join(ADAPTIVE)}."
    )


_EULER = Tableau(a=((),), b=(1.0,), c=(0.0,))
# The classical fourth-order method (Kutta 1901).
_RK4 = Tableau(a=((), (0.5,), (0.0, 0.5), (0.0, 0.0, 1.0)), b=(1 / 6, 1 / 3, 1 / 3, 1 / 6), c=(0.0, 0.5, 0.5, 1.0))


def _needed(a: tuple, b: tuple) -> int:
    """How many leading stages the step uses: a trailing stage with $b_i = 0$ that no
    later stage reads only serves first-same-as-last reuse, which fixed steps skip."""
    stages = len(b)
    while (
        stages > 1 and b[stages - 1] == 0 and all(len(row) <= stages - 1 or row[stages - 1] == 0 for row in a[stages:])
    ):
        stages -= 1
    return stages


def _converted(table) -> Tableau:
    """A diffrax `ButcherTableau` as plain numbers, without the stages fixed steps skip."""
    a = ((),) + tuple(tuple(float(v) for v in row) for row in table.a_lower)
    b = tuple(float(v) for v in table.b_sol)
    c = (0.0,) + tuple(float(v) for v in table.c)
    stages = _needed(a, b)
    return Tableau(a=a[:stages], b=b[:stages], c=c[:stages])


def _from_diffrax(class_name: str) -> Tableau:
    import diffrax  # lazy: start-up (diffrax, for adaptive runs only)

    return _converted(getattr(diffrax, class_name).tableau)


def tableau(name: str) -> Tableau:
    """The Butcher tableau of a named solver."""
    if name not in SOLVERS:
        raise ConfigError(f"unknown solver {name!r}; choose one of {', '.join(SOLVERS)}.")
    if name.startswith("euler"):
        return _EULER
    if name == "rk4":
        return _RK4
    return _from_diffrax(SOLVERS[name].diffrax)  # pyright: ignore[reportArgumentType]  (every method past euler* and rk4 names its diffrax class)


def tableau_of(solver) -> Tableau:
    """The tableau of a diffrax solver instance (explicit Runge-Kutta methods and Euler)."""
    import diffrax  # lazy: start-up (diffrax, for adaptive runs only)

    if isinstance(solver, diffrax.Euler):
        return _EULER
    table = getattr(solver, "tableau", None)
    if not isinstance(solver, diffrax.AbstractERK) or table is None:
        raise ConfigError(
            f"fixed-step runs take an explicit Runge-Kutta solver, got {type(solver).__name__}; "
            "pass adaptive=True to use it with diffeqsolve."
        )
    return _converted(table)


def rk_step(
    f: Callable[[ScalarLike, Array], Array],
    table: Tableau,
    t: ScalarLike,
    h: ScalarLike,
    y: Float[Array, "*shape"],
) -> Float[Array, "*shape"]:
    """One explicit Runge-Kutta step of size `h` from `(t, y)` for $\\dot y = f(t, y)$,
    for a state of any shape (the step map of `simulate` applies it, see `step_map`)."""
    ks: list[Array] = []
    for a_row, c in zip(table.a, table.c):
        increment = _combine(a_row, ks)
        ks.append(f(t + c * h if c else t, y if increment is None else y + h * increment))
    return y + h * _combine(table.b, ks)  # pyright: ignore[reportOperatorIssue]  (a tableau's b has a non-zero weight: never None)


def _combine(weights: tuple[float, ...], ks: list[Array]) -> Array | None:
    """$\\sum_j w_j k_j$ over the non-zero weights (None when there is none)."""
    terms = [k if w == 1 else w * k for w, k in zip(weights, ks) if w != 0]
    return functools.reduce(operator.add, terms) if terms else None
