r"""Spectra of the virtual attention matrices of a trained transformer, across depth.

Each head of each block defines two $d \times d$ matrices of rank at most $d_k$ (Elhage
et al. 2021; Traveling Words, 002_*.txt, section 2.2):

- the query-key form $W_{QK} = Q_h^\top K_h$, whose bilinear form $x_i^\top W_{QK} x_j$ is
  the attention logit (times $\beta = 1/\sqrt{d_k}$);
- the output-value map $W_{OV} = O_h V_h$, the update a token receives from a token it
  attends to.

Their eigenvalues and singular values, block after block, are the "spectral dynamics" of
the Neural ODE Transformers paper (000_*.txt, section 5.1, figure 2): positive
eigenvalues of $W_{QK}$ make similar tokens attend to each other, positive eigenvalues of
$W_{OV}$ make them attract (the $V = I$ of the clustering theorems), negative ones repel.

Both matrices are products $A B^\top$ of two $d \times r$ factors ($r = d_k$ or $d_v$), so
nothing of size $d \times d$ is ever formed: their non-zero eigenvalues are those of the
$r \times r$ matrix $B^\top A$ (for $W_{QK}$: $K_h Q_h^\top$), and their singular values
and vectors come from thin QR factors $A = U_A R_A$, $B = U_B R_B$ and the SVD of
$R_A R_B^\top$. Every layer and head is done at once (batched linear algebra).

Biases are left out (they shift logits and updates, not the bilinear/linear part), and
with rotary positions $W_{QK}$ is the form at relative offset zero.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr
from jaxtyping import Array, Complex, Float

from ..presentation._figures import caption, colormap, save, styled, subplots
from ._canonical import Checkpoint

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["LowRankSpectrum", "draw_spectra", "head_spectra", "low_rank_spectrum", "low_rank_svd", "thin_qr"]


class LowRankSpectrum(eqx.Module):
    r"""Eigenvalues and SVD of a batch of low-rank products $M = A B^\top$.

    `eigenvalues` are the $r$ eigenvalues of largest modulus (the others are zero),
    sorted by decreasing modulus; `singular` the $r$ largest singular values, decreasing,
    with $M = \sum_k$ `singular[k]` `left[:, k]` `right[:, k]`$^\top$."""

    eigenvalues: Complex[Array, "*batch r"]
    singular: Float[Array, "*batch r"]
    left: Float[Array, "*batch d r"]
    right: Float[Array, "*batch d r"]


@jax.jit
def _sorted_eigenvalues(small: Float[Array, "*batch r r"]) -> Complex[Array, "*batch r"]:
    values = jnp.linalg.eigvals(small)
    order = jnp.argsort(-jnp.abs(values), axis=-1)
    return jnp.take_along_axis(values, order, axis=-1)


def _eigenvalues(small: Float[Array, "*batch r r"]) -> Complex[Array, "*batch r"]:
    """Eigenvalues of real square matrices, sorted by decreasing modulus. The general
    (non-symmetric) eigensolver runs on the CPU, where every JAX version has it."""
    return jax.block_until_ready(_sorted_eigenvalues(jax.device_put(small, jax.devices("cpu")[0])))


def _swap(x: Array) -> Array:
    return jnp.swapaxes(x, -1, -2)


def _cholesky_qr(a: Float[Array, "*batch d r"]) -> tuple[Float[Array, "*batch d r"], Float[Array, "*batch r r"]]:
    r"""One Cholesky QR pass: $A^\top A = R^\top R$, $Q = A R^{-1}$."""
    lower = jnp.linalg.cholesky(_swap(a) @ a)
    q = _swap(jax.scipy.linalg.solve_triangular(lower, _swap(a), lower=True))
    return q, _swap(lower)


@jax.jit
def _cholesky_qr2(a: Float[Array, "*batch d r"]) -> tuple[Float[Array, "*batch d r"], Float[Array, "*batch r r"]]:
    q1, r1 = _cholesky_qr(a)
    q, r2 = _cholesky_qr(q1)
    return q, r2 @ r1


def thin_qr(a: Float[Array, "*batch d r"]) -> tuple[Float[Array, "*batch d r"], Float[Array, "*batch r r"]]:
    r"""Thin QR factors of a batch of tall matrices by CholeskyQR2 (Fukaya et al. 2014):
    two Cholesky QR passes, orthogonal to working precision while the condition number
    stays below $\epsilon^{-1/2}$, and made of matrix products (several times faster on
    CPU than batched Householder QR). Where a Cholesky factor fails (rank-deficient or
    too ill-conditioned factors) the whole batch falls back to Householder QR.

    Each compiled program here holds one chain of LAPACK calls, and each is waited for:
    two independent LAPACK calls in flight at once on XLA's CPU threads can deadlock
    inside the BLAS library (seen with QR and SVD in one program, jaxlib 0.10)."""
    q, r = _cholesky_qr2(a)
    if not (bool(jnp.isfinite(r).all()) and bool(jnp.isfinite(q).all())):
        q, r = jnp.linalg.qr(a)
    return q, r


@jax.jit
def _core_svd(
    qa: Float[Array, "*batch d r"],
    ra: Float[Array, "*batch r r"],
    qb: Float[Array, "*batch d r"],
    rb: Float[Array, "*batch r r"],
):
    u, s, vt = jnp.linalg.svd(ra @ _swap(rb))
    return qa @ u, s, qb @ _swap(vt)


def low_rank_svd(
    a: Float[Array, "*batch d r"], b: Float[Array, "*batch d r"]
) -> tuple[Float[Array, "*batch d r"], Float[Array, "*batch r"], Float[Array, "*batch d r"]]:
    r"""`(left, singular, right)` of $M = A B^\top$ ($d \times d$, rank $\le r$): with thin
    QR factors $A = U_A R_A$, $B = U_B R_B$ (both factored in one batch), the SVD of the
    $r \times r$ core $R_A R_B^\top = u\, s\, v^\top$ gives $M = (U_A u)\, s\, (U_B v)^\top$."""
    q, r = thin_qr(jnp.stack([a, b]))
    return jax.block_until_ready(_core_svd(q[0], r[0], q[1], r[1]))


def low_rank_spectrum(a: Float[Array, "*batch d r"], b: Float[Array, "*batch d r"]) -> LowRankSpectrum:
    r"""The spectrum of $M = A B^\top$ ($d \times d$, rank $\le r$) from its factors: its
    non-zero eigenvalues are those of the $r \times r$ matrix $B^\top A$ (for
    $W_{QK}$: $K_h Q_h^\top$), its SVD is `low_rank_svd`."""
    left, singular, right = low_rank_svd(a, b)
    return LowRankSpectrum(_eigenvalues(jnp.matmul(_swap(b), a)), singular, left, right)


def query_key_factors(checkpoint: Checkpoint) -> tuple[Float[Array, "L H d dk"], Float[Array, "L H d dk"]]:
    r"""$(Q_h^\top, K_h^\top)$ of every layer and head: $W_{QK} = Q_h^\top K_h$."""
    att = checkpoint.blocks.attention
    return jnp.swapaxes(att.query, -1, -2), jnp.swapaxes(att.key, -1, -2)


def output_value_factors(checkpoint: Checkpoint) -> tuple[Float[Array, "L H d dv"], Float[Array, "L H d dv"]]:
    r"""$(O_h, V_h^\top)$ of every layer and head: $W_{OV} = O_h V_h$."""
    att = checkpoint.blocks.attention
    return att.output, jnp.swapaxes(att.value, -1, -2)


def _summaries(prefix: str, spectrum: LowRankSpectrum, trace: np.ndarray, what: str) -> dict:
    """Per (layer, head) scalars of one matrix's spectrum, as Dataset variables."""
    values = np.asarray(spectrum.eigenvalues)
    modulus = np.abs(values)
    total = modulus.sum(-1)
    positive = np.where(values.real > 0, modulus, 0.0).sum(-1)  # pyright: ignore[reportAttributeAccessIssue]  # numpy's stub has .real only for known dtypes
    with np.errstate(invalid="ignore", divide="ignore"):
        fraction = np.where(total > 0, positive / np.where(total > 0, total, 1.0), np.nan)
    singular = np.asarray(spectrum.singular)
    dims = ("layer", "head")
    return {
        f"{prefix}_radius": (dims, modulus[..., 0], {"description": f"spectral radius max|lambda| of {what}"}),
        f"{prefix}_positive_fraction": (
            dims,
            fraction,
            {
                "description": f"share of the eigenvalue mass sum|lambda| of {what} carried by eigenvalues with "
                "positive real part"
            },
        ),
        f"{prefix}_trace": (dims, np.asarray(trace), {"description": f"trace of {what} (sum of its eigenvalues)"}),
        f"{prefix}_frobenius": (
            dims,
            np.sqrt((singular**2).sum(-1)),
            {
                "description": f"Frobenius norm of {what}, sqrt(sum sigma^2); for x, y ~ N(0, I) the variance of "
                "x^T M y is its square"
            },
        ),
        f"{prefix}_operator_norm": (dims, singular[..., 0], {"description": f"largest singular value of {what}"}),
    }


