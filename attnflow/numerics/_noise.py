r"""Noise: the stochastic dynamics $dX = \mathcal{F}(t, X)\,dt + \sigma\, dW$ on the field's geometry.

The Brownian path of a member is drawn from the member's key, in one of two ways
(`NOISE_PATHS`, the config's `noise.path`):

- `tree`: a diffrax `VirtualBrownianTree`. Its values at the dyadic times
  $t_0 + k (t_1 - t_0) 2^{-\text{depth}}$ do not depend on the step size, so a seed gives
  the same path at any dt (exactly where the grid times are dyadic, to the tree's
  resolution elsewhere). Each step descends the tree: about 9 normal draws of the state's
  shape per step at depth 10.
- `increments` (`StepIncrements`): the step k over $[t, t + h]$ draws its own normal
  $\sqrt{h}\,Z_k$ from the key folded with k. These are exactly the increments of a
  Brownian path on the fixed grid the run steps on, one normal draw per step (9 times
  fewer than the tree's at n = 1e6: 0.04 s against 0.37 s on a 2-core CPU), but another
  dt gives another path.

Either way an ensemble stays one vmapped program.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray, ScalarLike

from ..schema._config import NOISE_KINDS, NOISE_PATHS
from ..schema._errors import ConfigError
from ._geometry import AbstractGeometry
from ._schedules import AbstractSchedule


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
    `VirtualBrownianTree` of the state's shape, or its `StepIncrements` on a grid of fixed
    steps; build either with `brownian_noise`.

    `schedule`, when given, is a scalar schedule $s(t)$ (shape `()`, see `attnflow.numerics._schedules`)
    and the strength is $\sigma(t) = \sigma\, s(t)$: its piece is chosen at the step's
    midpoint, as the field's are, and a smooth factor is read at the step's start (the
    Ito convention), so the step adds $\sigma(t)\,\Delta W$.
    """

    sigma: Float[Array, ""]
    path: eqx.Module
    schedule: AbstractSchedule | None = None
    kind: str = eqx.field(static=True, default="projected")

    def __check_init__(self):
        if self.kind not in NOISE_KINDS:
            raise ConfigError(f"unknown noise kind {self.kind!r}; choose one of {', '.join(NOISE_KINDS)}.")

    def increment(
        self,
        geometry: AbstractGeometry,
        t: ScalarLike,
        h: ScalarLike,
        x: Float[Array, "n d"],
        at: ScalarLike | None = None,
    ) -> Float[Array, "n d"]:
        r"""$\sigma(t) \Delta W$ over $[t, t + h]$ at the state `x` of the step's start (projected
        to its tangent space for `projected`), the schedule's piece chosen at `at` (the
        field's `piece_time`; default the step's midpoint). Times are clipped to the tree's
        interval, which a last grid time may overshoot by a rounding."""
        path = self.path
        lo, hi = jnp.asarray(path.t0, x.dtype), jnp.asarray(path.t1, x.dtype)  # pyright: ignore[reportAttributeAccessIssue]  (a diffrax Brownian path; typed eqx.Module, diffrax is imported lazily)
        dw = path.evaluate(jnp.clip(t, lo, hi), jnp.clip(t + h, lo, hi))  # pyright: ignore[reportAttributeAccessIssue]  (as above)
        if self.kind == "projected":
            dw = geometry.project(x, dw)
        return self.strength(t, t + h / 2 if at is None else at) * dw

    def strength(self, t: ScalarLike, at: ScalarLike | None = None) -> Float[Array, ""]:
        r"""$\sigma(t)$, with the piece of a piecewise schedule chosen at `at` (default `t`)."""
        if self.schedule is None:
            return self.sigma
        return self.sigma * self.schedule(t, at)


