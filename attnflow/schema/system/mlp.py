r"""The MLP of a transformer block as a term of the field (`mlp.enabled=true`):
$\mathrm{MLP}(x)_i = W_2\,\sigma(W_1 x_i + b_1) + b_2$ token by token, or the gated
$W_2\,(g(W_1 x_i + b_1) \odot W_3 x_i) + b_2$ with $g = \mathrm{silu}$ (`activation=swiglu`)
or $g = \mathrm{gelu}_{\tanh}$ (`activation=geglu`, T5 v1.1's), with Gaussian weights of
scale `mlp.scale` and `mlp.hidden` units (null: 4d)."""

from __future__ import annotations

from typing import ClassVar

from .._checks import number
from .._words import number_text
from ._part import Part

GATED = ("swiglu", "geglu")  # the activations with a gate matrix W3 (attnflow.numerics._terms.MLP)


class MLP(Part):
    name: ClassVar[str] = "mlp"
    switch: ClassVar[str | None] = "mlp.enabled"
    data: ClassVar[tuple[str, ...]] = ("mlp.scale",)

    @classmethod
    def enabled(cls, cfg):
        return bool(cfg.mlp.enabled)

    @classmethod
    def check(cls, cfg, betas):
        if cfg.mlp.enabled and cfg.mlp.hidden is not None:
            number("mlp.hidden", cfg.mlp.hidden, minimum=1)

    @classmethod
    def unused(cls, cfg):
        if cfg.mlp.enabled:
            return []
        return [
            (
                "with mlp.enabled=false",
                [(f"mlp.{k}", lambda c, k=k: getattr(c.mlp, k)) for k in ("hidden", "activation", "scale", "bias")],
            )
        ]

    @classmethod
    def draws_weights(cls, cfg):
        return bool(cfg.mlp.enabled)

    @classmethod
    def build(cls, cfg, get, key, beta, dtype, lib):
        jax, draw_matrix, Constant = lib.jax, lib.draw_matrix, lib.Constant
        mlp, d = cfg.mlp, cfg.d
        hidden = mlp.hidden or 4 * d
        # The fifth of the member's five weight streams (attention takes the first four).
        k1, k2, k3, k4, k5 = jax.random.split(jax.random.split(key, 5)[4], 5)
        scale = get("mlp.scale")
        const = lambda k, shape: Constant(draw_matrix("gaussian", k, shape, scale, dtype))
        return lib.MLP(
            w1=const(k1, (hidden, d)),
            w2=const(k2, (d, hidden)),
            b1=const(k3, (hidden,)) if mlp.bias else None,
            b2=const(k4, (d,)) if mlp.bias else None,
            gate=const(k5, (hidden, d)) if mlp.activation in GATED else None,
            activation=mlp.activation.value,  # pyright: ignore[reportAttributeAccessIssue]  (an Activation choice; the `in GATED` above narrows it to str literals)
        )

    @classmethod
    def describe(cls, stored):
        mlp, d = stored.get("mlp"), stored.get("d", "?")
        if not (isinstance(mlp, dict) and mlp.get("enabled")):
            return []
        hidden = mlp.get("hidden") or f"4d = {4 * d if isinstance(d, int) else '?'}"
        return [f"MLP ({mlp.get('activation', '?')}, hidden {hidden}, scale {number_text(mlp.get('scale'))})"]
