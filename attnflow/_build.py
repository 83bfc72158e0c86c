"""From a configuration (a plain nested dict, as Hydra composes it) to attnflow objects.

`validate_config` checks every value once, in Python, before anything is traced; the
`build_*` functions then only assemble modules. Nothing here imports Hydra.
"""

from __future__ import annotations

import copy
import importlib.resources
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import yaml
from jaxtyping import Array, PRNGKeyArray, ScalarLike

from ._errors import ConfigError
from ._field import SCHEMES, VectorField
from ._initial import (
    AbstractInitialCondition,
    GaussianMixture,
    Given,
    Orthonormal,
    SphericalCaps,
    UniformCube,
    UniformSphere,
)
from ._metrics import METRICS, Recorder
from ._random_matrices import LAWS, draw
from ._schedules import AbstractSchedule, Constant, Identity, PiecewiseConstant, PiecewiseSchedule, Scaled
from ._simulate import fixed_steps
from ._solvers import ADAPTIVE, SOLVERS
from ._terms import ACTIVATIONS, MLP, NORMS, SelfAttention, TokenNorm

def config_source() -> tuple[str, Any]:
    """Where the Hydra configs are: `("pkg://attnflow.conf", files)` once installed, or the
    repository's `conf/` folder when attnflow is imported from a source checkout."""
    try:
        return "pkg://attnflow.conf", importlib.resources.files("attnflow.conf")
    except ModuleNotFoundError:
        folder = Path(__file__).resolve().parents[1] / "conf"
        return str(folder), folder


def _packaged_yaml(*parts: str) -> dict:
    return yaml.safe_load(config_source()[1].joinpath(*parts).read_text())


def _load_defaults() -> tuple[dict, dict]:
    # One source of truth: the Hydra configs shipped in attnflow/conf (conf/ in the repo).
    root = _packaged_yaml("config.yaml")
    groups = [entry for entry in root.pop("defaults", []) if isinstance(entry, dict)]
    inits = {}
    for name in INITS:
        spec = _packaged_yaml("init", f"{name}.yaml") or {}
        inits[name] = {k: v for k, v in spec.items() if k != "kind"}
    for entry in groups:
        ((group, option),) = entry.items()
        root[group] = _packaged_yaml(group, f"{option}.yaml")
    return root, inits


INITS = ("uniform", "orthonormal", "caps", "mixture", "cube", "given")
MATRIX_KINDS = ("identity", "matrix", "random", "tied", "none")
DTYPES = ("float32", "float64")
DEFAULTS, _INIT_DEFAULTS = _load_defaults()
_MATRIX_DEFAULTS = dict(DEFAULTS["weights"]["q"])


def _merge(base: Mapping, override: Mapping) -> dict:
    out = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _choice(name: str, value: Any, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"unknown {name} {value!r}; choose one of {', '.join(map(str, allowed))}.")


def _number(name: str, value: Any, *, positive=False, integer=False, minimum=None) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and integer:
        ok = float(value).is_integer()
    if not ok:
        raise ConfigError(f"{name} must be a finite {'integer' if integer else 'number'}, got {value!r}.")
    if positive and value <= 0:
        raise ConfigError(f"{name} must be positive, got {value!r}.")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value!r}.")


def _array_shape(name: str, value: Any) -> tuple[int, ...]:
    """The shape of a user array given as nested lists; ragged or non-numeric input is refused."""
    if value is None:
        return ()
    try:
        array = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a rectangular array of numbers (nested lists of equal length).") from None
    if not np.isfinite(array).all():
        raise ConfigError(f"{name} must hold finite numbers only, got a NaN or an infinity.")
    return array.shape


def _known(name: str, given: Any, allowed) -> None:
    """Refuse keys of a nested group that attnflow does not know (a typo would be ignored)."""
    if not isinstance(given, Mapping):
        raise ConfigError(f"{name} must be a mapping of {', '.join(allowed)}, got {given!r}.")
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise ConfigError(
            f"unknown key(s) {', '.join(f'{name}.{k}' for k in unknown)}; {name} takes {', '.join(allowed)}."
        )


