"""The errors attnflow raises for people: one sentence, what was wrong, what is allowed."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any


def did_you_mean(name: object, names: Iterable[object], prefix: str = "") -> str:
    """ " (did you mean PREFIXNAME?)" for the known name nearest to a misspelt `name`, or
    "" when none is near: the one suggestion of every refusal of an unknown name."""
    near = difflib.get_close_matches(str(name), [str(n) for n in names], n=1)
    return f" (did you mean {prefix}{near[0]}?)" if near else ""


class ConfigError(ValueError):
    """An impossible or unknown configuration value, caught before any work starts."""


class NonFiniteStateError(FloatingPointError):
    """A state became NaN or infinite during a run."""

    # Set on the error by a study that raises it (`solve_study`, `attnflow.run`): the
    # statistics so far (`_store.Results`, not imported: every module imports this one)
    # and their xarray Dataset.
    results: Any
    dataset: Any


class SolverFailure(RuntimeError):
    """The ODE solver stopped before `t1` (step budget exhausted or step size collapsed)."""

    # Set on the error by a study that raises it (`solve_study`, `attnflow.run`): the
    # statistics so far (`_store.Results`, not imported: every module imports this one)
    # and their xarray Dataset.
    results: Any
    dataset: Any


class CheckpointError(ConfigError):
    """A checkpoint that cannot be read: missing, truncated, inconsistent, of an unknown
    architecture, or pickle-based and not trusted. One sentence: which file and why."""


class StorageError(OSError):
    """A file of a run could not be written (a full disk, a quota, a folder made
    read-only or removed while the run worked). One sentence: which file and why."""


class RunNote(UserWarning):
    """What a run should know that is not an error: a setting that had no effect (a
    switch time outside the run's interval, a Sinkhorn tolerance its iterations missed),
    or a compilation cache it could not keep. A Python warning from the API; one line,
    `attnflow: note: ...`, on the command line."""
