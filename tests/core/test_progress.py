"""Progress lines: the count done of the total, the rate and the time left where they are
drawn (a terminal, or a console asked for), nothing elsewhere; the lines of an
experiment's analysis and of an animation appear under the command's own line."""

import io
import re
import time

import numpy as np
import pytest

from attnflow._progress import Progress


def _console():
    from rich.console import Console

    buffer = io.StringIO()
    return buffer, Console(file=buffer, width=200)


def test_a_drawn_line_shows_the_count_its_rate_and_the_time_left():
    buffer, console = _console()
    with Progress("phase diagram", 4, unit="pieces", show=True, console=console) as bar:
        for _ in range(4):
            time.sleep(0.02)
            bar.advance()
    text = buffer.getvalue()
    assert "phase diagram" in text and "4/4 pieces" in text
    rate = float(re.search(r"([0-9.e+]+) pieces/s", text).group(1))
    assert 1 < rate < 4 / 0.02 * 1.5  # 4 pieces in at least 80 ms
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
    from attnflow.experiments import animation, lyapunov

    k, every, steps = 3, 5, 20
    zeros = lambda system, keys, betas, members, beta_index, *rest: (
        np.zeros((len(members), k)), np.zeros((len(members), steps // every, k)))
    monkeypatch.setattr(lyapunov, "_piece", zeros)
    study = af.resolve_study({"n": 4, "beta": [0.5, 1.0], "members": 3, "t1": 2.0, "dt": 0.1, "chunk_size": 4})
    buffer, console = _console()
    with Progress("attnflow", 1, show=True, console=console) as outer:
        lyapunov.ensemble_spectra(study, k, every)
        x = np.random.default_rng(0).standard_normal((5, 4, 3))
        animation(x / np.linalg.norm(x, axis=-1, keepdims=True), np.linspace(0, 1, 5), tmp_path / "a.gif",
                  frames=5)
        outer.advance()
    text = buffer.getvalue()
    assert re.search(r"Lyapunov spectra .* 6/6 members", text)  # two pieces: 4 pairs, then 2
    assert re.search(r"animation a\.gif .* 5/5 frames", text)
