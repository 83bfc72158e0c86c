"""What an initial condition of a config is (`InitialCondition`): its line in the help
(`title`), its typed settings (the dataclass's fields with their meanings, whose
defaults are in `conf/init/KIND.yaml`), their check, its description, and the law it
builds. Nothing here imports JAX: the schema and the help read these classes; `build`
imports the law it assembles."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from omegaconf import MISSING

from .._checks import as_floats


@dataclass
class InitialCondition:
    """An initial condition named by `init=KIND` (`kind`); its other fields are its
    settings, `init.FIELD` on the command line.

    A subclass is one file of `attnflow/schema/initial/` with one line in `KINDS`; it says
    what tokens it draws (`title`, the line of `attnflow --help`), what each setting
    means (`setting(MISSING, "meaning")`: the default is in conf/init/KIND.yaml), which of
    its settings are numbers the run traces (`data`: a new value reuses the compiled
    program), checks them against the run (`check`), and builds the law that draws the
    tokens (`build`).
    """

    kind: str = MISSING
    title: ClassVar[str] = ""
    data: ClassVar[tuple[str, ...]] = ()

    def check(self, cfg: Any) -> None:
        """Refuse, in one sentence naming `init.KEY`, settings no run of `cfg` (its `n`,
        `d`, `dtype`, scheme and metrics) can start from."""

    def build(self, get: Callable[[str], Any], dtype: Any, lib: Any) -> Any:
        """The law (`attnflow.AbstractInitialCondition`) of these settings; `get(name)`
        reads setting `name`, traced where it is one of `data`; `lib` holds JAX and the
        numerics (`attnflow.numerics._numerics`: `lib.jnp`, `lib.SphericalCaps`). Every kind defines it (the
        registry `KINDS` refuses one that does not)."""

    @classmethod
    def describe(cls, settings: Mapping[str, Any]) -> str:
        """The initial condition of stored `settings` (the `init` of a results file's
        config) in words, for captions: the kind and its settings, an array named, not
        printed."""
        parts = []
        for key, value in settings.items():
            if key == "kind" or value is None:
                continue
            if isinstance(value, (list, tuple)):
                parts.append(f"{key} given")
            else:
                shown = f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else value
                parts.append(f"{key} = {shown}")
        kind = settings.get("kind", "?")
        return f"{kind} ({', '.join(parts)})" if parts else str(kind)

    def as_floats(self) -> InitialCondition:
        """The settings that are data as floats (`[1, 2]` and `[1.0, 2.0]` are one config)."""
        return dataclasses.replace(self, **{name: as_floats(getattr(self, name)) for name in self.data})
