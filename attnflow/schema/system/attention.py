r"""Self-attention as a term of the field (`attention=true`):
$$\mathrm{SA}(t, X)_i = \sum_h O_h \sum_j \mathrm{softmax}_j(\beta \langle Q_h x_i, K_h x_j\rangle)\, V_h x_j,$$
or unnormalized (`attention_kind=usa`, $1/n$), doubly stochastic (`sinkhorn`) or its
$\beta \to \infty$ limit (`hardmax`); causal, with ALiBi, over `heads` heads whose
matrices Q, K, V, O are weight schedules (`weights.*`: the identity, a given matrix,
random laws redrawn or not, V tied to $\pm Q^\top K$, piecewise factors and a polynomial
in time). The keys it owns: `attention_kind`, `causal`, `alibi`, `heads`, `heads_combine`,
`d_k`, `d_v`, `weights`, `sinkhorn`, `hardmax`, `summation`, `summation_tol` (`_summation`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from .._checks import as_floats, number
from .._errors import ConfigError
from .._methods import SOLVERS
from .._metric_registry import names_reading, reading, user_metrics
from .._words import polynomial_text, sequence_text
from ..weights import KINDS, SETTINGS, Matrix
from . import _summation
from ._part import Part

# The largest count an int32 loop counter reaches (`attnflow.numerics._tiled._INDEX_LIMIT`).
_INDEX_LIMIT = 2**31 - 1


class Attention(Part):
    name: ClassVar[str] = "attention"
    switch: ClassVar[str | None] = "attention"
    data: ClassVar[tuple[str, ...]] = (
        "alibi",
        *(f"weights.{m}.{k}" for m in "qkvo" for k in ("scale", "value", "sign", "switch_times", "factors", "poly")),
    )

    @classmethod
    def enabled(cls, cfg):
        return bool(cfg.attention)

    @classmethod
    def check(cls, cfg, betas):
        if not cfg.attention and reading("attention", cfg.metrics):
            raise ConfigError("the attention metrics need attention=true.")
        if cfg.alibi is not None:
            slopes = cfg.alibi if isinstance(cfg.alibi, list) else [cfg.alibi] * cfg.heads
            if len(slopes) != cfg.heads:
                raise ConfigError(f"alibi needs one slope or one per head ({cfg.heads}), got {len(slopes)}.")
            for s in slopes:
                number("an alibi slope", s, minimum=0)
        _check_normalisation(cfg, betas)
        if cfg.attention:
            check_weights(cfg)
        _summation.check(cfg)

    @classmethod
    def as_floats(cls, cfg):
        weights = cfg.weights
        for m in "qkvo":
            spec = getattr(weights, m)
            weights = dataclasses.replace(weights, **{m: dataclasses.replace(spec, value=as_floats(spec.value))})
        return dataclasses.replace(cfg, alibi=as_floats(cfg.alibi), weights=weights)

    @classmethod
    def remedies(cls, cfg):
        return [] if cfg.attention_kind == "hardmax" else ["a smaller beta"]

    @classmethod
    def recorded_metrics(cls, cfg):
        # Every Sinkhorn run is held to its sinkhorn.tol by the column error.
        return ("marginal_error",) if cfg.attention_kind == "sinkhorn" else ()

    @classmethod
    def attributes(cls, cfg):
        return _summation.attributes(cfg)

    @classmethod
    def fixed(cls, cfg):
        return {"summation": _summation.summation(cfg)}

    @classmethod
    def recorder_options(cls, cfg, fixed):
        chosen = fixed["summation"]
        if chosen.method == "direct":
            return {}
        return {"on_circle": cfg.d == 2, "energy_degree": chosen.energy_degree}

    @classmethod
    def metric_block(cls, cfg, block):
        # Sinkhorn attention is never tiled, so neither are its metrics.
        return 0 if cfg.attention_kind == "sinkhorn" and block is None else block

    @classmethod
    def unused(cls, cfg):
        rules: list[tuple[str, list]] = []
        if not cfg.attention:
            rules.append(
                (
                    "with attention=false",
                    [
                        ("attention_kind", lambda c: c.attention_kind),
                        ("causal", lambda c: c.causal),
                        ("alibi", lambda c: c.alibi),
                        ("heads", lambda c: c.heads),
                        ("heads_combine", lambda c: c.heads_combine),
                        ("d_k", lambda c: c.d_k),
                        ("d_v", lambda c: c.d_v),
                        *[(f"weights.{m}", lambda c, m=m: getattr(c.weights, m)) for m in "qkvo"],
                    ],
                )
            )
        for kind, keys in (("sinkhorn", ("iterations", "tol")), ("hardmax", ("ties", "self_attention"))):
            if cfg.attention_kind != kind:
                rules.append(
                    (
                        f"with attention_kind={cfg.attention_kind}",
                        [(f"{kind}.{k}", lambda c, kind=kind, k=k: getattr(getattr(c, kind), k)) for k in keys],
                    )
                )
        if cfg.attention:
            rules += unused_weights(cfg)
        if cfg.summation == "direct":
            rules.append(("with summation=direct", [("summation_tol", lambda c: c.summation_tol)]))
        return rules

    @classmethod
    def draws_weights(cls, cfg):
        return bool(cfg.attention) and any(getattr(cfg.weights, m).kind == "random" for m in "qkvo")

    @classmethod
    def schedules(cls, cfg):
        if not cfg.attention:
            return []
        return [(f"weights.{m}", getattr(cfg.weights, m)) for m in "qkvo" if getattr(cfg.weights, m).kind != "none"]

    @classmethod
    def build(cls, cfg, get, key, beta, dtype, lib):
        jnp = lib.jnp
        heads = cfg.heads
        # The first four of the member's five weight streams (the MLP takes the fifth).
        streams = lib.jax.random.split(key, 5)[:4]
        built: dict[str, Any] = {}
        for m, stream in zip("qkvo", streams):
            built[m] = schedule(cfg, m, get, stream, built, dtype, lib)
        v, o = built["v"], built["o"]
        alibi = None if cfg.alibi is None else jnp.broadcast_to(jnp.asarray(get("alibi"), dtype), (heads,))
        # Under the time change, the attention's exact forms that keep it finite at any beta
        # and its clusters still (SelfAttention), where they are exact and the logits whole.
        exact = cfg.time_change.speed is not None and lib.resolve_block(cfg.n, cfg.attention_block) is None
        chosen = get("summation")  # fixed from the whole config (`fixed`), not from this one's beta
        return lib.SelfAttention(
            built["q"],
            built["k"],
            v,
            o,
            jnp.asarray(beta, dtype),
            alibi,
            heads=heads,
            kind=cfg.attention_kind.value,
            causal=bool(cfg.causal),
            block=cfg.attention_block,
            sinkhorn_iterations=int(cfg.sinkhorn.iterations),
            hardmax_ties=float(cfg.hardmax.ties),
            hardmax_self=bool(cfg.hardmax.self_attention),
            unit_rows=_unit_rows(cfg),
            attracting=_attracting(cfg),
            combine=cfg.heads_combine.value,
            scale_free=exact and cfg.attention_kind == "usa" and not cfg.mlp.enabled,
            exclude_coincident=exact
            and cfg.attention_kind in ("sa", "usa")
            and cfg.scheme == "sphere"
            and SOLVERS[cfg.solver.value].projected
            and lib.identity_multiple(v)
            and o is None,
            summation=chosen.method,
            degree=chosen.degree,
        )

    @classmethod
    def describe(cls, stored):
        dynamics = {"sa": "SA (softmax attention)", "usa": "USA (unnormalized attention, 1/n)"}
        if stored.get("attention") is False:
            return ["attention off"]
        parts = [f"Dynamics {dynamics.get(stored.get('attention_kind'), stored.get('attention_kind', '?'))}"]  # pyright: ignore[reportCallIssue, reportArgumentType]  (get of any stored value, None included, is fine)
        heads, d = stored.get("heads", 1), stored.get("d", "?")
        if heads != 1 or stored.get("d_k") is not None or stored.get("d_v") is not None:
            parts.append(f"{heads} heads, $d_k$ = {stored.get('d_k') or d}, $d_v$ = {stored.get('d_v') or d}")
        if stored.get("causal"):
            parts.append("causal mask")
        if stored.get("alibi") is not None:
            parts.append(f"ALiBi slope {sequence_text(stored['alibi'])}")
        return parts

    @classmethod
    def paragraph(cls, stored):
        weights = stored.get("weights")
        if stored.get("attention") is False:
            return None
        if not isinstance(weights, dict):
            return "Weights: not recorded"
        shared, per_beta = bool(weights.get("shared", True)), bool(weights.get("per_beta", False))
        matrices = [
            _matrix(name, weights.get(key, {}), shared, per_beta) for name, key in zip("QKVO", "qkvo") if key in weights
        ]
        return "Weights: " + "; ".join(matrices)

    @classmethod
    def switches(cls, stored):
        return _switches(stored)


@dataclasses.dataclass(frozen=True)
class Heads:
    """The heads of one attention term as its settings say: the group its keys sit in
    (`prefix`: "" for self-attention, "cross." for cross-attention), its weights' node,
    its number of heads and its d_k and d_v (None: d)."""

    prefix: str
    weights: Any
    heads: int
    d_k: int | None
    d_v: int | None


def heads_of(cfg) -> Heads:
    """The self-attention's heads."""
    return Heads("", cfg.weights, cfg.heads, cfg.d_k, cfg.d_v)


