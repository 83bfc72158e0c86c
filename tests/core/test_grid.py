"""`attnflow.numerics._grid`: the fixed-step grid and the output times, from their definitions."""

from __future__ import annotations

import numpy as np
import pytest

from attnflow.schema._errors import ConfigError
from attnflow.numerics._grid import bracketing_steps, every_steps, save_steps, save_times, step_count


def test_step_count_is_the_whole_number_of_steps_and_refuses_a_step_that_does_not_divide():
    assert step_count(0, 1, 0.1) == 10  # 1/0.1 = 9.999999999999998 in floating point
    assert step_count(2, 5, 0.25) == 12
    with pytest.raises(ConfigError, match="does not divide t1 - t0 = 1 into whole steps"):
        step_count(0, 1, 0.3)
    with pytest.raises(ConfigError, match="longer than t1 - t0"):
        step_count(0, 1, 3)
    with pytest.raises(ConfigError, match="dt must be a positive number"):
        step_count(0, 1, -0.1)


def test_linear_saves_hold_both_ends_and_are_evenly_strided():
    steps = save_steps(10, 3)
    np.testing.assert_array_equal(steps, [0, 5, 10])
    np.testing.assert_array_equal(save_steps(10, 4), [0, 4, 8, 10])  # every ceil(10/3) = 4, and the last
    np.testing.assert_array_equal(save_steps(7, 1), [7])
    np.testing.assert_array_equal(every_steps(10, 3), [0, 3, 6, 9, 10])


def test_log_saves_are_geometric_and_merge_repeated_steps():
    steps = save_steps(1000, 5, "log")
    assert steps[0] == 0 and steps[-1] == 1000 and (np.diff(steps) > 0).all()
    ratios = steps[2:] / steps[1:-1]
    np.testing.assert_allclose(ratios, ratios[0], rtol=0.05)  # 1, 10, 100, 1000
    assert len(save_steps(3, 50, "log")) <= 4  # at most the 4 grid steps, duplicates merged


def test_output_times_and_their_brackets():
    np.testing.assert_allclose(save_times(0, 2, 5), [0, 0.5, 1, 1.5, 2])
    times = save_times(1, 11, 4, "log", first=0.1)
    np.testing.assert_allclose(times, [1, 1.1, 2, 11])
    k, theta = bracketing_steps([0.0, 0.25, 1.0], 0.0, 1.0, 10)
    np.testing.assert_array_equal(k, [0, 2, 9])
    np.testing.assert_allclose(theta, [0, 0.5, 1.0])
    with pytest.raises(ConfigError, match="output times must lie in"):
        bracketing_steps([1.5], 0.0, 1.0, 10)
