r"""The mean-field limit of attention on the circle: the density of infinitely many tokens.

Tokens $x = (\cos\theta, \sin\theta)$ on $S^1$ under self-attention with
$Q = K = V = I$ move along the circle at the angular speed
$\dot\theta_i = \langle e_{\theta_i}, \sum_j a_{ij} x_j\rangle$, and
$\langle e_\theta, x_j\rangle = \sin(\theta_j - \theta)$. As $n \to \infty$ the empirical
measure of the angles tends to a density $\rho(t, \theta)$ (mass 1) that solves the
continuity equation

$$\partial_t \rho + \partial_\theta(\rho\, v[\rho]) = \tfrac{\sigma^2}{2}\, \partial_\theta^2 \rho,$$

with the attention field of the density

$$v[\rho](\theta) = \frac{1}{Z(\theta)} \int_0^{2\pi} e^{\beta\cos(\varphi - \theta)}
  \sin(\varphi - \theta)\, \rho(\varphi)\, d\varphi$$

and $Z(\theta) = \int e^{\beta\cos(\varphi - \theta)} \rho(\varphi)\, d\varphi$ for
softmax attention (`"sa"`), $Z = 1$ for unnormalised attention (`"usa"`, the $1/n$ of
its finite-n form); $\sigma$ is the strength of a Brownian noise on the angles (the
continuity equation without noise: eq. (19) of "A Survey of Continuous Time Dynamics of
Transformers", after "A mathematical perspective on Transformers").

**The spectral form.** With $\rho(\theta) = \sum_k c_k e^{ik\theta}$, the kernels are
convolutions, so the fields are multiplications of Fourier coefficients:
$\hat v_k = i a_k c_k$ with $a_k = \int_0^{2\pi} e^{\beta\cos u}\sin u \sin(ku)\,du
= \pi(I_{k-1}(\beta) - I_{k+1}(\beta))$ and $\hat Z_k = 2\pi I_k(\beta) c_k$ ($I_k$ the
modified Bessel functions). The coefficients of the kernels are computed here by the
trapezoidal rule on a fine grid (exact to rounding for these analytic periodic
kernels), independently of the Bessel closed forms the tests compare with. The product
$\rho v$ (and the quotient by $Z$) is formed on a grid of $N$ points and transformed
back, keeping the modes $|k| \le K = \lfloor (N - 1)/3 \rfloor$: the 2/3 rule, so that
the quadratic product does not alias onto the kept modes. Then

$$\dot c_k = -ik\, \widehat{(\rho v)}_k - \tfrac{\sigma^2 k^2}{2} c_k,$$

the diffusion diagonal, and $\dot c_0 = 0$ exactly: the mass $2\pi c_0$ is conserved to
rounding. The coefficients are stepped by a diffrax solver with adaptive steps.

**Positivity.** The exact density stays positive, but at $\sigma = 0$ it concentrates into
clusters that sharpen exponentially; once a cluster is narrower than the grid resolves,
the truncated series oscillates and dips below zero. The solution records its minimum,
and a run whose density falls below $-$`tolerance` times the mean density says so in a
warning.

**Linear stability.** The uniform density $\rho_0 = 1/2\pi$ is stationary, and a small
perturbation in mode $k \ge 1$ grows at the rate (docs/model.md, "The mean-field limit on
the circle")

$$\lambda_k = \frac{k}{2}\,\frac{I_{k-1}(\beta) - I_{k+1}(\beta)}{\zeta} - \frac{\sigma^2 k^2}{2},
  \qquad \zeta = I_0(\beta) \text{ (SA)},\ \zeta = 1 \text{ (USA)}$$

(`circle_growth_rate`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Literal

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import scipy.special
from jaxtyping import Array, ArrayLike, Complex, Float

from ..numerics._noise import critical_sigma
from ..running._ensemble import available_memory
from ..schema._errors import ConfigError, SolverFailure

SOLVERS = {"tsit5": diffrax.Tsit5, "dopri8": diffrax.Dopri8, "kvaerno5": diffrax.Kvaerno5}


class MeanFieldSolution(eqx.Module):
    """The density of `meanfield_circle` at the times asked for.

    - `ts`: the times;
    - `coefficients`: the Fourier coefficients $c_k$, $k = 0, \\dots, K$, of
      $\\rho(t, \\theta) = \\sum_{|k| \\le K} c_k e^{ik\\theta}$ ($c_{-k} = \\bar c_k$);
    - `density`: $\\rho$ on the grid $\\theta_j = 2\\pi j/N$ at each time;
    - `mass`: $\\int \\rho\\, d\\theta = 2\\pi c_0$ at each time;
    - `min_density`: the minimum of $\\rho$ on the grid at each time;
    - `steps`: the number of accepted solver steps.
    """

    ts: Float[Array, " times"]
    coefficients: Complex[Array, "times modes"]
    density: Float[Array, "times grid"]
    mass: Float[Array, " times"]
    min_density: Float[Array, " times"]
    steps: Array


# e^beta in float64 (its largest number is e^709.78): unnormalised attention keeps it.
USA_LARGEST_BETA = 700.0


def _kernel_points(beta: float, modes: int) -> int:
    """The quadrature points of `_kernel_coefficients`."""
    return 2 * modes + 128 + int(40 * np.sqrt(beta))


def kernel_table_bytes(beta: float, grid: int) -> int:
    r"""The memory the kernel's coefficients are formed in for a density on `grid`
    points at `beta`: three float64 tables of (modes + 1) x points (the phases, their
    sines and cosines), points growing like $40\sqrt\beta$."""
    modes = (int(grid) - 1) // 3
    return 3 * 8 * (modes + 1) * _kernel_points(float(beta), modes)


def check_kernel_table(beta: float, grid: int, name: str = "beta") -> None:
    """Refuse (`ConfigError`, before anything is allocated) a beta whose kernel tables do
    not fit in half of the available memory; `name` is the setting that gave beta."""
    need, memory = kernel_table_bytes(beta, grid), available_memory()
    if need > memory // 2:
        raise ConfigError(
            f"{name}={beta:g} needs {need / 2**30:.1f} GiB for the kernel's Fourier coefficients on "
            f"the circle ({40 * np.sqrt(beta):.3g} quadrature points for each of {(grid - 1) // 3 + 1} "
            f"modes), more than half of the {memory / 2**30:.1f} GiB available; lower {name} (the "
            f"clusters of beta={beta:g} are far narrower than {grid} grid points resolve anyway)."
        )


def _kernel_coefficients(beta: float, modes: int):
    r"""$a_k / e^{\beta}$ and $2\pi I_k(\beta) / e^{\beta}$ for $k = 0, \dots,$ `modes`,
    by the trapezoidal rule on P points. Its error for mode k is the coefficient of mode
    P - k, of order $e^{-(P - k)^2 / 2\beta}$: with
    $P \ge 2\,\mathrm{modes} + 128 + 40\sqrt\beta$ it is below $e^{-800}$."""
    points = _kernel_points(beta, modes)
    u = jnp.arange(points, dtype=jnp.float64) * (2 * jnp.pi / points)
    weight = jnp.exp(beta * (jnp.cos(u) - 1)) * (2 * jnp.pi / points)
    k = jnp.arange(modes + 1, dtype=jnp.float64)
    phase = k[:, None] * u[None, :]
    field = jnp.sum((weight * jnp.sin(u))[None, :] * jnp.sin(phase), axis=1)
    normalizer = jnp.sum(weight[None, :] * jnp.cos(phase), axis=1)
    return field, normalizer


def _rhs(grid: int, modes: int):
    k = jnp.arange(modes + 1, dtype=jnp.float64)

    def to_grid(c):
        return jnp.fft.irfft(c, n=grid) * grid

    def from_grid(values):
        return jnp.fft.rfft(values)[: modes + 1] / grid

    def rhs(t, y, args):
        field, normalizer, softmax, sigma = args
        c = jax.lax.complex(y[: modes + 1], y[modes + 1 :])
        rho = to_grid(c)
        # Softmax divides by Z, unnormalised attention by 1: data, so both kinds share one program.
        v = to_grid(c * jax.lax.complex(jnp.zeros_like(field), field)) / (
            softmax * to_grid(c * normalizer.astype(c.dtype)) + (1 - softmax)
        )
        flux = from_grid(rho * v)
        dc = flux * jax.lax.complex(jnp.zeros_like(k), -k) - (0.5 * sigma**2 * k**2).astype(c.dtype) * c
        return jnp.concatenate([dc.real, dc.imag])

    return rhs


@eqx.filter_jit
def _solve(y0, ts, field, normalizer, softmax, sigma, *, grid, modes, solver, rtol, atol, max_steps):
    term = diffrax.ODETerm(_rhs(grid, modes))
    solution = diffrax.diffeqsolve(
        term,
        SOLVERS[solver](),
        ts[0],
        ts[-1],
        None,
        y0,
        args=(field, normalizer, softmax, sigma),
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
        max_steps=max_steps,
        throw=False,
    )
    c = jax.lax.complex(solution.ys[:, : modes + 1], solution.ys[:, modes + 1 :])  # pyright: ignore[reportOptionalSubscript]  # ys is saved (SaveAt(ts=ts))
    density = jnp.fft.irfft(c, n=grid, axis=-1) * grid
    return c, density, solution.stats["num_accepted_steps"], solution.result == diffrax.RESULTS.successful


def meanfield_circle(
    density: Float[ArrayLike, " grid"] | Sequence[float],
    ts: Float[ArrayLike, " times"] | Sequence[float],
    *,
    beta: float,
    kind: Literal["sa", "usa"] = "sa",
    sigma: float = 0.0,
    solver: str = "tsit5",
    rtol: float = 1e-8,
    atol: float = 1e-10,
    max_steps: int = 200_000,
    tolerance: float = 1e-6,
) -> MeanFieldSolution:
    r"""Solve the continuity equation of the token density on the circle,
    $\partial_t \rho + \partial_\theta(\rho\, v[\rho]) = \frac{\sigma^2}{2}\partial_\theta^2\rho$,
    spectrally (see the module's docstring), in float64.

    **Arguments:**

    - `density`: the initial density $\rho(0, \theta_j)$ on the grid
      $\theta_j = 2\pi j / N$, $j = 0, \dots, N - 1$; its modes $|k| \le (N - 1)/3$ are
      kept (the products are formed on this grid, dealiased by the 2/3 rule). Its mass
      is whatever it integrates to (1 for a probability density).
    - `ts`: increasing times at which the density is returned, from the initial time.
    - `beta`: the inverse temperature $\beta \ge 0$.
    - `kind`: `"sa"` (softmax attention, the field divided by $Z$) or `"usa"`
      (unnormalised, the $1/n$ of the particles' sum becoming the density's mass).
    - `sigma`: the noise strength $\sigma \ge 0$ (diffusion $\sigma^2/2$).
    - `solver`: `"tsit5"` (explicit, the default: fastest here), `"dopri8"` or
      `"kvaerno5"` (implicit, for strongly diffusive runs), with adaptive steps at
      `rtol`, `atol` and at most `max_steps` steps.
    - `tolerance`: a density below $-$`tolerance` times its mean on the grid makes a
      warning (the clusters are narrower than the grid resolves).

    **Returns:** a `MeanFieldSolution`.
    """
    if not jax.config.read("jax_enable_x64"):
        raise ConfigError("meanfield_circle computes in float64: call jax.config.update('jax_enable_x64', True) first.")
    rho = np.asarray(density, np.float64)
    ts = np.asarray(ts, np.float64)
    if rho.ndim != 1 or rho.size < 7 or not np.all(np.isfinite(rho)):
        raise ConfigError(
            f"the initial density must be a finite 1-d array on at least 7 grid points, got shape {rho.shape}."
        )
    if ts.ndim != 1 or ts.size < 1 or not np.all(np.isfinite(ts)) or np.any(np.diff(ts) <= 0):
        raise ConfigError(f"ts must be a non-empty increasing 1-d array of finite times, got {ts!r}.")
    if kind not in ("sa", "usa"):
        raise ConfigError(f"kind must be 'sa' (softmax) or 'usa' (unnormalised), got {kind!r}.")
    if not (np.isfinite(beta) and beta >= 0) or not (np.isfinite(sigma) and sigma >= 0):
        raise ConfigError(f"beta and sigma must be finite and >= 0, got beta={beta!r}, sigma={sigma!r}.")
    if kind == "usa" and beta > USA_LARGEST_BETA:
        raise ConfigError(
            f"unnormalised attention multiplies by e^beta, which float64 holds up to beta = "
            f"{USA_LARGEST_BETA:g}, got beta={beta:g}; lower beta, or take kind='sa'."
        )
    if solver not in SOLVERS:
        raise ConfigError(f"solver must be one of {', '.join(SOLVERS)}, got {solver!r}.")
    grid = rho.size
    check_kernel_table(float(beta), grid)
    modes = (grid - 1) // 3
    c0 = np.fft.rfft(rho)[: modes + 1] / grid
    y0 = jnp.asarray(np.concatenate([c0.real, c0.imag]))
    field, normalizer = _kernel_coefficients(float(beta), modes)
    if kind == "usa":
        field = field * np.exp(beta)  # the e^beta that softmax divides out
    softmax = jnp.asarray(1.0 if kind == "sa" else 0.0)
    c, rho_t, steps, ok = _solve(
        y0,
        jnp.asarray(ts),
        field,
        normalizer,
        softmax,
        jnp.asarray(sigma, jnp.float64),
        grid=grid,
        modes=modes,
        solver=solver,
        rtol=jnp.asarray(float(rtol)),
        atol=jnp.asarray(float(atol)),
        max_steps=max_steps,
    )
    if not bool(ok):
        raise SolverFailure(
            f"the {solver} solver stopped before t = {ts[-1]:g} (at most {max_steps} steps): raise "
            "max_steps, or stop before the clusters are narrower than the grid resolves."
        )
    minimum = jnp.min(rho_t, axis=1)
    mean = float(c0[0].real)
    low = float(jnp.min(minimum))
    if low < -tolerance * mean:
        at = ts[int(np.argmax(np.asarray(minimum) < -tolerance * mean))]
        warnings.warn(
            f"the mean-field density goes negative from t = {at:g} on (minimum {low:.3g}, mean {mean:.3g}): "
            f"its clusters are narrower than {grid} grid points resolve, so read it only before then.",
            RuntimeWarning,
            stacklevel=2,
        )
    return MeanFieldSolution(jnp.asarray(ts), c, rho_t, 2 * jnp.pi * c[:, 0].real, minimum, steps)


def circle_growth_rate(
    k: ArrayLike, beta: ArrayLike, kind: Literal["sa", "usa"] = "sa", sigma: ArrayLike = 0.0
) -> np.ndarray | float:
    r"""The linear growth rate of mode $k \ge 1$ of a small perturbation of the uniform
    density $1/2\pi$ (mass 1) under the continuity equation of `meanfield_circle`:

    $$\lambda_k = \frac{k}{2}\,\frac{I_{k-1}(\beta) - I_{k+1}(\beta)}{\zeta}
      - \frac{\sigma^2 k^2}{2} = \frac{k^2 I_k(\beta)}{\beta\,\zeta} - \frac{\sigma^2 k^2}{2},$$

    $\zeta = I_0(\beta)$ for softmax attention, 1 for unnormalised (derived in
    docs/model.md). NumPy, broadcasting over `k`, `beta` and `sigma`.
    """
    k, beta, sigma = (np.asarray(a, np.float64) for a in (k, beta, sigma))
    # The exponentially scaled Bessel functions, e^{-beta} I_k, so that large beta does not overflow.
    drift = 0.5 * k * (scipy.special.ive(k - 1, beta) - scipy.special.ive(k + 1, beta))
    drift = drift / scipy.special.ive(0, beta) if kind == "sa" else drift * np.exp(beta)
    return drift - 0.5 * sigma**2 * k**2


def circle_stationary_order(
    beta: float, sigma: float, *, points: int = 512, tol: float = 1e-12, max_iterations: int = 200_000
) -> float:
    r"""The order parameter $r = |\int e^{i\theta}\rho(\theta)\,d\theta|$ of the ordered
    stationary density of noisy unnormalised attention (`"usa"`, Q = K = V = I) on the
    circle: the mean-field limit of the stationary $|\frac1n\sum_i x_i|$ below the
    critical noise $\sigma_c = \sqrt{2 I_1(\beta)/\beta}$ (`attnflow.critical_sigma`).

    The unnormalised field is a gradient, $v[\rho] = \partial_\theta \Phi$ with
    $\Phi = W * \rho$ and $W(u) = e^{\beta\cos u}/\beta$, so the stationary densities of
    the continuity equation with diffusion $\frac{\sigma^2}{2}\partial_\theta^2$ are
    the solutions of

    $$\rho = e^{2\Phi/\sigma^2} \Big/ \int_0^{2\pi} e^{2\Phi/\sigma^2}, \qquad
      \hat\Phi_k = \frac{2\pi I_k(\beta)}{\beta}\, c_k .$$

    They are found by the damped fixed-point iteration $\rho \leftarrow (\rho + T\rho)/2$
    from the bump $(1 + \cos\theta)/2\pi$, on `points` angles, until $T\rho$ moves by
    less than `tol` (in $\max|\cdot|$); the convergence slows as $\sigma \to \sigma_c$
    (about 9000 iterations at $0.999\,\sigma_c$, $\beta = 1$), where $r$ falls to 0 like
    $\sqrt{\sigma_c - \sigma}$. For $\sigma \ge \sigma_c$ the uniform density, linearly
    stable there, is returned: $r = 0$. A density narrower than the grid's spacing (large
    $\beta$, small $\sigma$) gives $r = 1$ to that resolution. Raises `SolverFailure` when
    `max_iterations` do not converge.
    """
    beta, sigma = float(beta), float(sigma)
    if not (0 < beta <= USA_LARGEST_BETA and sigma > 0):
        raise ConfigError(
            f"circle_stationary_order needs 0 < beta <= {USA_LARGEST_BETA:g} (e^beta in float64) and "
            "sigma > 0, "
            f"got beta={beta!r}, sigma={sigma!r}."
        )
    sigma_c = critical_sigma(beta, 2)
    if sigma >= sigma_c * (1 - 1e-9):  # within rounding of sigma_c counts as sigma_c
        return 0.0
    theta = np.arange(points) * (2 * np.pi / points)
    # 2/sigma^2 times the Fourier multipliers of W (finite in float64 for beta <= 700).
    gain = 2 / sigma**2 * 2 * np.pi * scipy.special.iv(np.arange(points // 2 + 1), beta) / beta
    rho = (1 + np.cos(theta)) / (2 * np.pi)
    for _ in range(max_iterations):
        exponent = np.fft.irfft(gain * np.fft.rfft(rho), points)
        image = np.exp(exponent - exponent.max())
        image /= image.mean() * 2 * np.pi
        moved = np.abs(image - rho).max()
        rho = 0.5 * (rho + image)
        if moved < tol:
            return float(np.abs(np.mean(rho * np.exp(1j * theta))) * 2 * np.pi)
    raise SolverFailure(
        f"the stationary density at beta={beta:g}, sigma={sigma:g} did not converge in "
        f"{max_iterations} iterations; sigma is too close to the critical {sigma_c:.6g}, or raise "
        "max_iterations."
    )


def _circle_cdf(coefficients: Complex[ArrayLike, " modes"], points: int) -> np.ndarray:
    """$F(\\theta) = \\int_0^\\theta \\rho$ on `points` equally spaced angles $2\\pi j/$`points`
    (and at $2\\pi$: `points + 1` values), from the coefficients $c_0, \\dots, c_K$."""
    c = np.asarray(coefficients)
    k = np.arange(1, c.size)
    primitive = np.zeros(points // 2 + 1, complex)  # of the zero-mean part: c_k / (ik)
    primitive[1 : c.size] = c[1:] / (1j * k)
    periodic = np.fft.irfft(primitive, n=points) * points
    theta = np.arange(points + 1) * (2 * np.pi / points)
    periodic = np.append(periodic, periodic[0])
    return c[0].real * theta + periodic - periodic[0]


def circle_wasserstein(
    angles: Float[ArrayLike, " n"], coefficients: Complex[ArrayLike, " modes"], points: int = 8192
) -> float:
    r"""The Wasserstein-1 distance on the circle between the empirical measure of
    `angles` (each of mass $1/n$) and the density with Fourier coefficients
    `coefficients` (mass 1):

    $$W_1 = \min_\alpha \int_0^{2\pi} |F(\theta) - G(\theta) - \alpha|\, d\theta,$$

    $F$ the empirical and $G$ the density's cumulative distribution from angle 0, the
    minimum reached at $\alpha$ the median of $F - G$ under $d\theta$ (Rabin, Delon,
    Gousseau, "Transportation distances on the circle", 2011). $G$ is evaluated on
    `points` equally spaced angles and linearly between them; the integral of
    $|F - G - \alpha|$ is then exact between the sorted breakpoints of both (and
    $\alpha$ the median of $F - G$ at their midpoints).
    """
    theta = np.sort(np.mod(np.asarray(angles, np.float64), 2 * np.pi))
    n = theta.size
    grid = np.arange(points + 1) * (2 * np.pi / points)
    cdf = _circle_cdf(coefficients, points)
    cuts = np.sort(np.concatenate([grid, theta]))
    lengths = np.diff(cuts)
    # F is constant and G linear between two breakpoints: F - G - alpha is linear there.
    empirical = np.searchsorted(theta, 0.5 * (cuts[:-1] + cuts[1:]), side="right") / n
    at = np.interp(cuts, grid, cdf)
    start, end = empirical - at[:-1], empirical - at[1:]
    middle = 0.5 * (start + end)
    ranked = np.argsort(middle)
    cumulative = np.cumsum(lengths[ranked])
    alpha = middle[ranked][np.searchsorted(cumulative, 0.5 * cumulative[-1])]
    a, b = start - alpha, end - alpha
    same = a * b >= 0
    size = np.abs(a) + np.abs(b)
    crossing = np.divide(a * a + b * b, size, out=np.zeros_like(size), where=size > 0)
    return float(np.sum(lengths * 0.5 * np.where(same, size, crossing)))
