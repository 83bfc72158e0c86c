"""Weight schedules: functions of time that return the matrices of the vector field.

A schedule is called as `schedule(t)` and returns an array of a fixed `shape`, for
example `(heads, d_k, d)` for the queries. Every array inside a schedule is data
(traced), so changing the values never recompiles; the number of pieces is structure.
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, ScalarLike

from ._errors import ConfigError


class AbstractSchedule(eqx.Module):
    """A matrix-valued function of time $t \\mapsto W(t)$."""

    @abc.abstractmethod
    def __call__(self, t: ScalarLike) -> Array:
        """The value at time `t`."""

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

    def __call__(self, t):
        return jnp.broadcast_to(jnp.eye(self.dim, dtype=self.dtype), self.shape)

    @property
    def shape(self):
        return (self.heads, self.dim, self.dim)


class Constant(AbstractSchedule):
    """A fixed array, $W(t) = W_0$."""

    value: Array

    def __call__(self, t):
        return self.value

    @property
    def shape(self):
        return tuple(self.value.shape)


class PiecewiseConstant(AbstractSchedule):
    """$W(t) = W_k$ for $\\tau_{k} \\le t < \\tau_{k+1}$, with switch times $\\tau_1 < \\dots$.

    `values` has one more entry along its first axis than `times` has switches; a
    value equal to a switch time takes the piece that starts there. A periodic redraw
    is the special case of equally spaced switch times.
    """

    times: Float[Array, " k"]
    values: Array

    def __check_init__(self):
        if self.values.shape[0] != self.times.shape[0] + 1:
            raise ConfigError(
                f"a piecewise-constant schedule with {self.times.shape[0]} switch times "
                f"needs {self.times.shape[0] + 1} pieces, got {self.values.shape[0]}."
            )

    def __call__(self, t):
        index = jnp.searchsorted(self.times, t, side="right")
        return self.values[index]

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

    def __call__(self, t):
        powers = t ** jnp.arange(self.coefficients.shape[0], dtype=self.coefficients.dtype)
        return jnp.sum(self.coefficients * powers) * self.base(t)

    @property
    def shape(self):
        return self.base.shape


class PiecewiseSchedule(AbstractSchedule):
    """Switch between whole schedules at given times (each piece may itself vary)."""

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

    def __call__(self, t):
        index = jnp.searchsorted(self.times, t, side="right")
        values = jnp.stack([p(t) for p in self.pieces])
        return values[index]

    @property
    def shape(self):
        return self.pieces[0].shape
