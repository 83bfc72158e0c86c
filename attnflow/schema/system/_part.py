"""What a built-in term of the vector field is to the rest of attnflow (`Part`): the
config keys it owns, their check, the keys it leaves unused, its description in a
caption, the traced numbers among its settings, and the term it builds. Nothing here
imports JAX: the captions of `attnflow plot` read these classes; `build` imports the
term it assembles."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar


class Part:
    """A term of the field that the study's own keys switch on and set (attention, the
    MLP); a researcher's term is a class of `terms` instead (docs/extending.md).

    A part is one file of `attnflow/schema/system/` with one line in `PARTS`. Its methods are
    class methods of the config (`cfg`, a checked `Config`) or, for captions, of the
    config a results file stores (`stored`, plain mappings).
    """

    name: ClassVar[str]
    # The boolean key that switches it on ("attention", "mlp.enabled"), named when no
    # term is on; None for a part switched otherwise.
    switch: ClassVar[str | None] = None
    # The config paths of its settings that are data (traced: a new value reuses the
    # compiled program), read when given (`None` and a choice are structure).
    data: ClassVar[tuple[str, ...]] = ()
    # Whether `build` also takes `member=`: the member's own key (`member.key`, apart from
    # the weights' key, which the ensemble may share) and the flow of the study's scheme,
    # solver and dt (`member.flow(terms, y0, t1)`, the state at t1 from y0 at 0): what a part
    # draws and evolves per member (the source tokens of cross-attention).
    takes_member: ClassVar[bool] = False

    @classmethod
    def enabled(cls, cfg: Any) -> bool:
        """Whether the config switches the part on. Every part defines it (the registry
        `PARTS` refuses one that does not)."""
        return False

    @classmethod
    def check(cls, cfg: Any, betas: list[float]) -> None:
        """Refuse, in one sentence naming the key, settings the part cannot run with."""

    @classmethod
    def unused(cls, cfg: Any) -> list[tuple[str, list[tuple[str, Callable[[Any], Any]]]]]:
        """The part's keys that `cfg` does not use, each group with the reason: `(reason,
        [(key, getter), ...])`, the reason "with SETTING" or "to SETTING"; a value given
        there (differing from the default) is refused: "KEY does not apply REASON"."""
        return []

    @classmethod
    def draws_weights(cls, cfg: Any) -> bool:
        """Whether the part draws random weights (then `weights.shared` and
        `weights.per_beta` apply)."""
        return False

    @classmethod
    def schedules(cls, cfg: Any) -> list[tuple[str, Any]]:
        """Its settings that switch in time, `(path, node)` with `node.switch_times`."""
        return []

    @classmethod
    def as_floats(cls, cfg: Any) -> Any:
        """`cfg` with the part's number-or-list settings as floats (`[1, 2]` and
        `[1.0, 2.0]` are one config)."""
        return cfg

    @classmethod
    def remedies(cls, cfg: Any) -> list[str]:
        """What a run whose state turned NaN or infinite may change in the part ("a
        smaller beta"), said only where the config would accept it."""
        return []

    @classmethod
    def recorded_metrics(cls, cfg: Any) -> tuple[str, ...]:
        """Metrics every run with the part records, to check itself against (kept in the
        results only when the config asks for them)."""
        return ()

    @classmethod
    def saved_bytes(cls, cfg: Any, itemsize: int) -> int:
        """Bytes the part adds to one saved time of one member (the source's tokens)."""
        return 0

    @classmethod
    def attributes(cls, cfg: Any) -> dict[str, Any]:
        """Attributes the part adds to the results file (how it computed what it did)."""
        return {}

    @classmethod
    def fixed(cls, cfg: Any) -> dict[str, Any]:
        """Settings the part decides from the whole config before the run that the
        compiled program depends on though they follow from data (beta, the weights): the
        degree of harmonic summation. `build` and `recorder_options` read them from `fixed`
        (`get(NAME)` in `build`), never from a config, whose beta and data may be another
        study's that shares the program."""
        return {}

    @classmethod
    def recorder_options(cls, cfg: Any, fixed: Mapping[str, Any]) -> dict[str, Any]:
        """Settings the part gives the metrics' `Recorder` (how they may be computed), from
        the config's structure and what the parts fixed (`fixed`)."""
        return {}

    @classmethod
    def metric_block(cls, cfg: Any, block: int | None) -> int | None:
        """The tiles the metrics may form attention maps in (`attention_block`), for a
        part whose maps are formed whole."""
        return block

    @classmethod
    def build(cls, cfg: Any, get: Callable[[str], Any], key: Any, beta: Any, dtype: Any, lib: Any) -> Any:
        """The term (`attnflow.AbstractInteraction`) of one member: `get(path)` reads a
        setting (traced where it is data), `key` is the member's key for its weights, `lib`
        holds JAX and the numerics it assembles (`attnflow.numerics._numerics`: `lib.jax`,
        `lib.SelfAttention`). Every
        part defines it (the registry `PARTS` refuses one that does not)."""

    @classmethod
    def describe(cls, stored: Mapping[str, Any]) -> list[str]:
        """Phrases of the caption's sentence on the system, from a stored config."""
        return []

    @classmethod
    def paragraph(cls, stored: Mapping[str, Any]) -> str | None:
        """A paragraph of its own in the caption (the weights), or None."""
        return None

    @classmethod
    def switches(cls, stored: Mapping[str, Any]) -> dict[float, list[str]]:
        """The times its settings switch at, each with what switches ("V"), from a stored
        config: marked on the figure's time axis."""
        return {}