def matrices(cfg, heads: Heads | None = None) -> list[tuple[Any, Matrix]]:
    """The settings of Q, K, V and O with the matrices they set: per head (d_k, d),
    (d_k, d), (d_v, d) and (d, d_v)."""
    heads = heads or heads_of(cfg)
    d = cfg.d
    dk, dv = heads.d_k or d, heads.d_v or d
    shapes = {"q": (dk, d), "k": (dk, d), "v": (dv, d), "o": (d, dv)}
    group = f"{heads.prefix}weights"
    return [
        (
            getattr(heads.weights, m),
            Matrix(m, rows=shapes[m][0], cols=shapes[m][1], heads=heads.heads, cfg=cfg, group=group),
        )
        for m in "qkvo"
    ]


def unused_weights(cfg, heads: Heads | None = None) -> list[tuple[str, list]]:
    """The settings of each matrix that its kind does not read (`Part.unused`'s rules):
    `weights.M.KEY` "to weights.M.kind=KIND" (`cross.weights.M.KEY` for cross-attention)."""
    heads = heads or heads_of(cfg)
    group = f"{heads.prefix}weights"

    def node(c, m):  # the settings of matrix m in the config c
        for part in group.split("."):
            c = getattr(c, part)
        return getattr(c, m)

    rules = []
    for m in "qkvo":
        kind = KINDS[getattr(heads.weights, m).kind]
        unused = [k for k in SETTINGS if k not in kind.uses]
        if not kind.in_time:
            unused += ["switch_times", "factors", "poly"]
        getters = [(f"{group}.{m}.{k}", lambda c, m=m, k=k: getattr(node(c, m), k)) for k in unused]
        rules.append((f"to {group}.{m}.kind={kind.kind}", getters))
    return rules