class StepIncrements(eqx.Module):
    r"""The increments of a Brownian path on a grid of fixed steps: the step over
    $[s, t]$ with $s = t_0 + k h$ draws $\sqrt{t - s}\,Z_k$, $Z_k$ a standard normal of
    `shape` from `key` folded with k, independent across steps. It has the interface of a
    diffrax Brownian path (`t0`, `t1`, `evaluate(s, t)`) for the fixed steps `simulate`
    takes, and no values between grid times: an adaptive solver needs the tree."""

    key: PRNGKeyArray
    t0: float = eqx.field(static=True)
    t1: float = eqx.field(static=True)
    step: Float[Array, ""]
    shape: tuple[int, ...] = eqx.field(static=True)
    dtype: jnp.dtype = eqx.field(static=True)

    def evaluate(self, s: ScalarLike, t: ScalarLike) -> Array:
        s, t = jnp.asarray(s, self.dtype), jnp.asarray(t, self.dtype)
        k = jnp.round((s - self.t0) / self.step).astype(jnp.int32)
        normal = jax.random.normal(jax.random.fold_in(self.key, k), self.shape, self.dtype)
        return jnp.sqrt(t - s) * normal


def tree_depth(t0: float, t1: float, dt: float, depth: int | None = None) -> int:
    """`depth`, or where it is None the least depth whose resolution $(t_1 - t_0) 2^{-\\text{depth}}$
    is at most `dt`. The values at the dyadic times of the shallower levels do not depend on
    the depth, so the default gives one path for every dyadic step $(t_1 - t_0)/2^k$."""
    if depth is not None:
        return int(depth)
    return max(1, math.ceil(math.log2((t1 - t0) / dt) - 1e-9))


def brownian_noise(
    key: PRNGKeyArray,
    sigma: ScalarLike,
    shape: tuple[int, ...],
    *,
    t0: float,
    t1: float,
    kind: str = "projected",
    depth: int = 16,
    dtype=jnp.float32,
    schedule: AbstractSchedule | None = None,
    path: str = "tree",
    step: ScalarLike | None = None,
) -> BrownianNoise:
    r"""$\sigma\,dW$ with the Brownian path of `key` on $[t_0, t_1]$; `shape` is the state's,
    `(n, d)`; `schedule` a scalar factor $s(t)$ of the strength, $\sigma(t) = \sigma\, s(t)$
    (None: constant). `path="tree"` resolves the path to $(t_1 - t_0) 2^{-\text{depth}}$ (a
    step of that size or coarser on the dyadic grid sees it exactly); `path="increments"`
    draws one normal per fixed step of size `step` (`StepIncrements`; `depth` unused)."""
    if schedule is not None and schedule.shape != ():
        raise ConfigError(f"a noise schedule is a scalar factor of sigma, got values of shape {schedule.shape}.")
    if path == "increments":
        if step is None or (isinstance(step, (int, float)) and not step > 0):
            raise ConfigError(f"noise.path=increments draws one normal per fixed step: give its step, got {step!r}.")
        step = jnp.asarray(step, dtype)
        increments = StepIncrements(key, float(t0), float(t1), step, tuple(shape), jnp.dtype(dtype))
        return BrownianNoise(jnp.asarray(sigma, dtype), increments, schedule, kind)
    if path != "tree":
        raise ConfigError(f"unknown noise path {path!r}; choose one of {', '.join(NOISE_PATHS)}.")
    import diffrax  # lazy: start-up (diffrax, for noisy runs only)

    if not 1 <= int(depth) <= 40:
        raise ConfigError(f"noise.depth must be a whole number from 1 to 40, got {depth!r}.")
    tree = diffrax.VirtualBrownianTree(
        t0, t1, tol=(t1 - t0) * 2.0 ** -int(depth), shape=jax.ShapeDtypeStruct(shape, dtype), key=key
    )
    return BrownianNoise(jnp.asarray(sigma, dtype), tree, schedule, kind)


