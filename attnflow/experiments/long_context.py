"""The long-context phase transition of one attention layer.

One softmax attention layer with $Q = K = V = I$ maps n unit tokens to
$y_i = \\sum_j a_{ij} x_j$, $a_{ij} \\propto e^{\\beta\\langle x_i, x_j\\rangle}$, at the
inverse temperature $\\beta_n = \\gamma \\log n$. For equiangular inputs,
$\\langle x_i, x_j\\rangle = \\rho$ for every $i \\ne j$, the cosine between two outputs has
a closed form at every n (tests/README.md, "The long-context transition"): with
$w = e^{\\beta(1 - \\rho)}$ and $c = w - 1$,

$$
\\cos(y_i, y_k) = \\frac{c^2 \\rho + (2c + n)(1 + (n - 1)\\rho)}{c^2 + (2c + n)(1 + (n - 1)\\rho)},
$$

which for $s = w / n$ fixed and $n \\to \\infty$ becomes
$\\rho (1 + s)^2 / (s^2 + 2 s \\rho + \\rho)$. Since $s = n^{\\gamma(1 - \\rho) - 1}$, the
cosine tends to 1 when $\\gamma < 1/(1 - \\rho)$ (every output is the mean: the tokens
collapse), to $4\\rho / (1 + 3\\rho)$ at $\\gamma = 1/(1 - \\rho)$, and to $\\rho$ above (every
output is its own input) (Chen, Lin, Polyanskiy, Rigollet, "Critical attention scaling
in long-context transformers", 2025).

The experiment sweeps n log-spaced from `n_min` to `n_max` (1e5 on a CPU, 1e6 on a GPU
by default) and $\\gamma$ at multiples of the critical $1/(1 - \\rho)$ (`gamma_critical`),
for each $\\rho$ of `rho`. The tokens are $x_i = \\sqrt\\rho\\, u + \\sqrt{1 - \\rho}\\, z_i$ with
$z_i$ uniform on the unit sphere of $u^\\perp$ in $\\mathbb{R}^d$: only approximately
equiangular, $\\langle x_i, x_j\\rangle - \\rho = (1 - \\rho)\\langle z_i, z_j\\rangle$ has
standard deviation $(1 - \\rho)/\\sqrt{d - 1}$ (stored: `inner_product_spread`). The `rows`
sampled query tokens get orthonormal $z_i$, so that among themselves they are exactly
equiangular and the measured cosine carries no sampling noise of their own inner
products; their inner products with the other tokens keep the spread. Its effect grows
with beta: the off-diagonal weights are multiplied on average by the weight factor
$\\hat m = \\frac{1}{n - 1}\\sum_{j \\ne i} e^{\\beta(\\langle x_i, x_j\\rangle - \\rho)}$ (stored:
`weight_factor`; 1 for exact equiangularity, about $e^{\\beta^2(1 - \\rho)^2 / 2(d - 1)}$).
The default d = 1024 was chosen from that measurement: at n = 1e5, rho = 0.5 and the
critical gamma the weight factor is 1.07 and the measured cosine lies 0.0066 above the
exact equiangular value (d = 256: 1.30 and 0.025; d = 2048: 1.03 and 0.0033, in 1.6 times
the time).

Each output is computed by the core's `SelfAttention` for the sampled query tokens
against all n keys (`SelfAttention(..., rows=...)`, in tiles above
`attnflow.numerics._tiled.TILED_ABOVE` tokens), once per n for every $\\gamma$ (beta is data);
the stored cosine is the mean over the sampled pairs.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..schema._config import NOT_RESULT_KEYS, Config
from ..schema._errors import ConfigError
from ..schema._schema import setting
from ._common import caption, colormap, config_of, counted, refuse_given, subplots, whole_number
from ._experiment import Counter, Experiment, Keeper
from ._lazy import lazy, on_first_call

if TYPE_CHECKING:
    import jax
    import jax.numpy as jnp
    import xarray as xr
    from matplotlib.figure import Figure

    from ..numerics import _schedules, _terms
    from ..running import _ensemble
else:
    jax = lazy("jax")
    jnp = lazy("jax.numpy")
    xr = lazy("xarray")
    _schedules = lazy("attnflow.numerics._schedules")
    _terms = lazy("attnflow.numerics._terms")
    _ensemble = lazy("attnflow.running._ensemble")


@dataclass
class Options:
    rho: list[float] = setting([0.5], "pairwise correlation(s) of the input tokens, in (0, 1)")
    gamma_critical: list[float] = setting([0.5, 0.75, 1.0, 1.5, 2.0], "gamma in units of the critical 1/(1 - rho)")
    n_min: int = setting(100, "the fewest tokens")
    n_max: int | None = setting(None, "null: 1e5 on a CPU, 1e6 on a GPU")
    n_count: int = setting(7, "n log-spaced from n_min to n_max")
    rows: int = setting(64, "query tokens sampled; the cosine is the mean over their pairs")


# The config keys the experiment reads; any other key given is refused.
_READ_KEYS = ("d", "dtype", "seed", "attention_block", "experiment", *NOT_RESULT_KEYS)
# Copies of the largest token set held at once (the tokens, their tiles of keys and of
# values with the normalizer column, and temporaries).
_COPIES = 5


def default_n_max() -> int:
    """The top of the n range on this backend: 1e6 on a GPU, 1e5 elsewhere."""
    return 10**6 if jax.default_backend() == "gpu" else 10**5


def _numbers(name: str, values, low: float, high: float | None) -> list[float]:
    if not isinstance(values, (list, tuple)) or not values:
        raise ConfigError(
            f"experiment.options.{name} of experiment long_context must be a non-empty list of numbers, got {values!r}."
        )
    for v in values:
        inside = isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and v > low  # pyright: ignore[reportOperatorIssue]  # numbers.Real's stub lacks >
        if not inside or (high is not None and v >= high):  # pyright: ignore[reportOperatorIssue]  # numbers.Real's stub lacks >=
            where = f"in ({low:g}, {high:g})" if high is not None else f"above {low:g}"
            raise ConfigError(
                f"every experiment.options.{name} of experiment long_context must lie {where}, got {v!r}."
            )
    return [float(v) for v in values]


def sizes(n_min: int, n_max: int | None, n_count: int) -> np.ndarray:
    """The token counts of the sweep: `n_count` integers log-spaced from `n_min` to `n_max`
    (None: `default_n_max()`)."""
    top = n_max or default_n_max()
    return np.unique(np.round(np.geomspace(n_min, top, n_count)).astype(np.int64))


def equiangular_cosine(n, rho, beta):
    """The cosine between two outputs of the layer for exactly equiangular inputs (the
    closed form of the module docstring), at finite n; NumPy, broadcasting."""
    n, rho, beta = (np.asarray(a, np.float64) for a in (n, rho, beta))
    c = np.expm1(beta * (1 - rho))
    mass = (2 * c + n) * (1 + (n - 1) * rho)
    return (c * c * rho + mass) / (c * c + mass)


def asymptotic_cosine(s, rho):
    """$\\rho(1 + s)^2 / (s^2 + 2 s \\rho + \\rho)$: the closed form as $n \\to \\infty$ at fixed $s = w / n$."""
    s, rho = np.asarray(s, np.float64), np.asarray(rho, np.float64)
    return rho * (1 + s) ** 2 / (s * s + 2 * s * rho + rho)


def limit_cosine(ratio, rho):
    """The limit as $n \\to \\infty$ at $\\gamma = $ `ratio` $/(1 - \\rho)$: 1, $4\\rho/(1 + 3\\rho)$ or $\\rho$."""
    ratio, rho = np.broadcast_arrays(np.asarray(ratio, np.float64), np.asarray(rho, np.float64))
    return np.where(ratio < 1, 1.0, np.where(ratio == 1, 4 * rho / (1 + 3 * rho), rho))


def equiangular_tokens(key, n: int, d: int, rho, dtype, rows=None):
    """$x_i = \\sqrt\\rho\\, e_1 + \\sqrt{1 - \\rho}\\, z_i$, $z_i$ uniform on the unit sphere of
    $e_1^\\perp$. The tokens `rows` get orthonormal $z_i$ (a uniformly rotated frame, each
    $z_i$ still uniform), so that among themselves they are exactly equiangular."""
    k_all, k_frame = jax.random.split(key)
    z = jax.random.normal(k_all, (n, d - 1), dtype)
    z = z / jnp.linalg.norm(z, axis=-1, keepdims=True)
    if rows is not None:
        frame, r = jnp.linalg.qr(jax.random.normal(k_frame, (d - 1, len(rows)), dtype))
        z = z.at[rows].set((frame * jnp.sign(jnp.diagonal(r))[None, :]).T)
    rho = jnp.asarray(rho, dtype)
    return jnp.concatenate([jnp.full((n, 1), jnp.sqrt(rho), dtype), jnp.sqrt(1 - rho) * z], axis=1)


def sample_rows(n: int, rows: int) -> np.ndarray:
    """`rows` query tokens spread evenly over the n (the tokens are exchangeable)."""
    return np.unique(np.round(np.linspace(0, n - 1, rows)).astype(np.int32))


def _layer(d: int, beta, dtype, block) -> _terms.SelfAttention:
    eye = _schedules.Identity(1, d, jnp.dtype(dtype).name)
    return _terms.SelfAttention(eye, eye, eye, None, beta, None, heads=1, block=block, unit_rows=True, attracting=True)


@on_first_call(lambda f: jax.jit(f))
def _pair_cosines(y):
    """Mean, 10th and 90th percentile of the cosines between distinct rows of `y`."""
    u = y / jnp.linalg.norm(y, axis=-1, keepdims=True)
    m = y.shape[0]
    c = (u @ u.T)[~np.eye(m, dtype=bool)]
    return jnp.mean(c), jnp.percentile(c, 10), jnp.percentile(c, 90)


def _measure(x, rows, betas, rho, block):
    """For every beta: the cosine statistics of the outputs at `rows`, the weight factor
    $\\hat m$ (mean over the rows), and the spread of the inner products."""
    n, d = x.shape
    offsets = x[rows] @ x.T - rho  # (rows, n): <x_i, x_j> - rho
    off_diagonal = jnp.arange(n, dtype=rows.dtype)[None, :] != rows[:, None]
    spread = jnp.sqrt(jnp.sum(jnp.where(off_diagonal, offsets, 0) ** 2) / (rows.shape[0] * (n - 1)))

    def one(beta):
        y = _layer(d, beta, x.dtype, block)(0.0, x, rows=rows)
        factor = jnp.sum(jnp.where(off_diagonal, jnp.exp(beta * offsets), 0), axis=1) / (n - 1)
        return (*_pair_cosines(y), jnp.mean(factor))

    return jax.lax.map(one, betas), spread


_measure_jit = on_first_call(lambda f: jax.jit(f, static_argnames=("block",)))(_measure)


def long_context_dataset(cfg: Config, options: Options, on_piece=None, keep=None) -> xr.Dataset:
    """The sweep: for every rho and n, tokens drawn once, then every gamma (dims `rho`,
    `n`, `gamma_critical`); `keep(compute)` keeps each finished (rho, n) as a piece of
    the run (`attnflow.experiments._runner.OwnPieces`; None: everything is computed)."""
    keep = keep or (lambda compute: compute())
    dtype = jnp.dtype(cfg.dtype.value)
    rhos = np.asarray(options.rho, np.float64)
    ratios = np.asarray(options.gamma_critical, np.float64)
    ns = sizes(options.n_min, options.n_max, options.n_count)
    shape = (len(rhos), len(ns), len(ratios))
    out = {name: np.full(shape, np.nan) for name in ("cosine", "cosine_q10", "cosine_q90", "weight_factor")}
    spread = np.full(shape[:2], np.nan)
    key = jax.random.key(cfg.seed)

    def measure(a, rho, n) -> dict:  # a: the index of rho; n: a NumPy integer of the sizes
        rows = sample_rows(int(n), options.rows)
        x = equiangular_tokens(jax.random.fold_in(jax.random.fold_in(key, a), int(n)), int(n), cfg.d, rho, dtype, rows)
        betas = jnp.asarray(ratios / (1 - rho) * np.log(n), dtype)
        (mean, q10, q90, factor), sd = jax.device_get(
            _measure_jit(x, jnp.asarray(rows), betas, jnp.asarray(rho, dtype), block=cfg.attention_block)
        )
        return {"cosine": mean, "cosine_q10": q10, "cosine_q90": q90, "weight_factor": factor, "spread": sd}

    for a, rho in enumerate(rhos):
        for b, n in enumerate(ns):
            measured = keep(lambda a=a, rho=rho, n=n: measure(a, rho, n))
            for name in ("cosine", "cosine_q10", "cosine_q90", "weight_factor"):
                out[name][a, b] = np.asarray(measured[name], np.float64)
            spread[a, b] = float(measured["spread"])
            if on_piece is not None:
                on_piece()
    return _dataset(cfg, rhos, ns, ratios, out, spread)


def _dataset(cfg, rhos, ns, ratios, out, spread) -> xr.Dataset:
    dims = ("rho", "n", "gamma_critical")
    gamma = ratios[None, None, :] / (1 - rhos[:, None, None])
    beta = gamma * np.log(ns)[None, :, None]
    w = np.exp(beta * (1 - rhos[:, None, None]))
    ds = xr.Dataset(coords={"rho": rhos, "n": ns, "gamma_critical": ratios})
    described = {
        "cosine": "mean cosine between the outputs of distinct sampled query tokens",
        "cosine_q10": "10th percentile over the sampled pairs of the output cosine",
        "cosine_q90": "90th percentile over the sampled pairs of the output cosine",
        "weight_factor": "mean over sampled rows of (1/(n-1)) sum_{j != i} exp(beta (<x_i, x_j> - rho)): 1 for "
        "exactly equiangular tokens",
    }
    for name, text in described.items():
        ds[name] = xr.DataArray(out[name], dims=dims).assign_attrs(description=text)
    ds["gamma"] = xr.DataArray(gamma[:, 0, :], dims=("rho", "gamma_critical")).assign_attrs(
        description="gamma = gamma_critical / (1 - rho)"
    )
    ds["beta"] = xr.DataArray(beta, dims=dims).assign_attrs(description="beta = gamma log n")
    exact = equiangular_cosine(ns[None, :, None], rhos[:, None, None], beta)
    ds["exact"] = xr.DataArray(exact, dims=dims).assign_attrs(
        description="the output cosine for exactly equiangular tokens at this n (closed form)"
    )
    ds["asymptotic"] = xr.DataArray(
        asymptotic_cosine(w / ns[None, :, None], rhos[:, None, None]), dims=dims
    ).assign_attrs(description="rho (1 + s)^2 / (s^2 + 2 s rho + rho) with s = exp(beta (1 - rho)) / n")
    limit = limit_cosine(ratios[None, :], rhos[:, None])
    ds["limit"] = xr.DataArray(limit, dims=("rho", "gamma_critical")).assign_attrs(
        description="the limit as n -> infinity: 1 below the critical gamma, 4 rho / (1 + 3 rho) at it, rho above"
    )
    ds["inner_product_spread"] = xr.DataArray(spread, dims=("rho", "n")).assign_attrs(
        description="root mean square of <x_i, x_j> - rho over sampled i and all j != i"
    )
    ds.attrs["d"] = cfg.d
    return ds


class LongContext(Experiment):
    title = "The long-context phase transition: output cosines of one attention layer at beta = gamma log n"
    paper = (
        'Chen, Lin, Polyanskiy, Rigollet, "Critical attention scaling in long-context transformers" (2025); '
        "closed form at finite n: tests/README.md"
    )
    Options = Options
    coordinates = {
        "rho": ("cosine rho between any two input tokens (equiangular inputs)", "1"),
        "gamma_critical": ("gamma as a multiple of the critical 1/(1 - rho), beta = gamma log n", "1"),
    }

    def check(self) -> None:
        cfg, options = self.cfg, self.options
        _numbers("rho", options.rho, 0.0, 1.0)
        _numbers("gamma_critical", options.gamma_critical, 0.0, None)
        for name, value, minimum in (
            ("n_min", options.n_min, 2),
            ("n_count", options.n_count, 1),
            ("rows", options.rows, 2),
        ):
            if not whole_number(value, minimum):
                raise ConfigError(
                    f"experiment.options.{name} of experiment long_context must be a whole number >= "
                    f"{minimum}, got {value!r}."
                )
        top = options.n_max
        if top is not None and not (whole_number(top, 2) and top >= options.n_min):
            raise ConfigError(
                f"experiment.options.n_max of experiment long_context must be null or a whole number "
                f"from n_min={options.n_min} on, got {top!r}."
            )
        if options.n_count == 1 and top is not None and top != options.n_min:
            raise ConfigError(
                f"experiment.options.n_max={top} does not apply with experiment.options.n_count=1 (the "
                f"one n is n_min={options.n_min}); remove it or raise n_count."
            )
        # The sizes are rounded to whole numbers and merged where they meet: fewer than n_count would be run.
        ns = sizes(options.n_min, options.n_max, options.n_count)
        found = len(ns)
        if found < options.n_count:
            raise ConfigError(
                f"experiment.options.n_count={options.n_count} log-spaced sizes from "
                f"n_min={options.n_min} to n_max={top or default_n_max()} round to {found} different n; "
                "lower n_count or widen the range."
            )
        if options.rows > options.n_min:
            raise ConfigError(
                f"experiment.options.rows={options.rows} query tokens cannot be sampled from "
                f"n_min={options.n_min} tokens; take rows <= n_min."
            )
        if whole_number(cfg.d, 3) and options.rows > cfg.d - 1:
            raise ConfigError(
                f"experiment.options.rows={options.rows} sampled tokens are made exactly equiangular "
                f"(orthonormal in u-perp), which needs rows <= d - 1 = {cfg.d - 1}; lower rows or "
                "raise d."
            )
        if not (whole_number(cfg.d, 3)):
            raise ConfigError(
                f"experiment long_context needs d >= 3 (a direction u and the sphere of u-perp), got d={cfg.d!r}."
            )
        if cfg.attention_block is not None and not whole_number(cfg.attention_block, 0):
            raise ConfigError(
                f"attention_block must be null, 0 or a positive whole number, got {cfg.attention_block!r}."
            )
        refuse_given(
            cfg,
            [f.name for f in dataclasses.fields(Config) if f.name not in _READ_KEYS],
            "long_context",
            "one Q = K = V = I softmax layer on its own tokens: it reads d, dtype, seed and attention_block, "
            "and n and beta come from its options",
        )
        itemsize = 4 if cfg.dtype.value == "float32" else 8
        need = _COPIES * int(ns[-1]) * cfg.d * itemsize
        memory = _ensemble.available_memory()
        if need > memory:
            raise ConfigError(
                f"the largest token set needs about {need / 2**30:.1f} GiB (n={ns[-1]}, "
                f"d={cfg.d}, {_COPIES} copies at once), more than the {memory / 2**30:.1f} GiB "
                "available; lower d or experiment.options.n_max."
            )

    def panels(self, base: dict) -> dict[str, dict]:
        return {}  # everything is computed in `analyse`: one SelfAttention program per n

    def pieces(self) -> int:
        """Units of work for the progress bar: one per (rho, n)."""
        options = self.options
        return len(options.rho) * len(sizes(options.n_min, options.n_max, options.n_count))

    def analyse(self, results: dict[str, xr.Dataset], *, on_piece: Counter, keep: Keeper) -> xr.Dataset:
        work = lambda advance: long_context_dataset(self.cfg, self.options, advance, keep)
        return counted("long_context", self.pieces(), work, on_piece)

    @staticmethod
    def draw(ds: xr.Dataset) -> dict[str, Figure]:
        cfg = config_of(ds)
        rhos = ds["rho"].values
        fig, axes = subplots(len(rhos), 2, figsize=(11.0, 4.0 * len(rhos)), layout="constrained", squeeze=False)
        ns = ds["n"].values
        fine = np.geomspace(ns[0], ns[-1], 200)
        cmap = colormap("viridis")
        ratios = ds["gamma_critical"].values
        for row, rho in enumerate(rhos):
            part = ds.sel(rho=rho)
            left, right = axes[row]
            for k, ratio in enumerate(ratios):
                color = cmap(k / max(len(ratios) - 1, 1))
                one = part.sel(gamma_critical=ratio)
                gamma = float(one["gamma"])
                label = f"$\\gamma = {ratio:g} / (1 - \\rho)$ = {gamma:.3g}"
                left.fill_between(ns, one["cosine_q10"], one["cosine_q90"], color=color, alpha=0.15, linewidth=0)
                left.plot(ns, one["cosine"], "o", color=color, markersize=4, label=label)
                exact = equiangular_cosine(fine, rho, gamma * np.log(fine))
                left.plot(fine, exact, "-", color=color, linewidth=1)
                left.axhline(float(one["limit"]), color=color, linestyle="--", linewidth=0.8)
                right.loglog(ns, np.abs(one["cosine"] - one["limit"]), "o-", color=color, markersize=4, label=label)
                right.loglog(fine, np.abs(exact - float(one["limit"])), ":", color=color, linewidth=1)
            left.set_xscale("log")
            left.set_xlabel("n (tokens)")
            left.set_ylabel("cosine between two outputs")
            left.set_title(
                f"(a) $\\rho$ = {rho:g}: measured (dots, 10-90% band), exact equiangular (lines), limits (dashed)",
                fontsize=9,
            )
            right.set_xlabel("n (tokens)")
            right.set_ylabel("|cosine - limit|")
            right.set_title(f"(b) $\\rho$ = {rho:g}: distance to the limit, measured (dots) and equiangular (dotted)")
            right.legend(loc="lower left", fontsize=7)
        caption(fig, _caption(ds, cfg), width=170)
        return {"long_context": fig}


def _caption(ds, cfg) -> str:
    ns = ds["n"].values
    rho0 = float(ds["rho"].values[0])
    text = (
        "One softmax attention layer, Q = K = V = I, on n tokens $x_i = \\sqrt{\\rho}\\, u + \\sqrt{1 - \\rho}\\, z_i$ "
        f"in d = {ds.attrs['d']} dimensions ($z_i$ uniform on the sphere of u-perp: approximately equiangular, inner "
        f"products $\\rho$ with root-mean-square deviation {float(ds['inner_product_spread'].max()):.3f}), at "
        f"$\\beta = \\gamma \\log n$, n from {ns[0]} to {ns[-1]}; the cosine between two outputs $y_i = \\sum_j "
        f"a_{{ij}} x_j$, mean over the pairs of {cfg['experiment']['options']['rows']} sampled query tokens, each "
        "attending to all n keys. Below the critical $\\gamma = 1/(1 - \\rho)$ the outputs collapse (cosine $\\to$ 1), "
        f"at it the cosine tends to $4 \\rho / (1 + 3 \\rho)$ ({4 * rho0 / (1 + 3 * rho0):.3f} at $\\rho$ = {rho0:g}), "
        "above it to $\\rho$. "
    )
    last = ds.isel(n=-1)
    gaps = np.abs(last["cosine"] - last["exact"]).max().item()
    text += f"At n = {ns[-1]} the measured cosines lie within {gaps:.4f} of the exact equiangular curves."
    critical = np.flatnonzero(np.isclose(ds["gamma_critical"].values, 1.0))
    if critical.size:
        at = last.isel(gamma_critical=critical[0])
        factor = ds["weight_factor"].isel(gamma_critical=critical[0]).max().item()
        measured = np.abs(at["cosine"] - at["limit"]).max().item()
        exact = np.abs(at["exact"] - at["limit"]).max().item()
        text += (
            f" At the critical $\\gamma$ the measured distance to the limit is {measured:.4f} "
            f"at n = {ns[-1]} against {exact:.1e} for exactly equiangular "
            "tokens: there $\\beta = \\log n / (1 - \\rho)$ makes the deviation from equiangularity count, the "
            "off-diagonal weights growing on average by the weight factor, up to "
            f"{factor:.3f} (1 for exact tokens)."
        )
    return text
