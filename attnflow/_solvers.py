"""Time stepping: diffrax solvers, classical RK4, and the retraction onto the sphere."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import diffrax as dfx
import numpy as np

from ._errors import ConfigError
from ._geometry import AbstractGeometry

_rk4_tableau = dfx.ButcherTableau(
    a_lower=(np.array([0.5]), np.array([0.0, 0.5]), np.array([0.0, 0.0, 1.0])),
    b_sol=np.array([1 / 6, 1 / 3, 1 / 3, 1 / 6]),
    # Embedded midpoint rule (weight 1 on the second stage): a second-order estimate.
    b_error=np.array([1 / 6, 1 / 3 - 1, 1 / 3, 1 / 6]),
    c=np.array([0.5, 0.5, 1.0]),
)


class RK4(dfx.AbstractERK):
    """The classical fourth-order Runge-Kutta method.

    Its embedded error estimate is the midpoint rule, so with an adaptive controller the
    local error it controls is $O(h^3)$.
    """

    tableau: ClassVar[dfx.ButcherTableau] = _rk4_tableau
    interpolation_cls: ClassVar[Callable[..., dfx.ThirdOrderHermitePolynomialInterpolation]] = (
        dfx.ThirdOrderHermitePolynomialInterpolation.from_k
    )

    def order(self, terms):
        return 4

    def error_order(self, terms):
        return 3


class Retracted(dfx.AbstractWrappedSolver):
    """Any diffrax solver followed by the geometry's retraction after every step.

    On the sphere this is the projection method: every accepted step ends with
    $x_i \\leftarrow x_i / |x_i|$. The step's error estimate is the wrapped solver's,
    taken before the retraction. The dense output's end point is the retracted state,
    and values saved between steps are retracted by the caller.
    """

    solver: dfx.AbstractSolver
    geometry: AbstractGeometry

    @property
    def term_structure(self):
        return self.solver.term_structure

    @property
    def interpolation_cls(self):  # pyright: ignore
        return self.solver.interpolation_cls

    @property
    def term_compatible_contr_kwargs(self):
        return self.solver.term_compatible_contr_kwargs

    def order(self, terms):
        return self.solver.order(terms)

    def strong_order(self, terms):
        return self.solver.strong_order(terms)

    def error_order(self, terms):
        return self.solver.error_order(terms)

    def init(self, terms, t0, t1, y0, args):
        return self.solver.init(terms, t0, t1, y0, args)

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        y1, y_error, dense_info, solver_state, result = self.solver.step(
            terms, t0, t1, y0, args, solver_state, made_jump
        )
        y1 = self.geometry.retract(y1)
        if "y1" in dense_info:
            dense_info = dict(dense_info, y1=y1)
        return y1, y_error, dense_info, solver_state, result

    def func(self, terms, t0, y0, args):
        return self.solver.func(terms, t0, y0, args)


# name -> (solver class, whether the sphere field is tangent-projected, order)
SOLVERS: dict[str, tuple[type[dfx.AbstractSolver], bool, int]] = {
    "euler": (dfx.Euler, True, 1),
    "euler_renorm": (dfx.Euler, False, 1),
    "heun": (dfx.Heun, True, 2),
    "midpoint": (dfx.Midpoint, True, 2),
    "ralston": (dfx.Ralston, True, 2),
    "bosh3": (dfx.Bosh3, True, 3),
    "rk4": (RK4, True, 4),
    "tsit5": (dfx.Tsit5, True, 5),
    "dopri5": (dfx.Dopri5, True, 5),
    "dopri8": (dfx.Dopri8, True, 8),
}
ADAPTIVE = tuple(name for name, (cls, _, _) in SOLVERS.items() if cls is not dfx.Euler)


def solver_from_name(name: str) -> tuple[dfx.AbstractSolver, bool]:
    """The diffrax solver for a name, and whether the sphere field is projected.

    `euler` is scheme (a) of DESIGN.md section 2: Euler on the tangent-projected field,
    then the retraction. `euler_renorm` is scheme (b): Euler on the unprojected field,
    then the retraction, as in most public phase-diagram code.
    """
    if name not in SOLVERS:
        raise ConfigError(f"unknown solver {name!r}; choose one of {', '.join(SOLVERS)}.")
    cls, tangent, _ = SOLVERS[name]
    if issubclass(cls, dfx.AbstractRungeKutta):
        # A plain lax.scan over the stages: forward- and reverse-mode autodiff both pass
        # through it (diffrax's default checkpointed scan is reverse-mode only), which the
        # tangent dynamics of Lyapunov exponents need.
        return cls(scan_kind="lax"), tangent
    return cls(), tangent