def _log_attention_mode(beta: ScalarLike, d: ScalarLike) -> float:
    r"""$\log A(\beta)$ (see `attention_mode`), after checking beta and d."""
    from scipy import special  # lazy: start-up

    try:
        whole, value = float(d).is_integer(), float(beta)  # pyright: ignore[reportArgumentType]  (ScalarLike admits complex: its TypeError is caught below)
    except (TypeError, ValueError):
        raise ConfigError(f"beta and d must be numbers, got beta={beta!r} and d={d!r}.") from None
    if isinstance(d, bool) or not whole or float(d) < 2:  # pyright: ignore[reportArgumentType]  (d converted above)
        raise ConfigError(f"the sphere S^(d-1) needs a whole dimension d >= 2, got d={d!r}.")
    if isinstance(beta, bool) or not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"beta must be a finite number >= 0, got beta={beta!r}.")
    d, beta = int(float(d)), value  # pyright: ignore[reportArgumentType]  (d converted above)
    if beta == 0:
        return -math.log(d)
    nu = d / 2 - 1
    # ive(nu, b) = e^{-b} I_nu(b): the exponent is put back in log space.
    return special.gammaln(d / 2) + nu * math.log(2 / beta) + math.log(special.ive(d / 2, beta)) + beta - math.log(beta)


def _exp(log: float, what: str) -> float:
    """e^log, or one sentence where it is beyond float64."""
    if log > _LOG_LARGEST:
        raise ConfigError(f"{what} is e^{log:.6g}, beyond the largest float64 (e^{_LOG_LARGEST:.6g}); lower beta.")
    return math.exp(log)


_LOG_LARGEST = math.log(float(np.finfo(np.float64).max))


def attention_mode(beta: ScalarLike, d: ScalarLike) -> float:
    r"""$A(\beta) = \frac{1}{d-1}\,\mathbb{E}\big[e^{\beta t}(1 - t^2)\big]$, $t = \langle x, y\rangle$
    for $y$ uniform on $S^{d-1}$: the factor by which unnormalized attention with
    $Q = K = V = I$ moves the first spherical harmonic of a density near the uniform law,
    $v[\rho_0(1 + \varepsilon\langle a, \cdot\rangle)](x) = \varepsilon A(\beta) P_x a$. In closed form
    $A(\beta) = \Gamma(d/2)\,(2/\beta)^{d/2 - 1} I_{d/2}(\beta)/\beta$ ($I_1(\beta)/\beta$ on the
    circle), from the modified Bessel function; $A(0) = 1/d$.

    Raises `ConfigError` for beta that is not a finite number >= 0, a d that is not a
    whole number >= 2, or a value beyond float64 (beta above about 700)."""
    return _exp(_log_attention_mode(beta, d), f"A(beta={beta:g}, d={d})")


def first_mode_rate(beta: float, d: int, sigma: float) -> float:
    r"""The linear growth rate $\lambda = (d-1)\big(A(\beta) - \sigma^2/2\big)$ of the first spherical
    harmonic of the density at the uniform law, for the McKean-Vlasov equation of noisy
    unnormalized attention ($Q = K = V = I$) on $S^{d-1}$ (docs/model.md, "Noise")."""
    return (d - 1) * (attention_mode(beta, d) - sigma**2 / 2)


def critical_sigma(beta: ScalarLike, d: ScalarLike) -> float:
    r"""$\sigma_c(\beta, d) = \sqrt{2 A(\beta)}$: above it the uniform law of noisy unnormalized
    attention ($Q = K = V = I$) on $S^{d-1}$ is linearly stable, below it the first
    spherical harmonic grows (`first_mode_rate`)."""
    return _exp(0.5 * (math.log(2) + _log_attention_mode(beta, d)), f"sigma_c(beta={beta:g}, d={d})")


