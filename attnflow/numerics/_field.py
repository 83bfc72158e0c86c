"""The vector field: how attention, MLP and normalization combine."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Literal

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, ScalarLike

from ..schema._errors import ConfigError
from ._geometry import AbstractGeometry, Euclidean, Sphere
from ._metrics import _labels
from ._noise import BrownianNoise
from ._terms import AbstractInteraction, TokenNorm

SCHEMES = ("none", "sphere", "pre", "peri")


class ConstantSpeed(eqx.Module):
    """A time change to constant speed: the flow $\\dot X = \\mathcal{F}(X)$ run as

    $$\\frac{dX}{ds} = c\\, \\frac{\\mathcal{F}(X)}{\\|\\mathcal{F}(X)\\|},\\qquad
    \\|\\mathcal{F}\\|^2 = \\sum_i |\\mathcal{F}(X)_i|^2,$$

    and $dX/ds = 0$ where $\\mathcal{F}(X) = 0$. Where $\\mathcal{F} \\ne 0$ the paths are
    those of the flow in real time, reparametrised by the rescaled time
    $s = \\int_0^t \\|\\mathcal{F}(X(u))\\| du / c$: the whole state moves at speed $c$ (the
    Frobenius norm over all tokens of the field as it is stepped, tangent to the sphere
    with the `sphere` scheme's projection). A field of exponentially small size, such as
    the pull between clusters at large beta, is then followed at the speed of any other:
    "Dynamic metastability in the self-attention model" (Geshkovski, Koubbi, Polyanskiy,
    Rigollet) runs its energy staircase at $c = \\log\\beta$. Any positive factor of
    $\\mathcal{F}$ divides out.

    The norm is formed from the field over its largest entry, so that it neither
    overflows nor underflows for fields of any size.
    """

    speed: Float[Array, ""]

    def __call__(self, f: Float[Array, "n d"]) -> Float[Array, "n d"]:
        largest = jnp.max(jnp.abs(f))
        moving = largest != 0  # (a NaN field stays NaN: the run reports it, it does not stop)
        unit = f / jnp.where(moving, largest, 1)
        norm = jnp.sqrt(jnp.sum(unit * unit))
        return jnp.where(moving, self.speed * unit / jnp.where(moving, norm, 1), 0)


class Collisions(eqx.Module):
    """Tokens that meet stick together: after every fixed step, the tokens closer than
    `distance` to one another (the connected components of the graph
    $|x_i - x_j| < r$, the chordal distance, about the angle on the sphere) are moved to
    their mean, put back on the sphere there.

    In the exact flow coincident tokens stay coincident (they see the same field), and
    under a constant-speed time change (`ConstantSpeed`) two tokens that attract collide
    after a finite rescaled time. A fixed step cannot land on that collision: the pair
    passes through itself and dithers at the scale of the step, and the field inside the
    pair, of the size of the step, then outweighs the exponentially small pull between
    clusters that the time change is meant to follow. Merging resolves the collision
    at the scale $r$: a pair that meets symmetrically meets at its mean. Tokens alone in
    their component are left exactly as they are. The graph is formed whole ($n^2$
    distances).
    """

    distance: Float[Array, ""]

    def __call__(self, x: Float[Array, "n d"], geometry: AbstractGeometry) -> Float[Array, "n d"]:
        gap = x[:, None, :] - x[None, :, :]
        labels = _labels(jnp.sum(gap * gap, axis=-1) < self.distance**2)
        counts = jnp.zeros(x.shape[0], x.dtype).at[labels].add(1)[labels]
        mean = jnp.zeros_like(x).at[labels].add(x)[labels] / counts[:, None]
        return jnp.where(counts[:, None] > 1, geometry.retract(mean), x)


class VectorField(eqx.Module):
    """$\\dot X = \\mathcal{F}(t, X)$ built from interaction terms $F = \\sum_k F_k$.

    - `none`: $\\dot x_i = F(t, X)_i$ in $\\mathbb{R}^d$;
    - `sphere`: $\\dot x_i = P_{x_i} F(t, X)_i$ on $S^{d-1}$ (the post-LN limit);
    - `pre`: $\\dot x_i = F(t, N(X))_i$ (the pre-LN residual stream);
    - `peri`: $\\dot x_i = N_{out}(F(t, N(X))_i)$.

    `geometry` is where the state lives: the `Sphere` for `sphere` and flat space
    (`Euclidean`) for the other schemes, which is also its default. `tangent` says
    whether the field is projected onto the geometry's tangent space, $P_{x_i}$ above
    (the identity in flat space): `True` projects; `False` leaves the projection out,
    so that only the retraction after every step keeps the state on the sphere (the
    `euler_renorm` scheme of public phase-diagram code); `None` (the default) takes
    the convention of the solver that steps it, projected for every solver but
    `euler_renorm` (see `attnflow.numerics._simulate.step_map`). Called directly, a field with
    `tangent=None` is projected.

    `time_change`, when set, runs the flow at constant speed in a rescaled time (see
    `ConstantSpeed`): the field returned is $c\\,\\mathcal{F}/\\|\\mathcal{F}\\|$ of the
    field above. `collisions`, when set, merges the tokens that meet after every
    fixed step (see `Collisions`; adaptive runs refuse it). `noise`, when set, makes the
    fixed steps those of the SDE $dX = \\mathcal{F}\\,dt + \\sigma\\,dW$ (see `BrownianNoise`);
    with noise the field may have no terms ($\\mathcal{F} = 0$).

    Called as `field(t, x, args)` so that it is a diffrax vector field. `piece_time`,
    when set, is the time at which piecewise weight schedules choose their piece (the
    fixed-step loop pins it to each step's midpoint, see `pinned`); by default they
    choose it at the evaluation time `t`.
    """

    terms: tuple[AbstractInteraction, ...]
    scheme: Literal["none", "sphere", "pre", "peri"] = eqx.field(static=True, default="sphere")
    norm: TokenNorm | None = None
    out_norm: TokenNorm | None = None
    tangent: bool | None = eqx.field(static=True, default=None)
    piece_time: Float[Array, ""] | None = None
    time_change: ConstantSpeed | None = None
    collisions: Collisions | None = None
    geometry: AbstractGeometry = None  # pyright: ignore[reportAssignmentType]  (the scheme's, see __post_init__)
    noise: BrownianNoise | None = None

    def __post_init__(self):
        if self.geometry is None:
            self.geometry = Sphere() if self.scheme == "sphere" else Euclidean()

    def __check_init__(self):
        if self.scheme not in SCHEMES:
            raise ConfigError(f"unknown normalization scheme {self.scheme!r}; choose one of {', '.join(SCHEMES)}.")
        if self.scheme in ("pre", "peri") and self.norm is None:
            raise ConfigError(f"the {self.scheme!r} scheme needs a token normalization `norm`.")
        if self.scheme == "peri" and self.out_norm is None:
            raise ConfigError("the 'peri' scheme needs an output normalization `out_norm`.")
        expected = Sphere if self.scheme == "sphere" else Euclidean
        if not isinstance(self.geometry, expected):
            raise ConfigError(
                f"the {self.scheme!r} scheme lives on the geometry {expected.__name__}(), "
                f"got {type(self.geometry).__name__}."
            )
        if self.tangent not in (True, False, None):
            raise ConfigError(
                f"tangent must be True (project the field), False (leave the projection out) or None "
                f"(the solver's convention), got {self.tangent!r}."
            )
        if not self.terms and self.noise is None:
            raise ConfigError("the vector field has no terms: switch on attention, the MLP or both.")
        if self.noise is not None and self.time_change is not None:
            raise ConfigError(
                "noise is added in real time; a constant-speed time change has no real time to add "
                "it in: leave out the noise or the time change."
            )
        projected_sphere = self.scheme == "sphere" and self.tangent is not False
        if any(getattr(term, "exclude_coincident", False) for term in self.terms) and not projected_sphere:
            raise ConfigError(
                "attention that leaves out coincident tokens needs the tangent-projected sphere field "
                "(scheme 'sphere' with tangent=True, or None and a solver other than euler_renorm)."
            )
        if any(getattr(term, "scale_free", False) for term in self.terms) and (
            self.time_change is None or len(self.terms) > 1
        ):
            raise ConfigError(
                "scale-free unnormalized attention (logits shifted by their maximum) is exact only as "
                "the one term of a field with a constant-speed time change."
            )

    def pinned(self, at: ScalarLike) -> VectorField:
        """The same field with its schedules' pieces chosen at time `at`."""
        return dataclasses.replace(self, piece_time=jnp.asarray(at))

    def raw(self, t: ScalarLike, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        """$F(t, \\cdot)$ evaluated at the (normalized, for pre/peri) tokens, unprojected."""
        h = self.norm(x) if self.scheme in ("pre", "peri") else x  # pyright: ignore[reportOptionalCall]  (__check_init__: pre/peri have a norm)
        at = self.piece_time
        if not self.terms:  # noise alone: F = 0
            return jnp.zeros_like(x)
        values = [term(t, h, at) if takes_piece_time(term) else term(t, h) for term in self.terms]
        return sum(values[1:], values[0])

    def __call__(self, t: ScalarLike, x: Float[Array, "n d"], args=None) -> Float[Array, "n d"]:
        f = self.raw(t, x)
        if self.scheme == "peri":
            f = self.out_norm(f)  # pyright: ignore[reportOptionalCall]  (__check_init__: peri has an out_norm)
        elif self.tangent is not False:
            f = self.geometry.project(x, f)
        return f if self.time_change is None else self.time_change(f)

    def attention_weights(self, t: ScalarLike, x: Float[Array, "n d"]) -> Float[Array, "heads n n"]:
        """The attention matrices of the first attention term, at the tokens it sees."""
        h = self.norm(x) if self.scheme in ("pre", "peri") else x  # pyright: ignore[reportOptionalCall]  (__check_init__: pre/peri have a norm)
        for term in self.terms:
            if hasattr(term, "weights"):  # a term with attention matrices
                return term.weights(t, h, self.piece_time)  # pyright: ignore[reportAttributeAccessIssue]  (hasattr above)
        raise ConfigError("attention metrics need an attention term in the vector field.")


@functools.cache
def _takes_piece_time(kind: type) -> bool:
    parameters = list(inspect.signature(kind.__call__).parameters.values())[1:]  # after self
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 3 or any(p.kind == p.VAR_POSITIONAL for p in parameters)


def takes_piece_time(term: AbstractInteraction) -> bool:
    """Whether `term(t, x, at)` takes the piece-selection time `at` (a term whose
    `__call__` is `(t, x)` is called without it)."""
    return _takes_piece_time(type(term))
