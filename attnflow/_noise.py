r"""Noise: the stochastic dynamics $dX = \mathcal{F}(t, X)\,dt + \sigma\, dW$ on the field's geometry.

The Brownian path of a member is a diffrax `VirtualBrownianTree` drawn from the member's
key: its values at the dyadic times $t_0 + k (t_1 - t_0) 2^{-\text{depth}}$ do not depend
on the step size, so a seed gives the same path at any dt (exactly where the grid times
are dyadic, to the tree's resolution elsewhere), and an ensemble stays one vmapped program.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray, ScalarLike

from ._config import NOISE_KINDS
from ._errors import ConfigError
from ._geometry import AbstractGeometry


class BrownianNoise(eqx.Module):
    r"""$\sigma\, dW$, added to every fixed step of `simulate` (see `step_noise`).

    - `projected`: on the sphere, the Brownian motion of $S^{d-1}$ (generator
      $\frac{\sigma^2}{2}\Delta_{S^{d-1}}$): the Stratonovich SDE
      $dx_i = P_{x_i} F_i\,dt + \sigma P_{x_i} \circ dW_i$, whose Ito form carries the
      drift $-\frac{(d-1)\sigma^2}{2} x_i\,dt$. The step adds the tangent increment
      $\sigma P_{x_i}\Delta W_i$ at the step's start and retracts, $x \mapsto x/|x|$: the
      retraction supplies that Ito drift ($|P_x \Delta W|^2$ has mean $(d-1)h$).
    - `ambient`: the whole increment $\sigma \Delta W_i \in \mathbb{R}^d$ is added and the
      state retracted (noise on the residual stream before the normalization); on the
      sphere it has the same limit as `projected` as $h \to 0$.

    In flat space both are the additive noise $\sigma\,dW$. `path` is a diffrax
    `VirtualBrownianTree` of the state's shape; build one with `brownian_noise`.
    """

    sigma: Float[Array, ""]
    path: eqx.Module
    kind: str = eqx.field(static=True, default="projected")

    def __check_init__(self):
        if self.kind not in NOISE_KINDS:
            raise ConfigError(f"unknown noise kind {self.kind!r}; choose one of {', '.join(NOISE_KINDS)}.")

    def increment(self, geometry: AbstractGeometry, t: ScalarLike, h: ScalarLike,
                  x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        r"""$\sigma \Delta W$ over $[t, t + h]$ at the state `x` of the step's start (projected
        to its tangent space for `projected`). Times are clipped to the tree's interval,
        which a last grid time may overshoot by a rounding."""
        path = self.path
        lo, hi = jnp.asarray(path.t0, x.dtype), jnp.asarray(path.t1, x.dtype)
        dw = path.evaluate(jnp.clip(t, lo, hi), jnp.clip(t + h, lo, hi))
        if self.kind == "projected":
            dw = geometry.project(x, dw)
        return self.sigma * dw


def brownian_noise(key: PRNGKeyArray, sigma: ScalarLike, shape: tuple[int, ...], *, t0: float, t1: float,
                   kind: str = "projected", depth: int = 16, dtype=jnp.float32) -> BrownianNoise:
    r"""$\sigma\,dW$ with the Brownian path of `key` on $[t_0, t_1]$, resolved to
    $(t_1 - t_0) 2^{-\text{depth}}$ (a step of that size or coarser on the dyadic grid sees
    the path exactly); `shape` is the state's, `(n, d)`."""
    import diffrax  # lazy: start-up (diffrax, for noisy runs only)

    if not 1 <= int(depth) <= 40:
        raise ConfigError(f"noise.depth must be a whole number from 1 to 40, got {depth!r}.")
    tree = diffrax.VirtualBrownianTree(t0, t1, tol=(t1 - t0) * 2.0 ** -int(depth),
                                       shape=jax.ShapeDtypeStruct(shape, dtype), key=key)
    return BrownianNoise(jnp.asarray(sigma, dtype), tree, kind)