def _chi_square_mean(f, k: int) -> float:
    r"""$\mathbb{E}[f(Y)]$ for $Y = |\zeta|^2 \sim \chi^2_k$, $\zeta$ standard normal in $\mathbb{R}^k$: an
    integral over $r = |\zeta|$ against the chi density $r^{k-1}e^{-r^2/2}/(2^{k/2-1}\Gamma(k/2))$."""
    from scipy import integrate, special  # lazy: start-up

    log_norm = (k / 2 - 1) * math.log(2) + special.gammaln(k / 2)
    return integrate.quad(
        lambda r: f(r * r) * r ** (k - 1) * math.exp(-r * r / 2 - log_norm), 0, math.inf, epsabs=1e-14, epsrel=1e-12
    )[0]


def euler_first_mode_factor(beta: float, d: int, sigma: float, dt: float) -> tuple[float, float]:
    r"""$(a, c)$: one Euler step with noise (`solver=euler`, `noise.kind=projected`) of noisy
    unnormalized attention ($Q = K = V = I$) on $S^{d-1}$, at step $h$ = `dt`, maps the
    mean $m = \frac1n\sum_i x_i$ of tokens near the uniform law, to first order, to
    $a\,m$ plus a noise of variance $(1 - c^2)/n$ (docs/model.md, "Noise"):
    $$c = \mathbb{E}\big[(1 + s^2 Y)^{-1/2}\big],\quad
    a = c + (d-1)A(\beta)\,h\,\mathbb{E}\Big[\Big(1 + \tfrac{d-2}{d-1}s^2 Y\Big)(1 + s^2 Y)^{-3/2}\Big],$$
    $s^2 = \sigma^2 h$, $Y \sim \chi^2_{d-1}$ (the squared projected Brownian increment over $h$).
    $c$ is the mean of one token's retracted noise step, the second term the retraction's
    damping of the attention's step."""
    k, s2 = d - 1, sigma**2 * dt
    c = _chi_square_mean(lambda y: (1 + s2 * y) ** -0.5, k)
    g = _chi_square_mean(lambda y: (1 + (d - 2) / k * s2 * y) * (1 + s2 * y) ** -1.5, k)
    return c + k * attention_mode(beta, d) * dt * g, c


def euler_critical_sigma(beta: ScalarLike, d: ScalarLike, dt: ScalarLike) -> float:
    r"""The threshold of the step that runs take: the sigma at which one Euler step with noise
    (`solver=euler`, `noise.kind=projected`) at step $h$ = `dt` neither grows nor damps the
    first spherical harmonic of tokens near the uniform law, $a = 1$ in
    `euler_first_mode_factor` (docs/model.md, "Noise"). The retraction turns a token by the
    arctangent of its tangent increment, not by the increment, and the step's threshold lies
    above `critical_sigma` by $\sigma_c\,(d+1)A(\beta)\,h/4 + O(h^2)$ (2.2% at beta = 1, d = 2,
    dt = 60/1024). It tends to `critical_sigma` as dt -> 0.

    Raises `ConfigError` for beta and d as `critical_sigma` does, or dt that is not a
    positive number."""
    from scipy import optimize  # lazy: start-up

    sigma_c = critical_sigma(beta, d)
    try:
        step = float(dt)  # pyright: ignore[reportArgumentType]  (ScalarLike admits complex: its TypeError is caught below)
    except (TypeError, ValueError):
        step = math.nan
    if isinstance(dt, bool) or not (math.isfinite(step) and step > 0):
        raise ConfigError(f"dt must be a positive number, got dt={dt!r}.")
    beta, d = float(beta), int(float(d))  # pyright: ignore[reportArgumentType]  (checked by critical_sigma)

    def excess(sigma: float) -> float:  # a - 1: positive below the threshold, negative above
        return euler_first_mode_factor(beta, d, sigma, step)[0] - 1

    # a falls from 1 + (d-1)A h at sigma = 0 toward 0: the root is bracketed by doubling.
    high = 2 * sigma_c
    while excess(high) > 0:
        high *= 2
    root = optimize.brentq(excess, 0.0, high, xtol=1e-14, rtol=1e-13)  # pyright: ignore[reportArgumentType]  (scipy's stub types rtol as float64)
    return float(root)  # pyright: ignore[reportArgumentType]  (a float: full_output is off)
