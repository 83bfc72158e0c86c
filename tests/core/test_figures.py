"""`attnflow.presentation._figures`: the figures' style and captions."""

from __future__ import annotations

from attnflow.presentation._figures import caption, figure, wrap


def test_captions_wrap_between_math_spans_never_inside_one():
    text = "a long caption " * 6 + r"with $\cos(x_i, x_j) > 1 - \varepsilon$ inside " + "and more words " * 4
    lines = wrap(text, 40)
    assert all(line.count("$") % 2 == 0 for line in lines)  # every span whole on its line
    assert " ".join(lines) == " ".join(text.split())
    assert max(len(line) for line in lines if "$" not in line) <= 40


def test_a_caption_is_one_text_of_the_figure_under_its_axes():
    fig = figure()
    fig.add_subplot()
    caption(fig, "words " * 50, width=60)
    (text,) = fig.texts
    assert text.get_text().count("\n") >= 4 and text.get_position()[1] < 0
