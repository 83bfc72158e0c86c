r"""Cross-attention: the pull of a second population of tokens, the source, on the tokens
that flow (the target), as the decoder of an encoder-decoder transformer attends to the
encoder's output.

$$\mathrm{Cross}(t, Y; X)_i = c_H \sum_h O_h \sum_{j=1}^m a^h_{ij}\, V_h x_j,\qquad
a^h_{ij} = \frac{\exp(\beta_c \langle Q_h y_i, K_h x_j\rangle)}{Z^h_i},$$

with $Z^h_i = \sum_j \exp(\dots)$ for softmax attention (`"sa"`) and $Z^h_i = m$ for the
unnormalized kind (`"usa"`). The source tokens $x_1, \dots, x_m$ are held fixed while the
target flows (the decoder sees the encoder's final output at every layer): they are data
of the term, one array per ensemble member.
"""

from __future__ import annotations

from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, ScalarLike

from ..schema._errors import ConfigError
from ._schedules import AbstractSchedule, identity_multiple
from ._terms import COMBINES, AbstractInteraction, _add, _apply, _contract, _mix, check_outputs, combine_heads

# The kinds of cross-attention: softmax over the source tokens, or unnormalized (1/m).
CROSS_KINDS = ("sa", "usa")


class CrossAttention(AbstractInteraction):
    r"""Multi-head attention of the target tokens `y` (the term's input) to the fixed
    source tokens `source` `(m, d)`; see the module's equation.

    Schedules return per-head stacks as for `SelfAttention`: `query` `(heads, d_k, d)`,
    `key` `(heads, d_k, d)`, `value` `(heads, d_v, d)`, `output` `(heads, d, d_v)` or
    None for the identity; trained models add the biases `query_bias`, `key_bias`
    `(heads, d_k)`, `value_bias` `(heads, d_v)` and `output_bias` `(d,)`. The logits
    $n \times m$ per head are formed whole. The heads are summed (`combine="sum"`) or
    averaged (`"mean"`).
    """

    source: Float[Array, "m d"]
    query: AbstractSchedule
    key: AbstractSchedule
    value: AbstractSchedule
    output: AbstractSchedule | None
    beta: Float[Array, ""]
    heads: int = eqx.field(static=True)
    kind: str = eqx.field(static=True, default="sa")
    query_bias: AbstractSchedule | None = None
    key_bias: AbstractSchedule | None = None
    value_bias: AbstractSchedule | None = None
    output_bias: AbstractSchedule | None = None
    combine: Literal["sum", "mean"] = eqx.field(static=True, default="sum")

    def __check_init__(self):
        if self.kind not in CROSS_KINDS:
            raise ConfigError(
                f"cross-attention kind must be 'sa' (softmax) or 'usa' (unnormalized, 1/m), got {self.kind!r}."
            )
        if self.combine not in COMBINES:
            raise ConfigError(f"heads are combined by 'sum' or 'mean', got {self.combine!r}.")
        if self.source.ndim != 2:
            raise ConfigError(f"the source tokens must have shape (m, d), got {self.source.shape}.")
        for name in ("query", "key", "value"):
            shape = getattr(self, name).shape
            if len(shape) != 3 or shape[0] != self.heads:
                raise ConfigError(f"the {name} schedule must return shape (heads={self.heads}, rows, d), got {shape}.")
        (_, dk, d), (_, dk2, d2), (_, dv, d3) = self.query.shape, self.key.shape, self.value.shape
        if dk != dk2 or d2 != d3:
            raise ConfigError(
                f"query {self.query.shape} and key {self.key.shape} must share (heads, d_k) and key and "
                f"value {self.value.shape} must read the source's dimension."
            )
        if self.source.shape[1] != d2:
            raise ConfigError(
                f"the key and value schedules read source tokens of dimension {d2}, got {self.source.shape[1]}."
            )
        check_outputs(self, dk, dv, d)

    def working_bytes(self, n: int, itemsize: int) -> tuple[int, int]:
        """Queries, keys and values that are not the tokens themselves, the mixed values
        and the output; the $n \\times m$ logits and their exponentials (per head, one
        array for all heads with identity Q and K)."""
        m = self.source.shape[0]
        heads, dk, dv, d = self.heads, self.query.shape[1], self.value.shape[1], self.query.shape[2]
        identity = [identity_multiple(w) for w in (self.query, self.key, self.value)]
        rows = heads * (n * dk * (1 - identity[0]) + m * (dk * (1 - identity[1]) + dv * (1 - identity[2])))
        shared = identity[0] and identity[1]
        pairs = 2 * itemsize * n * m * (1 if shared else heads)
        return itemsize * (rows + heads * n * dv + n * d), pairs

    def logits(self, t: ScalarLike, y: Float[Array, "n d"], at: ScalarLike | None = None) -> Array:
        """$\\beta_c \\langle Q_h y_i, K_h x_j\\rangle$: `(heads, n, m)`, or `(n, m)` when
        every head has the same logits."""
        q = _add(_apply(self.query, t, y, at), self.query_bias, t, at)
        k = _add(_apply(self.key, t, self.source, at), self.key_bias, t, at)
        return self.beta * _contract(q, k)

    def source_weights(
        self, t: ScalarLike, y: Float[Array, "n d"], at: ScalarLike | None = None
    ) -> Float[Array, "heads n m"]:
        """The cross-attention matrices $a^h_{ij}$ of every head, target token i to source
        token j."""
        scores = self.logits(t, y, at)
        a = jax.nn.softmax(scores, axis=-1) if self.kind == "sa" else jnp.exp(scores) / self.source.shape[0]
        return jnp.broadcast_to(a, (self.heads,) + a.shape[-2:])

    def __call__(self, t, y, at=None):
        scores = self.logits(t, y, at)
        values = _add(_apply(self.value, t, self.source, at), self.value_bias, t, at)
        if self.kind == "sa":
            # The row maximum subtracted keeps exp() finite for any beta; normalized after
            # the mixing (n d divisions instead of n m).
            top = jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True))
            e = jnp.exp(scores - top)
            mixed = _mix(e, values)
            mixed = mixed / jax.lax.broadcast_to_rank(jnp.sum(e, axis=-1, keepdims=True), mixed.ndim)
        else:
            mixed = _mix(jnp.exp(scores), values) / self.source.shape[0]
        return combine_heads(self, t, at, mixed)
