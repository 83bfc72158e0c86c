"""Lyapunov exponents of a flow by the QR method of Benettin et al.

The state is stepped with the fixed-step map $\\Phi_h$ of `simulate` (`step_map`: pinned
schedule pieces, retraction on the sphere), and $k$ deviation vectors ride
along with it through the tangent map of that step, $V \\mapsto D\\Phi_h(y) V$, obtained
by `jax.jvp`. As $h \\to 0$ the tangent map of the discrete step converges to the flow
of the tangent ODE $\\dot V = D\\mathcal{F}(t, y) V$ at the order of the method.

Every `reorthonormalize_every` steps the deviation matrix is factored, $V = QR$, the
vectors are replaced by $Q$, and $\\log |R_{jj}|$ is added to the $j$-th sum; the
finite-time exponents over $[t_0, T]$ are

$$\\lambda_j(T) = \\frac{1}{T - t_0} \\sum_{\\text{intervals}} \\log |R_{jj}|,$$

which converge to the Lyapunov spectrum as $T \\to \\infty$ (Benettin, Galgani,
Giorgilli, Strelcyn, Meccanica 15, 1980). Since the product of the interval factors $R$
is the triangular factor of the whole product, the exponents do not depend on the
re-orthonormalisation interval in exact arithmetic; the interval only has to be short
enough that the vectors do not all fall onto the leading direction in floating point.

On the sphere each token moves in $T_{x_i} S^{d-1}$: the deviation vectors start in the
tangent space of every token and are projected back onto it before each factorization,
so the $k \\le n(d-1)$ exponents leave out the $n$ normal directions (along which the
retraction contracts at once, an exponent of $-\\infty$).

**Symmetries.** A flow that commutes with a group, $\\Phi_t(g y) = g\\, \\Phi_t(y)$, maps
the tangent vectors of the group orbit at $y$ to those at $\\Phi_t(y)$: for rotations,
$D\\Phi_t(y)[A y] = A\\, \\Phi_t(y)$ for every skew-symmetric $A$. Such vectors neither
grow nor shrink while the orbit keeps its dimension, so the spectrum holds zeros forced
by the symmetry, one per orbit direction, whatever the dynamics do. Self-attention with
$Q$, $K$, $V$ multiples of the identity commutes with every rotation of $\\mathbb R^d$:
its orbit has dimension $d(d-1)/2$ while the tokens span at least a plane (for example
two distinct clusters), and $d - 1$ at consensus. With `quotient` (for example
`rotation_orbit`), the deviation vectors are kept orthogonal to the orbit's tangent
space (projected before every factorization): the exponents are those of the flow on
the quotient, the *transverse* exponents, the spectrum with the orbit's directions
removed. The orbit's span is invariant under the tangent map, so the projected products
telescope: $P D\\Phi_2 P D\\Phi_1 P = P D\\Phi_2 D\\Phi_1 P$ with $P$ the projection.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Float, PRNGKeyArray, ScalarLike

from ..numerics._field import VectorField
from ..numerics._geometry import Euclidean
from ..numerics._grid import step_count
from ..numerics._simulate import step_map
from ..schema._errors import ConfigError


class LyapunovSpectrum(eqx.Module):
    r"""The output of `lyapunov_spectrum`.

    `exponents[j]` is the $j$-th finite-time exponent over $[t_0, t_1]$ (descending).
    `times[m]` is the $m$-th re-orthonormalisation time, the last one $t_1$;
    `running[m]`, when asked for, holds the finite-time exponents over $[t_0,$
    `times[m]`$]$, whose last row is `exponents`. Column $j$ of `running` follows the
    deviation vector whose exponent is `exponents[j]`, so that
    $(T_b \lambda_j(T_b) - T_a \lambda_j(T_a)) / (T_b - T_a)$ (with $T$ measured from
    $t_0$) is its exponent over $[T_a, T_b]$: the estimate without the initial transient.
    """

    exponents: Float[Array, " k"]
    times: Float[Array, " intervals"]
    running: Float[Array, "intervals k"] | None = None


def _orthonormalized(v: Float[Array, " k *shape"]) -> tuple[Array, Array]:
    """$V = QR$ of the flattened `(size, k)` matrix: $Q$ back in the shape of `v`, with
    its columns' signs chosen so that $R_{jj} \\ge 0$ (the unique factor with that
    convention), and $\\log |R_{jj}|$."""
    k = v.shape[0]
    q, r = jnp.linalg.qr(v.reshape(k, -1).T)
    diag = jnp.diagonal(r)
    sign = jnp.where(diag < 0, -1.0, 1.0).astype(q.dtype)
    return (q * sign[None, :]).T.reshape(v.shape), jnp.log(jnp.abs(diag))


def rotation_orbit(y: Float[Array, "n d"]) -> Float[Array, "m n d"]:
    """The tangent vectors $A y$ of the rotation orbit of the tokens $y$ (rows $x_i \\mapsto
    A x_i$), one for each generator $A = e_a e_b^\\top - e_b e_a^\\top$, $a < b$: $m =
    d(d-1)/2$ vectors that span the orbit's tangent space (fewer independent ones when the
    tokens are degenerate, for example all at one point). Tangent to the sphere at every
    token: the `quotient` of `lyapunov_spectrum` for rotation-equivariant flows."""
    d = y.shape[-1]
    a, b = (jnp.asarray(i) for i in np.triu_indices(d, k=1))
    m = jnp.arange(a.shape[0])
    # Row x_i of A y is e_a x_ib - e_b x_ia for the generator (a, b).
    out = jnp.zeros((a.shape[0],) + y.shape, y.dtype)
    out = out.at[m, :, a].set(y[:, b].T)
    return out.at[m, :, b].set(-y[:, a].T)


def _orbit_complement(span: Array, v: Array) -> Array:
    """`v` (k vectors) projected onto the orthogonal complement of the span of `span` (m
    vectors), both flattened. Directions of the span whose share of its Gram spectrum is
    at the round-off of the dtype (a degenerate orbit) are left out."""
    s = span.reshape(span.shape[0], -1)
    w, u = jnp.linalg.eigh(s @ s.T)
    keep = w > w[-1] * 100 * jnp.finfo(s.dtype).eps
    basis = jnp.where(keep[:, None], (u.T @ s) / jnp.sqrt(jnp.where(keep, w, 1.0))[:, None], 0.0)
    flat = v.reshape(v.shape[0], -1)
    return (flat - (flat @ basis.T) @ basis).reshape(v.shape)


def lyapunov_spectrum(
    field: VectorField | Callable,
    y0: Float[Array, "*shape"],
    *,
    t1: ScalarLike,
    dt: ScalarLike,
    k: int | None = None,
    t0: ScalarLike = 0.0,
    solver="rk4",
    reorthonormalize_every: int = 1,
    running: bool = False,
    key: PRNGKeyArray | None = None,
    args=None,
    quotient: Callable[[Array], Array] | None = None,
) -> LyapunovSpectrum:
    r"""The $k$ leading finite-time Lyapunov exponents of $\dot y = f(t, y)$ on $[t_0, t_1]$
    from `y0`, by the QR (Benettin) method.

    **Arguments:**

    - `field`: an attnflow `VectorField` (its `geometry` says whether the tokens live
      on the sphere, where `y0` is retracted first and the state after every step, as
      in `simulate`), or any callable `f(t, y, args)` on an array `y` of any shape
      (flat space); `args` is passed to it.
    - `dt`: the fixed step; it must cut $[t_0, t_1]$ into a whole number $N$ of steps.
    - `k`: how many exponents (default all: $n(d-1)$ on the sphere, `y0.size` in flat
      space).
    - `solver`: a fixed-step method by name (`euler`, `heun`, `midpoint`, `ralston`,
      `bosh3`, `rk4`, `tsit5`, `dopri5`, `dopri8`, or `euler_renorm` on the sphere) or
      a diffrax explicit Runge-Kutta solver instance.
    - `reorthonormalize_every`: steps between QR factorizations; it must divide $N$.
    - `running`: also return the finite-time exponents at every re-orthonormalisation
      time (their convergence in $T$).
    - `key`: draws the initial orthonormal deviation vectors (default
      `jax.random.key(0)`).
    - `quotient`: a function of the state returning vectors `(m, *y.shape)` that span
      the tangent space of the orbit of a symmetry of the flow (for example
      `rotation_orbit` when the flow commutes with rotations); the deviation vectors
      are then kept orthogonal to it, and the exponents are the transverse ones: the
      zeros that the symmetry forces are left out. `k` is then at most the dimension
      less $m$.

    Traceable in `y0` (and the field's arrays): it can be called under `jax.jit` and
    `jax.vmap` over members; $t_0$, $t_1$, `dt` and the integers are static.
    """
    y0 = jnp.asarray(y0)
    if not jnp.issubdtype(y0.dtype, jnp.floating):
        y0 = y0.astype(float)
    if isinstance(field, VectorField) and y0.ndim != 2:
        raise ConfigError(f"a VectorField's state has shape (n, d), got y0 of shape {y0.shape}.")
    num_steps = step_count(t0, t1, dt)
    dtype = y0.dtype
    t0_ = jnp.asarray(t0, dtype)
    h = (jnp.asarray(t1, dtype) - t0_) / num_steps
    step = step_map(field, solver, h, args=args)
    geometry = step.geometry
    y0 = geometry.retract(y0)

    on_sphere = not isinstance(geometry, Euclidean)
    dimension = y0.shape[0] * (y0.shape[1] - 1) if on_sphere else y0.size
    where = (
        f"the tangent space has dimension n(d - 1) = {dimension}" if on_sphere else f"the state has {dimension} entries"
    )
    if quotient is not None:
        if not callable(quotient):
            raise ConfigError(f"quotient must be a function of the state (such as rotation_orbit), got {quotient!r}.")
        spanning = jax.eval_shape(quotient, y0)
        if spanning.shape[1:] != y0.shape:
            raise ConfigError(
                f"quotient must return vectors of the state's shape, (m, "
                f"{', '.join(map(str, y0.shape))}), got shape {spanning.shape}."
            )
        dimension -= spanning.shape[0]
        where += f", less the {spanning.shape[0]} orbit directions of the quotient"
    k = dimension if k is None else k
    if not (isinstance(k, numbers.Integral) and 1 <= k <= dimension):
        raise ConfigError(f"k must be a whole number of exponents from 1 to {dimension} ({where}), got {k!r}.")
    every = reorthonormalize_every
    if not (isinstance(every, numbers.Integral) and every >= 1 and num_steps % every == 0):
        divisors = [m for m in range(1, min(num_steps, 50) + 1) if num_steps % m == 0]
        raise ConfigError(
            f"reorthonormalize_every must be a positive whole number of steps dividing the {num_steps} steps, "
            f"got {every!r}; for example one of {', '.join(map(str, divisors))}."
        )
    k, every = int(k), int(every)
    intervals = num_steps // every

    key = jax.random.key(0) if key is None else key
    on_manifold = lambda y, v: jax.vmap(lambda w: geometry.project(y, w))(v)
    if quotient is None:
        tangent = on_manifold
    else:
        tangent = lambda y, v: _orbit_complement(quotient(y), on_manifold(y, v))
    v0, _ = _orthonormalized(tangent(y0, jax.random.normal(key, (k,) + y0.shape, dtype)))

    def advance(y, v, t):
        # One primal evaluation and k tangents: the primal input is not batched, so
        # under the vmap over deviation vectors it is computed once.
        return jax.vmap(lambda w: jax.jvp(lambda z: step(t, z), (y,), (w,)), out_axes=(None, 0))(v)

    def interval(carry, m):
        y, v, sums = carry

        def one(state, j):
            y, v = state
            return advance(y, v, t0_ + jnp.asarray(m * every + j, dtype) * h), None

        (y, v), _ = lax.scan(one, (y, v), jnp.arange(every))
        v, logs = _orthonormalized(tangent(y, v))
        sums = sums + logs
        return (y, v, sums), (sums if running else None)

    (_, _, sums), history = lax.scan(interval, (y0, v0, jnp.zeros(k, dtype)), jnp.arange(intervals))
    times = t0_ + h * every * jnp.arange(1, intervals + 1, dtype=dtype)
    span = times[-1] - t0_
    # One order for both outputs, so that a column of `running` follows one deviation
    # vector (and differences of its cumulative sums give exponents over sub-windows).
    order = jnp.argsort(-sums)
    return LyapunovSpectrum(
        exponents=(sums / span)[order],
        times=times,
        running=(history / (times - t0_)[:, None])[:, order] if running else None,  # pyright: ignore[reportOptionalOperand]  # history is saved when running
    )
