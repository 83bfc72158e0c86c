"""The vector field: how attention, MLP and normalization combine."""

from __future__ import annotations

import dataclasses
from typing import Literal

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, ScalarLike

from ._errors import ConfigError
from ._geometry import AbstractGeometry, Euclidean, Sphere
from ._terms import AbstractInteraction, SelfAttention, TokenNorm

SCHEMES = ("none", "sphere", "pre", "peri")


class VectorField(eqx.Module):
    """$\\dot X = \\mathcal{F}(t, X)$ built from interaction terms $F = \\sum_k F_k$.

    - `none`: $\\dot x_i = F(t, X)_i$ in $\\mathbb{R}^d$;
    - `sphere`: $\\dot x_i = P_{x_i} F(t, X)_i$ on $S^{d-1}$ (the post-LN limit). With
      `tangent=False` the projection is left out and only the solver's retraction
      keeps the state on the sphere (the `euler_renorm` scheme of public phase-diagram
      code);
    - `pre`: $\\dot x_i = F(t, N(X))_i$ (the pre-LN residual stream);
    - `peri`: $\\dot x_i = N_{out}(F(t, N(X))_i)$.

    Called as `field(t, x, args)` so that it is a diffrax vector field. `piece_time`,
    when set, is the time at which piecewise weight schedules choose their piece (the
    fixed-step loop pins it to each step's midpoint, see `pinned`); by default they
    choose it at the evaluation time `t`.
    """

    terms: tuple[AbstractInteraction, ...]
    scheme: Literal["none", "sphere", "pre", "peri"] = eqx.field(static=True, default="sphere")
    norm: TokenNorm | None = None
    out_norm: TokenNorm | None = None
    tangent: bool = eqx.field(static=True, default=True)
    piece_time: Float[Array, ""] | None = None

    def __check_init__(self):
        if self.scheme not in SCHEMES:
            raise ConfigError(f"unknown normalization scheme {self.scheme!r}; choose one of {', '.join(SCHEMES)}.")
        if self.scheme in ("pre", "peri") and self.norm is None:
            raise ConfigError(f"the {self.scheme!r} scheme needs a token normalization `norm`.")
        if self.scheme == "peri" and self.out_norm is None:
            raise ConfigError("the 'peri' scheme needs an output normalization `out_norm`.")
        if not self.terms:
            raise ConfigError("the vector field has no terms: switch on attention, the MLP or both.")

    @property
    def geometry(self) -> AbstractGeometry:
        """Where the state lives: the sphere for `sphere`, flat space otherwise."""
        return Sphere() if self.scheme == "sphere" else Euclidean()

    def pinned(self, at: ScalarLike) -> "VectorField":
        """The same field with its schedules' pieces chosen at time `at`."""
        return dataclasses.replace(self, piece_time=jnp.asarray(at))

    def raw(self, t: ScalarLike, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        """$F(t, \\cdot)$ evaluated at the (normalized, for pre/peri) tokens, unprojected."""
        h = self.norm(x) if self.scheme in ("pre", "peri") else x
        at = self.piece_time
        return sum((term(t, h, at) for term in self.terms[1:]), self.terms[0](t, h, at))

    def __call__(self, t: ScalarLike, x: Float[Array, "n d"], args=None) -> Float[Array, "n d"]:
        f = self.raw(t, x)
        if self.scheme == "sphere" and self.tangent:
            f = self.geometry.project(x, f)
        elif self.scheme == "peri":
            f = self.out_norm(f)
        return f

    def attention_weights(self, t: ScalarLike, x: Float[Array, "n d"]) -> Float[Array, "heads n n"]:
        """The attention matrices of the first attention term, at the tokens it sees."""
        h = self.norm(x) if self.scheme in ("pre", "peri") else x
        for term in self.terms:
            if isinstance(term, SelfAttention):
                return term.weights(t, h, self.piece_time)
        raise ConfigError("attention metrics need an attention term in the vector field.")

