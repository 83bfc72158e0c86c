"""From a configuration to attnflow objects.

`validate_config` composes a config against the typed schema (`_config.py`, which
checks types, choices and unknown keys) and then checks what a type cannot say:
ranges, shapes, combinations, keys given for options that do not use them, and initial
data that no run could start from. The `build_*` functions then only assemble modules.
Nothing here imports Hydra.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, PRNGKeyArray, ScalarLike, UInt32

from ..numerics import _numerics
from ..numerics._field import Collisions, ConstantSpeed, VectorField
from ..numerics._geometry import Euclidean, Sphere
from ..numerics._grid import TimeGrid, save_steps, save_times, step_count, time_grid
from ..numerics._initial import AbstractInitialCondition
from ..numerics._metrics import MetricContext, Recorder, attention_rows
from ..numerics._noise import BrownianNoise, brownian_noise, tree_depth
from ..numerics._schedules import AbstractSchedule, Constant, factored
from ..numerics._simulate import simulate
from ..numerics._solvers import SOLVERS, no_error_estimate
from ..numerics._terms import TokenNorm
from ..numerics._tiled import INDEX_LIMIT, check_tiles, resolve_block
from ..schema._checks import array as _array
from ..schema._checks import as_floats as _floats
from ..schema._checks import number as _number
from ..schema._config import Config, _default_config, compose, to_container
from ..schema._errors import ConfigError
from ..schema._metric_registry import METRIC_NAMES, METRICS, Sizes, names_reading, reading
from ..schema.system import PARTS
from ._components import build_terms, check_terms, checking_dtype, code_digest, term_data, user_metrics


def betas_of(cfg: Config) -> tuple[list[float], bool]:
    """The list of betas and whether the config gave a list (a `beta` dimension)."""
    beta = cfg.beta
    is_list = isinstance(beta, (list, tuple))
    values = list(beta) if is_list else [beta]
    if not values:
        raise ConfigError("beta must be a positive number or a non-empty list of them.")
    for b in values:
        _number("every beta", b, positive=True)
    return [float(b) for b in values], is_list


def _not_applicable(cfg: Config, base: Config) -> None:
    """Refuse values given for options the run does not use (they would be stored but
    ignored): a value differing from its default where its switch is off."""

    def changed(getter) -> bool:
        return getter(cfg) != getter(base)

    # (why, keys): "with SETTING" or "to SETTING", and the keys with their getters.
    rules: list[tuple[str, list[tuple[str, Any]]]] = []
    for part in PARTS.values():
        rules += part.unused(cfg)
    if cfg.scheme not in ("pre", "peri"):
        rules.append(
            (
                f"with scheme={cfg.scheme} (token_norm is the N of pre and peri)",
                [
                    (f"token_norm.{k}", lambda c, k=k: getattr(c.token_norm, k))
                    for k in ("kind", "eps", "gamma", "shift")
                ],
            )
        )
    elif cfg.token_norm.kind != "layer":
        unused = ("eps", "gamma", "shift") if cfg.token_norm.kind == "sphere" else ("shift",)
        rules.append(
            (
                f"with token_norm.kind={cfg.token_norm.kind}",
                [(f"token_norm.{k}", lambda c, k=k: getattr(c.token_norm, k)) for k in unused],
            )
        )
    if cfg.noise.sigma == 0:
        rules.append(
            (
                "with noise.sigma=0",
                [
                    (f"noise.{k}", lambda c, k=k: getattr(c.noise, k))
                    for k in ("kind", "path", "depth", "switch_times", "factors", "poly")
                ],
            )
        )
    if not cfg.adaptive:
        rules.append(
            (
                "with adaptive=false (fixed steps take (t1 - t0)/dt steps)",
                [(k, lambda c, k=k: getattr(c, k)) for k in ("rtol", "atol", "max_steps")],
            )
        )
    if cfg.rank_rtol is not None and "attention_rank" not in cfg.metrics:
        rules.append(("with metrics without attention_rank", [("rank_rtol", lambda c: c.rank_rtol)]))
    if not reading("eps", cfg.metrics):
        rules.append((f"with metrics without {names_reading('eps')}", [("cluster_eps", lambda c: c.cluster_eps)]))
    if not any(part.draws_weights(cfg) for part in PARTS.values()):
        rules.append(
            (
                "with no random weights",
                [("weights.shared", lambda c: c.weights.shared), ("weights.per_beta", lambda c: c.weights.per_beta)],
            )
        )
    for reason, keys in rules:
        given = [name for name, getter in keys if changed(getter)]
        if given:
            names = " and ".join(given)
            raise ConfigError(
                f"{names} {'does' if len(given) == 1 else 'do'} not apply {reason}; remove "
                f"{'it' if len(given) == 1 else 'them'} or change that setting."
            )


@dataclasses.dataclass(frozen=True)
class Study:
    """A study's config checked and resolved once (`resolve_study`): every stage after
    the check (the plan of its pieces, the solves, the results file) reads these values
    instead of working them out from the config again.

    Arguments:
        config: the checked config (its sizes `n`, `d`, `members`, `heads` and its
            chunking `chunk_size` are read from it as they are).
        betas: the betas of the run, in float64, in the config's order.
        beta_is_list: whether the config gave a list (the results then have a `beta`
            dimension; a single beta is a scalar coordinate).
        grid: the times: fixed steps and the grid steps recorded, or the output times.
        output_bytes: the size of the statistics the run returns (at most this, for
            log-spaced output times).
        notes: what the run should be told about its settings that is not an error (a
            switch time outside the run's interval), one sentence each; stored in the
            results' `notes` attribute and said at the end of a run.
    """

    config: Config
    betas: np.ndarray
    beta_is_list: bool
    grid: TimeGrid
    output_bytes: int
    notes: tuple[str, ...] = ()

    @property
    def pairs(self) -> int:
        """The number of solves: betas x members."""
        return len(self.betas) * self.config.members


def validate_config(config: Mapping | Config | None = None) -> Config:
    """Compose `config` over the defaults and check every value; returns the typed config
    (`resolve_study(config).config`).

    Raises `ConfigError` with one sentence naming the bad value and what is allowed.
    """
    return resolve_study(config).config


def resolve_study(config: Mapping | Config | None = None) -> Study:
    """Compose `config` over the defaults, check every value, and resolve it into a `Study`
    (betas, times, output size).

    Raises `ConfigError` with one sentence naming the bad value and what is allowed.
    """
    cfg = compose(config)
    base = _default_config()
    d = cfg.d
    if isinstance(d, (list, tuple)):
        raise ConfigError(
            f"d={list(d)} is a list: a study takes one dimension (a list of them, one panel each, "
            "is for experiments such as experiment=phase_diagram)."
        )
    if not (isinstance(d, int) and not isinstance(d, bool)):
        raise ConfigError(f"d must be a whole number, got {d!r}.")
    if cfg.experiment is not None:
        raise ConfigError(
            f"experiment={cfg.experiment.name} is run by attnflow.run or attnflow.run_experiment (or "
            "the command line), not resolved as a single study."
        )
    given = [key for key in ("checkpoint", "text") if getattr(cfg, key) is not None]
    if given:
        raise ConfigError(
            f"{given[0]} is read by the experiments on trained models only (experiment=checkpoint, "
            "experiment=sensitivity); add one of them or remove it."
        )
    for key in ("n", "d", "members", "heads", "saves", "max_steps"):
        _number(key, getattr(cfg, key), minimum=1)
    _number("seed", cfg.seed, minimum=0)
    if cfg.seed >= 2**32:
        raise ConfigError(f"seed must be below 2^32 = {2**32}, got {cfg.seed}.")
    betas, beta_is_list = betas_of(cfg)
    for key in ("t0", "t1"):
        _number(key, getattr(cfg, key))
    if cfg.t1 <= cfg.t0:
        raise ConfigError(f"t1 must be greater than t0, got t0={cfg.t0} and t1={cfg.t1}.")
    steps = None  # the fixed steps, counted here once
    if cfg.dt is None:
        if not cfg.adaptive:
            raise ConfigError("dt must be given for fixed-step solvers (or set adaptive=true).")
    elif cfg.adaptive:
        _number("dt", cfg.dt, positive=True)
    else:
        steps = step_count(cfg.t0, cfg.t1, cfg.dt)  # the one rule of fixed-step grids
    if cfg.adaptive and not SOLVERS[cfg.solver.value].adaptive:
        raise no_error_estimate(f"solver {str(cfg.solver)!r}")
    cfg = _check_time_change(cfg, betas)
    for key in ("rtol", "atol", "cluster_eps"):
        _number(key, getattr(cfg, key), positive=True)
    if cfg.scheme == "sphere" and d < 2:
        raise ConfigError(f"tokens on the sphere need d >= 2, got d={d}.")
    metrics = set(cfg.metrics)
    user_metrics(cfg)  # an unknown name, or a function not registered with attnflow.metric, in one sentence
    for key in ("d_k", "d_v", "chunk_size", "cpu_devices"):
        if getattr(cfg, key) is not None:
            _number(key, getattr(cfg, key), minimum=1)
    if cfg.attention_block is not None:
        _number("attention_block", cfg.attention_block, minimum=0)
    dense_only = [m for m in METRIC_NAMES if m in metrics and not METRICS[m].tiled]
    if dense_only and resolve_block(cfg.n, cfg.attention_block) is not None:
        raise ConfigError(
            f"{dense_only[0]} needs the whole n x n attention maps, which are formed in tiles at "
            f"n={cfg.n} with attention_block={cfg.attention_block}; drop the metric or set "
            "attention_block=0 (dense)."
        )
    if cfg.rank_rtol is not None:
        _number("rank_rtol", cfg.rank_rtol, positive=True)
    _number("max_output_gib", cfg.max_output_gib, positive=True)
    if cfg.scheme in ("pre", "peri"):
        tn = cfg.token_norm
        _number("token_norm.eps", tn.eps, minimum=0)
        for key in ("gamma", "shift"):
            value = getattr(tn, key)
            if value is not None and _array(f"token_norm.{key}", value, cfg.dtype).shape not in ((), (d,)):
                raise ConfigError(f"token_norm.{key} must be a number or {d} numbers (one per dimension).")
    _check_noise(cfg)
    if not any(part.enabled(cfg) for part in PARTS.values()) and cfg.noise.sigma == 0 and not cfg.terms:
        offs = " and ".join(f"{part.switch}=false" for part in PARTS.values() if part.switch)
        raise ConfigError(
            f"{offs} leave no dynamics; switch one on (or the noise, noise.sigma > 0, or a term of terms)."
        )
    for part in PARTS.values():
        part.check(cfg, betas)
    cfg.init.check(cfg)
    _not_applicable(cfg, base)
    _check_sizes(cfg, len(betas), steps)
    check_terms(cfg, betas[0])
    size = len(betas) * cfg.members * _output_count(cfg, steps) * (_per_save_bytes(cfg) + _user_metric_bytes(cfg))
    if size / 2**30 > cfg.max_output_gib:
        raise ConfigError(
            f"the output would take {size / 2**30:.1f} GiB (more than max_output_gib={cfg.max_output_gib}); "
            "lower members or saves, or drop save_states and the attention metric."
        )
    cfg = _numbers_as_floats(cfg)
    if cfg.adaptive or cfg.exact_times:
        times = save_times(cfg.t0, cfg.t1, cfg.saves, cfg.save_spacing, cfg.dt)
        grid = time_grid(t1=cfg.t1, t0=cfg.t0, dt=cfg.dt, adaptive=cfg.adaptive, ts=times, num_steps=steps)
    else:
        assert steps is not None  # a fixed-step run: counted above
        grid = time_grid(
            t1=cfg.t1, t0=cfg.t0, dt=cfg.dt, save_steps=save_steps(steps, cfg.saves, cfg.save_spacing), num_steps=steps
        )
    return Study(cfg, np.asarray(betas, np.float64), beta_is_list, grid, size, _switches_outside(cfg))


def _switches_outside(cfg: Config) -> tuple[str, ...]:
    """A note for every schedule whose switch times fall outside (t0, t1): the run never
    switches there. Not an error: a sweep of t1 (`-m t1=3,10`) with a switch at 5 must
    still run its short job."""
    schedules = [("noise", cfg.noise)] if cfg.noise.sigma != 0 else []
    schedules += [schedule for part in PARTS.values() for schedule in part.schedules(cfg)]
    notes = []
    for path, spec in schedules:
        outside = [t for t in spec.switch_times if not cfg.t0 < t < cfg.t1]
        if outside:
            shown = ", ".join(f"{t:g}" for t in outside)
            notes.append(
                f"{path}.switch_times holds {shown}, outside the run's interval (t0, t1) = "
                f"({cfg.t0:g}, {cfg.t1:g}), so the run never switches there and the factors of the pieces "
                "it skips are unused."
            )
    return tuple(notes)


def _check_time_change(cfg: Config, betas: list[float]) -> Config:
    """The time change checked; a number as the speed becomes a float."""
    speed, collisions = cfg.time_change.speed, cfg.time_change.collisions
    if speed == "log_beta":
        low = [b for b in betas if b <= 1]
        if low:
            raise ConfigError(
                f"time_change.speed=log_beta needs every beta above 1 (a positive speed log beta), got beta={low[0]:g}."
            )
    elif speed is not None:
        if isinstance(speed, str):
            raise ConfigError(f"time_change.speed must be null, a positive number or log_beta, got {speed!r}.")
        _number("time_change.speed", speed, positive=True)
    if collisions is not None:
        _number("time_change.collisions", collisions, positive=True)
        if cfg.adaptive:
            raise ConfigError(
                "time_change.collisions merges tokens after each fixed step; adaptive runs have no "
                "such steps: set adaptive=false or collisions=null."
            )
        if resolve_block(cfg.n, cfg.attention_block) is not None:
            raise ConfigError(
                f"time_change.collisions forms all n^2 distances, which n={cfg.n} with "
                f"attention_block={cfg.attention_block} keeps to tiles; set attention_block=0 or "
                "collisions=null."
            )
    if speed in (None, "log_beta"):
        return cfg
    return dataclasses.replace(cfg, time_change=dataclasses.replace(cfg.time_change, speed=float(speed)))


def _check_noise(cfg: Config) -> None:
    """The noise checked: sigma >= 0, and a noisy run on fixed steps recorded on the grid."""
    noise = cfg.noise
    _number("noise.sigma", noise.sigma, minimum=0)
    if noise.depth is not None:
        _number("noise.depth", noise.depth, minimum=1)
    if noise.depth is not None and noise.depth > 40:
        raise ConfigError(f"noise.depth must be at most 40 (a tree resolving (t1 - t0)/2^40), got {noise.depth}.")
    times, factors = list(noise.switch_times), list(noise.factors)
    for value in times + factors + list(noise.poly or []):
        _number("every entry of noise.switch_times, .factors and .poly", value)
    if (times or factors) and len(factors) != len(times) + 1:
        raise ConfigError(
            f"noise has {len(times)} switch_times and needs {len(times) + 1} factors, got {len(factors)}."
        )
    if any(b <= a for a, b in zip(times, times[1:])):
        raise ConfigError(f"noise.switch_times must increase, got {times}.")
    if noise.sigma == 0:
        return
    if cfg.adaptive:
        raise ConfigError(
            "noise.sigma > 0 is stepped with fixed steps (the step size of an SDE path is not "
            "controlled here): set adaptive=false."
        )
    if cfg.time_change.speed is not None:
        raise ConfigError(
            "noise is added in real time, which a constant-speed time change replaces: set "
            "time_change.speed=null or noise.sigma=0."
        )
    if cfg.exact_times:
        raise ConfigError("a noisy path has no smooth interpolant between grid steps: set exact_times=false.")
    if noise.path.value == "increments":
        if noise.depth is not None:
            raise ConfigError(
                f"noise.depth={noise.depth} resolves a Brownian tree, and noise.path=increments draws one "
                "normal per step instead: set noise.depth=null, or noise.path=tree."
            )
        return
    least = tree_depth(cfg.t0, cfg.t1, cfg.dt)  # pyright: ignore[reportArgumentType]  (a noisy run is fixed-step: it has a dt)
    if noise.depth is not None and noise.depth < least:
        # Below its resolution the tree interpolates: the increments of steps finer than
        # it are a smooth, far weaker path (a quadratic variation 0.12 instead of 1 at
        # depth 1 and dt = 1/64), not Brownian noise.
        span = cfg.t1 - cfg.t0
        raise ConfigError(
            f"noise.depth={noise.depth} resolves the Brownian path to (t1 - t0)/2^{noise.depth} = "
            f"{span * 2.0**-noise.depth:.4g}, coarser than the step dt={cfg.dt:g}, so the noise "
            f"would be smoothed away; give noise.depth >= {least} (the least that resolves dt) or "
            "null (that least depth)."
        )
    # The strength times its largest factor, squared by the retraction's norm (and by the
    # energy of flat space): past the square root of the dtype's largest number a step
    # overflows at once.
    largest = math.sqrt(float(np.finfo(cfg.dtype.value).max))
    factor = max([abs(f) for f in factors] or [1.0])
    if noise.sigma * factor >= largest:
        strength = f"noise.sigma={noise.sigma:g}" + (f" times its factor {factor:g}" if factor != 1 else "")
        wider = " (or dtype=float64)" if cfg.dtype == "float32" else ""
        raise ConfigError(
            f"{strength} is too large for {cfg.dtype}: a step squares the strength, which overflows "
            f"from sqrt({float(np.finfo(cfg.dtype.value).max):.3g}) = {largest:.3g} on; give a "  # pyright: ignore[reportAttributeAccessIssue]  (a DType choice; `== "float32"` above narrows it to a str literal)
            f"smaller noise.sigma{wider}."
        )


def non_finite_advice(cfg: Config) -> str:
    """What a run whose state turned NaN or infinite may change, in words: only remedies
    that its config would accept (a noisy or colliding run takes no adaptive solver)."""
    remedies = ["a smaller dt"]
    if not cfg.adaptive and cfg.noise.sigma == 0 and cfg.time_change.collisions is None:
        remedies.append("an adaptive solver")
    if cfg.dtype == "float32":
        remedies.append("float64")
    remedies += [remedy for part in PARTS.values() if part.enabled(cfg) for remedy in part.remedies(cfg)]
    if cfg.noise.sigma != 0:
        remedies.append("a smaller noise.sigma")
    if cfg.adaptive:
        remedies[0] = "tighter rtol and atol"
    return "use " + (", ".join(remedies[:-1]) + " or " + remedies[-1] if len(remedies) > 1 else remedies[0])


def _numbers_as_floats(cfg: Config) -> Config:
    """The untyped (number-or-list) entries of a validated config, as floats."""
    for part in PARTS.values():
        cfg = part.as_floats(cfg)
    token_norm = dataclasses.replace(
        cfg.token_norm, gamma=_floats(cfg.token_norm.gamma), shift=_floats(cfg.token_norm.shift)
    )
    return dataclasses.replace(cfg, beta=_floats(cfg.beta), init=cfg.init.as_floats(), token_norm=token_norm)


def _check_sizes(cfg: Config, betas: int, steps: int | None) -> None:
    """Refuse the counts that a run's int32 indices and loop counters cannot hold (before
    the memory estimate, which could not even be traced for them, and before anything
    is formed from them): tokens, solves, steps and the tiled loops' pairs of tiles."""
    index = f"more than an int32 index can number (2^31 - 1 = {INDEX_LIMIT})"
    counter = f"more than the int32 step counter can count (2^31 - 1 = {INDEX_LIMIT})"
    if cfg.n > INDEX_LIMIT:
        raise ConfigError(f"n={cfg.n} tokens are {index}; lower n.")
    if betas * cfg.members > INDEX_LIMIT:
        raise ConfigError(
            f"{betas} beta{'s' if betas > 1 else ''} x {cfg.members} members make "
            f"{betas * cfg.members} solves, {index}; lower members."
        )
    if steps is not None:
        if steps > INDEX_LIMIT:
            raise ConfigError(f"(t1 - t0)/dt = {steps} steps are {counter}; raise dt or shorten [t0, t1].")
    elif cfg.max_steps > INDEX_LIMIT:
        raise ConfigError(f"max_steps={cfg.max_steps} is {counter}; lower it.")
    block = resolve_block(cfg.n, cfg.attention_block)
    if block is not None:
        check_tiles(cfg.n, block)


