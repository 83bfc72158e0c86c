"""A flow-matching surrogate of the attention flow: a time-dependent vector field that
moves each token on its own, trained to carry an ensemble to its image.

The attention flow moves token $i$ by a field that depends on all the others; section
5.3 of "A Survey of Continuous Time Dynamics of Transformers" asks how well a field
$v(s, x)$ that depends on time and on the token alone can do the same transport.
Flow matching (rectified flow, Liu et al. 2022) fits it on pairs $(x_0, x_1)$, a token
and its image at the final time $T$: along the straight path
$x_s = (1 - s)\\,x_0 + s\\,x_1$, $s \\in [0, 1]$, it minimizes

$$\\mathbb{E}_{s, (x_0, x_1)}\\, |v(s, x_s) - (x_1 - x_0)|^2 .$$

The minimizer is $v(s, x) = \\mathbb{E}[x_1 - x_0 \\mid x_s = x]$, whose flow has the
marginals of $x_s$: it carries the law of $x_0$ to the law of $x_1$ along nearly
straight lines, whatever curved path the attention flow took.

- `FlowMatchingField`: the field, an MLP of $(x, s)$; a term of a `VectorField`, so
  the core's `simulate` integrates it (`push_forward`);
- `fit_flow_matching`: its training with optax, in one compiled `lax.scan`;
- `sinkhorn_distance`: the transport distance (ott-jax) that compares ensembles.
"""

from __future__ import annotations

from typing import cast

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, Float, PRNGKeyArray, ScalarLike

from ..numerics._field import VectorField
from ..numerics._simulate import simulate
from ..numerics._terms import AbstractInteraction
from ..schema._errors import ConfigError


class FlowMatchingField(AbstractInteraction):
    """$v(s, x_i)$: an MLP of one token and the time $s \\in [0, 1]$, applied to every
    token separately; it never sees the other tokens.

    The input is $(x_i, s)$, `depth` hidden layers of `width` SiLU units, the output
    the velocity in $\\mathbb{R}^d$.
    """

    mlp: eqx.nn.MLP

    def __init__(self, d: int, *, width: int = 64, depth: int = 2, key: PRNGKeyArray, dtype=jnp.float32):
        if d < 1 or width < 1 or depth < 1:
            raise ConfigError(f"the flow-matching field needs d, width and depth >= 1, got {d}, {width}, {depth}.")
        self.mlp = eqx.nn.MLP(d + 1, d, width, depth, activation=jax.nn.silu, key=key, dtype=dtype)

    def __call__(self, t: ScalarLike, x: Float[Array, "n d"], at: ScalarLike | None = None) -> Float[Array, "n d"]:
        s = jnp.broadcast_to(jnp.asarray(t, x.dtype), x.shape[:-1] + (1,))
        return jax.vmap(self.mlp)(jnp.concatenate([x, s], axis=-1))


def flow_matching_loss(
    field: FlowMatchingField, s: Float[Array, " pairs"], x0: Float[Array, "pairs d"], x1: Float[Array, "pairs d"]
) -> Float[Array, ""]:
    """$\\frac{1}{P}\\sum_p |v(s_p, (1 - s_p) x_{0p} + s_p x_{1p}) - (x_{1p} - x_{0p})|^2$."""
    xs = (1 - s[:, None]) * x0 + s[:, None] * x1
    v = jax.vmap(lambda si, xi: field(si, xi[None])[0])(s, xs)
    return jnp.mean(jnp.sum((v - (x1 - x0)) ** 2, axis=-1))


@eqx.filter_jit
def _fit(field, x0, x1, test_s, test_x0, test_x1, key, steps: int, batch_size: int, learning_rate):
    optimizer = optax.adam(optax.cosine_decay_schedule(learning_rate, steps, alpha=0.05))
    params, static = eqx.partition(field, eqx.is_inexact_array)
    state = optimizer.init(params)
    loss_of = lambda p, s, a, b: flow_matching_loss(eqx.combine(p, static), s, a, b)

    def step(carry, key):
        params, state = carry
        k_pick, k_time = jax.random.split(key)
        pick = jax.random.randint(k_pick, (batch_size,), 0, x0.shape[0])
        s = jax.random.uniform(k_time, (batch_size,), x0.dtype)
        loss, grads = jax.value_and_grad(loss_of)(params, s, x0[pick], x1[pick])
        test = loss_of(params, test_s, test_x0, test_x1)
        with jax.numpy_dtype_promotion("standard"):  # optax's Adam mixes its int32 count with floats
            updates, state = optimizer.update(grads, state, params)
        return (optax.apply_updates(params, updates), state), (loss, test)

    (params, _), (losses, tests) = jax.lax.scan(step, (params, state), jax.random.split(key, steps))
    return eqx.combine(params, static), losses, tests


