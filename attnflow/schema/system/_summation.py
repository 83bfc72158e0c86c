"""How self-attention sums over the keys (`summation`), decided once per study before
the run: `direct` (every pair, whole or in tiles), `harmonic` (the kernel expanded in
harmonics of the key tokens on the circle or the sphere, `attnflow.numerics._harmonic`:
cost n L or n L^2), or `auto` (harmonic where it serves the config and is faster).

The degree L is static, one per study: the smallest whose coefficient tail at the largest
logit radius $r_{\\max} = \\max|\\beta| \\, \\|Q\\| \\, \\|K\\|$ (over the heads, the pieces and
the factors in time of the weights) is at most `summation_tol`
(`attnflow.schema._harmonic_degree`). Nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .._errors import ConfigError
from .._harmonic_degree import DIMS, RADIUS_MARGIN, basis_size, degree, error_bound
from .._metric_registry import subquadratic_metrics
from ..weights import KINDS, Matrix

# `auto` takes harmonic summation from n >= AUTO_RATIO times the number of harmonics on:
# the crossover benchmarks/harmonic.py measured on a 2-core CPU (float32, beta = 4) at
# n = 512 on the circle (25 harmonics) and n = 2048 on the sphere (196), 20 and 10 times.
AUTO_RATIO = 16
# The metrics whose values come from the same expansion (of the energy's kernel, Q = K = I).
_MOMENTS = ("energy", "log_energy")


@dataclasses.dataclass(frozen=True)
class Summation:
    """A study's summation: `method` ("direct" or "harmonic"), the degree of the field's
    expansion and its coefficient tail (`bound`), the degree of the energy metrics'
    expansion (0: none), and why harmonic summation does not serve the config ("" where
    it does; `auto` then sums directly)."""

    method: str
    degree: int = 0
    bound: float = 0.0
    energy_degree: int = 0
    reason: str = ""


def _largest_beta(cfg: Any) -> float:
    return float(np.max(np.abs(np.asarray(cfg.beta, np.float64))))


def _factor_bound(spec: Any, cfg: Any) -> float:
    """The largest |factor in time| of a matrix: its piecewise factors times its polynomial
    in t, whose largest value on [t0, t1] is taken on a fine grid (plus 0.1%)."""
    factors = np.abs(np.asarray(spec.factors, np.float64)).ravel()
    bound = float(factors.max()) if factors.size else 1.0
    if spec.poly is not None:
        t = np.linspace(cfg.t0, cfg.t1, 4097)
        bound *= 1.001 * float(np.max(np.abs(np.polynomial.polynomial.polyval(t, np.asarray(spec.poly, np.float64)))))
    return bound


def _norm(cfg: Any, name: str) -> float | None:
    """The largest norm weights.NAME takes in the run (None: random, known only then)."""
    spec = getattr(cfg.weights, name)
    d_k = cfg.d_k or cfg.d
    norm = KINDS[spec.kind].largest_norm(spec, Matrix(name, d_k, cfg.d, cfg.heads, cfg))
    return None if norm is None else norm * _factor_bound(spec, cfg)


def _why_not(cfg: Any) -> str:
    """What in the config harmonic summation cannot serve ("" where it serves it all)."""
    d = cfg.d
    reasons = (
        (not cfg.attention, "attention=false"),
        (cfg.attention_kind not in ("sa", "usa"), f"attention_kind={cfg.attention_kind}"),
        (cfg.scheme != "sphere", f"tokens off the sphere (scheme={cfg.scheme})"),
        (d not in DIMS, f"d={d}"),
        (bool(cfg.cross.enabled), "cross-attention (cross.enabled=true)"),
        (cfg.time_change.speed is not None, "a time change (time_change.speed)"),
    )
    for bad, what in reasons:
        if bad:
            return what
    if _norm(cfg, "q") is None or _norm(cfg, "k") is None:
        return "random Q or K (their norms, which set the degree, are known only once drawn)"
    dense = [m for m in cfg.metrics if m not in subquadratic_metrics(d)]
    if dense:
        return (
            f"the metric {dense[0]}, which needs every pair (at d={d} the metrics below n^2 are "
            f"{', '.join(subquadratic_metrics(d))})"
        )
    return ""


def pays(asked: str, degree: int, d: int, n: int) -> bool:
    """Whether harmonic summation at `degree` serves n tokens as `summation=asked` asks:
    `auto` from n = AUTO_RATIO times the harmonics on, `harmonic` from n = their number."""
    return basis_size(degree, d) * (AUTO_RATIO if asked == "auto" else 1) <= n


def summation(cfg: Any) -> Summation:
    """The study's summation as `summation` and `summation_tol` ask (unchecked: `check`
    refuses `harmonic` where it cannot serve)."""
    asked = getattr(cfg.summation, "value", cfg.summation)
    if asked == "direct":
        return Summation("direct")
    reason = _why_not(cfg)
    if reason:
        return Summation("direct", reason=reason)
    d, tol, beta = cfg.d, float(cfg.summation_tol), _largest_beta(cfg)
    q, k = _norm(cfg, "q"), _norm(cfg, "k")
    assert q is not None and k is not None  # _why_not said so
    radius = RADIUS_MARGIN * beta * q * k
    field = degree(radius, tol, d)
    if not pays(asked, field, d, cfg.n):
        return Summation(
            "direct",
            reason=f"beta={beta:g} at n={cfg.n}: its degree L={field} ({basis_size(field, d)} harmonics) "
            f"costs {'about' if asked == 'auto' else 'more than'} direct summation",
        )
    energy = degree(RADIUS_MARGIN * beta, tol, d) if any(m in _MOMENTS for m in cfg.metrics) else 0
    return Summation("harmonic", field, error_bound(radius, field, d), energy)


def check(cfg: Any) -> None:
    """Refuse `summation=harmonic` where it cannot serve the config, in one sentence
    naming what can; `auto` falls back to direct summation."""
    tol = cfg.summation_tol
    if not (isinstance(tol, (int, float)) and not isinstance(tol, bool) and 0 < tol < 1):
        raise ConfigError(f"summation_tol must be a number in (0, 1), got {tol!r}.")
    if getattr(cfg.summation, "value", cfg.summation) != "harmonic":
        return
    reason = summation(cfg).reason
    if reason:
        raise ConfigError(
            f"summation=harmonic serves softmax or unnormalized attention (known Q and K) of tokens on the "
            f"circle or the sphere (d=2 or 3) without cross-attention or a time change, with the metrics "
            f"below n^2; not {reason}: use summation=direct or summation=auto."
        )


def attributes(cfg: Any) -> dict[str, Any]:
    """What a results file says of the summation: the method used, and for harmonic
    summation its degree and coefficient tail; for `auto`, why it chose direct summation."""
    chosen = summation(cfg)
    attrs: dict[str, Any] = {"summation": chosen.method}
    if chosen.method == "harmonic":
        attrs.update(summation_degree=chosen.degree, summation_error_bound=chosen.bound)
    elif chosen.reason:
        attrs["summation_note"] = f"summation=auto chose direct summation: {chosen.reason}."
    return attrs