def betas_of(config: Mapping) -> tuple[list[float], bool]:
    """The list of betas and whether the config gave a list (a `beta` dimension)."""
    beta = config["beta"]
    is_list = isinstance(beta, (list, tuple))
    values = list(beta) if is_list else [beta]
    if not values:
        raise ConfigError("beta must be a positive number or a non-empty list of them.")
    for b in values:
        _number("every beta", b, positive=True)
    return [float(b) for b in values], is_list


def validate_config(config: Mapping) -> dict:
    """Fill in defaults and check every value; returns the completed config.

    Raises `ConfigError` with one sentence naming the bad value and what is allowed.
    """
    unknown = sorted(set(config) - set(DEFAULTS) - {"hydra"})
    if unknown:
        raise ConfigError(f"unknown config key(s) {', '.join(unknown)}; known keys are {', '.join(DEFAULTS)}.")
    config = dict(config)
    # The command line says `init=orthonormal` and `metrics=energy`; accept the same here.
    if isinstance(config.get("init"), str):
        config["init"] = {"kind": config["init"]}
    if isinstance(config.get("metrics"), str):
        config["metrics"] = [config["metrics"]]
    for group in ("token_norm", "mlp", "weights"):
        if group in config:
            _known(group, config[group], DEFAULTS[group])
    if "init" in config and not isinstance(config["init"], Mapping):
        raise ConfigError(f"init must be a kind ({', '.join(INITS)}) or a mapping with one, got {config['init']!r}.")
    for name, spec in (config.get("weights") or {}).items():
        if name != "shared" and spec is not None:
            _known(f"weights.{name}", spec, _MATRIX_DEFAULTS)
    cfg = _merge(DEFAULTS, config)
    cfg.pop("hydra", None)
    for key in ("n", "d", "members", "heads", "saves", "max_steps"):
        _number(key, cfg[key], integer=True, minimum=1)
        cfg[key] = int(cfg[key])
    _number("seed", cfg["seed"], integer=True, minimum=0)
    betas_of(cfg)
    _choice("dtype", cfg["dtype"], DTYPES)
    _choice("dynamics", cfg["dynamics"], ("sa", "usa"))
    _choice("norm", cfg["norm"], SCHEMES)
    _choice("solver", cfg["solver"], tuple(SOLVERS))
    _choice("save_spacing", cfg["save_spacing"], ("linear", "log"))
    for key in ("t0", "t1"):
        _number(key, cfg[key])
    if cfg["t1"] <= cfg["t0"]:
        raise ConfigError(f"t1 must be greater than t0, got t0={cfg['t0']} and t1={cfg['t1']}.")
    if cfg["dt"] is None:
        if not cfg["adaptive"]:
            raise ConfigError("dt must be given for fixed-step solvers (or set adaptive=true).")
    else:
        _number("dt", cfg["dt"], positive=True)
    if cfg["adaptive"] and cfg["solver"] not in ADAPTIVE:
        raise ConfigError(f"solver {cfg['solver']!r} has no error estimate; with adaptive=true use one of {', '.join(ADAPTIVE)}.")
    for key in ("rtol", "atol"):
        _number(key, cfg[key], positive=True)
    _number("eps", cfg["eps"], positive=True)
    if cfg["norm"] == "sphere" and cfg["d"] < 2:
        raise ConfigError(f"tokens on the sphere need d >= 2, got d={cfg['d']}.")
    if cfg["save_spacing"] == "log" and cfg["t0"] < 0:
        raise ConfigError("log-spaced output times need t0 >= 0.")
    metrics = list(cfg["metrics"])
    for m in metrics:
        _choice("metric", m, METRICS)
    if not cfg["attention"] and {"attention", "attention_rank"} & set(metrics):
        raise ConfigError("the attention metrics need attention=true.")
    for key in ("d_k", "d_v"):
        if cfg[key] is not None:
            _number(key, cfg[key], integer=True, minimum=1)
    if cfg["rank_rtol"] is not None:
        _number("rank_rtol", cfg["rank_rtol"], positive=True)
    _number("max_output_gib", cfg["max_output_gib"], positive=True)
    if cfg["chunk_size"] is not None:
        _number("chunk_size", cfg["chunk_size"], integer=True, minimum=1)
    if cfg["alibi"] is not None:
        slopes = cfg["alibi"] if isinstance(cfg["alibi"], (list, tuple)) else [cfg["alibi"]] * cfg["heads"]
        if len(slopes) != cfg["heads"]:
            raise ConfigError(f"alibi needs one slope or one per head ({cfg['heads']}), got {len(slopes)}.")
        for s in slopes:
            _number("an alibi slope", s, minimum=0)
    if cfg["norm"] in ("pre", "peri"):
        tn = cfg["token_norm"]
        _choice("token_norm.kind", tn.get("kind"), NORMS)
        _number("token_norm.eps", tn["eps"], minimum=0)
        for key in ("gamma", "shift"):
            if tn[key] is not None:
                if tn["kind"] == "sphere" or (key == "shift" and tn["kind"] != "layer"):
                    raise ConfigError(f"token_norm.{key} does not apply to token_norm.kind={tn['kind']!r}.")
                if _array_shape(f"token_norm.{key}", tn[key]) not in ((), (cfg["d"],)):
                    raise ConfigError(f"token_norm.{key} must be a number or {cfg['d']} numbers (one per dimension).")
    if not cfg["attention"] and not cfg["mlp"]["enabled"]:
        raise ConfigError("attention=false and mlp.enabled=false leave no dynamics; switch one on.")

    init = cfg["init"]
    _choice("init kind", init.get("kind"), INITS)
    _known("init", init, ("kind", *_INIT_DEFAULTS[init["kind"]]))
    cfg["init"] = init = _merge(_INIT_DEFAULTS[init["kind"]], init)
    n, d = cfg["n"], cfg["d"]
    if init["kind"] == "orthonormal" and n > d:
        raise ConfigError(f"the orthonormal initial condition needs n <= d, got n={n} > d={d}.")
    if init["kind"] in ("caps", "mixture"):
        _number(f"init.k", init["k"], integer=True, minimum=1)
        if init["centres"] is not None and _array_shape("init.centres", init["centres"]) != (init["k"], d):
            raise ConfigError(f"init.centres must have shape (k={init['k']}, d={d}), got {np.shape(init['centres'])}.")
    if init["kind"] == "caps":
        _number("init.radius", init["radius"], minimum=0)
    if init["kind"] == "mixture":
        _number("init.sigma", init["sigma"], minimum=0)
        _number("init.spread", init["spread"], minimum=0)
    if init["kind"] == "cube":
        _number("init.low", init["low"])
        _number("init.high", init["high"])
        if init["high"] <= init["low"]:
            raise ConfigError(f"init.low must be below init.high, got low={init['low']} and high={init['high']}.")
    if init["kind"] == "given" and _array_shape("init.value", init["value"]) != (n, d):
        raise ConfigError(f"init.value must have shape (n={n}, d={d}), got {np.shape(init['value'])}.")

    heads = cfg["heads"]
    dk = cfg["d_k"] or d
    dv = cfg["d_v"] or d
    weights = cfg["weights"]
    shapes = {"q": (dk, d), "k": (dk, d), "v": (dv, d), "o": (d, dv)}
    for name in ("q", "k", "v", "o"):
        spec = weights[name] = _merge(_MATRIX_DEFAULTS, weights.get(name) or {"kind": "none"})
        _choice(f"weights.{name}.kind", spec["kind"], MATRIX_KINDS)
        rows, cols = shapes[name]
        if spec["kind"] == "none" and name != "o":
            raise ConfigError(f"weights.{name} cannot be 'none'; use 'identity' for the identity.")
        if spec["kind"] == "identity" and rows != cols:
            raise ConfigError(f"weights.{name} cannot be the identity with shape {(rows, cols)}.")
        if spec["kind"] == "none" and dv != d:
            raise ConfigError(f"weights.o must be given when d_v={dv} differs from d={d}.")
        if spec["kind"] == "tied":
            if name != "v":
                raise ConfigError(f"only weights.v can be tied (to +-Q^T K), not weights.{name}.")
            if dv != d:
                raise ConfigError("V tied to +-Q^T K needs d_v = d.")
        _number(f"weights.{name}.scale", spec["scale"])
        if spec["kind"] == "random":
            _choice(f"weights.{name}.law", spec["law"], LAWS)
            if spec["law"] != "gaussian" and rows != cols:
                raise ConfigError(f"the {spec['law']} law needs square matrices, weights.{name} is {(rows, cols)}.")
        if spec["kind"] == "matrix":
            shape = _array_shape(f"weights.{name}.value", spec["value"])
            if shape not in ((rows, cols), (heads, rows, cols)):
                raise ConfigError(
                    f"weights.{name}.value must have shape {(rows, cols)} or {(heads, rows, cols)}, got {shape}."
                )
        times, factors = list(spec["switch_times"]), list(spec["factors"])
        if times or factors:
            if len(factors) != len(times) + 1:
                raise ConfigError(
                    f"weights.{name} has {len(times)} switch_times and needs {len(times) + 1} factors, got {len(factors)}."
                )
            if any(b <= a for a, b in zip(times, times[1:])):
                raise ConfigError(f"weights.{name}.switch_times must increase, got {times}.")
        if spec["redraw_every"] is not None:
            if spec["kind"] != "random":
                raise ConfigError(f"weights.{name}.redraw_every needs kind=random.")
            _number(f"weights.{name}.redraw_every", spec["redraw_every"], positive=True)
            if (cfg["t1"] - cfg["t0"]) / spec["redraw_every"] > 10_000:
                raise ConfigError(f"weights.{name}.redraw_every is too small: more than 10000 redraws over [t0, t1].")
    mlp = cfg["mlp"]
    if mlp["enabled"]:
        _choice("mlp.activation", mlp["activation"], ACTIVATIONS)
        if mlp["hidden"] is not None:
            _number("mlp.hidden", mlp["hidden"], integer=True, minimum=1)
    itemsize = 4 if cfg["dtype"] == "float32" else 8
    n_beta = len(betas_of(cfg)[0])
    per_save = 8 + (n * d * itemsize if cfg["save_states"] else 0) + (n * 4 if "cluster_sizes" in metrics else 0)
    per_save += heads * n * n * itemsize if "attention" in metrics else 0
    gib = n_beta * cfg["members"] * cfg["saves"] * per_save / 2**30
    if gib > cfg["max_output_gib"]:
        raise ConfigError(
            f"the output would take {gib:.1f} GiB (more than max_output_gib={cfg['max_output_gib']}); "
            "lower members or saves, or drop save_states and the attention metric."
        )
    return cfg


