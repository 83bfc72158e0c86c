"""The random attention matrices of the panels of `phase_diagram_random` ("A mathematical
perspective on Transformers", fig. 5, with the laws and scales of that paper's own code;
`attnflow.experiments.phase_diagram_random` says what each is), which `many_heads` draws
for each of its heads: the bilinear form of the logits B = Q^T K drawn directly (Q = I,
K = B) and V drawn from its own law or tied to B."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

_IDENTITY = {"kind": "identity"}
_PRODUCT = {"kind": "random", "law": "product"}
_GOE = {"kind": "random", "law": "goe"}
_WISHART = {"kind": "random", "law": "wishart"}


def _tied(sign: float, form: str):
    """V = sign B / sqrt(d) (sqrt(d + 1) for the GOE), transposed: the row-vector V of the
    paper's code as it acts on column vectors."""
    extra = 1 if form == "goe" else 0
    return lambda d: {"kind": "tied", "sign": sign, "scale": 1.0 / math.sqrt(d + extra), "transpose": True}


# label -> (its title, {weight: spec, or a function of d giving it})
PANELS: dict[str, tuple[str, dict[str, dict[str, Any] | Callable[[int], dict[str, Any]]]]] = {
    "product_wishart": (
        r"$Q^\top K = G_1G_2/\sqrt{d}$, $V = GG^\top/\sqrt{d}$",
        {"q": _IDENTITY, "k": _PRODUCT, "v": _WISHART},
    ),
    "goe_wishart": (r"$Q^\top K$ GOE, $V = GG^\top/\sqrt{d}$", {"q": _IDENTITY, "k": _GOE, "v": _WISHART}),
    "v_plus_qtk": (
        r"$Q^\top K = G_1G_2/\sqrt{d}$, $V = +Q^\top K/\sqrt{d}$",
        {"q": _IDENTITY, "k": _PRODUCT, "v": _tied(1.0, "product")},
    ),
    "v_minus_qtk": (
        r"$Q^\top K = G_1G_2/\sqrt{d}$, $V = -Q^\top K/\sqrt{d}$",
        {"q": _IDENTITY, "k": _PRODUCT, "v": _tied(-1.0, "product")},
    ),
    "product_identity": (r"$Q^\top K = G_1G_2/\sqrt{d}$, $V = I$", {"q": _IDENTITY, "k": _PRODUCT, "v": _IDENTITY}),
    "product_ginibre": (
        r"$Q^\top K = G_1G_2/\sqrt{d}$, V Ginibre $N(0, 1/d)$",
        {"q": _IDENTITY, "k": _PRODUCT, "v": {"kind": "random", "law": "gaussian"}},
    ),
}