def check_weights(cfg, heads: Heads | None = None) -> None:
    """Each matrix checked by its kind, then its scale, transpose and schedule in time."""
    for spec, matrix in matrices(cfg, heads):
        name = matrix.key
        number(f"{name}.scale", spec.scale)
        number(f"{name}.sign", spec.sign)
        per_piece = KINDS[spec.kind].check(spec, matrix)
        if spec.transpose and matrix.rows != matrix.cols:
            raise ConfigError(f"{name}.transpose needs a square matrix, {name} is {(matrix.rows, matrix.cols)}.")
        times, factors = list(spec.switch_times), list(spec.factors)
        for value in times + factors + list(spec.poly or []):
            number(f"every entry of {name}.switch_times, .factors and .poly", value)
        if (times or factors) and not (per_piece and not factors):
            if len(factors) != len(times) + 1:
                raise ConfigError(
                    f"{name} has {len(times)} switch_times and needs {len(times) + 1} factors, got {len(factors)}."
                )
            if any(b <= a for a, b in zip(times, times[1:])):
                raise ConfigError(f"{name}.switch_times must increase, got {times}.")


def _check_normalisation(cfg, betas: list[float]) -> None:
    """The settings of sinkhorn and hardmax attention, and what they cannot be combined with."""
    if cfg.attention_kind == "sinkhorn":
        number("sinkhorn.iterations", cfg.sinkhorn.iterations, minimum=1)
        number("sinkhorn.tol", cfg.sinkhorn.tol, positive=True)
        if cfg.sinkhorn.iterations > _INDEX_LIMIT:
            raise ConfigError(
                f"sinkhorn.iterations={cfg.sinkhorn.iterations} is more than the int32 loop counter "
                f"of the alternations can count (2^31 - 1 = {_INDEX_LIMIT}); lower it."
            )
        if cfg.causal:
            raise ConfigError(
                "attention_kind=sinkhorn cannot be causal: a lower-triangular doubly stochastic matrix is the identity."
            )
    if cfg.attention_kind == "hardmax":
        number("hardmax.ties", cfg.hardmax.ties, minimum=0)
        if cfg.alibi is not None:
            raise ConfigError("attention_kind=hardmax takes the argmax of <Q x_i, K x_j> alone: alibi does not apply.")
        if not cfg.hardmax.self_attention and cfg.n < 2:
            raise ConfigError("hardmax.self_attention=false needs n >= 2 tokens (a token needs another to attend to).")
        # beta does not enter the argmax: every beta of a list would solve the same
        # flow, which reads as agreeing replicates, unless something reads beta itself.
        reads_beta = reading("beta", cfg.metrics) or any(m.takes_context for m in user_metrics(cfg))
        if len(set(betas)) > 1 and not reads_beta and cfg.time_change.speed != "log_beta":
            raise ConfigError(
                f"attention_kind=hardmax does not read beta, so beta={as_floats(cfg.beta)} would solve one "
                f"flow {len(set(betas))} times over; give one beta, or record a metric that reads "
                f"beta ({names_reading('beta')})."
            )
    if cfg.attention_kind in ("sinkhorn", "hardmax") and cfg.attention_block:
        raise ConfigError(
            f"attention_kind={cfg.attention_kind} normalises the whole n x n logits and is not tiled: set "
            f"attention_block to null or 0, got {cfg.attention_block}."
        )


