"""Progress lines: the count done of the total, the rate and the time left where they are
drawn (a terminal, or a console asked for), nothing elsewhere; the lines of an
experiment's analysis and of an animation appear under the command's own line."""

import io
import re
import time

import numpy as np
import pytest

from attnflow.running._progress import Progress


def _console(clock=None, terminal=None):
    from rich.console import Console

    buffer = io.StringIO()
    return buffer, Console(file=buffer, width=200, get_time=clock, force_terminal=terminal)


class Clock:
    """A clock that moves only when told (rich reads its time from the console's)."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_drawn_line_shows_the_count_its_rate_and_the_time_left():
    buffer, console = _console()
    with Progress("phase diagram", 4, unit="pieces", show=True, console=console) as bar:
        for _ in range(4):
            time.sleep(0.02)
            bar.advance()
    text = buffer.getvalue()
    assert "phase diagram" in text and "4/4 pieces" in text
    # Pieces take seconds each: their rate is in seconds per piece.
    seconds = float(re.search(r"([0-9.e+-]+) s/piece", text).group(1))
    assert 0.02 / 1.5 < seconds < 1  # a piece every 20 ms (or more, on a busy machine)
    assert re.search(r"\d:\d\d:\d\d left \d:\d\d:\d\d", text)  # time spent, then time left


def test_time_covered_is_counted_as_time():
    buffer, console = _console()
    with Progress("solve", 30.0, unit="t", covered=True, show=True, console=console) as bar:
        for _ in range(300):
            bar.advance(0.1)
    assert bar.done == pytest.approx(30.0)
    assert "t 30/30" in buffer.getvalue() and "t/s" in buffer.getvalue()


def test_nothing_is_drawn_where_the_output_is_not_a_terminal(capsys):
    buffer, console = _console()  # a file, not a terminal
    with Progress("quiet", 3, console=console) as bar:
        for _ in range(3):
            bar.advance()
    assert bar.done == 3 and not bar.show and buffer.getvalue() == ""
    with Progress("quiet on stderr", 2) as bar:  # pytest's stderr is no terminal either
        bar.advance(2)
    assert capsys.readouterr().err == ""


def test_a_progress_under_a_drawn_one_adds_its_line_to_the_same_display():
    buffer, console = _console()
    with Progress("attnflow", 2, show=True, console=console) as outer:
        for _ in range(2):
            with Progress("analysis", 3, unit="members") as inner:  # show=None: drawn under the outer line
                inner.advance(3)
            outer.advance()
        with Progress("hidden", 1, show=False) as hidden:
            hidden.advance()
    text = buffer.getvalue()
    assert text.count("3/3 members") == 2 and "2/2 pieces" in text and "hidden" not in text


def test_the_analysis_of_an_experiment_and_an_animation_draw_their_lines(tmp_path, monkeypatch):
    """experiment=lyapunov computes its spectra after the (empty) study, in pieces: its
    line counts the (beta, member) pairs (each piece's program replaced by zeros here:
    the count is what is tested); an animation counts its frames."""
    import attnflow as af
    from attnflow.experiments import _spectra, animation

    k, every, steps = 3, 5, 20
    zeros = lambda system, keys, betas, members, beta_index, *rest: (
        np.zeros((len(members), k)), np.zeros((len(members), steps // every, k)))
    monkeypatch.setattr(_spectra, "_piece", zeros)
    study = af.resolve_study({"n": 4, "beta": [0.5, 1.0], "members": 3, "t1": 2.0, "dt": 0.1, "chunk_size": 4})
    buffer, console = _console()
    with Progress("attnflow", 1, show=True, console=console) as outer:
        _spectra.ensemble_spectra(study, k, every)
        x = np.random.default_rng(0).standard_normal((5, 4, 3))
        animation(x / np.linalg.norm(x, axis=-1, keepdims=True), np.linspace(0, 1, 5), tmp_path / "a.gif",
                  frames=5)
        outer.advance()
    text = buffer.getvalue()
    assert re.search(r"Lyapunov spectra .* 6/6 members", text)  # two pieces: 4 pairs, then 2
    assert re.search(r"animation a\.gif .* 5/5 frames", text)


def test_each_bar_keeps_one_rate_unit_and_long_pieces_get_a_time_left():
    """One rate unit per bar, whatever the speed (no switch to another unit, such as
    pieces/s to pieces/min); the rate and the time left come from every piece after the
    first (which also compiles), even when each takes longer than rich's 30 s window."""
    clock = Clock()
    buffer, console = _console(clock)
    with Progress("attnflow", 5, show=True, console=console) as bar:
        clock.now += 300  # the first piece, compiling: 5 minutes
        bar.advance()
        for _ in range(2):
            clock.now += 60  # then a minute each
            bar.advance()
        console.file.write("\n---\n")
        bar._bar.refresh()
    last = buffer.getvalue().rsplit("---", 1)[1]
    assert "3/5 pieces" in last and "60 s/piece" in last, last
    assert "left 0:02:00" in last, last  # two pieces to go
    assert "/min" not in buffer.getvalue() and "pieces/s" not in buffer.getvalue()

    clock = Clock()
    buffer, console = _console(clock)
    with Progress("Lyapunov spectra", 4, unit="members", show=True, console=console) as bar:
        for _ in range(4):
            clock.now += 30  # slower than one a second: still members per second
            bar.advance()
    text = buffer.getvalue()
    assert "0.0333 members/s" in text and "/min" not in text and "s/member" not in text, text
    with Progress("pieces", 2, rate="pieces/s", show=True, console=console) as bar:
        bar.advance(2)
    assert "s/piece" not in buffer.getvalue()


def test_a_status_line_says_what_is_done_and_goes_when_it_ends():
    from attnflow.running._progress import end_all, status

    buffer, console = _console(terminal=True)
    with status("importing JAX", show=True, console=console) as line:
        line._bar.refresh()
        line.describe("compiling")
        line._bar.refresh()
        drawn = buffer.getvalue()
    assert "importing JAX" in drawn and re.search(r"compiling.*\d:\d\d:\d\d", drawn), drawn  # the time spent
    assert "left" not in drawn and "pieces" not in drawn  # nothing counted
    ended = buffer.getvalue()[len(drawn):]
    assert "\x1b[?25h" in ended and ended.endswith("\x1b[2K")  # the cursor shown again, the line erased
    assert not Progress._drawn

    # Under a bar, a status adds its line and removes it when it ends; the bar stays.
    buffer, console = _console()
    with Progress("attnflow", 2, show=True, console=console) as bar:
        with status("first piece: compiling, then solving") as line:
            assert line.show and line._bar is bar._bar
            bar.advance()
        assert [task.description for task in bar._bar.tasks] == ["attnflow"]
        bar.advance()
    assert "2/2 pieces" in buffer.getvalue()

    # Nothing where nothing is drawn; `end_all` ends the lines an exit would skip.
    with status("quiet") as line:
        assert not line.show
    buffer, console = _console()
    outer = status("composing the config", show=True, console=console).__enter__()
    inner = Progress("attnflow", 1).__enter__()
    assert inner.show and Progress._drawn == [outer, inner]
    display = outer._bar
    end_all()
    assert not Progress._drawn and outer._bar is None and not display.live.is_started
