"""What a kind of weight matrix is (`WeightKind`): the settings of `weights.M` it reads,
their check against the matrix's shape, its description in a caption, and the schedule
it builds. Nothing here imports JAX: the schema, the help and the captions read these
classes; `build` imports the schedule it assembles."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

# The settings of weights.M beside `kind` that a kind may read; every kind reads the
# schedule in time (`switch_times`, `factors`, `poly`) unless it says otherwise.
SETTINGS = ("law", "scale", "value", "sign", "redraw_every", "transpose")


@dataclass(frozen=True)
class Matrix:
    """The matrix `weights.M` of the config is set for: `name` ("q"), its per-head shape
    `(rows, cols)`, the number of heads, the config (`cfg`: d, d_v, t0, t1, dtype), and
    the group its settings sit in (`group`: "weights", or "cross.weights" for the
    matrices of cross-attention)."""

    name: str
    rows: int
    cols: int
    heads: int
    cfg: Any
    group: str = "weights"

    @property
    def key(self) -> str:
        return f"{self.group}.{self.name}"


class WeightKind:
    """A kind of weight matrix, `weights.M.kind=KIND`: one file of `attnflow/schema/weights/`
    with one line in `KINDS`."""

    kind: ClassVar[str]
    uses: ClassVar[tuple[str, ...]] = ()  # the settings of SETTINGS it reads
    in_time: ClassVar[bool] = True  # whether it reads switch_times, factors and poly

    @classmethod
    def check(cls, spec: Any, matrix: Matrix) -> bool:
        """Refuse, in one sentence naming `weights.M.KEY`, settings this kind cannot build
        the matrix from; returns whether the value holds one matrix per piece of
        `switch_times` (then its switch times need no factors)."""
        return False

    @classmethod
    def build(
        cls,
        spec: Any,
        matrix: Matrix,
        get: Callable[[str], Any],
        key: Any,
        dtype: Any,
        built: Mapping[str, Any],
        lib: Any,
    ) -> Any:
        """The schedule of the matrix before its factors in time (None: no matrix);
        `get(path)` reads a setting (traced where it is data), `key` draws its random
        entries, `built` holds the schedules of the matrices built before it (q, k), `lib`
        JAX and the numerics (`attnflow.numerics._numerics`: `lib.jnp`, `lib.Constant`). Every
        kind defines it (the registry `KINDS` refuses one that does not)."""

    @classmethod
    def largest_norm(cls, spec: Any, matrix: Matrix) -> float | None:
        """The largest spectral norm of the matrix over its heads and pieces, before its
        factors in time; None where it is not known before the run (random entries)."""
        return None

    @classmethod
    def describe(cls, label: str, stored: Mapping[str, Any], drawn: str) -> str:
        """The matrix `label` ("Q") of stored settings in words; `drawn` says whether
        random weights are shared by the members and drawn per beta."""
        return f"{label} {cls.kind}"