def head_spectra(checkpoint: Checkpoint) -> xr.Dataset:
    r"""Eigenvalues and singular values of $W_{QK} = Q_h^\top K_h$ and $W_{OV} = O_h V_h$
    for every layer and head of `checkpoint`, with summaries across depth.

    Variables (dims `layer`, the 0-based block index, and `head`; `qk_rank`, `ov_rank`
    index the $d_k$ resp. $d_v$ eigenvalues of largest modulus, decreasing, and the
    singular values, decreasing):

    - `qk_eig_real`, `qk_eig_imag`, `qk_singular`, and the same for `ov_`;
    - `{qk,ov}_radius` (max $|\lambda|$), `{qk,ov}_positive_fraction`
      ($\sum_{\Re\lambda > 0} |\lambda| / \sum |\lambda|$), `{qk,ov}_trace`,
      `{qk,ov}_frobenius`, `{qk,ov}_operator_norm`, per layer and head.

    $W_{QK}$ is stored unscaled: the logits are $\beta x_i^\top W_{QK} x_j$ with
    $\beta = 1/\sqrt{d_k}$ (attribute `beta`)."""
    att = checkpoint.blocks.attention
    qk = low_rank_spectrum(*query_key_factors(checkpoint))
    ov = low_rank_spectrum(*output_value_factors(checkpoint))
    qk_trace = np.einsum("lhij,lhij->lh", np.asarray(att.query), np.asarray(att.key))
    ov_trace = np.einsum("lhij,lhji->lh", np.asarray(att.output), np.asarray(att.value))
    depth, heads = att.query.shape[:2]
    dims_qk, dims_ov = ("layer", "head", "qk_rank"), ("layer", "head", "ov_rank")
    qk_what, ov_what = "W_QK = Q_h^T K_h", "W_OV = O_h V_h"
    data = {
        "qk_eig_real": (
            dims_qk,
            np.asarray(qk.eigenvalues.real),
            {"description": f"real parts of the eigenvalues of {qk_what}"},
        ),
        "qk_eig_imag": (
            dims_qk,
            np.asarray(qk.eigenvalues.imag),
            {"description": f"imaginary parts of the eigenvalues of {qk_what}"},
        ),
        "qk_singular": (dims_qk, np.asarray(qk.singular), {"description": f"singular values of {qk_what}"}),
        "ov_eig_real": (
            dims_ov,
            np.asarray(ov.eigenvalues.real),
            {"description": f"real parts of the eigenvalues of {ov_what}"},
        ),
        "ov_eig_imag": (
            dims_ov,
            np.asarray(ov.eigenvalues.imag),
            {"description": f"imaginary parts of the eigenvalues of {ov_what}"},
        ),
        "ov_singular": (dims_ov, np.asarray(ov.singular), {"description": f"singular values of {ov_what}"}),
        **_summaries("qk", qk, qk_trace, qk_what),
        **_summaries("ov", ov, ov_trace, ov_what),
    }
    return xr.Dataset(
        data,
        coords={
            "layer": np.arange(depth),
            "head": np.arange(heads),
            "qk_rank": np.arange(qk.singular.shape[-1]),
            "ov_rank": np.arange(ov.singular.shape[-1]),
        },
        attrs={
            "model": checkpoint.name or checkpoint.family,
            "family": checkpoint.family,
            "beta": 1.0 / float(np.sqrt(checkpoint.head_dim)),
            "dim": checkpoint.dim,
            "description": "spectra of the per-head query-key and output-value matrices across depth "
            "(layer = 0-based block index; biases left out; rotary at offset zero)",
        },
    )