def _per_save_bytes(cfg: Config) -> int:
    itemsize = 4 if cfg.dtype == "float32" else 8
    n, d = cfg.n, cfg.d
    rows = attention_rows(n, cfg.attention_block)
    sources = cfg.cross.m if cfg.cross.enabled else 0
    sizes = Sizes(n=n, heads=cfg.heads, itemsize=itemsize, rows=None if rows is None else len(rows), sources=sources)
    total = 1 + sum(METRICS[m].size(sizes) for m in recorded_metrics(cfg) if m in METRICS)
    total += sum(part.saved_bytes(cfg, itemsize) for part in PARTS.values() if part.enabled(cfg))
    return total + (n * d * itemsize if cfg.save_states else 0)


def _user_metric_bytes(cfg: Config) -> int:
    """Bytes of one saved value of the researcher's metrics the config names, from the
    shapes they return (checked against the dimensions they declare)."""
    dtype = checking_dtype(cfg)
    tokens = jax.ShapeDtypeStruct((cfg.n, cfg.d), dtype)
    total = 0
    for metric in user_metrics(cfg):
        context = MetricContext(
            t=jnp.zeros((), dtype), beta=jnp.ones((), dtype), eps=jnp.ones((), dtype), field=None, config=cfg
        )
        call = (lambda x, m=metric, c=context: m.function(x, c)) if metric.takes_context else metric.function
        try:
            shape = jax.eval_shape(call, tokens)
        except Exception:  # it reads the field, which is built later: sized when the run is planned
            total += dtype.itemsize
            continue
        if not hasattr(shape, "shape") or len(shape.shape) != len(metric.dims):
            raise ConfigError(
                f"metric {metric.name} returns {getattr(shape, 'shape', type(shape).__name__)} on one "
                f"member's tokens, but declares the dimensions {metric.dims}; give dims= one name per "
                "axis of what it returns."
            )
        total += int(np.prod(shape.shape)) * jnp.dtype(cfg.dtype.value).itemsize
    return total


