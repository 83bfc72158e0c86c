"""Progress of a long run, drawn outside the compiled code, on stderr when it is a
terminal and silent otherwise (a log file, a test, a batch job):

- a bar (`Progress`): one line per task with its bar, the count done of its total
  (pieces, members, steps, frames, or time covered), its rate in one unit chosen for
  the bar (`pieces/s` or `s/piece`: never both), the time spent and the time left;
- a status line (`status`): what is being done where nothing is counted (importing
  JAX, compiling, loading a checkpoint, drawing figures), with the time spent; it
  disappears when it ends.

A bar or a status entered while another is drawn adds its line under that one (rich
draws one live display at a time). rich is imported lazily (start-up): only when a
line is drawn, so a run that draws none never loads it.

Off a terminal (a batch job, whose output goes to a file) every count writes, instead
of its bar, a line of text every so often where the command asks for them
(`Progress.lines`): the count, the rate, the time spent and left (`LINE_EVERY_S`,
`LINE_EVERY_FRACTION`, `LINE_AT_LEAST_S`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import ClassVar

# Counts whose units take seconds each: their rate is given as seconds per unit.
_SLOW_UNITS = ("pieces", "runs", "stages", "models", "snapshots")
# Off a terminal, a line of text at most every LINE_EVERY_S seconds and every
# LINE_EVERY_FRACTION of the total, whichever is rarer: at most ten lines however
# fast the run, and none more often than twice a minute however long; but a unit done
# LINE_AT_LEAST_S seconds or more after the last line says so, so that the slow last
# tenth of a run (its largest n) is not half an hour of silence.
LINE_EVERY_S = 30.0
LINE_EVERY_FRACTION = 0.1
LINE_AT_LEAST_S = 300.0
_now = time.monotonic  # the clock of the lines (a test's own)


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 1000 else f"{value:.3g}"


def _count(done: int | float, total: int | float, unit: str, covered: bool) -> str:
    """`done/total unit`; time covered (a float total) with three significant digits."""
    return f"{unit} {done:.3g}/{total:.3g}" if covered else f"{int(done)}/{int(total)} {unit}"


def _rate(speed: int | float | None, rate: str) -> str:
    """The one rate unit of a count: units per second, or seconds per unit (`rate`)."""
    value = "-" if not speed else _number(speed if rate.endswith("/s") else 1 / speed)
    return f"{value} {rate}"


def _clock(seconds: int | float) -> str:
    return str(timedelta(seconds=round(seconds)))


def _columns():
    """The columns of a line: description, bar, done/total and unit, rate, elapsed, left
    (a status line: description, a pulsing bar, elapsed)."""
    from rich.progress import BarColumn, ProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
    from rich.text import Text

    class Count(ProgressColumn):
        """`done/total unit`; time covered (a float total) with three significant digits."""

        def render(self, task) -> Text:
            if task.total is None:
                return Text("")
            return Text(
                _count(task.completed, task.total, task.fields.get("unit", ""), bool(task.fields.get("covered")))
            )

    class Rate(ProgressColumn):
        """The bar's one rate unit: units per second, or seconds per unit (`rate`)."""

        def render(self, task) -> Text:
            if task.total is None:
                return Text("")
            return Text(_rate(task.finished_speed or task.speed, task.fields["rate"]))

    class Left(TimeRemainingColumn):
        """`left H:MM:SS` (nothing on a status line)."""

        def render(self, task) -> Text:
            if task.total is None:
                return Text("")
            return Text("left ") + super().render(task)

    return (TextColumn("{task.description}"), BarColumn(), Count(), Rate(), TimeElapsedColumn(), Left())


