"""Time grids: the fixed-step rule and where output is recorded.

One rule serves `simulate`, the ensembles and the config: a fixed step `dt` must cut
$[t_0, t_1]$ into a whole number $N$ of steps (to a relative $10^{-6}$, so that a `dt`
rounded to float32 still passes), and the steps are then exactly $h = (t_1 - t_0)/N$.
Output is recorded at grid steps ("marks"); off-grid times are only produced on request.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from jaxtyping import ScalarLike

from ..schema._errors import ConfigError

# How far (t1 - t0)/dt may be from a whole number, relative to it: float32 rounding of
# dt moves it by about 6e-8 relative, a dt that really does not divide by far more.
_RELATIVE_SLACK = 1e-6


def step_count(t0: ScalarLike, t1: ScalarLike, dt: ScalarLike) -> int:
    """The number $N$ of fixed steps of size `dt` from `t0` to `t1`.

    Raises `ConfigError` (one sentence) unless `dt` is positive, no longer than
    $t_1 - t_0$, and divides it into whole steps.
    """
    t0, t1, dt = float(t0), float(t1), float(dt)  # pyright: ignore[reportArgumentType]  (ScalarLike admits complex; times are real)
    span = t1 - t0
    if not (math.isfinite(dt) and dt > 0):
        raise ConfigError(f"dt must be a positive number, got {dt:g}.")
    if not (math.isfinite(span) and span > 0):
        raise ConfigError(f"t1 must be greater than t0, got t0={t0:g} and t1={t1:g}.")
    ratio = span / dt
    count = round(ratio)
    if count < 1:
        raise ConfigError(f"dt={dt:g} is longer than t1 - t0 = {span:g}; choose dt <= {span:g}.")
    if abs(ratio - count) > _RELATIVE_SLACK * count:
        below, above = span / max(1, math.floor(ratio)), span / math.ceil(ratio)
        raise ConfigError(
            f"dt={dt:g} does not divide t1 - t0 = {span:g} into whole steps ((t1 - t0)/dt = {ratio:.6g}); "
            f"choose dt = (t1 - t0)/N such as {above:.6g} or {below:.6g}, or set adaptive=true."
        )
    return count


def grid_times(t0: ScalarLike, t1: ScalarLike, num_steps: int, at=None) -> np.ndarray:
    """The grid $t_k = t_0 + k (t_1 - t_0)/N$, in float64, computed so that a grid time
    that is a short decimal (1.2 on [0, 10] with N = 100) is its nearest float64; at the
    steps `at` only when given (the whole grid may not fit in memory)."""
    k = np.arange(num_steps + 1, dtype=np.float64) if at is None else np.asarray(at, dtype=np.float64)
    return (float(t0) * (num_steps - k) + float(t1) * k) / num_steps  # pyright: ignore[reportArgumentType]  (ScalarLike admits complex; times are real)


def save_steps(num_steps: int, saves: int, spacing: str = "linear") -> np.ndarray:
    """The grid steps at which a fixed-step run records, for about `saves` output times.

    Linear: every $s = \\lceil N / (S - 1) \\rceil$ steps and at $N$, so at most `saves`
    times with $t_0$ and $t_1$ always included. Log: $t_0$ and the grid steps nearest to
    `saves - 1` geometrically spaced times from $t_0 + h$ to $t_1$ (duplicates merged).
    With `saves = 1` only $t_1$ is recorded.
    """
    if saves < 1:
        raise ConfigError(f"saves must be at least 1, got {saves}.")
    if saves == 1:
        return np.array([num_steps])
    if spacing == "log":
        inner = np.geomspace(1, num_steps, saves - 1) if saves > 2 else np.array([num_steps])
        marks = np.concatenate([[0], np.round(inner).astype(np.int64)])
        return np.unique(np.clip(marks, 0, num_steps))
    return every_steps(num_steps, math.ceil(num_steps / (saves - 1)))


def every_steps(num_steps: int, every: int) -> np.ndarray:
    """The grid steps 0, k, 2k, ... below $N$, and $N$ itself."""
    if every < 1:
        raise ConfigError(f"save_every must be a positive number of steps, got {every}.")
    return np.unique(np.append(np.arange(0, num_steps, every), num_steps))


def save_times(
    t0: ScalarLike, t1: ScalarLike, saves: int, spacing: str = "linear", first: ScalarLike | None = None
) -> np.ndarray:
    """Exactly `saves` output times from `t0` to `t1` (for adaptive runs and
    `exact_times`): equally spaced, or $t_0$ and then geometric from $t_0 +$ `first`."""
    if saves == 1:
        return np.array([float(t1)])  # pyright: ignore[reportArgumentType]  (ScalarLike admits complex; times are real)
    span = float(t1) - float(t0)  # pyright: ignore[reportArgumentType]  (ScalarLike admits complex; times are real)
    if spacing == "log":
        first = span * 1e-3 if first is None else float(first)  # pyright: ignore[reportArgumentType]  (ScalarLike admits complex; times are real)
        if saves > 2 and not 0 < first < span:
            raise ConfigError(
                f"log-spaced output times start at t0 + dt and need 0 < dt < t1 - t0 = {span:g}, got dt={first:g}."
            )
        inner = np.geomspace(first, span, saves - 1) if saves > 2 else np.array([span])
        return np.concatenate([[float(t0)], float(t0) + inner])  # pyright: ignore[reportArgumentType]  (ScalarLike admits complex; times are real)
    return np.linspace(float(t0), float(t1), saves)  # pyright: ignore[reportArgumentType]  (ScalarLike admits complex; times are real)


def bracketing_steps(ts, t0: float, t1: float, num_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """For each time, the grid step $k$ at or below it and its position $\\theta \\in [0, 1]$
    in $[t_k, t_{k+1}]$ (0 on the grid, up to a relative $10^{-9}$ of a step)."""
    ts = np.asarray(ts, dtype=np.float64)
    if ts.size and (ts.min() < t0 - 1e-9 * (t1 - t0) or ts.max() > t1 + 1e-9 * (t1 - t0)):
        raise ConfigError(f"output times must lie in [t0, t1] = [{t0:g}, {t1:g}].")
    position = (ts - t0) / (t1 - t0) * num_steps
    nearest = np.round(position)
    on_grid = np.abs(position - nearest) <= 1e-9 * max(1, num_steps)
    position = np.where(on_grid, nearest, position)
    k = np.clip(np.floor(position), 0, max(num_steps - 1, 0)).astype(np.int64)
    theta = np.clip(position - k, 0.0, 1.0)
    return k, theta


@dataclasses.dataclass(frozen=True)
class TimeGrid:
    """The times of a solve, resolved once: from `t0` to `t1` in `num_steps` fixed steps
    of `dt` (`num_steps` None for an adaptive solve, whose `dt` is its first step),
    recording at the grid steps `marks`, or else at the times `ts` (an adaptive solve's
    only choice; a fixed-step solve interpolates them between grid steps)."""

    t0: float
    t1: float
    dt: float | None
    num_steps: int | None
    marks: tuple[int, ...] | None = None
    ts: tuple[float, ...] | None = None

    @property
    def adaptive(self) -> bool:
        return self.num_steps is None

    @property
    def count(self) -> int:
        """The number of output times."""
        return len(self.marks if self.ts is None else self.ts)  # pyright: ignore[reportArgumentType]  (a grid has marks or ts)

    @property
    def times(self) -> np.ndarray:
        """The output times in float64 (the grid times recorded, or `ts`)."""
        if self.ts is not None:
            return np.asarray(self.ts, dtype=np.float64)
        return grid_times(self.t0, self.t1, self.num_steps, at=self.marks)  # pyright: ignore[reportArgumentType]  (a grid without ts is fixed-step: it has num_steps)


def time_grid(
    *,
    t1: ScalarLike,
    t0: ScalarLike = 0.0,
    dt: ScalarLike | None = None,
    adaptive: bool = False,
    ts=None,
    save_every: int | None = None,
    save_steps=None,
    num_steps: int | None = None,
) -> TimeGrid:
    """The `TimeGrid` of `simulate`'s and `solve_ensemble`'s time arguments: output at the
    grid steps `save_steps`, or every `save_every` fixed steps and at `t1` (by default at
    $t_0$ and $t_1$), or at the times `ts`. `num_steps`, when the caller has counted
    them already, is not counted again."""
    t0, t1 = float(t0), float(t1)  # pyright: ignore[reportArgumentType]  (ScalarLike admits complex; times are real)
    dt = None if dt is None else float(dt)  # pyright: ignore[reportArgumentType]  (ScalarLike admits complex; times are real)
    if ts is not None:
        ts = tuple(float(t) for t in np.asarray(ts, dtype=np.float64).reshape(-1))
    if adaptive:
        if ts is None:
            raise ConfigError("adaptive solves need output times ts.")
        return TimeGrid(t0, t1, dt, None, None, ts)
    if dt is None:
        raise ConfigError("dt must be given for fixed-step solvers (or set adaptive=true).")
    steps = step_count(t0, t1, dt) if num_steps is None else int(num_steps)
    if ts is not None:
        return TimeGrid(t0, t1, dt, steps, None, ts)
    if save_steps is None:
        save_steps = every_steps(steps, steps if save_every is None else int(save_every))
    return TimeGrid(t0, t1, dt, steps, tuple(int(k) for k in np.asarray(save_steps).reshape(-1)), None)
