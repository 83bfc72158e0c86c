"""`simulate`: evolve one system of n tokens and record what is asked at given times."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Bool, Float, Int, ScalarLike

from ..schema._errors import ConfigError
from ._field import VectorField
from ._geometry import AbstractGeometry, Euclidean
from ._grid import bracketing_steps, every_steps, step_count
from ._schedules import switch_times
from ._solvers import SOLVERS, Tableau, rk_step, tableau, tableau_of


class Solution(eqx.Module):
    """The output of `simulate`.

    `stats` maps a name to an array whose first axis is `ts`; it holds the states `x`
    (shape `(times, n, d)`) when they were asked for. `result` is 0 when the solve
    reached `t1` and diffrax's failure code otherwise (adaptive runs only: a fixed-step
    run always completes); `reached[i]` says whether the solve got to `ts[i]`.
    """

    ts: Float[Array, " times"]
    stats: dict[str, Array]
    result: Int[Array, ""]
    num_steps: Int[Array, ""]
    reached: Bool[Array, " times"]

    @property
    def xs(self) -> Array:
        return self.stats["x"]


def _states(t, x, field):
    return {"x": x}


SPLITS = ("lie", "strang")


def _advance(field, table, t, h, y, split=None, retractions=None):
    r"""One step of size `h` from `(t, y)` with `field` already pinned to the step.

    Without `split`, one Runge-Kutta step of the whole field, then the retraction.
    With `split`, the field is cut into its terms $F = F_1 + \dots + F_m$ and each
    sub-flow takes a Runge-Kutta step of its own: Lie-Trotter applies
    $\Phi_1^h, \dots, \Phi_m^h$ in order (first order); Strang applies
    $\Phi_1^{h/2} \cdots \Phi_{m-1}^{h/2}\, \Phi_m^h\, \Phi_{m-1}^{h/2} \cdots \Phi_1^{h/2}$
    (second order). `retractions[k]`, when given, maps the state after each sub-step of
    term k (`retraction(at, y)` with the step's piece time `at`): the post-LN
    normalization of a trained encoder. The field's `collisions`, when set, then merge
    the tokens that met. The field's `noise`, when set, adds $\sigma \Delta W$ over the
    step (projected at `y` for the `projected` kind) to the Runge-Kutta step before the
    retraction: a Lie splitting of drift and noise, weak order 1 (strong order 1/2 on
    the sphere, where the noise is multiplicative; 1 for the additive noise of flat space).
    """
    geometry = field.geometry
    if split is None:
        moved = rk_step(lambda s, z: field(s, z), table, t, h, y)
        if field.noise is not None:  # the SDE's step: the noise increment at the step's start, then the retraction
            moved = moved + field.noise.increment(geometry, t, h, y, field.piece_time)
        y = geometry.retract(moved)
        return y if field.collisions is None else field.collisions(y, geometry)
    parts = [dataclasses.replace(field, terms=(term,)) for term in field.terms]
    retractions = retractions or (None,) * len(parts)

    def sub(k, start, size, y):
        y = geometry.retract(rk_step(lambda s, z: parts[k](s, z), table, start, size, y))
        return y if retractions[k] is None else retractions[k](field.piece_time, y)

    if split == "lie":
        for k in range(len(parts)):
            y = sub(k, t, h, y)
    else:
        last = len(parts) - 1
        for k in range(last):
            y = sub(k, t, h / 2, y)
        y = sub(last, t, h, y)
        for k in reversed(range(last)):
            y = sub(k, t + h / 2, h / 2, y)
    return y if field.collisions is None else field.collisions(y, geometry)


def stepped_field(field: VectorField, solver) -> VectorField:
    """`field` as `solver` steps it. A field that leaves its tangent projection to the
    solver (`tangent=None`) is projected by every solver but `euler_renorm`, which
    steps along the unprojected field (the scheme of public phase-diagram code); a field
    that says `tangent=True` or `False` is stepped as it says."""
    if field.tangent is None and isinstance(solver, str) and not SOLVERS[solver].projected:
        return dataclasses.replace(field, tangent=False)
    return field


def _check_split(field, split, retractions) -> None:
    if split is None and retractions is None:
        return
    if not isinstance(field, VectorField):
        raise ConfigError("split and retractions cut a VectorField into its terms; a plain callable has none.")
    if field.noise is not None:
        raise ConfigError(
            "a split step advances the terms one by one, and the noise belongs to none of them: "
            "leave out split and retractions for a noisy field."
        )
    if split not in SPLITS:
        raise ConfigError(
            f"unknown splitting {split!r}; choose one of {', '.join(SPLITS)} (retractions run after "
            "the sub-steps of a split)."
        )
    if field.time_change is not None:
        raise ConfigError(
            "a split step advances each term on its own, which a constant-speed time change of "
            "the whole field does not allow; leave out split or the time change."
        )
    if retractions is not None and len(retractions) != len(field.terms):
        raise ConfigError(
            f"give one retraction (or None) per term: {len(field.terms)} terms, {len(retractions)} retractions."
        )


class StepMap(eqx.Module):
    r"""The one-step map $\Phi_h(t, y)$ of a fixed-step run: `step(t, y)` is the state
    one step of size $h$ = `dt` after `(t, y)`.

    For a `VectorField` it is the step of `simulate`: every stage reads the schedule
    pieces in force at the midpoint $t + h/2$, the step is split into the field's terms
    when asked (`split`, `retractions`), followed by the geometry's retraction and the
    field's collisions. For a plain callable `f(t, y, args)` on an array of any shape it
    is one Runge-Kutta step in flat space. Build it with `step_map`.
    """

    field: VectorField | Callable
    table: Tableau = eqx.field(static=True)
    dt: ScalarLike
    split: str | None = eqx.field(static=True, default=None)
    retractions: tuple | None = None
    args: object = None

    def __call__(self, t: ScalarLike, y: Array) -> Array:
        h = self.dt
        if isinstance(self.field, VectorField):
            return _advance(self.field.pinned(t + h / 2), self.table, t, h, y, self.split, self.retractions)
        return rk_step(lambda s, z: self.field(s, z, self.args), self.table, t, h, y)

    @property
    def geometry(self) -> AbstractGeometry:
        """Where the state lives: the field's geometry, flat space for a plain callable."""
        return self.field.geometry if isinstance(self.field, VectorField) else Euclidean()


@runtime_checkable
class DepthDynamics(Protocol):
    """A field with its own fixed-step map over depth $t \\in [0, L]$: steps of 1 are the
    layers of a model (a checkpoint's `DepthFlow` is one). `split` and `retractions` are
    those of `step_map`; analyses take them, and `depth` as the final time, from here."""

    @property
    def field(self) -> VectorField: ...

    @property
    def split(self) -> str | None: ...

    @property
    def retractions(self) -> tuple | None: ...

    @property
    def depth(self) -> int: ...


def step_map(
    field: VectorField | Callable, solver, dt: ScalarLike, *, split: str | None = None, retractions=None, args=None
) -> StepMap:
    """The fixed-step map $\\Phi_h$ that `simulate` applies, as a callable `step(t, y)`:
    the one place where a field is stepped. `solver` is a name or a diffrax explicit
    Runge-Kutta solver (see `simulate`), `dt` the step $h$ (may be traced); `split` and
    `retractions` as in `simulate` (VectorField only); `args` goes to a plain callable
    `f(t, y, args)`. The analyses (Lyapunov spectrum, token sensitivity, the equiangular
    model) step through it, so they follow exactly the trajectory `simulate` computes.
    """
    if isinstance(solver, str) and solver not in SOLVERS:
        raise ConfigError(f"unknown solver {solver!r}; choose one of {', '.join(SOLVERS)}.")
    if isinstance(field, VectorField):
        field = stepped_field(field, solver)
    elif not callable(field):
        raise ConfigError(
            f"field must be an attnflow VectorField or a callable f(t, y, args), got {type(field).__name__}."
        )
    _check_split(field, split, retractions)
    table = tableau(solver) if isinstance(solver, str) else tableau_of(solver)
    return StepMap(field, table, dt, split, None if retractions is None else tuple(retractions), args)


# Runs of equally spaced marks up to which the records are taken without a branch per
# step (below); log-spaced saves have more runs and take the branch.
_MOST_RUNS = 8


def _runs(marks: np.ndarray) -> list[list[int]]:
    """`[gap, count]` of each run of equal gaps between consecutive marks."""
    runs: list[list[int]] = []
    for gap in np.diff(marks).tolist():
        if runs and runs[-1][0] == gap:
            runs[-1][1] += 1
        else:
            runs.append([int(gap), 1])
    return runs


def _grid_time(t0: Array, k, h) -> Array:
    """$t_k = t_0 + k h$ for a step index `k` (a Python or int32 number), in the time's dtype."""
    return t0 + jnp.asarray(k, t0.dtype) * h


def _record_at_marks(step: StepMap, y0, t0, num_steps: int, marks, record):
    """Fixed steps with `lax.scan`, recording at the grid steps `marks` (increasing).

    Step k goes from $t_k = t_0 + k h$ to $t_{k+1}$ with every stage using the schedule
    pieces in force at the midpoint $t_k + h/2$; the state at a mark is recorded before
    the step from it. Where the marks fall in a few runs of equal spacing (every step,
    every k-th step), each run is one scan whose body records and then takes its steps
    (an inner scan): no branch per step, which an accelerator would pay for with a
    round trip to the host at every step. Otherwise (`_record_by_branch`) one scan
    decides at each step whether to record. Steps after the last mark are not taken:
    they change no record.
    """
    marks = np.asarray(marks)
    runs = _runs(marks)
    if len(runs) > _MOST_RUNS:
        return _record_by_branch(step, y0, t0, num_steps, marks, record)
    field, h = step.field, step.dt

    def stats_at(k, y):
        t = _grid_time(t0, k, h)
        return record(t, y, field.pinned(t + h / 2))

    def advance(y, k, count: int):
        if count == 1:
            return step(_grid_time(t0, k, h), y)
        y, _ = lax.scan(lambda y, j: (step(_grid_time(t0, j, h), y), None), y, k + jnp.arange(count, dtype=jnp.int32))
        return y

    k = int(marks[0])
    y = advance(y0, 0, k) if k else y0
    parts = []
    for gap, count in runs:

        def segment(y, k, gap=gap):
            return advance(y, k, gap), stats_at(k, y)

        y, stats = lax.scan(segment, y, k + gap * jnp.arange(count, dtype=jnp.int32))
        parts.append(stats)
        k += gap * count
    parts.append(jax.tree.map(lambda s: s[None], stats_at(jnp.asarray(k, jnp.int32), y)))
    return jax.tree.map(lambda *p: jnp.concatenate(p), *parts)


def _record_by_branch(step: StepMap, y0, t0, num_steps: int, marks, record):
    """`_record_at_marks` with one `lax.scan` over every step that records where the step
    is a mark: the statistics go into a buffer with one spare slot that takes the (zero)
    output of the steps that record nothing. The predicate depends on the step index
    only, so under `jax.vmap` over members the `lax.cond` stays a branch.
    """
    field, h = step.field, step.dt
    marks = jnp.asarray(marks, jnp.int32)
    count = marks.shape[0]

    def stats_at(k, y):
        t = _grid_time(t0, k, h)
        return record(t, y, field.pinned(t + h / 2))

    template = jax.eval_shape(stats_at, 0, y0)
    buffer = jax.tree.map(lambda s: jnp.zeros((count + 1,) + s.shape, s.dtype), template)

    def store(buffer, k, y):
        slot = jnp.searchsorted(marks, k)
        hit = marks[jnp.minimum(slot, count - 1)] == k
        stats = lax.cond(hit, stats_at, lambda k, y: jax.tree.map(jnp.zeros_like, template), k, y)
        slot = jnp.where(hit, slot, count)
        return jax.tree.map(lambda b, s: b.at[slot].set(s), buffer, stats)

    def one(carry, k):
        y, buffer = carry
        buffer = store(buffer, k, y)
        return (step(_grid_time(t0, k, h), y), buffer), None

    (y1, buffer), _ = lax.scan(one, (y0, buffer), jnp.arange(num_steps, dtype=jnp.int32))
    buffer = store(buffer, num_steps, y1)
    return jax.tree.map(lambda b: b[:count], buffer)


def _hermite(field, t0, h, ks, thetas, states):
    """Cubic Hermite interpolation between the grid states bracketing each output time,
    with the slopes of the step's own field pieces, then retracted."""
    geometry = field.geometry

    def one(k, theta, x0, x1):
        t = t0 + k * h
        pinned = field.pinned(t + h / 2)
        f0 = geometry.project(x0, pinned(t, x0))
        f1 = geometry.project(x1, pinned(t + h, x1))
        t2, t3 = theta * theta, theta * theta * theta
        x = (2 * t3 - 3 * t2 + 1) * x0 + (t3 - 2 * t2 + theta) * h * f0 + (3 * t2 - 2 * t3) * x1 + (t3 - t2) * h * f1
        return geometry.retract(x)

    return jax.vmap(one)(ks, thetas, *states)


def simulate(
    field: VectorField,
    y0: Float[Array, "n d"],
    *,
    t1: ScalarLike,
    t0: ScalarLike = 0.0,
    dt: ScalarLike | None = None,
    solver="tsit5",
    save_every: int | None = None,
    save_steps=None,
    ts=None,
    num_steps: int | None = None,
    record: Callable | None = None,
    adaptive: bool = False,
    rtol: float = 1e-6,
    atol: float = 1e-8,
    max_steps: int = 100_000,
    split: str | None = None,
    retractions=None,
) -> Solution:
    r"""Solve $\dot X = \mathcal{F}(t, X)$ from `y0` on $[t_0, t_1]$ for one system.

    **Arguments:**

    - `field`: the `VectorField`; its `geometry` says where the state lives. On the
      sphere `y0` is retracted first, every step is followed by the retraction, and
      values interpolated between steps are retracted too.
    - `solver`: a name (`euler`, `euler_renorm`, `heun`, `midpoint`, `ralston`,
      `bosh3`, `rk4`, `tsit5`, `dopri5`, `dopri8`) or a diffrax solver instance.
      On the sphere `euler` steps along the tangent-projected field and `euler_renorm`
      along the unprojected one, both then retract, when the field leaves its
      projection to the solver (`VectorField(tangent=None)`, the default); a field
      built with `tangent=True` or `False` is stepped as it says, by any solver.
    - `dt`: the fixed step, or the first step when `adaptive`. Fixed steps must cut
      $[t_0, t_1]$ into a whole number $N$ of steps (`attnflow.step_count`); the
      steps are then exactly $h = (t_1 - t_0)/N$. With traced times pass `num_steps`.
    - Output, for fixed steps: the states at the grid steps `save_steps` (integers in
      $[0, N]$), or every `save_every` steps and at $t_1$, or (default) at $t_0$ and
      $t_1$. `ts` asks for arbitrary times in $[t_0, t_1]$ instead: those on the grid
      are recorded there, the others interpolated (cubic Hermite) between the grid
      states around them. For adaptive runs, `ts` (default $t_0, t_1$) are read off
      diffrax's dense output.
    - `record`: `record(t, x, field) -> dict` of statistics saved at each output time
      (e.g. a `Recorder`); by default the states themselves, under `"x"`.
    - `adaptive`: PID step-size control with `rtol`, `atol` and at most `max_steps`
      steps; the solver steps to just before and just after every switch time of the
      field's schedules.
    - The field's `time_change` (constant speed) makes `t` the rescaled time; its
      `collisions` merge the tokens that met after every fixed step (not with
      `adaptive`).
    - The field's `noise` (`BrownianNoise`) makes the fixed steps those of the SDE
      $dX = \mathcal{F}\,dt + \sigma\,dW$: each step adds the Brownian increment of the
      field's tree before the retraction (weak order 1); not with `adaptive`, `ts` or
      `split`.
    - `split`: `"lie"` (Lie-Trotter) or `"strang"` advances each term of the field by
      its own sub-step (fixed steps only): a sequential transformer block is the
      Lie-Trotter split of attention and MLP with one Euler step per layer.
      `retractions`, one callable `(at, x) -> x` or None per term, maps the state after
      each of that term's sub-steps (the post-LN normalization).

    Piecewise weight schedules (a switch time belongs to the piece that starts
    there) are read, in a fixed-step run, at each step's midpoint: a switch on the grid
    takes effect exactly at the step that starts there, in every dtype, and an off-grid
    switch at the nearest grid time.

    Traceable: it can be called under `jax.jit` and `jax.vmap`, and the fixed-step path
    is differentiable in forward mode (`jax.jvp`, for tangent dynamics) and reverse
    mode (`jax.grad`) for every solver. It does not raise for a failed or non-finite
    run; look at `result`, `reached` and the states, or use the ensemble runner.
    """
    if isinstance(solver, str) and solver not in SOLVERS:
        raise ConfigError(f"unknown solver {solver!r}; choose one of {', '.join(SOLVERS)}.")
    field = stepped_field(field, solver)
    if dt is None and not adaptive:
        raise ConfigError("fixed-step integration needs a step dt.")
    y0 = field.geometry.retract(jnp.asarray(y0))
    record = _states if record is None else record
    _check_split(field, split, retractions)
    if (split is not None or retractions is not None) and (adaptive or ts is not None):
        raise ConfigError("split steps are fixed steps recorded on the grid: leave out adaptive and ts.")
    if adaptive and field.collisions is not None:
        raise ConfigError(
            "collisions merge tokens after each fixed step; an adaptive run has no such steps: "
            "use fixed steps (adaptive=false) or leave out the collisions."
        )
    if field.noise is not None and (adaptive or ts is not None):
        raise ConfigError(
            "a noisy field is stepped with fixed steps recorded on the grid (an SDE path has no "
            "smooth interpolant): leave out adaptive and ts."
        )
    if adaptive:
        return _simulate_adaptive(field, solver, y0, t0, t1, dt, ts, record, rtol, atol, max_steps)

    if num_steps is None:
        num_steps = step_count(t0, t1, dt)  # pyright: ignore[reportArgumentType]  (a fixed-step run has a dt: checked above)
    dtype = y0.dtype
    t0_, t1_ = jnp.asarray(t0, dtype), jnp.asarray(t1, dtype)
    h = (t1_ - t0_) / num_steps
    step = step_map(field, solver, h, split=split, retractions=retractions)
    if ts is None:
        if save_steps is None:
            save_steps = every_steps(num_steps, num_steps if save_every is None else int(save_every))
        marks = np.asarray(save_steps, np.int64)
        if marks.ndim != 1 or marks.size == 0 or (np.diff(marks) <= 0).any() or marks[0] < 0 or marks[-1] > num_steps:
            raise ConfigError(f"save_steps must be increasing grid steps in [0, {num_steps}], got {marks.tolist()}.")
        stats = _record_at_marks(step, y0, t0_, num_steps, marks, record)
        out_ts = t0_ + h * jnp.asarray(marks, dtype)
    else:
        ks, thetas = bracketing_steps(np.asarray(ts), float(t0), float(t1), num_steps)  # pyright: ignore[reportArgumentType]  (ArrayLike admits complex; times are real)
        marks = np.unique(np.concatenate([ks, ks + 1]))
        grid = _record_at_marks(step, y0, t0_, num_steps, marks, _states)["x"]
        index = lambda k: jnp.asarray(np.searchsorted(marks, k))
        states = (grid[index(ks)], grid[index(ks + 1)])
        xs = _hermite(field, t0_, h, jnp.asarray(ks, dtype), jnp.asarray(thetas, dtype), states)
        out_ts = jnp.asarray(ts, dtype)
        pins = t0_ + (jnp.asarray(ks, dtype) + 0.5) * h
        stats = jax.vmap(lambda t, x, at: record(t, x, field.pinned(at)))(out_ts, xs, pins)
    return Solution(
        ts=out_ts,
        stats=stats,
        result=jnp.asarray(0, jnp.int32),
        num_steps=jnp.asarray(num_steps),
        reached=jnp.ones(out_ts.shape, bool),
    )


def _simulate_adaptive(field, solver, y0, t0, t1, dt, ts, record, rtol, atol, max_steps) -> Solution:
    from ._adaptive import diffrax_solver, solve_adaptive  # lazy: start-up (diffrax, for adaptive runs only)

    solver = diffrax_solver(solver) if isinstance(solver, str) else solver
    dtype = y0.dtype
    ts = jnp.stack([jnp.asarray(t0, dtype), jnp.asarray(t1, dtype)]) if ts is None else jnp.asarray(ts, dtype)
    jumps = switch_times(field)
    stats, result, steps, reached = solve_adaptive(
        field,
        solver,
        y0,
        t0=t0,
        t1=t1,
        dt=dt,
        ts=ts,
        record=record,
        rtol=rtol,
        atol=atol,
        max_steps=max_steps,
        jump_ts=None if jumps is None else jumps.astype(dtype),
    )
    return Solution(
        ts=ts,
        stats=stats,  # pyright: ignore[reportArgumentType]  (SaveAt(fn=record) fills ys with record's dict)
        result=jnp.asarray(result, jnp.int32),
        num_steps=jnp.asarray(steps),
        reached=reached,
    )