def save_plan(cfg: Mapping) -> tuple[np.ndarray | None, int | None]:
    """How output times are produced: `(None, save_every)` when they fall on the
    fixed-step grid (recorded exactly, by the scan loop), else `(ts, None)` for
    diffrax's dense output."""
    if not cfg["adaptive"] and cfg["save_spacing"] == "linear" and cfg["saves"] >= 2:
        steps = fixed_steps(cfg["t0"], cfg["t1"], cfg["dt"])
        if steps is not None and steps % (cfg["saves"] - 1) == 0:
            return None, steps // (cfg["saves"] - 1)
    return save_times(cfg), None


def save_times(cfg: Mapping) -> np.ndarray:
    """The output times: `saves` points from t0 to t1, equally or log spaced."""
    t0, t1, k = cfg["t0"], cfg["t1"], cfg["saves"]
    if k == 1:
        return np.array([t1])
    if cfg["save_spacing"] == "log":
        first = cfg["dt"] if cfg["dt"] else (t1 - t0) * 1e-3
        return np.concatenate([[t0], t0 + np.geomspace(first, t1 - t0, k - 1)])
    return np.linspace(t0, t1, k)


def _schedule(spec: Mapping, name: str, key: PRNGKeyArray, shape, cfg: Mapping, dtype) -> AbstractSchedule | None:
    heads = shape[0]
    kind = spec["kind"]
    if kind == "none":
        return None
    if kind == "identity":
        base: AbstractSchedule = Identity(heads, shape[-1], jnp.dtype(dtype).name)
    elif kind == "matrix":
        value = jnp.asarray(spec["value"], dtype)
        base = Constant(jnp.broadcast_to(value, shape))
    elif kind == "random" and spec["redraw_every"] is not None:
        period = spec["redraw_every"]
        count = int(math.ceil((cfg["t1"] - cfg["t0"]) / period))
        times = jnp.asarray(cfg["t0"] + period * np.arange(1, count + 1), dtype)
        values = draw(spec["law"], key, (count + 1,) + tuple(shape), spec["scale"], dtype)
        base = PiecewiseConstant(times, values)
    elif kind == "random":
        base = Constant(draw(spec["law"], key, tuple(shape), spec["scale"], dtype))
    else:
        raise AssertionError(kind)  # 'tied' is resolved by the caller
    return _modulate(spec, base, dtype)


