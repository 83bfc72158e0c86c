"""How a caption says a value of the config: numbers in `g` format, lists in brackets.
Nothing here imports JAX."""

from __future__ import annotations

from typing import Any


def number_text(value: Any) -> str:
    """A number as a caption shows it (`g` format); anything else as text."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return f"{value:g}"


def sequence_text(values: Any) -> str:
    """A number or a (nested) list of them, as `[a, b]`."""
    values = values if isinstance(values, (list, tuple)) else [values]
    return "[" + ", ".join(number_text(v) for v in values) + "]"


def polynomial_text(coefficients: Any) -> str:
    """The polynomial factor $f(t) = \\sum_k c_k t^k$ of a schedule, as a caption says it."""
    coefficients = coefficients if isinstance(coefficients, (list, tuple)) else [coefficients]
    terms = []
    for k, c in enumerate(coefficients):
        if c == 0:
            continue
        power = "" if k == 0 else (" $t$" if k == 1 else f" $t^{{{k}}}$")
        terms.append(f"{number_text(c)}{power}")
    return " + ".join(terms).replace("+ -", "- ") or "0"