def fit_flow_matching(
    field: FlowMatchingField,
    x0: Float[Array, "pairs d"],
    x1: Float[Array, "pairs d"],
    *,
    key: PRNGKeyArray,
    steps: int,
    batch_size: int = 256,
    learning_rate: float = 3e-3,
    test: tuple[Float[Array, "tests d"], Float[Array, "tests d"]] | None = None,
) -> tuple[FlowMatchingField, Float[Array, " steps"], Float[Array, " steps"]]:
    """Train `field` by flow matching on the pairs `(x0[p], x1[p])`: `steps` Adam steps
    (cosine-decayed learning rate), each on `batch_size` pairs drawn with replacement
    and times $s$ uniform in $[0, 1]$.

    Returns the trained field, the training loss of every step (on its minibatch) and
    the loss on the held-out pairs `test` (at times drawn once, the same for every
    step; NaN without `test`). The same `key` gives the same result.
    """
    if x0.shape != x1.shape or x0.shape[0] == 0:
        raise ConfigError(f"x0 and x1 must be non-empty arrays of the same shape, got {x0.shape} and {x1.shape}.")
    if steps < 1 or batch_size < 1:
        raise ConfigError(f"steps and batch_size must be positive, got {steps} and {batch_size}.")
    k_fit, k_test = jax.random.split(key)
    if test is None:
        test_x0 = test_x1 = jnp.full((1, x0.shape[1]), jnp.nan, x0.dtype)
    else:
        test_x0, test_x1 = test
    test_s = jax.random.uniform(k_test, (test_x0.shape[0],), x0.dtype)
    return cast(
        "tuple[FlowMatchingField, Array, Array]",  # what _fit returns: the trained field, losses and tests
        _fit(
            field,
            x0,
            x1,
            test_s,
            test_x0,
            test_x1,
            k_fit,
            int(steps),
            int(batch_size),
            jnp.asarray(learning_rate, x0.dtype),
        ),
    )


def push_forward(
    field: FlowMatchingField,
    x0: Float[Array, "members n d"],
    s: Float[np.ndarray, " times"],
    *,
    steps: int,
    solver: str = "rk4",
) -> Float[Array, "members times n d"]:
    """The tokens `x0` carried by the surrogate's flow $\\dot x = v(s, x)$ from $s = 0$
    to $1$ in `steps` fixed steps of `solver` (the core's `simulate`, in flat space),
    recorded at the times `s` (on the step grid, or interpolated between its steps)."""
    system = VectorField(terms=(field,), scheme="none")
    s = np.asarray(s)
    # The times are static (the solve records at them): one compiled program per field
    # structure, times and steps, reused by every call with the same ones.
    return _carry(system, x0, tuple(s.tolist()), str(s.dtype), int(steps), solver)


@eqx.filter_jit
def _carry(system, x0, s: tuple[float, ...], dtype: str, steps: int, solver: str):
    s = np.asarray(s, dtype)  # pyright: ignore[reportAssignmentType]  # the static tuple of times, as an array
    one = lambda y0: simulate(system, y0, t1=1.0, dt=1.0 / steps, num_steps=steps, solver=solver, ts=s).xs
    return jax.vmap(one)(x0)


def sinkhorn_distance(x: Float[Array, "points d"], y: Float[Array, "others d"], *, epsilon: float) -> Float[Array, ""]:
    """$\\sqrt{S_\\epsilon(\\mu_x, \\mu_y)}$, the square root of the Sinkhorn divergence
    (Feydy et al. 2019; ott-jax) between the uniform empirical measures on the rows of
    `x` and `y`, for the squared Euclidean cost and regularization `epsilon`.

    It is zero for equal measures and tends to the Wasserstein-2 distance as
    `epsilon` goes to 0; a length, in the units of the points.
    """
    from ott.geometry.pointcloud import PointCloud  # lazy: start-up
    from ott.tools.sinkhorn_divergence import sinkhorn_divergence  # lazy: start-up

    # ott-jax's Sinkhorn mixes its int iteration count with floats and broadcasts by rank.
    with jax.numpy_dtype_promotion("standard"), jax.numpy_rank_promotion("allow"):
        value, _ = sinkhorn_divergence(
            PointCloud, x, y, epsilon=epsilon, solve_kwargs={"threshold": 1e-4, "max_iterations": 5000}
        )
    return jnp.sqrt(jnp.maximum(value, 0.0))
