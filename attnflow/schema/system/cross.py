r"""Cross-attention to a second population as a term of the field (`cross.enabled=true`):
$$\mathrm{Cross}(t, Y; X)_i = \sum_h O_h \sum_{j=1}^m
\mathrm{softmax}_j(\beta_c \langle Q_h y_i, K_h x_j\rangle)\, V_h x_j,$$
or unnormalized (`cross.attention_kind=usa`, $1/m$). The study's n tokens are the target
Y (a decoder's residual stream); the m source tokens X (an encoder's output) are drawn
per member from `cross.init`, then either held at once or first run through their own
non-causal self-attention flow for the time `cross.source_time` (the study's attention
weights, scheme, solver and dt, at `cross.source_beta`), and are held fixed while the
target flows. The keys it owns: `cross.*`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, ClassVar

from .._checks import as_floats, number
from .._errors import ConfigError
from .._metric_registry import names_reading, reading
from ..initial import INITS
from ._part import Part
from .attention import Attention, Heads, check_weights, schedule, unused_weights

# The stream of the member's weight key the cross-attention's matrices are drawn from
# (self-attention takes the first four of five, the MLP the fifth).
_WEIGHT_STREAM = 7


def _heads(cfg) -> Heads:
    cross = cfg.cross
    return Heads("cross.", cross.weights, cross.heads, cross.d_k, cross.d_v)


class Cross(Part):
    name: ClassVar[str] = "cross"
    switch: ClassVar[str | None] = "cross.enabled"
    takes_member: ClassVar[bool] = True
    data: ClassVar[tuple[str, ...]] = (
        "cross.beta",
        "cross.source_beta",
        *(
            f"cross.weights.{m}.{k}"
            for m in "qkvo"
            for k in ("scale", "value", "sign", "switch_times", "factors", "poly")
        ),
        *sorted({f"cross.init.{name}" for kind in INITS.values() for name in kind.data}),
    )

    @classmethod
    def enabled(cls, cfg):
        return bool(cfg.cross.enabled)

    @classmethod
    def check(cls, cfg, betas):
        cross = cfg.cross
        if not cross.enabled:
            if reading("source", cfg.metrics):
                raise ConfigError(
                    f"the metrics of the target against the source ({names_reading('source')}) need cross.enabled=true."
                )
            return
        for key in ("m", "heads"):
            number(f"cross.{key}", getattr(cross, key), minimum=1)
        for key in ("d_k", "d_v"):
            if getattr(cross, key) is not None:
                number(f"cross.{key}", getattr(cross, key), minimum=1)
        number("cross.source_time", cross.source_time, minimum=0)
        for key in ("beta", "source_beta"):
            if getattr(cross, key) is not None:
                number(f"cross.{key}", getattr(cross, key), positive=True)
        if cross.source_time > 0 and not cfg.adaptive:
            steps = cross.source_time / cfg.dt
            if abs(steps - round(steps)) > 1e-9 * max(1.0, steps):
                raise ConfigError(
                    f"the source's flow takes the study's steps: cross.source_time={cross.source_time:g} must be a "
                    f"whole number of dt={cfg.dt:g}."
                )
        try:
            cross.init.check(dataclasses.replace(cfg, n=cross.m, init=cross.init))
        except ConfigError as error:  # said of the source's keys
            said = re.sub(r"\bn\b", "cross.m", re.sub(r"(?<![\w.])init\.", "cross.init.", str(error)))
            raise ConfigError(said) from None
        check_weights(cfg, _heads(cfg))

    @classmethod
    def as_floats(cls, cfg):
        cross = cfg.cross
        weights = cross.weights
        for m in "qkvo":
            spec = getattr(weights, m)
            weights = dataclasses.replace(weights, **{m: dataclasses.replace(spec, value=as_floats(spec.value))})
        cross = dataclasses.replace(cross, weights=weights, init=cross.init.as_floats())
        return dataclasses.replace(cfg, cross=cross)

    @classmethod
    def remedies(cls, cfg):
        return ["a smaller cross.beta"] if cfg.cross.attention_kind == "usa" else []

    @classmethod
    def unused(cls, cfg):
        cross = cfg.cross
        keys = ("m", "source_time", "source_beta", "beta", "attention_kind", "heads", "d_k", "d_v", "init")
        if not cross.enabled:
            getters = [(f"cross.{k}", lambda c, k=k: getattr(c.cross, k)) for k in keys]
            getters += [(f"cross.weights.{m}", lambda c, m=m: getattr(c.cross.weights, m)) for m in "qkvo"]
            return [("with cross.enabled=false", getters)]
        rules: list[tuple[str, list]] = []
        if cross.source_time == 0:
            rules.append(
                (
                    "with cross.source_time=0 (the source has no flow of its own)",
                    [("cross.source_beta", lambda c: c.cross.source_beta)],
                )
            )
        rules += unused_weights(cfg, _heads(cfg))
        return rules

    @classmethod
    def draws_weights(cls, cfg):
        return bool(cfg.cross.enabled) and any(getattr(cfg.cross.weights, m).kind == "random" for m in "qkvo")

    @classmethod
    def schedules(cls, cfg):
        if not cfg.cross.enabled:
            return []
        weights = cfg.cross.weights
        return [(f"cross.weights.{m}", getattr(weights, m)) for m in "qkvo" if getattr(weights, m).kind != "none"]

    @classmethod
    def saved_bytes(cls, cfg, itemsize):
        # The source's tokens, with the states (`source_x`), at every saved time.
        return cfg.cross.m * cfg.d * itemsize if cfg.save_states else 0

    @classmethod
    def build(cls, cfg, get, key, beta, dtype, lib, member=None):
        if member is None:
            raise ConfigError("cross-attention draws its source tokens from the member's key: build it with one.")
        jnp, cross = lib.jnp, cfg.cross
        source = cross.init.build(lambda name: get(f"cross.init.{name}"), dtype, lib)(member.key, cross.m, cfg.d, dtype)
        if cross.source_time > 0:
            # The encoder: the study's self-attention, without its mask, at the source's beta.
            encoder = dataclasses.replace(
                cfg, causal=False, alibi=None, time_change=dataclasses.replace(cfg.time_change, speed=None)
            )
            source_beta = beta if cross.source_beta is None else get("cross.source_beta")
            attention = Attention.build(encoder, get, key, source_beta, dtype, lib)
            source = member.flow((attention,), source, cross.source_time)
        streams = lib.jax.random.split(lib.jax.random.fold_in(key, _WEIGHT_STREAM), 4)
        built: dict[str, Any] = {}
        for m, stream in zip("qkvo", streams):
            built[m] = schedule(cfg, m, get, stream, built, dtype, lib, _heads(cfg))
        return lib.CrossAttention(
            source,
            built["q"],
            built["k"],
            built["v"],
            built["o"],
            jnp.asarray(beta if cross.beta is None else get("cross.beta"), dtype),
            heads=cross.heads,
            kind=cross.attention_kind.value,
            combine=cfg.heads_combine.value,
        )

    @classmethod
    def describe(cls, stored):
        cross = stored.get("cross")
        if not isinstance(cross, dict) or not cross.get("enabled"):
            return []
        kind = {"sa": "softmax", "usa": "unnormalized"}.get(cross.get("attention_kind"), "?")  # pyright: ignore[reportCallIssue, reportArgumentType]  (get of any stored value is fine)
        text = f"cross-attention ({kind}) to {cross.get('m', '?')} source tokens"
        if cross.get("beta") is not None:
            text += rf", $\beta_c$ = {cross['beta']:g}"
        if cross.get("source_time"):
            text += f" after their own flow to t = {cross['source_time']:g}"
        return [text]
