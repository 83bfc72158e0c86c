r"""A fixed external field: every token is pulled toward one direction $u$,
$$F(t, X)_i = s\,u,$$
the same vector for every token at every time (`direction` $u$, `strength` $s$). On the
sphere the scheme projects it, $\dot x_i = s P_{x_i} u$: each token runs along the great
circle toward $u/|u|$, the gradient flow of $x \mapsto s\langle x, u\rangle$, and the angle
$\theta$ between a token and $u$ obeys $\dot\theta = -s|u|\sin\theta$, that is
$$\tan\frac{\theta(t)}{2} = \tan\frac{\theta(0)}{2}\, e^{-s|u|t}.$$
Beside attention it is a bias of the residual stream toward one direction (a constant
input, a prompt's pull): `+terms.pull._target_=external_field +terms.pull.direction=[0,0,1]`.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Float, ScalarLike

from ..numerics._terms import AbstractInteraction
from ..schema._errors import ConfigError


class ExternalField(AbstractInteraction):
    r"""$F(t, X)_i = s\,u$ for every token: a pull of strength `strength` toward
    `direction` (module docstring)."""

    direction: Float[Array, " d"]
    strength: Float[Array, ""] = 1.0  # pyright: ignore[reportAssignmentType]  (a default number, made an array at call time)

    def __check_init__(self):
        if jnp.ndim(self.direction) != 1:
            raise ConfigError(
                f"the direction of an external field is one vector of d numbers, got shape {jnp.shape(self.direction)}."
            )

    def __call__(self, t: ScalarLike, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        if self.direction.shape[-1] != x.shape[-1]:
            raise ConfigError(
                f"the direction of an external field has {self.direction.shape[-1]} numbers; the "
                f"tokens have d={x.shape[-1]}."
            )
        pull = jnp.asarray(self.strength, x.dtype) * jnp.asarray(self.direction, x.dtype)
        return jnp.broadcast_to(pull, x.shape)

    def working_bytes(self, n: int, itemsize: int) -> tuple[int, int]:
        """Its output alone: one vector per token."""
        return itemsize * n * self.direction.shape[-1], 0
