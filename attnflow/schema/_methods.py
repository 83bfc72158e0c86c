"""The time-stepping methods `solver=NAME` names, one line each: the schema's choices,
the check of adaptive stepping and the steppers (`_solvers.py`, `_adaptive.py`) read
this table. Nothing here imports JAX."""

from __future__ import annotations

from typing import NamedTuple


class Method(NamedTuple):
    """What attnflow asks of a time-stepping method: whether the sphere's field is
    projected onto the tangent space for it (`euler_renorm` steps the unprojected field
    and retracts), its order, the diffrax class whose tableau it takes (None: written
    here), and whether it estimates its error (and so can adapt its step)."""

    projected: bool
    order: int
    diffrax: str | None
    adaptive: bool


# The methods `solver=NAME` names, one line each (the schema's choices come from here;
# nothing here imports JAX).
SOLVERS: dict[str, Method] = {
    "euler": Method(True, 1, None, adaptive=False),
    "euler_renorm": Method(False, 1, None, adaptive=False),
    "heun": Method(True, 2, "Heun", adaptive=True),
    "midpoint": Method(True, 2, "Midpoint", adaptive=True),
    "ralston": Method(True, 2, "Ralston", adaptive=True),
    "bosh3": Method(True, 3, "Bosh3", adaptive=True),
    "rk4": Method(True, 4, None, adaptive=True),
    "tsit5": Method(True, 5, "Tsit5", adaptive=True),
    "dopri5": Method(True, 5, "Dopri5", adaptive=True),
    "dopri8": Method(True, 8, "Dopri8", adaptive=True),
}
ADAPTIVE = tuple(name for name, method in SOLVERS.items() if method.adaptive)
