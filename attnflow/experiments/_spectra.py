"""The finite-time Lyapunov spectra of a study's ensemble by the QR method, as experiments
lyapunov and lyapunov_polynomial compute them: every (beta, member) pair of a resolved
study through `attnflow.lyapunov_spectrum`, one compiled program (a `jax.vmap` over a
piece of pairs, beta being data) called once per piece; the checks of what it needs,
made before anything is computed; the options both experiments share (`k`,
`reorthonormalize_every`)."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import numpy as np

from ..running._progress import Progress
from ..schema._config import Config
from ..schema._errors import ConfigError
from ..storage._store import in_background
from ._lazy import lazy, on_first_call

if TYPE_CHECKING:
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    from ..analysis import spectrum
    from ..running import _build
else:
    eqx = lazy("equinox")
    jax = lazy("jax")
    jnp = lazy("jax.numpy")
    spectrum = lazy("attnflow.analysis.spectrum")
    _build = lazy("attnflow.running._build")

# The initial deviation frame of a member is drawn from its key folded with this.
_FRAME = 3
PERCENTILES = {"q10": "10th percentile", "median": "median", "q90": "90th percentile"}


def check_qr_options(name: str, k: int | None, every: int) -> None:
    """The options `k` (exponents kept, None: d) and `reorthonormalize_every` (steps
    between QR factorizations) of experiment `name`, whatever the study."""
    if k is not None and k < 1:
        raise ConfigError(
            f"experiment.options.k of experiment {name} must be null or a whole number of exponents >= 1, got {k!r}."
        )
    if every < 1:
        raise ConfigError(
            f"experiment.options.reorthonormalize_every of experiment {name} must be a whole "
            f"number of steps >= 1, got {every!r}."
        )


def exponent_count(cfg: Config, k: int | None) -> int:
    """The number of exponents kept: the option `k`, by default d."""
    return int(k) if k is not None else int(cfg.d)


def check_spectrum(name: str, study: _build.Study, k: int, every: int, option: str = "reorthonormalize_every") -> None:
    """What `ensemble_spectra` needs of a resolved study, checked before any computing:
    fixed steps, at least two QR intervals of `every` steps (the value of
    `experiment.options.<option>`), and (tracing one member's spectrum, nothing
    computed) k within range."""
    cfg = study.config
    if study.grid.adaptive:
        raise ConfigError(
            f"experiment {name} follows the fixed step map of the solver (the QR method needs its "
            "tangent map); set adaptive=false and give dt."
        )
    steps = study.grid.num_steps
    assert steps is not None  # fixed steps: adaptive refused above
    if isinstance(every, int) and every >= 1 and steps % every:
        divisors = [m for m in range(1, min(steps, 50) + 1) if steps % m == 0]
        raise ConfigError(
            f"experiment.options.{option}={every} must be a whole number of steps dividing the {steps} "
            f"steps; for example one of {', '.join(map(str, divisors))}."
        )
    if isinstance(every, int) and steps % every == 0 and steps // every < 2:
        raise ConfigError(
            f"experiment.options.{option}={every} leaves one QR interval in the "
            f"{steps} steps; take at most {steps // 2} so that the late-window exponents exist."
        )
    system = _build.build_system(cfg)
    dtype = jnp.dtype(cfg.dtype.value)
    try:
        jax.eval_shape(
            lambda key, beta: _one(system, key, beta, (cfg.t0, cfg.t1, cfg.dt), k, every, cfg.solver.value),
            jax.random.key(0),
            jnp.zeros((), dtype),
        )
    except ConfigError as error:
        # `lyapunov_spectrum` names its argument k, given here as experiment.options.k.
        if str(error).startswith("k "):
            raise ConfigError(f"experiment.options.{error}") from None
        raise


def _one(system, key, beta, span, k, every, solver, quotient=None):
    """One member's spectrum: its field and tokens from the config, its deviation frame
    from its own key."""
    t0, t1, dt = span
    field, y0, _ = system(key, beta)
    res = spectrum.lyapunov_spectrum(
        field,
        y0,
        t0=t0,
        t1=t1,
        dt=dt,
        k=k,
        solver=solver,
        reorthonormalize_every=every,
        running=True,
        key=jax.random.fold_in(key, _FRAME),
        quotient=quotient,
    )
    return res.exponents, res.running


@on_first_call(lambda f: eqx.filter_jit(f))
def _piece(system, keys, betas, members, beta_index, span, k, every, solver, quotient=None):
    """The pairs (keys[members[p]], betas[beta_index[p]]) of one piece, a vmap over them."""
    return jax.vmap(lambda m, b: _one(system, keys[m], betas[b], span, k, every, solver, quotient))(members, beta_index)


@dataclasses.dataclass(frozen=True)
class Spectra:
    """Finite-time exponents of an ensemble (NumPy arrays, leading axes (beta, member)).

    `exponents` over $[t_0, t_1]$; `running[..., m, :]` over $[t_0,$ `times[m]`$]$;
    `late` over $[$`window`$, t_1]$, the second half of the QR times."""

    betas: np.ndarray
    times: np.ndarray
    exponents: np.ndarray
    running: np.ndarray
    late: np.ndarray
    window: float


def local_exponents(spectra: Spectra, t0: float) -> np.ndarray:
    """The exponents over each QR interval $[t_{m-1}, t_m]$: differences of the cumulative
    log-stretches $S(t) = (t - t_0) \\lambda(t)$ over the interval's length (the local
    rates of the deviation vectors, in the order of `exponents`)."""
    times = np.concatenate([[t0], spectra.times])
    sums = spectra.running * (times[1:] - t0)[:, None]
    sums = np.concatenate([np.zeros_like(sums[..., :1, :]), sums], axis=-2)
    return np.diff(sums, axis=-2) / np.diff(times)[:, None]


def default_chunk(cfg: Config, k: int) -> int:
    """Pairs solved at once: each one's working set (a state and its k tangent copies with
    the n x n attention of each head) kept near 1 MiB in all: smaller and larger pieces
    were both slower on a CPU (benchmarks/README.md)."""
    item = 4 if cfg.dtype.value == "float32" else 8
    return max(1, 2**20 // ((k + 1) * cfg.n * max(cfg.n, cfg.d) * item * cfg.heads))


def ensemble_spectra(study: _build.Study, k: int, every: int, quotient=None) -> Spectra:
    """The k leading finite-time exponents of every (beta, member) of a resolved study:
    member m has the key `split(key(seed), members)[m]` (the core studies'
    members: the same weights and initial tokens), for every beta. `quotient` as for
    `lyapunov_spectrum` (the transverse exponents)."""
    cfg, betas = study.config, study.betas
    dtype = jnp.dtype(cfg.dtype.value)
    system = _build.build_system(cfg)
    keys = jax.random.split(jax.random.key(cfg.seed), cfg.members)
    span = (cfg.t0, cfg.t1, cfg.dt)
    count, members = len(betas), cfg.members
    pairs = count * members
    chunk = cfg.chunk_size or default_chunk(cfg, k)
    pieces = math.ceil(pairs / chunk)
    size = math.ceil(pairs / pieces)
    beta_array = jnp.asarray(betas, dtype)
    exponents, running = [], []
    what = "Lyapunov spectra" if quotient is None else "transverse Lyapunov spectra"
    with Progress(what, pairs, unit="members") as bar:
        for i in range(pieces):
            index = np.arange(i * size, (i + 1) * size) % pairs  # the last piece wraps around
            out = in_background(
                lambda index=index: jax.device_get(
                    _piece(
                        system,
                        keys,
                        beta_array,
                        (index % members).astype(np.int32),
                        (index // members).astype(np.int32),
                        span,
                        k,
                        every,
                        cfg.solver.value,
                        quotient,
                    )
                )
            )
            exponents.append(out[0])
            running.append(out[1])
            bar.advance(min(size, pairs - i * size))
    exponents = np.concatenate(exponents)[:pairs].reshape(count, members, k).astype(np.float64)
    running = np.concatenate(running)[:pairs].reshape(count, members, -1, k).astype(np.float64)
    assert study.grid.num_steps is not None  # fixed steps (check_spectrum)
    intervals = study.grid.num_steps // every
    times = cfg.t0 + (cfg.t1 - cfg.t0) * np.arange(1, intervals + 1) / intervals
    half = intervals // 2 - 1
    # Cumulative log-stretches S(t) = (t - t0) lambda(t): their difference over
    # [times[half], t1] is that window's exponent (a column follows one vector).
    sums = running * (times - cfg.t0)[:, None]
    late = (sums[..., -1, :] - sums[..., half, :]) / (times[-1] - times[half])
    bad = ~np.isfinite(exponents).all(axis=-1)
    if bad.any():
        where = sorted({betas[b] for b in np.nonzero(bad)[0]})
        raise ConfigError(
            f"the exponents of {int(bad.sum())} of {pairs} (beta, member) pairs are not finite (at beta = "
            f"{', '.join(f'{b:g}' for b in where[:5])}): the states or deviation vectors blew up; lower dt."
        )
    return Spectra(np.asarray(betas), times, exponents, running, late, float(times[half]))
