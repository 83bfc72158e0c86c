"""Progress of a long run, drawn outside the compiled code: one line per task with its
bar, the count done of its total (pieces, members, steps, frames, or time covered),
its rate, the time spent and the time left (rich), on stderr when it is a terminal and
silent otherwise (a log file, a test, a batch job).

rich is imported lazily (start-up): only when a bar is drawn, so a run that draws none
(output to a file, a test) never loads it.
"""

from __future__ import annotations

import sys
from contextlib import AbstractContextManager
from typing import ClassVar


def _columns():
    """The columns of a line: description, bar, done/total and unit, rate, elapsed, left."""
    from rich.progress import BarColumn, ProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
    from rich.text import Text

    class Count(ProgressColumn):
        """`done/total unit`; time covered (a float total) with three significant digits."""

        def render(self, task) -> Text:
            unit = task.fields.get("unit", "")
            if task.fields.get("covered"):
                return Text(f"{unit} {task.completed:.3g}/{task.total:.3g}")
            return Text(f"{int(task.completed)}/{int(task.total)} {unit}")

    class Rate(ProgressColumn):
        """Units per second (per minute when slower than one a second)."""

        def render(self, task) -> Text:
            speed = task.finished_speed or task.speed
            unit = task.fields.get("unit", "")
            if not speed:
                return Text(f"- {unit}/s")
            if speed < 1:
                return Text(f"{speed * 60:.3g} {unit}/min")
            return Text(f"{speed:.3g} {unit}/s")

    return (TextColumn("{task.description}"), BarColumn(), Count(), Rate(), TimeElapsedColumn(), TextColumn("left"),
            TimeRemainingColumn())


class Progress(AbstractContextManager):
    """`with Progress("phase diagram", total=pieces) as bar: ... bar.advance()`.

    `unit` names what is counted ("pieces", "members", "steps", "frames"); with
    `covered=True` the total is an amount of time (a float, e.g. t1 - t0) and
    `advance(dt)` adds the time covered. `console` (a rich Console) draws the line
    there instead of on stderr. `show=None` draws it when that is a terminal, or when
    another Progress is drawn: a Progress entered then adds its line under that one
    (rich draws one live display at a time), so that an experiment's analysis shows
    its own count beside the command's count of pieces.
    """

    _drawn: ClassVar[list[Progress]] = []  # the drawn Progress lines of this process, outermost first

    def __init__(self, description: str, total: int | float, *, unit: str = "pieces", covered: bool = False,
                 show: bool | None = None, console=None):
        self.description = description
        self.covered = covered
        self.total = max(float(total), 0.0) if covered else max(int(total), 1)
        self.unit = unit
        self.done = 0.0 if covered else 0
        self.console = console
        self._asked = show
        self.show = self._wanted()
        self._bar = None
        self._task = None
        self._owner = False

    def _wanted(self) -> bool:
        if self._asked is not None:
            return self._asked
        terminal = self.console.is_terminal if self.console is not None else sys.stderr.isatty()
        return bool(Progress._drawn) or terminal

    def __enter__(self) -> Progress:
        self.show = self._wanted()
        if self.show:
            if Progress._drawn:
                self._bar = Progress._drawn[-1]._bar
            else:
                from rich.console import Console
                from rich.progress import Progress as Bar

                console = self.console if self.console is not None else Console(stderr=True)
                self._bar = Bar(*_columns(), console=console, transient=False, refresh_per_second=4)
                self._bar.__enter__()
                self._owner = True
            self._task = self._bar.add_task(self.description, total=self.total, unit=self.unit,
                                            covered=self.covered)
            Progress._drawn.append(self)
        return self

    def advance(self, steps: int | float = 1) -> None:
        """`steps` more units done (or, with `covered`, that much more time covered)."""
        self.done += steps
        if self._bar is not None:
            self._bar.update(self._task, advance=steps)

    def describe(self, description: str) -> None:
        self.description = description
        if self._bar is not None:
            self._bar.update(self._task, description=description)

    def __exit__(self, *exc) -> None:
        if self._bar is None:
            return
        Progress._drawn.remove(self)
        if self._owner:
            self._bar.__exit__(*exc)
        self._bar = None
