"""Attention sums on the circle and the sphere in $O(nL)$ and $O(nL^2)$: harmonic summation.

For unit tokens the logits of one head are $\\beta\\langle Q x_i, K x_j\\rangle = \\langle u_i,
x_j\\rangle$ with the query vector $u_i = \\beta K^\\top Q x_i$ (`query_vectors`), of length
$r_i$ and direction $\\hat u_i$. The kernel $e^{\\langle u_i, x_j\\rangle}$ separates in
harmonics of $x_j$ (Jacobi-Anger on $S^1$, Funk-Hecke and the addition theorem on $S^2$):
$$e^{-r}e^{r \\cos(\\psi - \\phi)} = \\sum_{k \\ge 0} w_k c_k(r) \\cos k(\\psi - \\phi),\\qquad
c_k(r) = e^{-r} I_k(r),\\ w_0 = 1,\\ w_k = 2;$$
$$e^{-r}e^{r\\,\\hat u \\cdot y} = \\sum_{l \\ge 0} w_l c_l(r) P_l(\\hat u \\cdot y)
= \\sum_{l \\ge 0} w_l c_l(r) \\sum_{m} S_{lm}(\\hat u) S_{lm}(y),\\qquad
c_l(r) = e^{-r} i_l(r),\\ w_l = 2l + 1,$$
with $S_{lm}$ the real Schmidt semi-normalised spherical harmonics ($\\sum_m S_{lm}(a)
S_{lm}(b) = P_l(a \\cdot b)$), and $\\cos k(\\psi - \\phi) = \\cos k\\psi \\cos k\\phi +
\\sin k\\psi \\sin k\\phi$ likewise a sum of products. Truncated at degree $L$, the sum
$\\sum_j e^{\\langle u_i, x_j\\rangle} v_j$ is then $e^{r_i} F(u_i)^\\top M$ with the
moments $M = \\sum_j B(x_j) v_j^\\top$ of the $2L + 1$ (circle) or $(L + 1)^2$ (sphere)
basis functions $B$ and the query features $F(u) = w\\,c(r) \\odot B(\\hat u)$: a cost
linear in n.

The scaled coefficients $c_k(r) \\le 1$ never overflow: they come from the ratios
$\\rho_k = c_k / c_{k-1} = r / (a_k + r \\rho_{k+1})$ ($a_k = 2k$ on the circle, $2k + 1$
on the sphere: the three-term recurrences of $I_k$ and $i_l$), a continued fraction run
backwards from $\\rho_{L + 24} = 0$ (Miller's algorithm; the 24 guard orders make the
ratios at $k \\le L$ exact to rounding), normalised by $\\sum_k w_k c_k(r) = 1$ (the kernel
at $\\hat u \\cdot y = 1$). Softmax attention divides by the same sum with $v = 1$ (the
scale $e^{r_i}$ cancels); unnormalised attention multiplies by $e^{r_i} / n$, overflowing
exactly where the direct path's $e^{\\ell_{ij}}$ does.

The degree: $|P_l| \\le 1$ and $|\\cos| \\le 1$, so the truncation changes each scaled
pair term $e^{\\langle u_i, x_j\\rangle - r_i}$ by at most the coefficient tail
$\\tau_L(r_i) = \\sum_{k > L} w_k c_k(r_i)$, which grows with r (`error_bound`). `degree`
is the smallest L with $\\tau_L(r_{\\max}) \\le$ `tol` at the largest radius $r_{\\max} =
\\beta \\max_h \\|K_h^\\top Q_h\\|_2$ (`largest_radius`): one static L per call.

Masks: causal attention sums over $j \\le i$. The tokens go in chunks of `WINDOW`; a
query sums the keys of its own chunk exactly (direct exps: the rows with few keys, whose
normaliser may be small against the truncation error, are exact) and those of the earlier
chunks through their moments, a prefix sum carried from chunk to chunk (memory
$O(\\mathrm{chunk} \\cdot L^{d-1})$ whatever n). ALiBi's weight $e^{-\\lambda |i - j|}$
factors as $e^{-\\lambda (i - s + 1)} e^{-\\lambda (s - 1 - j)}$ across a chunk boundary s:
the carried moments decay by $e^{-\\lambda \\cdot \\mathrm{chunk}}$ per chunk (a linear
recurrence), and without the causal mask the keys $j > i$ come from the same sums run over
the reversed sequence.

The field's error: with $\\tau$ the tail at the degree, row i changes by at most
$\\tau e^{r_i} \\sum_{j\\,\\mathrm{far}} |v_j|$ in its sum and $\\tau e^{r_i} n_{\\mathrm{far}}$ in its
normaliser $Z_i$; relative to the field that is $\\tau$ times $e^{r_i} n / Z_i$, between 1
(all keys along $u_i$) and $e^{2 r_i}$ (all keys opposite), about $\\sqrt{2\\pi r}$ (circle)
or $2r$ (sphere) for tokens spread uniformly.

Everything is written for one head; `attention_heads` maps it over a head axis.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Float

from ..schema._errors import ConfigError
from ..schema._harmonic_degree import (
    _GUARD,
    _backward_step,
    _check_dim,
    _forward,
    _orders_backward,
    _weights,
    basis_size,
)

# Floats of basis functions per chunk of tokens without a mask: 2^17, 512 KiB in float32
# (at n = 2^20, d = 2: chunks of 4096 tokens ran 1.5x faster than 42000, 3x faster than
# one chunk; benchmarks/harmonic.py).
_CHUNK_FLOATS = 2**17
# Tokens per chunk under a mask: each query sums the keys of its own chunk exactly (so a
# row with few keys, or with ALiBi weights that leave few, is exact) and the earlier ones
# through their moments.
WINDOW = 128


def coefficients(r: Float[Array, " ..."], degree: int, d: int) -> Float[Array, "... L"]:
    """$c_k(r) = e^{-r} I_k(r)$ (circle) or $e^{-r} i_k(r)$ (sphere, modified spherical
    Bessel functions of the first kind) for k = 0 ... `degree`: shape `r.shape + (degree + 1,)`."""
    _check_dim(d)
    orders = tuple(jnp.asarray(a, r.dtype) for a in _orders_backward(d, degree + _GUARD))
    zero = jnp.zeros_like(r)
    (_, nested), ratios = lax.scan(_backward_step(r), (zero, zero), orders)
    return _forward(ratios[::-1], nested, degree, jnp.stack)


def query_vectors(q: Array, key: Array | None, beta) -> Array:
    """$u_i = \\beta K^\\top q_i$ from the queries `q` `(heads, m, d_k)` or `(m, d_k)` and the
    key matrices `key` `(heads, d_k, d)` (None: the identity, d_k = d): the logits are then
    $\\langle u_i, x_j\\rangle$."""
    if key is None:
        return beta * q
    spec = "mk,hkd->hmd" if q.ndim == 2 else "hmk,hkd->hmd"
    return beta * jnp.einsum(spec, q, key)


def _orders(degree: int, d: int) -> np.ndarray:
    """The degree of each basis function, in the order of `basis`."""
    if d == 2:
        return np.concatenate([[0], np.repeat(np.arange(1, degree + 1), 2)])
    return np.repeat(np.arange(degree + 1), 2 * np.arange(degree + 1) + 1)


def _powers(x: Float[Array, "c d"], degree: int) -> tuple[Array, Array]:
    """The real and imaginary parts of $(x_0 + i x_1)^m$, m = 0 ... `degree`: `(c, degree + 1)`
    each, by doubling (the powers $0 \\dots 2^j - 1$ times $(x_0 + i x_1)^{2^j}$)."""
    re, im = jnp.ones_like(x[:, :1]), jnp.zeros_like(x[:, :1])
    step_re, step_im = x[:, :1], x[:, 1:2]
    while re.shape[1] <= degree:
        re, im = (
            jnp.concatenate([re, re * step_re - im * step_im], axis=1),
            jnp.concatenate([im, im * step_re + re * step_im], axis=1),
        )
        step_re, step_im = step_re * step_re - step_im * step_im, 2 * step_re * step_im
    return re[:, : degree + 1], im[:, : degree + 1]


def _legendre_tables(degree: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The recurrence over l of $R_l^m(z) = \\sqrt{(l - m)! / (l + m)!}\\, P_l^m(z) / \\sin^m\\theta$
    for all m at once: $R_l = A_l z R_{l-1} - B_l R_{l-2} + E_l$, with $E_l$ the constant
    $R_l^l = (2l - 1)!! / \\sqrt{(2l)!}$ and $R_{l}^{l-1} = \\sqrt{2l - 1}\\, z R_{l-1}^{l-1}$.
    Rows l = 0 ... degree, columns m."""
    size = degree + 1
    a, b, e = np.zeros((size, size)), np.zeros((size, size)), np.zeros((size, size))
    sectoral = 1.0
    for l in range(size):  # noqa: E741
        if l > 0:
            sectoral *= math.sqrt((2 * l - 1) / (2 * l))
            a[l, l - 1] = math.sqrt(2 * l - 1)
        e[l, l] = sectoral
        for m in range(l - 1):
            a[l, m] = (2 * l - 1) / math.sqrt((l - m) * (l + m))
            b[l, m] = math.sqrt((l + m - 1) * (l - m - 1) / ((l - m) * (l + m)))
    return a, b, e


