"""Progress of a long run, drawn outside the compiled code: one bar of finished pieces
with their rate and the time left (rich), on stderr when it is a terminal and silent
otherwise (a log file, a test, a batch job).
"""

from __future__ import annotations

import sys
from contextlib import AbstractContextManager


class Progress(AbstractContextManager):
    """`with Progress("phase diagram", total=pieces) as bar: ... bar.advance()`.

    `show=None` draws the bar when stderr is a terminal.
    """

    def __init__(self, description: str, total: int, *, show: bool | None = None):
        self.description = description
        self.total = max(int(total), 1)
        self.done = 0
        self.show = sys.stderr.isatty() if show is None else show
        self._bar = None
        self._task = None

    def __enter__(self) -> "Progress":
        if self.show:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
            from rich.progress import Progress as Bar

            self._bar = Bar(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("pieces"),
                TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
                console=Console(stderr=True), transient=False, refresh_per_second=4,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task(self.description, total=self.total)
        return self

    def advance(self, steps: int = 1) -> None:
        self.done += steps
        if self._bar is not None:
            self._bar.update(self._task, advance=steps)

    def describe(self, description: str) -> None:
        self.description = description
        if self._bar is not None:
            self._bar.update(self._task, description=description)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
            self._bar = None
