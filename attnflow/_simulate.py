"""`simulate`: evolve one system of n tokens and record what is asked at given times."""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable

import diffrax as dfx
import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from ._errors import ConfigError
from ._field import VectorField
from ._geometry import Sphere
from ._solvers import Retracted, solver_from_name


class Solution(eqx.Module):
    """The output of `simulate`.

    `stats` maps a name to an array whose first axis is `ts`; it holds the states `x`
    (shape `(times, n, d)`) when they were asked for, and the boolean `finite`.
    `result` is diffrax's result code (`dfx.RESULTS.successful` when `t1` was reached).
    """

    ts: Float[Array, " times"]
    stats: dict[str, Array]
    result: dfx.RESULTS
    num_steps: Int[Array, ""]

    @property
    def xs(self) -> Array:
        return self.stats["x"]


def _states(t, x, field):
    return {"x": x}


def check_times(t0: float, t1: float, dt: float | None, ts=None) -> None:
    """Raise `ConfigError` for an impossible time interval, step or output grid."""
    if not (math.isfinite(t0) and math.isfinite(t1)) or t1 <= t0:
        raise ConfigError(f"the time interval needs t0 < t1 (both finite), got t0={t0}, t1={t1}.")
    if dt is not None and not (math.isfinite(dt) and dt > 0):
        raise ConfigError(f"the step dt must be a positive number, got dt={dt}.")
    if ts is not None:
        ts = jnp.asarray(ts)
        if ts.ndim != 1 or ts.shape[0] < 1:
            raise ConfigError("the output times must be a non-empty 1-d array.")
        if bool(jnp.any(jnp.diff(ts) < 0)) or float(ts[0]) < t0 or float(ts[-1]) > t1:
            raise ConfigError(f"the output times must be non-decreasing and lie in [t0={t0}, t1={t1}].")


def simulate(
    field: VectorField,
    y0: Float[Array, "n d"],
    *,
    t1: float,
    t0: float = 0.0,
    dt: float | None = None,
    solver: str | dfx.AbstractSolver = "tsit5",
    ts: Float[Array, " times"] | None = None,
    record: Callable | None = None,
    adaptive: bool = False,
    rtol: float = 1e-6,
    atol: float = 1e-8,
    max_steps: int = 100_000,
) -> Solution:
    """Solve $\\dot X = \\mathcal{F}(t, X)$ from `y0` on $[t_0, t_1]$ for one system.

    **Arguments:**

    - `field`: the `VectorField`; its `geometry` says where the state lives. On the
      sphere `y0` is retracted first, every step is followed by the retraction, and
      values saved between steps are retracted too.
    - `solver`: a name (`euler`, `euler_renorm`, `heun`, `midpoint`, `ralston`,
      `bosh3`, `rk4`, `tsit5`, `dopri5`, `dopri8`) or a diffrax solver instance.
      `euler_renorm` steps along the unprojected field, then retracts.
    - `dt`: the fixed step, or the first step when `adaptive`.
    - `ts`: output times (default: `t0` and `t1`).
    - `record`: `record(t, x, field) -> dict` of statistics saved at `ts`
      (e.g. a `Recorder`); by default the states themselves, under `"x"`.
    - `adaptive`: PID step-size control with `rtol`, `atol` instead of fixed steps.

    Traceable: it can be called under `jax.jit` and `jax.vmap`. It does not raise for
    a failed or non-finite run; look at `result` and `stats["finite"]`, or use the
    ensemble runner, which does.
    """
    if isinstance(solver, str):
        solver, tangent = solver_from_name(solver)
        if field.scheme == "sphere" and field.tangent != tangent:
            field = dataclasses.replace(field, tangent=tangent)
    if dt is None and not adaptive:
        raise ConfigError("fixed-step integration needs a step dt.")
    if adaptive and not isinstance(solver, dfx.AbstractAdaptiveSolver):
        raise ConfigError(f"{type(solver).__name__} has no error estimate, so it cannot adapt its step; "
                          "use heun, ralston, bosh3, rk4, tsit5, dopri5 or dopri8.")
    geometry = field.geometry
    if isinstance(geometry, Sphere):
        solver = Retracted(solver, geometry)
    y0 = geometry.retract(jnp.asarray(y0))
    if ts is None:
        ts = jnp.stack([jnp.asarray(t0, y0.dtype), jnp.asarray(t1, y0.dtype)])
    record = _states if record is None else record

    def save(t, y, args):
        return record(t, geometry.retract(y), field)

    controller = dfx.PIDController(rtol=rtol, atol=atol) if adaptive else dfx.ConstantStepSize()
    with warnings.catch_warnings():
        # diffrax pre-fills the output buffers with inf, which NumPy warns about when
        # casting to the integer and boolean statistics; every slot is overwritten.
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
    return Solution(ts=sol.ts, stats=sol.ys, result=sol.result, num_steps=sol.stats["num_steps"])