def _modulate(spec: Mapping, base: AbstractSchedule, dtype) -> AbstractSchedule:
    if spec["switch_times"]:
        times = jnp.asarray(spec["switch_times"], dtype)
        base = PiecewiseSchedule(
            times, tuple(Scaled(jnp.asarray([f], dtype), base) for f in spec["factors"])
        )
    elif spec["factors"]:
        base = Scaled(jnp.asarray([spec["factors"][0]], dtype), base)
    if spec["poly"] is not None:
        base = Scaled(jnp.asarray(spec["poly"], dtype).reshape(-1), base)
    return base


class _QtK(AbstractSchedule):
    """$V(t) = s\\, Q(t)^T K(t)$ per head, for V tied to the attention matrix."""

    query: AbstractSchedule
    key: AbstractSchedule
    sign: float

    def __call__(self, t):
        q, k = self.query(t), self.key(t)
        return self.sign * jnp.einsum("hkd,hke->hde", q, k)

    @property
    def shape(self):
        return (self.query.shape[0], self.query.shape[-1], self.query.shape[-1])


def build_field(cfg: Mapping, key: PRNGKeyArray, beta, dtype) -> VectorField:
    """The vector field of a validated config; random weights are drawn from `key`."""
    n, d, heads = cfg["n"], cfg["d"], cfg["heads"]
    dk, dv = cfg["d_k"] or d, cfg["d_v"] or d
    w = cfg["weights"]
    kq, kk, kv, ko, km = jax.random.split(key, 5)
    terms = []
    if cfg["attention"]:
        q = _schedule(w["q"], "q", kq, (heads, dk, d), cfg, dtype)
        k = _schedule(w["k"], "k", kk, (heads, dk, d), cfg, dtype)
        if w["v"]["kind"] == "tied":
            v = _modulate(w["v"], _QtK(q, k, float(w["v"]["sign"])), dtype)
        else:
            v = _schedule(w["v"], "v", kv, (heads, dv, d), cfg, dtype)
        o = _schedule(w["o"], "o", ko, (heads, d, dv), cfg, dtype)
        alibi = cfg["alibi"]
        if alibi is not None:
            alibi = jnp.broadcast_to(jnp.asarray(alibi, dtype), (heads,))
        terms.append(
            SelfAttention(q, k, v, o, jnp.asarray(beta, dtype), alibi, heads=heads,
                          kind=cfg["dynamics"], causal=bool(cfg["causal"]))
        )
    mlp = cfg["mlp"]
    if mlp["enabled"]:
        hidden = mlp["hidden"] or 4 * d
        k1, k2, k3, k4, k5 = jax.random.split(km, 5)
        scale = mlp["scale"]
        const = lambda k, shape: Constant(draw("gaussian", k, shape, scale, dtype))
        gated = mlp["activation"] == "swiglu"
        terms.append(
            MLP(
                w1=const(k1, (hidden, d)),
                w2=const(k2, (d, hidden)),
                b1=const(k3, (hidden,)) if mlp["bias"] else None,
                b2=const(k4, (d,)) if mlp["bias"] else None,
                gate=const(k5, (hidden, d)) if gated else None,
                activation=mlp["activation"],
            )
        )
    tn = cfg["token_norm"]
    norm = None
    if cfg["norm"] in ("pre", "peri"):
        per_dim = lambda v: None if v is None else jnp.broadcast_to(jnp.asarray(v, dtype), (d,))
        norm = TokenNorm(tn["kind"], per_dim(tn["gamma"]), per_dim(tn["shift"]), eps=float(tn["eps"]))
    return VectorField(tuple(terms), scheme=cfg["norm"], norm=norm, out_norm=norm)