def basis(x: Float[Array, "c d"], degree: int) -> Float[Array, "c K"]:
    """The real harmonics up to `degree` at unit vectors `x`: on the circle $1, \\cos\\phi,
    \\sin\\phi, \\dots, \\cos L\\phi, \\sin L\\phi$; on the sphere the Schmidt semi-normalised
    $S_{lm}$ ($\\sum_m S_{lm}(a) S_{lm}(b) = P_l(a \\cdot b)$), degree by degree: $S_{l0} = R_l^0$,
    then $\\sqrt 2 R_l^m \\cos m\\phi \\sin^m\\theta$, $\\sqrt 2 R_l^m \\sin m\\phi \\sin^m\\theta$ for
    m = 1 ... l (`_legendre_tables`, and $(x + iy)^m$ for the rest: no angles, no division).
    A zero row gives a finite row."""
    d = x.shape[-1]
    _check_dim(d)
    re, im = _powers(x, degree)
    if d == 2:
        waves = jnp.stack([re[:, 1:], im[:, 1:]], axis=-1).reshape(x.shape[0], 2 * degree)
        return jnp.concatenate([re[:, :1], waves], axis=1)
    tables = tuple(jnp.asarray(t, x.dtype) for t in _legendre_tables(degree))
    z = x[:, 2:3]

    def step(previous, table):
        a, b, e = table
        current = a[None] * z * previous[0] - b[None] * previous[1] + e[None]
        return (current, previous[0]), current

    zero = jnp.zeros((x.shape[0], degree + 1), x.dtype)
    _, legendre = lax.scan(step, (zero, zero), tables)  # (l, c, m)
    ls, ms = np.concatenate([np.repeat(np.arange(degree + 1), 2 * np.arange(degree + 1) + 1)]), []
    factor, sines = [], []
    for l in range(degree + 1):  # noqa: E741
        ms += [0] + [m for m in range(1, l + 1) for _ in range(2)]
        factor += [1.0] + [math.sqrt(2)] * (2 * l)
        sines += [False] + [bool(i % 2) for i in range(2 * l)]
    ms, sines = np.asarray(ms), np.asarray(sines)
    waves = jnp.where(sines, im[:, ms], re[:, ms])
    return legendre[ls, :, ms].T * waves * jnp.asarray(factor, x.dtype)[None]


