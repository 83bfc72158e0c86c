"""`attnflow.schema._checks`: the one-sentence checks of a config's values that every
component uses."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnflow.schema._checks import array, as_floats, number
from attnflow.schema._errors import ConfigError


@pytest.mark.parametrize(
    ("value", "kwargs", "says"),
    [
        (math.nan, {}, "x must be a finite number, got nan."),
        (True, {}, "x must be a finite number, got True."),
        (0, {"positive": True}, "x must be positive, got 0."),
        (0.5, {"minimum": 1}, "x must be at least 1, got 0.5."),
    ],
)
def test_a_number_out_of_range_is_one_sentence_naming_the_key(value, kwargs, says):
    with pytest.raises(ConfigError) as error:
        number("x", value, **kwargs)
    assert str(error.value) == says
    number("x", 2, positive=True, minimum=1)  # in range: no error


def test_arrays_are_rectangular_finite_and_fit_the_dtype():
    np.testing.assert_array_equal(array("a", [[1, 2], [3, 4]], "float32"), [[1.0, 2.0], [3.0, 4.0]])
    with pytest.raises(ConfigError, match="rectangular array"):
        array("a", [[1, 2], [3]], "float32")
    with pytest.raises(ConfigError, match="finite numbers only"):
        array("a", [1, math.inf], "float64")
    with pytest.raises(ConfigError, match="beyond the largest float32"):
        array("a", [1e39], "float32")
    assert as_floats([[1, 2]]) == [[1.0, 2.0]] and as_floats(None) is None