class Progress(AbstractContextManager):
    """`with Progress("phase diagram", total=pieces) as bar: ... bar.advance()`.

    `unit` names what is counted ("pieces", "members", "steps", "frames"); with
    `covered=True` the total is an amount of time (a float, e.g. t1 - t0) and
    `advance(dt)` adds the time covered. The rate is given in one unit for the whole
    run: seconds per unit for counts of slow units (pieces, runs, stages, models,
    snapshots), units per second otherwise, or as `rate` says (`"s/piece"`,
    `"pieces/s"`). A total of None is a status line (see `status`). `console` (a rich
    Console) draws the line there instead of on stderr. `show=None` draws it when that
    is a terminal, or when another line is drawn: a line entered then adds itself under
    that one (rich draws one live display at a time), so that an experiment's analysis
    shows its own count beside the command's count of pieces. `Progress.muted = True`
    draws nothing in this process (the jobs of a parallel launcher share a terminal).

    `Progress.lines` (a function taking a line of text; the command sets it while a run
    works) is given each count's description, count, rate, time spent and time left every
    so often when its bar is not drawn and stdout is not a terminal (a batch job's log):
    at most every `LINE_EVERY_S` seconds and every `LINE_EVERY_FRACTION` of the total,
    whichever is rarer. A status line writes none.
    """

    _drawn: ClassVar[list[Progress]] = []  # the drawn lines of this process, outermost first
    muted: ClassVar[bool] = False
    lines: ClassVar[Callable[[str], None] | None] = None

    def __init__(
        self,
        description: str,
        total: int | float | None,
        *,
        unit: str = "pieces",
        covered: bool = False,
        show: bool | None = None,
        console=None,
        rate: str | None = None,
    ):
        self.description = description
        self.covered = covered
        if total is None:
            self.total = None
        else:
            self.total = max(float(total), 0.0) if covered else max(int(total), 1)
        self.unit = unit
        if rate is None:
            rate = f"s/{unit.removesuffix('s')}" if unit in _SLOW_UNITS else f"{unit}/s"
        self.rate = rate
        self.done = 0.0 if covered else 0
        self.console = console
        self._asked = show
        self.show = self._wanted()
        self._bar = None
        self._task = None
        self._owner = False
        self._lines: Callable[[str], None] | None = None  # where this count's lines of text go
        self._start = 0.0  # when the count began (its lines say the time spent)
        self._said: tuple[float, float] = (0.0, 0.0)  # (time, done) of the last line of text
        self._first: tuple[float, float] | None = None  # (time, done) when the first unit was done

    def _wanted(self) -> bool:
        if self._asked is not None:
            return self._asked
        if Progress.muted:
            return False
        terminal = self.console.is_terminal if self.console is not None else sys.stderr.isatty()
        return bool(Progress._drawn) or terminal

    def __enter__(self) -> Progress:
        self.show = self._wanted()
        # Lines of text for a count without a bar, unless stdout is a terminal (shown as it comes).
        self._lines = None if self.show or self.total is None or sys.stdout.isatty() else Progress.lines
        self._start = _now()
        self._said = (self._start, 0.0)
        if self.show:
            if Progress._drawn:
                self._bar = Progress._drawn[-1]._bar
            else:
                from rich.console import Console
                from rich.progress import Progress as Bar

                console = self.console if self.console is not None else Console(stderr=True)
                # A display opened by a status line goes when it ends; a bar's stays.
                # The rate is estimated from every finished unit after the first (the
                # first one also compiles), however long each takes.
                self._bar = Bar(
                    *_columns(),
                    console=console,
                    transient=self.total is None,
                    refresh_per_second=4,
                    speed_estimate_period=10 * 365 * 86400,
                )
                self._bar.__enter__()
                self._owner = True
            assert self._bar is not None  # an enclosing line's display, or the one just opened
            self._task = self._bar.add_task(
                self.description, total=self.total, unit=self.unit, covered=self.covered, rate=self.rate
            )
            Progress._drawn.append(self)
        return self

    def advance(self, steps: int | float = 1) -> None:
        """`steps` more units done (or, with `covered`, that much more time covered)."""
        self.done += steps
        if self._bar is not None:
            assert self._task is not None  # added with the bar
            self._bar.update(self._task, advance=steps)
        if self._lines is not None:
            self._line()

    def _line(self) -> None:
        """A line of text, if one is due: the count, the rate (from the units after the
        first, which also compiles, as the bar's), the time spent and left."""
        assert self._lines is not None and self.total is not None  # a count's lines only
        now = _now()
        if self._first is None:
            self._first = (now, self.done)
        quiet = now - self._said[0]
        if (quiet < LINE_EVERY_S or self.done - self._said[1] < LINE_EVERY_FRACTION * self.total) and not (
            quiet >= LINE_AT_LEAST_S and self.done > self._said[1]
        ):
            return
        self._said = (now, self.done)
        since, first = self._first
        spent = now - self._start
        speed = (self.done - first) / (now - since) if self.done > first and now > since else None
        if speed is None and spent > 0:
            speed = self.done / spent
        left = f"about {_clock((self.total - self.done) / speed)} left" if speed else "time left unknown"
        count = _count(self.done, self.total, self.unit, self.covered)
        self._lines(f"{self.description}: {count}, {_rate(speed, self.rate)}, {_clock(spent)} spent, {left}")

    def describe(self, description: str) -> None:
        self.description = description
        if self._bar is not None:
            assert self._task is not None  # added with the bar
            self._bar.update(self._task, description=description)

    def __exit__(self, *exc) -> None:
        if self._bar is None:
            return
        Progress._drawn.remove(self)
        if self.total is None and not self._owner:
            assert self._task is not None  # added with the bar
            self._bar.remove_task(self._task)  # a status line under a bar: gone when it ends
        if self._owner:
            self._bar.__exit__(*exc)
        self._bar = None


def status(description: str, *, show: bool | None = None, console=None) -> Progress:
    """`with status("compiling"): ...`: a line saying what is being done (a pulsing bar
    and the time spent) while a step with nothing to count runs; it disappears when the
    step ends. Drawn where a `Progress` would be; `describe` changes what it says."""
    return Progress(description, None, unit="", show=show, console=console)


def end_all() -> None:
    """End every line drawn in this process, innermost first (before a message that must
    be the last thing on the terminal, or an exit that skips the `with` blocks)."""
    for line in reversed(list(Progress._drawn)):
        line.__exit__(None, None, None)
