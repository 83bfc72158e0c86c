"""Weight schedules: functions of time that return the matrices of the vector field.

A schedule is called as `schedule(t)` and returns an array of a fixed `shape`, for
example `(heads, d_k, d)` for the queries. Every array inside a schedule is data
(traced), so changing the values never recompiles; the number of pieces is structure.

Piecewise schedules are right-continuous: a switch time belongs to the piece that
starts there. `schedule(t, at)` chooses the piece at time `at` instead of `t` (smooth
factors still see `t`); fixed-step runs pass each step's midpoint, so that every stage
of a step uses one piece and a switch on the grid takes effect exactly at the step that
starts there, whatever the last bits of the floating-point times.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, ScalarLike

from ..schema._errors import ConfigError


class AbstractSchedule(eqx.Module):
    """A matrix-valued function of time $t \\mapsto W(t)$."""

    @abc.abstractmethod
    def __call__(self, t: ScalarLike, at: ScalarLike | None = None) -> Array:
        """The value at time `t`, with the piece of a piecewise schedule chosen at `at`
        (default `t`)."""

    @property
    @abc.abstractmethod
    def shape(self) -> tuple[int, ...]:
        """The shape of every value."""


class Identity(AbstractSchedule):
    """The identity matrix for every head and every t.

    Kept as its own type so that the attention term can skip a matrix product that
    would multiply by one: with $Q = K = V = I$ the cost per step is $O(n^2 d)$.
    """

    heads: int = eqx.field(static=True)
    dim: int = eqx.field(static=True)
    dtype: str = eqx.field(static=True, default="float32")

    def __call__(self, t, at=None):
        return jnp.broadcast_to(jnp.eye(self.dim, dtype=self.dtype), self.shape)

    @property
    def shape(self):
        return (self.heads, self.dim, self.dim)


class Constant(AbstractSchedule):
    """A fixed array, $W(t) = W_0$."""

    value: Array

    def __call__(self, t, at=None):
        return self.value

    @property
    def shape(self):
        return tuple(self.value.shape)


class PiecewiseConstant(AbstractSchedule):
    """$W(t) = W_k$ for $\\tau_{k} \\le t < \\tau_{k+1}$, with switch times $\\tau_1 < \\dots$.

    `values` has one more entry along its first axis than `times` has switches. The
    switch time itself belongs to the piece that starts there ($W(\\tau_k) = W_k$). A
    periodic redraw is the special case of equally spaced switch times.
    """

    times: Float[Array, " k"]
    values: Array

    def __check_init__(self):
        if self.values.shape[0] != self.times.shape[0] + 1:
            raise ConfigError(
                f"a piecewise-constant schedule with {self.times.shape[0]} switch times "
                f"needs {self.times.shape[0] + 1} pieces, got {self.values.shape[0]}."
            )

    def __call__(self, t, at=None):
        index = jnp.searchsorted(self.times, t if at is None else at, side="right")
        return self.values[index]

    @property
    def shape(self):
        return tuple(self.values.shape[1:])


class Interpolated(AbstractSchedule):
    r"""$W(t)$ interpolated between knots $(\tau_k, W_k)$, constant beyond the first and last.

    `kind="linear"` joins the knots by straight lines; `kind="cubic"` uses cubic Hermite
    pieces whose slopes are the centred differences of the knots (Catmull-Rom; one-sided
    at the ends), so $W$ is $C^1$ between the first and last knot and passes through
    every knot. A checkpoint's layers become knots at $t = 0, 1, \dots, L - 1$.
    """

    times: Float[Array, " k"]
    values: Array
    kind: str = eqx.field(static=True, default="linear")

    def __check_init__(self):
        if self.kind not in ("linear", "cubic"):
            raise ConfigError(f"interpolation must be 'linear' or 'cubic', got {self.kind!r}.")
        if self.times.ndim != 1 or self.values.shape[0] != self.times.shape[0] or self.times.shape[0] < 2:
            raise ConfigError(
                f"an interpolated schedule needs at least two knots and one value per knot, got "
                f"{self.times.shape[0]} times and {self.values.shape[0]} values."
            )

    def __call__(self, t, at=None):
        times, values = self.times, self.values
        t = jnp.clip(jnp.asarray(t, times.dtype), times[0], times[-1])
        k = jnp.clip(jnp.searchsorted(times, t, side="right") - 1, 0, times.shape[0] - 2)
        width = times[k + 1] - times[k]
        s = ((t - times[k]) / width).astype(values.dtype)
        w0, w1 = values[k], values[k + 1]
        if self.kind == "linear":
            return (1 - s) * w0 + s * w1
        slopes = jnp.gradient(values, times, axis=0)
        m0, m1 = slopes[k] * width, slopes[k + 1] * width
        s2, s3 = s * s, s * s * s
        return (2 * s3 - 3 * s2 + 1) * w0 + (s3 - 2 * s2 + s) * m0 + (-2 * s3 + 3 * s2) * w1 + (s3 - s2) * m1

    @property
    def shape(self):
        return tuple(self.values.shape[1:])


class Scaled(AbstractSchedule):
    """$W(t) = f(t)\\, W_0(t)$ with a polynomial $f(t) = \\sum_k c_k t^k$.

    The weight-magnitude schedules of the Neural ODE Transformers paper (app. C.8),
    e.g. $f(t) = (t/T)^2/2$ is `coefficients = [0, 0, 1/(2 T^2)]`.
    """

    coefficients: Float[Array, " p"]
    base: AbstractSchedule

    def __call__(self, t, at=None):
        return self.factor(t) * self.base(t, at)

    def factor(self, t: ScalarLike) -> Array:
        """$f(t)$."""
        powers = t ** jnp.arange(self.coefficients.shape[0], dtype=self.coefficients.dtype)
        return jnp.sum(self.coefficients * powers)

    @property
    def shape(self):
        return self.base.shape


class Retimed(AbstractSchedule):
    """$W(a + b t)$: a schedule read at an affinely mapped time; $b = 0$ holds it at
    $a$. Offset and rate are data, so a frozen and a time-dependent field share one
    compiled solve."""

    base: AbstractSchedule
    offset: Float[Array, ""]
    rate: Float[Array, ""]

    def __call__(self, t, at=None):
        return self.base(self.offset + self.rate * t, None if at is None else self.offset + self.rate * at)

    @property
    def shape(self):
        return self.base.shape


class PiecewiseSchedule(AbstractSchedule):
    """Switch between whole schedules at given times (each piece may itself vary).

    As for `PiecewiseConstant`, the switch time itself belongs to the piece that
    starts there.
    """

    times: Float[Array, " k"]
    pieces: tuple[AbstractSchedule, ...]

    def __check_init__(self):
        if len(self.pieces) != self.times.shape[0] + 1:
            raise ConfigError(
                f"a piecewise schedule with {self.times.shape[0]} switch times needs "
                f"{self.times.shape[0] + 1} pieces, got {len(self.pieces)}."
            )
        shapes = {p.shape for p in self.pieces}
        if len(shapes) != 1:
            raise ConfigError(f"all pieces of a schedule must have one shape, got {sorted(shapes)}.")

    def __call__(self, t, at=None):
        index = self.piece(t if at is None else at)
        return jnp.stack([p(t, at) for p in self.pieces])[index]

    def piece(self, at: ScalarLike) -> Array:
        """The index of the piece in force at time `at`."""
        return jnp.searchsorted(self.times, at, side="right")

    @property
    def shape(self):
        return self.pieces[0].shape


def identity_multiple(schedule: AbstractSchedule) -> bool:
    """Whether the schedule is $c(t) I$ by construction (a structural, static fact): the
    identity, scaled by polynomials, or switching between such schedules."""
    if isinstance(schedule, Identity):
        return True
    if isinstance(schedule, Scaled):
        return identity_multiple(schedule.base)
    if isinstance(schedule, PiecewiseSchedule):
        return all(identity_multiple(p) for p in schedule.pieces)
    return False


def identity_factor(schedule: AbstractSchedule, t: ScalarLike, at: ScalarLike | None = None) -> Array | None:
    """$c(t)$ for a schedule that is $c(t) I$ (see `identity_multiple`); None for the
    identity itself, so that callers can skip multiplying by one."""
    if isinstance(schedule, Identity):
        return None
    if isinstance(schedule, Scaled):
        inner = identity_factor(schedule.base, t, at)
        return schedule.factor(t) if inner is None else schedule.factor(t) * inner
    if isinstance(schedule, PiecewiseSchedule):
        ones = jnp.ones((), schedule.times.dtype)
        factors = [identity_factor(p, t, at) for p in schedule.pieces]
        stacked = jnp.stack([ones if c is None else c for c in factors])
        return stacked[schedule.piece(t if at is None else at)]
    raise TypeError(f"{type(schedule).__name__} is not a multiple of the identity.")


def switch_times(tree) -> Array | None:
    """Every switch time of the piecewise schedules inside `tree` (a vector field, a
    term), concatenated; None when there is none."""
    piecewise = (PiecewiseConstant, PiecewiseSchedule)
    found = [
        leaf.times
        for leaf in jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, piecewise))
        if isinstance(leaf, piecewise)
    ]
    return jnp.concatenate(found) if found else None


class Transposed(AbstractSchedule):
    """$W(t)^\top$ per head: the matrix a code that multiplies row vectors ($x W$) applies
    to column vectors."""

    base: AbstractSchedule

    def __call__(self, t, at=None):
        return jnp.swapaxes(self.base(t, at), -1, -2)

    @property
    def shape(self):
        return self.base.shape[:-2] + self.base.shape[:-3:-1]


class QtK(AbstractSchedule):
    """$V(t) = s\\, Q(t)^T K(t)$ per head, for V tied to the attention matrix."""

    query: AbstractSchedule
    key: AbstractSchedule
    sign: Array

    def __call__(self, t, at=None):
        q, k = self.query(t, at), self.key(t, at)
        return self.sign * jnp.einsum("hkd,hke->hde", q, k)

    @property
    def shape(self):
        return (self.query.shape[0], self.query.shape[-1], self.query.shape[-1])


def factored(path: str, spec: Any, get: Callable[[str], Any], base: AbstractSchedule, dtype) -> AbstractSchedule:
    """`base` times the piecewise-constant factors of `path.switch_times`/`path.factors` and
    the polynomial `path.poly` (the convention of `weights.*` and `noise`); `get(path)` reads a
    setting (traced where it is data) and `spec` is the config node at `path`."""
    factors = jnp.asarray(get(f"{path}.factors"), dtype).reshape(-1)
    if len(spec.switch_times) and factors.shape[0]:
        # (Switch times without factors: a kind=matrix value with one matrix per piece,
        # already piecewise.)
        times = jnp.asarray(get(f"{path}.switch_times"), dtype)
        base = PiecewiseSchedule(times, tuple(Scaled(factors[i : i + 1], base) for i in range(factors.shape[0])))
    elif factors.shape[0]:
        base = Scaled(factors[:1], base)
    if spec.poly is not None:
        base = Scaled(jnp.asarray(get(f"{path}.poly"), dtype).reshape(-1), base)
    return base