def _output_count(cfg: Config, steps: int | None) -> int:
    """How many output times a run records, counted without forming them (an absurd
    `saves` is refused, not allocated); log-spaced grid steps are counted before the
    rounded times that coincide are merged (at most this many)."""
    if cfg.adaptive or cfg.exact_times or cfg.saves == 1:
        return cfg.saves
    assert steps is not None  # a fixed-step run: counted by the caller
    if cfg.save_spacing == "log":
        return min(cfg.saves, steps + 1)
    every = math.ceil(steps / (cfg.saves - 1))  # `save_steps`: every `every` steps, and the last
    return -(-steps // every) + 1


class _Values:
    """The numeric values of a config, read by dotted path: the traced `data` where
    given (see `ConfiguredSystem`), else the config's own value."""

    def __init__(
        self, cfg: Config, data: Mapping[str, ArrayLike] | None = None, fixed: Mapping[str, Any] | None = None
    ):
        self.cfg = cfg
        self.data = data or {}
        self.fixed = fixed or {}

    def __call__(self, path: str) -> Any:
        if path in self.fixed:
            return self.fixed[path]
        return self.data[path] if path in self.data else _get(self.cfg, path)


def _noise_schedule(get: _Values, dtype) -> AbstractSchedule | None:
    r"""The factor $s(t)$ of the noise strength, $\sigma(t) = \sigma\, s(t)$ (None: constant)."""
    spec = get.cfg.noise
    if not spec.factors and spec.poly is None:
        return None
    return factored("noise", spec, get, Constant(jnp.ones((), dtype)), dtype)


def _fixed(cfg: Config) -> dict[str, Any]:
    """What the parts decide from the whole config (its betas and data) that the compiled
    program depends on (`Part.fixed`)."""
    return {k: v for part in PARTS.values() if part.enabled(cfg) for k, v in part.fixed(cfg).items()}


def build_field(
    cfg: Config,
    key: PRNGKeyArray,
    beta: ScalarLike,
    dtype,
    data: Mapping[str, ArrayLike] | None = None,
    noise: BrownianNoise | None = None,
    member_key: PRNGKeyArray | None = None,
    fixed: Mapping[str, Any] | None = None,
) -> VectorField:
    """The vector field of a validated config; random weights are drawn from `key`.
    `data` may give (traced) values for the config's numeric entries, by dotted path;
    `noise` is the member's Brownian noise, when the config has some; `member_key` the
    member's own key, for what a part draws per member (the source tokens of
    cross-attention; default `key`); `fixed` the settings the parts fixed from the whole
    config (`Part.fixed`; by default from `cfg`)."""
    get = _Values(cfg, data, _fixed(cfg) if fixed is None else fixed)
    time_change = collisions = None
    if cfg.time_change.speed == "log_beta":
        time_change = ConstantSpeed(jnp.log(jnp.asarray(beta, dtype)))
    elif cfg.time_change.speed is not None:
        time_change = ConstantSpeed(jnp.asarray(get("time_change.speed"), dtype))
    if cfg.time_change.collisions is not None:
        collisions = Collisions(jnp.asarray(get("time_change.collisions"), dtype))
    member = _Member(cfg, get, dtype, key if member_key is None else member_key)
    terms = [
        part.build(cfg, get, key, beta, dtype, _numerics, **({"member": member} if part.takes_member else {}))
        for part in PARTS.values()
        if part.enabled(cfg)
    ]
    terms += build_terms(cfg, get, key, beta, dtype)
    return _field_of(cfg, get, dtype, tuple(terms), time_change=time_change, collisions=collisions, noise=noise)


def _field_of(cfg: Config, get: _Values, dtype, terms: tuple, **options) -> VectorField:
    """The field of `terms` on the study's scheme: its token norm (pre, peri), geometry and
    tangent projection (the sphere scheme projects the field for every solver but
    euler_renorm, the unprojected scheme)."""
    d = cfg.d
    norm = None
    if cfg.scheme in ("pre", "peri"):
        tn = cfg.token_norm
        per_dim = lambda path: (
            None if _get(cfg, path) is None else jnp.broadcast_to(jnp.asarray(get(path), dtype), (d,))
        )
        norm = TokenNorm(tn.kind.value, per_dim("token_norm.gamma"), per_dim("token_norm.shift"), eps=float(tn.eps))
    geometry = Sphere() if cfg.scheme == "sphere" else Euclidean()
    return VectorField(
        terms,
        scheme=cfg.scheme.value,  # pyright: ignore[reportAttributeAccessIssue]  (a Scheme choice; the comparisons above narrow it to str literals)
        norm=norm,
        out_norm=norm,
        geometry=geometry,
        tangent=SOLVERS[cfg.solver.value].projected,
        **options,
    )


class _Member:
    """What a part that draws and evolves something of its own per member is handed
    (`Part.takes_member`): the member's own `key`, and `flow(terms, y0, t1)`, the state
    at `t1` of the deterministic flow of `terms` from `y0` at time 0 on the study's
    scheme, with its solver and its dt (or its adaptive control)."""

    def __init__(self, cfg: Config, get: _Values, dtype, key):
        self.cfg, self.get, self.dtype, self.key = cfg, get, dtype, key

    def flow(self, terms: tuple, y0, t1: float):
        cfg = self.cfg
        field = _field_of(cfg, self.get, self.dtype, tuple(terms))
        solution = simulate(
            field,
            y0,
            t0=0.0,
            t1=t1,
            dt=cfg.dt,
            solver=cfg.solver.value,
            adaptive=cfg.adaptive,
            rtol=cfg.rtol,
            atol=cfg.atol,
            max_steps=cfg.max_steps,
        )
        return solution.xs[-1]


def build_init(cfg: Config, dtype, data: Mapping[str, ArrayLike] | None = None) -> AbstractInitialCondition:
    """The initial-condition law of a validated config (`data` as for `build_field`)."""
    get = _Values(cfg, data)
    return cfg.init.build(lambda name: get(f"init.{name}"), dtype, _numerics)


# Config values that are data (traced): a new value reuses the compiled program. The
# rest (sizes, choices, counts) is structure, static and part of what is compiled.
_DATA_PATHS = (
    "cluster_eps",
    "token_norm.gamma",
    "token_norm.shift",
    "time_change.speed",
    "time_change.collisions",
    "noise.sigma",
    "noise.switch_times",
    "noise.factors",
    "noise.poly",
)


def _get(cfg: Any, path: str) -> Any:
    for part in path.split("."):
        cfg = cfg.get(part) if isinstance(cfg, Mapping) else getattr(cfg, part, None)
    return cfg


def _data(cfg: Config) -> dict[str, np.ndarray]:
    """The numeric values of a config that enter the field as arrays. A weight scale of
    exactly 1 stays structure: the identity is then applied without a product."""
    values = {}
    parts = [path for part in PARTS.values() for path in part.data]
    for path in (*_DATA_PATHS, *parts, *(f"init.{name}" for name in type(cfg.init).data)):
        value = _get(cfg, path)
        if isinstance(value, str):  # a choice (time_change.speed=log_beta) is structure
            continue
        if value is None or (path.endswith(".scale") and path.split(".")[-3:-2] == ["weights"] and value == 1):
            continue
        if path == "noise.sigma" and value == 0:  # no noise is structure: the deterministic program
            continue
        values[path] = np.asarray(value, dtype=np.float64)
    values.update(term_data(cfg))
    return values


class _Structure:
    """The structure of a config as a static, hashable value: configs that differ only
    in their data share it, and so share the compiled program. It keeps one such config
    to build from, whose numeric values are never read: the builders read the traced
    values of `ConfiguredSystem.values` instead (`_Values`)."""

    def __init__(self, cfg: Config, data: dict[str, np.ndarray], fixed: dict[str, Any] | None = None):
        self.cfg = cfg
        self.fixed = fixed or {}
        container = to_container(cfg)
        for path, value in data.items():
            node = container
            *parents, last = path.split(".")
            for part in parents:
                node = node[part]
            node[last] = ("data", value.shape)
        # The source of the researcher's own code the config names is structure too: an
        # edited term or metric is another program.
        container["code_digest"] = code_digest(cfg)
        # What the parts fixed from the whole config (`Part.fixed`: the degree of harmonic
        # summation, from the largest beta and the weights) is compiled in too.
        container["fixed"] = repr(sorted(self.fixed.items()))
        self._key = repr(sorted(container.items(), key=lambda item: item[0]))

    def __hash__(self):
        return hash(self._key)

    def __eq__(self, other):
        return isinstance(other, _Structure) and self._key == other._key

    def __repr__(self):
        return f"_Structure({self._key})"


class ConfiguredSystem(eqx.Module):
    """One ensemble member of a config: `system(key, beta) -> (field, y0, recorder)`.

    The config's structure is static (it decides what is compiled); its numeric
    values, the seed (from which the weights shared by the ensemble are drawn), and
    beta are data.
    """

    structure: _Structure = eqx.field(static=True)
    values: dict[str, ArrayLike]
    seed: UInt32[ArrayLike, ""]

    @property
    def config(self) -> Config:
        """The structure's config (its numeric values are those of `values`)."""
        return self.structure.cfg

    def __call__(self, key: PRNGKeyArray, beta: ScalarLike):
        cfg = self.config
        dtype = jnp.dtype(cfg.dtype.value)
        k_init, k_weights = jax.random.split(key)
        if cfg.weights.shared:
            k_weights = jax.random.fold_in(jax.random.key(self.seed), 1)
        if cfg.weights.per_beta:
            # A draw of its own for every value of beta (equal in float32: one draw), with
            # the same initial tokens: the members are then independent per (member, beta)
            # in their weights, as in the code of "A mathematical perspective on Transformers".
            bits = jax.lax.bitcast_convert_type(jnp.asarray(beta, jnp.float32), jnp.uint32)
            k_weights = jax.random.fold_in(k_weights, bits)
        noise = None
        if cfg.noise.sigma != 0:
            # The member's own Brownian path (the same at every beta), from a key apart from
            # those of its tokens and weights.
            noise = brownian_noise(
                jax.random.fold_in(key, 2),
                _Values(cfg, self.values, self.structure.fixed)("noise.sigma"),
                (cfg.n, cfg.d),
                t0=cfg.t0,
                t1=cfg.t1,
                kind=cfg.noise.kind.value,
                depth=tree_depth(cfg.t0, cfg.t1, cfg.dt, cfg.noise.depth),  # pyright: ignore[reportArgumentType]  (a noisy run is fixed-step: it has a dt)
                dtype=dtype,
                schedule=_noise_schedule(_Values(cfg, self.values, self.structure.fixed), dtype),
                path=cfg.noise.path.value,
                step=(cfg.t1 - cfg.t0) / step_count(cfg.t0, cfg.t1, cfg.dt),  # pyright: ignore[reportArgumentType]  (as above)
            )
        # The member's own key for what a part draws per member (cross-attention's source),
        # apart from those of its tokens, weights and noise.
        field = build_field(
            cfg,
            k_weights,
            beta,
            dtype,
            self.values,
            noise=noise,
            member_key=jax.random.fold_in(key, 3),
            fixed=self.structure.fixed,
        )
        y0 = build_init(cfg, dtype, self.values)(k_init, cfg.n, cfg.d, dtype)
        custom = user_metrics(cfg)
        recorder = Recorder(
            beta=jnp.asarray(beta, dtype),
            eps=jnp.asarray(_Values(cfg, self.values, self.structure.fixed)("cluster_eps"), dtype),
            metrics=recorded_metrics(cfg),
            save_states=bool(cfg.save_states),
            rank_rtol=cfg.rank_rtol,
            block=_metric_block(cfg),
            custom=custom,
            config=cfg if any(metric.takes_context for metric in custom) else None,
            **{
                k: v
                for part in PARTS.values()
                if part.enabled(cfg)
                for k, v in part.recorder_options(cfg, self.structure.fixed).items()
            },
        )
        return field, y0, recorder


def recorded_metrics(cfg: Config) -> tuple[str, ...]:
    """The metrics a run records: the config's, and those its parts check the run
    against (`Part.recorded_metrics`: the column error of Sinkhorn attention, kept in the
    results only when the config asks for it)."""
    metrics = tuple(str(m) for m in cfg.metrics if str(m) in METRICS)
    for part in PARTS.values():
        if part.enabled(cfg):
            metrics += tuple(m for m in part.recorded_metrics(cfg) if m not in metrics)
    return metrics


def _metric_block(cfg: Config) -> int | None:
    """The tiles the metrics form the attention maps in: `attention_block`, unless a part
    forms its maps whole (`Part.metric_block`)."""
    block = cfg.attention_block
    for part in PARTS.values():
        if part.enabled(cfg):
            block = part.metric_block(cfg, block)
    return block


def build_system(cfg: Config | Mapping) -> ConfiguredSystem:
    """The member builder of a config (beta, the seed and the ensemble size are left
    out: they are data or do not change what is compiled). A mapping, as `run` takes
    one, is composed and checked first (`validate_config`); a `Config` is taken as
    validated."""
    if not isinstance(cfg, Config):
        if not isinstance(cfg, Mapping):
            raise ConfigError(
                f"build_system takes a config: a mapping of keys to values, or a Config from "
                f"validate_config, got {type(cfg).__name__}."
            )
        cfg = validate_config(cfg)
    static = dataclasses.replace(cfg, beta=0.0, seed=0, members=1)
    data = _data(static)
    fixed = _fixed(cfg)
    dtype = jnp.dtype(cfg.dtype.value)
    values: dict[str, ArrayLike] = {path: np.asarray(value, dtype) for path, value in data.items()}
    return ConfiguredSystem(_Structure(static, data, fixed), values, np.asarray(cfg.seed, np.uint32))
