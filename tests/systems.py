"""The reference systems of the tests (their closed forms are written in README.md)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from scipy.integrate import solve_ivp

import attnflow as af


def identity_field(d, beta, *, kind="sa", causal=False, heads=1, scheme="sphere", dtype=jnp.float64, tangent=None):
    """Q = K = V = I self-attention (the model of Geshkovski et al.)."""
    eye = af.Identity(heads, d, jnp.dtype(dtype).name)
    attention = af.SelfAttention(eye, eye, eye, None, jnp.asarray(beta, dtype), None, heads=heads, kind=kind,
                                 causal=causal)
    return af.VectorField((attention,), scheme=scheme, tangent=tangent)


def random_field(key, d, beta, *, heads=2, dk=None, kind="sa", causal=False, mlp=False, dtype=jnp.float64,
                 scheme="sphere", alibi=None):
    """Multi-head attention with Gaussian Q, K, V, O (and optionally an MLP)."""
    import jax

    dk = dk or d
    kq, kk, kv, ko, k1, k2, k3 = jax.random.split(key, 7)
    g = lambda k, shape: af.Constant(af.draw_matrix("gaussian", k, shape, 1.0, dtype))
    attention = af.SelfAttention(g(kq, (heads, dk, d)), g(kk, (heads, dk, d)), g(kv, (heads, d, d)),
                                 g(ko, (heads, d, d)), jnp.asarray(beta, dtype),
                                 None if alibi is None else jnp.asarray(alibi, dtype), heads=heads, kind=kind,
                                 causal=causal)
    terms = [attention]
    if mlp:
        terms.append(af.MLP(w1=g(k1, (3 * d, d)), w2=g(k2, (d, 3 * d)), b1=g(k3, (3 * d,)), activation="gelu"))
    norm = af.TokenNorm("layer") if scheme in ("pre", "peri") else None
    return af.VectorField(tuple(terms), scheme=scheme, norm=norm, out_norm=norm)


def equiangular_rate(rho, beta, n, kind="sa"):
    """d rho/dt for n equiangular unit vectors with common inner product rho (Q = K = V = I)."""
    num = 2 * np.exp(beta * rho) * (1 - rho) * (1 + (n - 1) * rho)
    den = np.exp(beta) + (n - 1) * np.exp(beta * rho) if kind == "sa" else n
    return num / den


def equiangular_rho(times, beta, n, kind="sa", rho0=0.0):
    """The common inner product rho(t), by a tight independent (SciPy) solve."""
    sol = solve_ivp(lambda t, r: equiangular_rate(r, beta, n, kind), (0.0, float(np.max(times))), [rho0],
                    method="DOP853", rtol=1e-13, atol=1e-15, t_eval=np.asarray(times, float), dense_output=False)
    return sol.y[0]


def published_staircase(angles, betas, steps: int, step: float = 1e-5) -> np.ndarray:
    """The energy staircase computed as the published code of "Dynamic metastability in the
    self-attention model" computes it, in angles on the circle: with
    $g_i = \\frac{1}{n^2} \\sum_j -\\sin(\\theta_i - \\theta_j) e^{\\beta(\\cos(\\theta_i - \\theta_j) - 1)}$,
    each step is $\\theta \\leftarrow \\theta + h \\log(\\beta)\\, g / |g|$, and when $|g| < 10^{-5}$
    every pair $j < k$ (in index order) with $|\\theta_j - \\theta_k| < 10^{-3}$ gets
    $\\theta_k \\leftarrow \\theta_j$. Returns $\\frac{1}{n^2} \\sum_{ij} e^{\\beta(\\cos(\\theta_i -
    \\theta_j) - 1)}$ after each step (at rescaled times $h, 2h, \\dots$), one row per beta of
    `betas`: the runs are independent, advanced side by side (numpy over the betas, one
    Python loop over the steps)."""
    beta = np.asarray(betas, dtype=np.float64).reshape(-1, 1, 1)
    theta = np.tile(np.asarray(angles, dtype=np.float64), (beta.shape[0], 1))
    n = theta.shape[1]
    energy = np.empty((beta.shape[0], steps))
    speed = step * np.log(beta[:, :, 0])

    def pairs(theta):
        gap = theta[:, :, None] - theta[:, None, :]
        return gap, np.exp(beta * (np.cos(gap) - 1))

    gap, weight = pairs(theta)
    for k in range(steps):
        g = np.sum(-np.sin(gap) * weight, axis=2) / n**2
        size = np.sqrt(np.sum(g * g, axis=1, keepdims=True))
        theta = theta + np.divide(speed * g, size, out=np.zeros_like(g), where=size > 0)
        gap, weight = pairs(theta)
        snap = size[:, 0] < 1e-5
        # (a pass where no pair is within 1e-3 and apart changes nothing: skipped)
        if snap.any() and np.any(snap[:, None, None] & (np.abs(gap) < 1e-3) & (gap != 0)):
            for j in range(n):
                for i in range(j + 1, n):
                    close = snap & (np.abs(theta[:, j] - theta[:, i]) < 1e-3)
                    theta[:, i] = np.where(close, theta[:, j], theta[:, i])
            gap, weight = pairs(theta)
        energy[:, k] = np.mean(weight, axis=(1, 2))
    return energy


def rk4_rate(rate, h):
    """The exponent of $\\dot v = \\lambda v$ under RK4 steps of size h: $\\log |R(h\\lambda)| / h$,
    $R(z) = 1 + z + z^2/2 + z^3/6 + z^4/24$."""
    z = rate * h
    return np.log(np.abs(1 + z + z**2 / 2 + z**3 / 6 + z**4 / 24)) / h
