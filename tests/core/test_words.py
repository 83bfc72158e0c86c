"""`attnflow.schema._words`: how a caption says a value of the config."""

from __future__ import annotations

from attnflow.schema._words import number_text, polynomial_text, sequence_text


def test_numbers_lists_and_polynomials_as_a_caption_says_them():
    assert number_text(0.25) == "0.25" and number_text(1e-7) == "1e-07"
    assert number_text(True) == "True" and number_text("x") == "x" and number_text(None) == "None"
    assert sequence_text([1, 2.5]) == "[1, 2.5]" and sequence_text(3) == "[3]"
    assert polynomial_text([1, 0, -2]) == "1 - 2 $t^{2}$"
    assert polynomial_text([0, 0.5]) == "0.5 $t$" and polynomial_text([0]) == "0"