def _complex_plane(ax, ds: xr.Dataset, prefix: str, norm, cmap) -> None:
    """Every eigenvalue of every head as a point in the complex plane, coloured by layer."""
    real, imag = ds[f"{prefix}_eig_real"].values, ds[f"{prefix}_eig_imag"].values
    layer = np.broadcast_to(ds["layer"].values[:, None, None], real.shape)
    keep = (real != 0) | (imag != 0)
    ax.scatter(real[keep], imag[keep], c=layer[keep], cmap=cmap, norm=norm, s=4, alpha=0.6, linewidth=0)
    ax.axvline(0, color="0.4", linewidth=0.6)
    ax.axhline(0, color="0.4", linewidth=0.6)
    ax.set_xlabel(r"$\mathrm{Re}\,\lambda$")
    ax.set_ylabel(r"$\mathrm{Im}\,\lambda$")


def _real_parts(ax, ds: xr.Dataset, prefix: str, norm, cmap) -> None:
    """Real parts of the eigenvalues against depth (the paper's spectral-flow panels)."""
    real = ds[f"{prefix}_eig_real"].values
    layer = ds["layer"].values
    heads = real.shape[1]
    jitter = (np.arange(heads) - (heads - 1) / 2) / max(heads, 1) * 0.6
    x = layer[:, None, None] + jitter[None, :, None]
    x = np.broadcast_to(x, real.shape)
    c = np.broadcast_to(layer[:, None, None], real.shape)
    ax.scatter(x.ravel(), real.ravel(), c=c.ravel(), cmap=cmap, norm=norm, s=3, alpha=0.6, linewidth=0)
    ax.axhline(0, color="0.4", linewidth=0.6)
    ax.set_xlabel("layer (heads side by side)")
    ax.set_ylabel(r"$\mathrm{Re}\,\lambda$")


