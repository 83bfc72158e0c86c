r"""The value matrix tied to the attention matrix, $V = s\,Q^\top K$ per head (`sign` s
times `scale`): `weights.v.kind=tied`, the symmetric case of the gradient-flow theorems."""

from __future__ import annotations

from .._errors import ConfigError
from .._words import number_text
from ._kind import WeightKind


class Tied(WeightKind):
    kind = "tied"
    uses = ("sign", "scale", "transpose")

    @classmethod
    def check(cls, spec, matrix):
        if matrix.name != "v":
            raise ConfigError(f"only weights.v can be tied (to +-Q^T K), not {matrix.key}.")
        if matrix.rows != matrix.cols:
            raise ConfigError("V tied to +-Q^T K needs d_v = d.")
        return False

    @classmethod
    def build(cls, spec, matrix, get, key, dtype, built, lib):
        q, k, jnp = built["q"], built["k"], lib.jnp
        sign = jnp.asarray(get(f"{matrix.key}.sign"), dtype) * jnp.asarray(get(f"{matrix.key}.scale"), dtype)
        tied = lib.QtK(q, k, sign)
        if isinstance(q, lib.Constant) and isinstance(k, lib.Constant):
            tied = lib.Constant(tied(0.0))  # fixed Q and K: Q^T K formed once, not at every step
        return tied

    @classmethod
    def describe(cls, label, stored, drawn):
        scale = stored.get("scale", 1)
        factor = "" if scale == 1 else f"{number_text(scale)} "
        return f"{label} = {'-' if stored.get('sign', 1) < 0 else ''}{factor}" r"$Q^\top K$"
