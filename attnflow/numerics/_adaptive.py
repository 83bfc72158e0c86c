"""Adaptive time stepping through `diffrax.diffeqsolve` (imported only when a run adapts).

PID step-size control with the retraction after every accepted step on the sphere, and
every switch time of the weight schedules as a jump time: the controller steps to just
before and just after it, so no step straddles a discontinuity of the field.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import ClassVar

import diffrax as dfx
import jax.numpy as jnp
import numpy as np

from ..schema._errors import ConfigError
from ._geometry import AbstractGeometry
from ._solvers import _RK4, SOLVERS, no_error_estimate

_rk4_tableau = dfx.ButcherTableau(
    a_lower=tuple(np.array(row) for row in _RK4.a[1:]),
    b_sol=np.array(_RK4.b),
    # Embedded midpoint rule (weight 1 on the second stage): a second-order estimate.
    b_error=np.array(_RK4.b) - np.array([0.0, 1.0, 0.0, 0.0]),
    c=np.array(_RK4.c[1:]),
)


class RK4(dfx.AbstractERK):
    """The classical fourth-order Runge-Kutta method as a diffrax solver.

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


def diffrax_solver(name: str) -> dfx.AbstractSolver:
    """The diffrax solver of a name that has an error estimate (all but the Euler schemes)."""
    if name not in SOLVERS:
        raise ConfigError(f"unknown solver {name!r}; choose one of {', '.join(SOLVERS)}.")
    if not SOLVERS[name].adaptive:
        raise no_error_estimate(f"solver {name!r}")
    cls = RK4 if name == "rk4" else getattr(dfx, SOLVERS[name].diffrax)  # pyright: ignore[reportArgumentType]  (every adaptive method but rk4 names its diffrax class)
    return cls()


def solve_adaptive(field, solver, y0, *, t0, t1, dt, ts, record, rtol, atol, max_steps, jump_ts):
    """`diffeqsolve` with PID control, saving `record(t, x, field)` at the times `ts`.

    Returns `(stats, result code, steps taken, reached)` where `reached[i]` says whether
    the solve got to `ts[i]` (it stops early when it runs out of steps).
    """
    if not isinstance(solver, dfx.AbstractAdaptiveSolver):
        raise no_error_estimate(type(solver).__name__)
    geometry = field.geometry
    solver = Retracted(solver, geometry)

    def save(t, y, args):
        return record(t, geometry.retract(y), field)

    controller = dfx.PIDController(rtol=rtol, atol=atol)
    if jump_ts is not None and jump_ts.shape[0]:
        controller = dfx.ClipStepSizeController(controller, jump_ts=jump_ts)
    with warnings.catch_warnings():
        # diffrax pre-fills the output buffers with inf, which NumPy warns about when
        # casting to the integer and boolean statistics; unreached slots are masked.
        warnings.filterwarnings("ignore", "invalid value encountered in cast", RuntimeWarning)
        sol = dfx.diffeqsolve(
            dfx.ODETerm(field),
            solver,
            t0=t0,
            t1=t1,
            dt0=dt,
            y0=y0,
            saveat=dfx.SaveAt(ts=ts, fn=save),
            stepsize_controller=controller,
            max_steps=max_steps,
            throw=False,
        )
    reached = jnp.isfinite(sol.ts)  # pyright: ignore[reportArgumentType]  (SaveAt(ts=...) fills sol.ts)
    return sol.ys, sol.result._value, sol.stats["num_steps"], reached