def _singular_curves(ax, ds: xr.Dataset, prefix: str, norm, cmap) -> None:
    """Each head's singular values (decreasing) as one curve, coloured by layer."""
    from matplotlib.collections import LineCollection  # lazy: start-up

    singular = ds[f"{prefix}_singular"].values
    index = np.arange(1, singular.shape[-1] + 1)
    curves = singular.reshape(-1, singular.shape[-1])
    keep = (curves > 0).all(-1)
    segments = np.stack([np.broadcast_to(index, curves.shape), curves], axis=-1)[keep]
    lines = LineCollection(segments, cmap=cmap, norm=norm, linewidth=0.6, alpha=0.5)  # pyright: ignore[reportArgumentType]  # an (N, points, 2) array is a sequence of segments; matplotlib's stub wants a Sequence
    lines.set_array(np.repeat(ds["layer"].values, singular.shape[1])[keep])
    ax.add_collection(lines)
    ax.set_yscale("log")
    if keep.any():
        ax.set_xlim(0.5, index[-1] + 0.5)
        ax.set_ylim(curves[keep].min() / 1.5, curves[keep].max() * 1.5)
    ax.set_xlabel("index k")
    ax.set_ylabel(r"$\sigma_k$")


@styled
def draw_spectra(ds: xr.Dataset, folder: Path | None = None, name: str = "spectra") -> dict[str, Figure]:
    """Figures of a `head_spectra` Dataset, in the style of the QK/OV spectral plots of
    the Neural ODE Transformers paper: `name` (eigenvalues in the complex plane and
    their real parts against depth, singular-value curves, for QK and OV, coloured by
    layer) and `name_summary` (spectral radius, positive share, trace and Frobenius norm
    against depth, median over heads with the min-max band). Returns them by name,
    saved as PNG and PDF in `folder` when one is given."""
    from matplotlib.cm import ScalarMappable  # lazy: start-up
    from matplotlib.colors import Normalize  # lazy: start-up

    layers = ds["layer"].values
    cmap = colormap("viridis")
    norm = Normalize(layers.min(), max(layers.max(), layers.min() + 1))
    model = ds.attrs.get("model", "")
    fig, axes = subplots(3, 2, figsize=(9.5, 10.5), layout="constrained")
    titles = {"qk": r"$W_{QK} = Q_h^\top K_h$", "ov": r"$W_{OV} = O_h V_h$"}
    letters = iter("abcdef")
    for column, prefix in enumerate(("qk", "ov")):
        _complex_plane(axes[0, column], ds, prefix, norm, cmap)
        axes[0, column].set_title(f"({next(letters)}) eigenvalues of {titles[prefix]}")
    for column, prefix in enumerate(("qk", "ov")):
        _real_parts(axes[1, column], ds, prefix, norm, cmap)
        axes[1, column].set_title(rf"({next(letters)}) $\mathrm{{Re}}\,\lambda$({prefix.upper()}) across depth")
    for column, prefix in enumerate(("qk", "ov")):
        _singular_curves(axes[2, column], ds, prefix, norm, cmap)
        axes[2, column].set_title(f"({next(letters)}) singular values of {titles[prefix]}")
    fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=axes, label="layer", shrink=0.5)
    caption(
        fig,
        (
            f"{model}: {ds.sizes['layer']} layers x {ds.sizes['head']} heads. (a, b) every non-zero eigenvalue of each "
            f"head's query-key and output-value matrix; (c, d) their real parts per layer (positive: similar tokens "
            f"attend to / attract each other, negative: repel); (e, f) the singular values of each head, one curve per "
            "head. Colour: layer. QK is unscaled (logits are $\\beta\\, x^\\top W_{QK}\\, y$, $\\beta$ = "
            f"{ds.attrs.get('beta', float('nan')):.3g})."
        ),
        width=120,
    )
    figures = {name: fig}

    fig, axes = subplots(2, 2, figsize=(9.5, 6.5), layout="constrained")
    panels = (
        ("radius", r"spectral radius $\max|\lambda|$"),
        ("positive_fraction", r"share of $|\lambda|$ with $\mathrm{Re}\,\lambda > 0$"),
        ("trace", "trace"),
        ("frobenius", "Frobenius norm"),
    )
    for ax, (letter, (key, label)) in zip(axes.ravel(), zip("abcd", panels)):
        for prefix, color in (("qk", "C0"), ("ov", "C3")):
            values = ds[f"{prefix}_{key}"].values
            ax.fill_between(layers, np.nanmin(values, 1), np.nanmax(values, 1), color=color, alpha=0.15, linewidth=0)
            ax.plot(
                layers,
                np.nanmedian(values, 1),
                color=color,
                marker="o",
                markersize=3,
                label=f"{prefix.upper()}: median over heads, min-max",
            )
        ax.set_xlabel("layer")
        ax.set_title(f"({letter}) {label}")
    axes[0, 0].legend(loc="best")
    axes[0, 1].set_ylim(-0.02, 1.02)
    caption(fig, f"{model}: summaries of the per-head QK and OV spectra across depth.", width=120)
    figures[f"{name}_summary"] = fig
    if folder is not None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        for key, fig in figures.items():
            save(fig, folder, key)
    return figures