def _query_features(u: Float[Array, "c d"], degree: int) -> tuple[Array, Array]:
    """$F(u) = w\\,c(r) \\odot B(\\hat u)$ `(c, K)` and the radii r `(c,)`."""
    d = u.shape[-1]
    r = jnp.sqrt(jnp.sum(u * u, axis=-1))
    direction = u / jnp.where(r > 0, r, 1)[:, None]
    scale = coefficients(r, degree, d) * jnp.asarray(_weights(d, degree), u.dtype)[None]
    return basis(direction, degree) * scale[:, _orders(degree, d)], r


def _split(a: Array, size: int) -> Array:
    """`a` padded with zeros along its first axis to a multiple of `size`, cut into chunks."""
    count = -(-a.shape[0] // size)
    a = jnp.pad(a, [(0, count * size - a.shape[0])] + [(0, 0)] * (a.ndim - 1))
    return a.reshape((count, size) + a.shape[1:])


def default_chunk(degree: int, d: int) -> int:
    """Tokens per chunk without a mask: `_CHUNK_FLOATS` floats of basis functions, at least 512."""
    return max(512, _CHUNK_FLOATS // basis_size(degree, d))


def _unmasked(u, x, v, degree: int, chunk: int) -> Array:
    """$e^{-r_i} \\sum_j e^{\\langle u_i, x_j\\rangle} v_j$, truncated: the moments over all
    keys, then the query features against them."""

    def accumulate(moments, chunk_xv):
        xc, vc = chunk_xv
        return moments + basis(xc, degree).T @ vc, None

    init = jnp.zeros((basis_size(degree, x.shape[-1]), v.shape[-1]), v.dtype)
    moments, _ = lax.scan(accumulate, init, (_split(x, chunk), _split(v, chunk)))
    out = lax.map(lambda uc: _query_features(uc, degree)[0] @ moments, _split(u, chunk))
    return out.reshape(-1, v.shape[-1])[: u.shape[0]]


def _prefix(u, x, v, degree: int, chunk: int, slope, strict: bool) -> Array:
    """$e^{-r_i} \\sum_{j \\le i} e^{-\\lambda (i - j)} e^{\\langle u_i, x_j\\rangle} v_j$ (j < i when
    `strict`; $\\lambda$ = `slope`, None for 0): the keys of the query's own chunk summed
    exactly, those of the earlier chunks through their moments, carried from chunk to chunk
    (weighted by $e^{-\\lambda (s - 1 - j)}$ at a chunk starting at s)."""
    n, dtype = x.shape[0], v.dtype
    slope = jnp.zeros((), dtype) if slope is None else jnp.asarray(slope, dtype)
    index = jnp.arange(chunk, dtype=dtype)
    gap = index[:, None] - index[None, :]
    near_keys = gap > 0 if strict else gap >= 0

    def one_chunk(carry, chunk_uxv):
        uc, xc, vc = chunk_uxv
        features, r = _query_features(uc, degree)
        far = (features @ carry) * jnp.exp(-slope * (index + 1))[:, None]
        # |gap|: the masked entries stay finite (and so do their derivatives).
        logits = uc @ xc.T - r[:, None] - slope * jnp.abs(gap)
        near = jnp.where(near_keys, jnp.exp(logits), 0) @ vc
        keys = basis(xc, degree) * jnp.exp(-slope * (chunk - 1 - index))[:, None]
        return carry * jnp.exp(-slope * chunk) + keys.T @ vc, far + near

    init = jnp.zeros((basis_size(degree, x.shape[-1]), v.shape[-1]), dtype)
    _, out = lax.scan(one_chunk, init, (_split(u, chunk), _split(x, chunk), _split(v, chunk)))
    return out.reshape(-1, v.shape[-1])[:n]


def attention(
    u: Float[Array, "m d"],
    x: Float[Array, "n d"],
    v: Float[Array, "n dv"],
    *,
    degree: int,
    kind: str = "sa",
    causal: bool = False,
    slope=None,
    chunk: int | None = None,
) -> Float[Array, "m dv"]:
    """$\\sum_j a_{ij} v_j$ for one head with the logits $\\ell_{ij} = \\langle u_i, x_j\\rangle
    - \\lambda |i - j|$ ($-\\infty$ for $j > i$ when `causal`), by harmonic summation to
    `degree`: what `attnflow.numerics._tiled.attention` returns for $q_i = u_i$, $k_j = x_j$,
    beta 1 and the same `kind`, `causal` and `slope` ($\\lambda$), up to the truncation.

    `u` are the query vectors (`query_vectors`), `x` the unit tokens (d = 2 or 3), `v` the
    values. `kind="sa"` normalizes each row by its sum, `"usa"` divides by n. With a mask
    (causal or ALiBi) the queries are the n tokens in order (m = n). `chunk`: tokens per
    chunk (default `default_chunk`, `WINDOW` under a mask: the keys summed exactly).
    """
    (m, d), n = u.shape, x.shape[0]
    _check_dim(d)
    if kind not in ("sa", "usa"):
        raise ConfigError(f"harmonic summation serves the attention kinds 'sa' and 'usa', got {kind!r}.")
    masked = causal or slope is not None
    if masked and m != n:
        raise ConfigError(f"masked harmonic attention takes the queries of all n={n} tokens, got m={m}.")
    normalized = kind == "sa"
    if normalized:
        # The row sums as one more column of v: the same moments give both.
        v = jnp.concatenate([v, jnp.ones((n, 1), v.dtype)], axis=1)
    chunk = min(chunk or (WINDOW if masked else default_chunk(degree, d)), n)
    if not masked:
        out = _unmasked(u, x, v, degree, chunk)
    else:
        out = _prefix(u, x, v, degree, chunk, slope, strict=False)
        if not causal:
            # the keys after each query: the same sums over the reversed sequence, j > i
            out = out + _prefix(u[::-1], x[::-1], v[::-1], degree, chunk, slope, strict=True)[::-1]
    if normalized:
        return out[:, :-1] / out[:, -1:]
    r = jnp.sqrt(jnp.sum(u * u, axis=-1))
    return out * (jnp.exp(r) / n)[:, None]


def attention_heads(
    u: Array,
    x: Float[Array, "n d"],
    v: Array,
    slopes: Array | None,
    *,
    degree: int,
    kind: str = "sa",
    causal: bool = False,
    chunk: int | None = None,
) -> Array:
    """`attention` for every head: `u` `(heads, m, d)` or `(m, d)` when every head shares
    it, `v` `(heads, n, dv)` or `(n, dv)`, `slopes` `(heads,)` or None; `x` the tokens
    `(n, d)`. Returns `(heads, m, dv)`, or `(m, dv)` when no operand has a head axis: the
    mixed values of `SelfAttention` before its output matrices."""
    operands = (u, v, slopes)
    plain = (2, 2, 0)
    axes = tuple(None if a is None or a.ndim == p else 0 for a, p in zip(operands, plain))

    def one(u, v, slope):
        return attention(u, x, v, degree=degree, kind=kind, causal=causal, slope=slope, chunk=chunk)

    if all(axis is None for axis in axes):
        return one(*operands)
    return jax.vmap(one, in_axes=axes)(*operands)


def log_pair_sum(x: Float[Array, "n d"], beta, degree: int, chunk: int | None = None) -> Float[Array, ""]:
    """$\\log \\sum_{ij} e^{\\beta \\langle x_i, x_j\\rangle}$ of unit tokens by harmonic summation to
    `degree` (the interaction energy's sum, $Q = K = I$): row i's sum is $e^{r_i}$ times the
    scaled one, $r_i = |\\beta|$, so the log never overflows. Cost O(n L) or O(n L^2)."""
    d = x.shape[-1]
    _check_dim(d)
    chunk = chunk or default_chunk(degree, d)
    ones = jnp.ones((x.shape[0], 1), x.dtype)
    scaled = _unmasked(beta * x, x, ones, degree, chunk)[:, 0]  # e^{-|beta|} times each row's sum
    # Truncation can leave a scaled sum at rounding level below 0 where the true one is tiny.
    tiny = jnp.finfo(x.dtype).tiny
    return jnp.abs(beta) + jax.nn.logsumexp(jnp.log(jnp.maximum(scaled, tiny)))
