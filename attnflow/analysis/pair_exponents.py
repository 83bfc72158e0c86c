r"""Token-pair sensitivity: finite-time Lyapunov exponents of one token's velocity with
respect to another token ("Neural ODE Transformers", eq. 7 and appendix B).

**The quantity.** Along a trajectory $X(t) = (x_1, \dots, x_n)$ of
$\dot X = \mathcal{F}(t, X)$, write $J_{ji}(t) = \partial \mathcal{F}_j / \partial x_i$ for
the $d \times d$ block of the field's Jacobian that says how the velocity of token $j$
(the *output*) responds to a displacement of token $i$ (the *input*). The pair's tangent
matrix solves

$$\dot Y_{ji} = J_{ji}(t)\, Y_{ji}, \qquad Y_{ji}(t_0) = I_d,$$

and the sensitivity of output $j$ to input $i$ is its largest finite-time exponent

$$\lambda_{ji} = \frac{1}{t_1 - t_0} \log \sigma_{\max}\big(Y_{ji}(t_1)\big).$$

$Y_{ji}$ is not a block of the flow's full Jacobian (which adds every path
$i \to k \to j$ through other tokens): it follows the direct coupling of the pair alone,
as a conditional Lyapunov exponent follows one subsystem. For softmax attention the
block is, per head (appendix B, with the factor $\beta$ and the terms of the query that
the appendix leaves out),

$$J_{ji} = a_{ji} V + \beta\, a_{ji} (v_i - f_j)\, q_j^\top K
   + \delta_{ij}\, \beta \sum_m a_{jm} (v_m - f_j)\, k_m^\top Q,$$

with $q = Qx$, $k = Kx$, $v = Vx$ and $f_j = \sum_m a_{jm} v_m$: the attention weight
$a_{ji}$ times a factor that also measures how far the value $v_i$ is from the output.

**The discretisation.** The trajectory is stepped by the run's own one-step map
$\Phi_h$: the step of `simulate` (`step_map`, with the schedule pieces pinned at the
step's midpoint, a Lie-Trotter or Strang split and the post-LN retractions of a
checkpoint's layer map where asked), or one Runge-Kutta step of a plain callable. Let
$B_{ji}$ be the $d \times d$ blocks of the Jacobian of its increment
$\Phi_h(X) - X$ at the step's start, and $M_{ji} = I_d + B_{ji}$ the pair's one-step
tangent map; then $Y_{ji} \leftarrow M_{ji} Y_{ji}$ at every step. For Euler,
$B_{ji} = h J_{ji}(t_k, X_k)$ and this is exactly the Euler step of the equation above
along the Euler trajectory. For any other Runge-Kutta method or split,
$B_{ji} = h J_{ji} + O(h^2)$ (the $O(h^2)$ terms include chains $J_{jk} J_{ki}$ through
other tokens), a first-order consistent discretisation: as $h \to 0$ every method gives
the exponents of the continuous equation, at first order. At $h = 1$ on a checkpoint's
depth flow, $M_{ji}$ is the identity plus the block of the Jacobian of the real layer's
update, $\partial(\text{layer}(X)_j - x_j)/\partial x_i$.

The rows $B_{j\cdot}$ for the chosen outputs come from reverse mode: one `jax.vjp` of
the step, pulled back along the $d$ unit cotangents of each output token (`len(outputs)`
$\cdot d$ pullbacks a step, against $n d$ tangents in forward mode); the trajectory,
the tangent products and the attention average are one `lax.scan` over the steps.

**Renormalisation.** Every `normalize_every` steps each $Y_{ji}$ is divided by the
power of two $2^{e}$ at or below its largest entry and $e$ is added to an integer count
$E_{ji}$, so that long runs neither overflow nor underflow. Scaling by a power of two
is exact in floating point, so the exponents do not depend on the interval, and
$\lambda_{ji} = (E_{ji} \log 2 + \log \sigma_{\max}(Y_{ji})) / (t_1 - t_0)$. A pair
whose block vanishes keeps $Y = I$ exactly, and its exponent is exactly 0.

**Causal models.** With a causal mask token $j$ never sees tokens $i > j$, so
$J_{ji} = 0$ and $\lambda_{ji} = 0$ says nothing: those entries are reported as NaN.

**The attention map** beside it, which explanations read instead: the attention
matrices of the field's attention term, averaged over heads and over the steps (at each
step's starting state), rows the outputs,
$\bar a_{ji} = \frac{1}{N} \sum_k \frac{1}{H} \sum_h a^h_{ji}(t_k)$.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, ArrayLike, Float, Int, ScalarLike

from ..numerics._field import VectorField
from ..numerics._grid import step_count
from ..numerics._simulate import DepthDynamics, StepMap, step_map
from ..numerics._terms import SelfAttention
from ..schema._errors import ConfigError


class Sensitivity(eqx.Module):
    r"""The output of `token_sensitivity`.

    `exponents[r, i]` is $\lambda_{ji}$ for the output token $j$ = `outputs[r]` and the
    input token $i$ (NaN where a causal mask hides $i$ from $j$, $i > j$);
    `attention[r, i]` the head- and step-averaged attention weight $\bar a_{ji}$ (None
    for a plain callable or a field without attention); `outputs` the output positions
    (non-negative); `times` the renormalisation times, the last one $t_1$.
    """

    exponents: Float[Array, "outputs n"]
    attention: Float[Array, "outputs n"] | None
    outputs: Int[Array, " outputs"]
    times: Float[Array, " intervals"]


def _attention_terms(field) -> list[SelfAttention]:
    return [term for term in field.terms if isinstance(term, SelfAttention)] if isinstance(field, VectorField) else []


def _attention(step: StepMap, t, x: Float[Array, "n d"]) -> Float[Array, "n n"]:
    """The attention matrix that the step from `(t, x)` reads at its start, averaged over heads."""
    return jnp.mean(step.field.pinned(t + step.dt / 2).attention_weights(t, x), axis=0)


def _tangent_maps(
    step: StepMap, t, x: Float[Array, "n d"], outputs: Int[Array, " m"]
) -> tuple[Float[Array, "n d"], Float[Array, "m n d d"]]:
    r"""$\Phi_h(t, X)$ and the one-step tangent maps $M_{ji} = I_d + B_{ji}$ of the
    outputs $j$ against every token $i$, $B$ the Jacobian blocks of the increment
    $\Phi_h(X) - X$; by reverse mode, $d$ pullbacks per output."""
    n, d = x.shape
    x1, pull = jax.vjp(lambda z: step(t, z), x)
    eye = jnp.eye(d, dtype=x.dtype)
    coordinate = jnp.arange(d)

    def row(j):
        basis = jnp.zeros((d, n, d), x.dtype).at[coordinate, j, coordinate].set(1)
        # rows[a, i, b] = d Phi_{j a} / d x_{i b}: on the diagonal block that is already
        # I + B_jj; off it, the increment's block B_ji needs the identity added.
        (rows,) = jax.vmap(pull)(basis)
        blocks = jnp.swapaxes(rows, 0, 1)
        return blocks + jnp.where((jnp.arange(n, dtype=j.dtype) != j)[:, None, None], eye, 0)

    return x1, lax.map(row, outputs)


def _rescaled(y: Float[Array, "*batch d d"]) -> tuple[Float[Array, "*batch d d"], Int[Array, "*batch"]]:
    """`y / 2**e` with $2^e \\le \\max |y| < 2^{e+1}$, and `e`: an exact rescaling."""
    _, e = jnp.frexp(jnp.max(jnp.abs(y), axis=(-2, -1)))
    e = e - 1
    return jnp.ldexp(y, -e[..., None, None]), e


@eqx.filter_jit
def _sensitivity(step: StepMap, x0, t0, num_steps: int, every: int, outputs: tuple[int, ...]):
    n, d = x0.shape
    rows = jnp.asarray(outputs, jnp.int32)
    m = len(outputs)
    dtype = x0.dtype
    h = step.dt
    attention_terms = _attention_terms(step.field)

    def one(state, k):
        x, y, attention = state
        t = t0 + jnp.asarray(k, dtype) * h
        if attention_terms:
            attention = attention + _attention(step, t, x)[rows]
        x, maps = _tangent_maps(step, t, x, rows)
        return (x, jnp.einsum("jiab,jibc->jiac", maps, y), attention), None

    def interval(state, r):
        x, y, attention, counts = state
        (x, y, attention), _ = lax.scan(one, (x, y, attention), r * every + jnp.arange(every))
        y, e = _rescaled(y)
        return (x, y, attention, counts + e), None

    y0 = jnp.broadcast_to(jnp.eye(d, dtype=dtype), (m, n, d, d))
    start = (x0, y0, jnp.zeros((m, n), dtype), jnp.zeros((m, n), jnp.int32))
    (_, y, attention, counts), _ = lax.scan(interval, start, jnp.arange(num_steps // every))
    top = jnp.linalg.svd(y, compute_uv=False)[..., 0]
    span = h * num_steps
    exponents = (counts.astype(dtype) * jnp.log(jnp.asarray(2, dtype)) + jnp.log(top)) / span
    if any(term.causal for term in attention_terms):
        hidden = jnp.arange(n, dtype=rows.dtype)[None, :] > rows[:, None]
        exponents = jnp.where(hidden, jnp.nan, exponents)
    return exponents, (attention / num_steps if attention_terms else None)


def _output_positions(outputs, n: int) -> tuple[int, ...]:
    """The output positions as non-negative indices (negative ones count from the end)."""
    if outputs is None:
        return tuple(range(n))
    if isinstance(outputs, numbers.Integral):
        outputs = [outputs]
    given = (
        list(np.asarray(outputs).reshape(-1).tolist()) if isinstance(outputs, (Sequence, np.ndarray, jax.Array)) else []
    )
    if not given or any(not isinstance(o, numbers.Integral) or isinstance(o, bool) or not -n <= o < n for o in given):  # pyright: ignore[reportOperatorIssue]  # numbers.Integral's stub lacks __ge__
        raise ConfigError(
            f"outputs must be token positions from {-n} to {n - 1} (negative ones count from the end) "
            f"or None for all {n} tokens, got {outputs!r}."
        )
    return tuple(int(o) % n for o in given)


def token_sensitivity(
    flow: VectorField | DepthDynamics | Callable,
    x0: Float[ArrayLike, "n d"],
    *,
    t1: ScalarLike | None = None,
    dt: ScalarLike | None = None,
    t0: ScalarLike = 0.0,
    outputs: int | Sequence[int] | None = None,
    solver="euler",
    split: str | None = None,
    retractions=None,
    normalize_every: int = 1,
    args=None,
) -> Sensitivity:
    r"""The token-pair sensitivities $\lambda_{ji}$ of eq. 7 ("Neural ODE Transformers")
    over $[t_0, t_1]$ from the tokens `x0`, beside the averaged attention map.

    **Arguments:**

    - `flow`: a `VectorField` (on the sphere `x0` is retracted first, as in
      `simulate`); a checkpoint's `DepthFlow` (then $t_1$ defaults to its depth, `dt`
      to 1 and `split`, `retractions` to its own: the real model's layer map); or a
      plain callable `f(t, x, args)` on the `(n, d)` state (`args` passed to it).
    - `dt`: the fixed step; it must cut $[t_0, t_1]$ into a whole number $N$ of steps.
    - `outputs`: the output tokens $j$ (rows), a position or a list of them (negative
      ones count from the end); default every token. `[-1]`, the token whose state
      predicts the next one, costs $1/n$ of the full map.
    - `solver`: a fixed-step method by name (see `simulate`) or a diffrax explicit
      Runge-Kutta solver; Euler makes the tangent step exactly the Euler step of eq. 7.
    - `split`, `retractions`: as in `simulate` (VectorField and DepthFlow only).
    - `normalize_every`: steps between renormalisations of the tangent matrices; it must
      divide $N$ (the result does not depend on it: the rescaling is exact).

    Traceable in `x0` and the flow's arrays (it can run under `jax.vmap` over an
    ensemble of initial states); the times, `outputs` and the integers are static.
    """
    if isinstance(flow, DepthDynamics):
        t1 = flow.depth if t1 is None else t1
        dt = 1.0 if dt is None else dt
        split = flow.split if split is None else split
        retractions = flow.retractions if retractions is None else retractions
        flow = flow.field
    x0 = jnp.asarray(x0)
    if not jnp.issubdtype(x0.dtype, jnp.floating):
        x0 = x0.astype(float)
    if x0.ndim != 2:
        raise ConfigError(f"the tokens x0 must have shape (n, d), got {tuple(x0.shape)}.")
    if t1 is None or dt is None:
        raise ConfigError("token_sensitivity needs the final time t1 and the step dt (a DepthFlow has its own).")
    if not callable(flow):
        raise ConfigError(
            f"flow must be a VectorField, a DepthFlow or a callable f(t, x, args), got {type(flow).__name__}."
        )
    num_steps = step_count(t0, t1, dt)
    dtype = x0.dtype
    t0_ = jnp.asarray(t0, dtype)
    h = (jnp.asarray(t1, dtype) - t0_) / num_steps
    step = step_map(flow, solver, h, split=split, retractions=retractions, args=args)
    x0 = step.geometry.retract(x0)
    n = x0.shape[0]
    positions = _output_positions(outputs, n)
    every = normalize_every
    if not (
        isinstance(every, numbers.Integral) and not isinstance(every, bool) and every >= 1 and num_steps % every == 0
    ):
        divisors = [k for k in range(1, min(num_steps, 50) + 1) if num_steps % k == 0]
        raise ConfigError(
            f"normalize_every must be a positive whole number of steps dividing the {num_steps} steps, "
            f"got {every!r}; for example one of {', '.join(map(str, divisors))}."
        )
    exponents, attention = _sensitivity(step, x0, t0_, num_steps, int(every), positions)
    times = t0_ + h * every * jnp.arange(1, num_steps // every + 1, dtype=dtype)
    return Sensitivity(exponents=exponents, attention=attention, outputs=jnp.asarray(positions, jnp.int32), times=times)