def build_init(cfg: Mapping, dtype) -> AbstractInitialCondition:
    """The initial-condition law of a validated config."""
    spec = cfg["init"]
    kind = spec["kind"]
    centres = None if spec.get("centres") is None else jnp.asarray(spec["centres"], dtype)
    if kind == "uniform":
        # Off the sphere too, "uniform" means unit vectors with uniform directions.
        return UniformSphere()
    if kind == "orthonormal":
        return Orthonormal()
    if kind == "caps":
        return SphericalCaps(int(spec["k"]), jnp.asarray(spec["radius"], dtype), centres)
    if kind == "mixture":
        return GaussianMixture(int(spec["k"]), jnp.asarray(spec["sigma"], dtype), jnp.asarray(spec["spread"], dtype), centres)
    if kind == "cube":
        return UniformCube(jnp.asarray(spec["low"], dtype), jnp.asarray(spec["high"], dtype))
    return Given(jnp.asarray(spec["value"], dtype))


class ConfiguredSystem(eqx.Module):
    """One ensemble member of a config: `system(key, beta) -> (field, y0, recorder)`.

    The config is static (its structure decides what is compiled); the seed-derived
    key for shared weights is data.
    """

    frozen: tuple = eqx.field(static=True)
    shared_key: PRNGKeyArray

    @property
    def config(self) -> dict:
        return _thaw(self.frozen)

    def __call__(self, key: PRNGKeyArray, beta: ScalarLike):
        cfg = self.config
        dtype = jnp.dtype(cfg["dtype"])
        k_init, k_weights = jax.random.split(key)
        if cfg["weights"]["shared"]:
            k_weights = self.shared_key
        field = build_field(cfg, k_weights, beta, dtype)
        y0 = build_init(cfg, dtype)(k_init, cfg["n"], cfg["d"], dtype)
        recorder = Recorder(
            beta=jnp.asarray(beta, dtype),
            eps=jnp.asarray(cfg["eps"], dtype),
            metrics=tuple(cfg["metrics"]),
            save_states=bool(cfg["save_states"]),
            rank_rtol=cfg["rank_rtol"],
        )
        return field, y0, recorder


def _freeze(value):
    if isinstance(value, Mapping):
        return ("__dict__",) + tuple((k, _freeze(v)) for k, v in sorted(value.items()))
    if isinstance(value, (list, tuple)):
        return ("__list__",) + tuple(_freeze(v) for v in value)
    return value


def _thaw(value):
    if isinstance(value, tuple) and value and value[0] == "__dict__":
        return {k: _thaw(v) for k, v in value[1:]}
    if isinstance(value, tuple) and value and value[0] == "__list__":
        return [_thaw(v) for v in value[1:]]
    return value


def build_system(cfg: Mapping) -> ConfiguredSystem:
    """The member builder of a validated config (beta is left out: it is data)."""
    static = {k: v for k, v in cfg.items() if k not in ("beta", "seed", "members")}
    shared_key = jax.random.fold_in(jax.random.key(cfg["seed"]), 1)
    return ConfiguredSystem(_freeze(static), shared_key)