def schedule(cfg, name: str, get, key, built, dtype, lib, heads: Heads | None = None):
    """The schedule of `weights.NAME` (None: no matrix; `cross.weights.NAME` for the heads of
    cross-attention), built by its kind and modulated in time; its random entries drawn
    from `key`."""
    spec, matrix = {m.name: (spec, m) for spec, m in matrices(cfg, heads)}[name]
    base = KINDS[spec.kind].build(spec, matrix, get, key, dtype, built, lib)
    if base is None:
        return None
    # Times the factors of the matrix's settings, transposed where they say so.
    base = lib.factored(matrix.key, spec, get, base, dtype)
    return lib.Transposed(base) if spec.transpose else base


def _unit_rows(cfg) -> bool:
    """Whether the attention term sees unit tokens: the states on the sphere (retracted
    after every step; a Runge-Kutta stage is off the sphere by O(dt^2)), or normalized by
    the sphere token norm first."""
    return cfg.scheme == "sphere" or (cfg.scheme in ("pre", "peri") and cfg.token_norm.kind == "sphere")


def _attracting(cfg) -> bool:
    """Whether beta times the factors of Q and K is never negative (every beta is positive):
    Q and K the identity times scales and piecewise factors >= 0, without a polynomial in
    time. The term uses the known row maximum of the logits only then (any other Q and K
    are not multiples of the identity and search for it anyway)."""
    nonnegative = lambda *values: all(bool(np.all(np.asarray(v, np.float64) >= 0)) for v in values)
    specs = [getattr(cfg.weights, m) for m in "qk"]
    return all(
        spec.kind == "identity" and spec.poly is None and nonnegative(spec.scale, list(spec.factors)) for spec in specs
    )


def _matrix(name: str, spec: Any, shared: bool, per_beta: bool = False) -> str:
    """One of Q, K, V, O as a caption says it: its kind's words, then its transpose and
    its factors in time."""
    if not isinstance(spec, dict):
        return f"{name} {spec}"
    kind = KINDS.get(spec.get("kind"))  # pyright: ignore[reportArgumentType]  (get of any stored value, None included, is fine)
    if kind is None:
        return f"{name} {spec.get('kind', '?')}"
    drawn = ("shared" if shared else "per member") + (
        " and beta" if per_beta and not shared else ", per beta" if per_beta else ""
    )
    text = kind.describe(name, spec, drawn)
    if not kind.in_time:
        return text
    if spec.get("transpose") and "transpose" in kind.uses:
        text += " transposed"
    if spec.get("switch_times"):
        factors, times = sequence_text(spec.get("factors", [])), sequence_text(spec["switch_times"])
        text += f" × factors {factors} switching at t = {times}"
    if spec.get("poly") is not None:
        text += f" × $f(t)$ = {polynomial_text(spec['poly'])}"
    return text


def _switches(cfg: Mapping[str, Any]) -> dict[float, list[str]]:
    """The times at which a weight matrix switches (its `switch_times`: factors or
    matrices piecewise in time), each with the matrices that switch then (["Q", "K"]).
    Periodic redraws (`redraw_every`) are said in the caption, not marked."""
    weights = cfg.get("weights")
    found: dict[float, list[str]] = {}
    if isinstance(weights, dict):
        for name, key in zip("QKVO", "qkvo"):
            spec = weights.get(key)
            if not isinstance(spec, dict) or spec.get("kind") == "none":
                continue
            for at in np.atleast_1d(spec.get("switch_times") or []).astype(float).tolist():
                if name not in found.setdefault(at, []):
                    found[at].append(name)
    return found
