"""`attnflow.schema._metric_registry`: what each built-in metric reads, and a researcher's
metric registered by the decorator."""

from __future__ import annotations

import pytest

import attnflow as af
from attnflow.schema._metric_registry import METRIC_NAMES, METRICS, TAKEN, names_reading, reading, registered


def test_what_the_metrics_read_is_said_by_the_registry():
    assert reading("beta", METRIC_NAMES) == {"energy", "log_energy"}
    assert "clusters" in reading("eps", METRIC_NAMES) and not reading("eps", ["energy"])
    assert "energy" in names_reading("beta")
    assert set(METRICS) == set(METRIC_NAMES)


def test_the_decorator_registers_a_function_with_its_attributes_and_leaves_it_callable():
    @af.metric(long_name="twice the first coordinate", units="1", dims=("token",))
    def twice(x):
        return 2 * x[:, 0]

    found = registered(twice)
    assert found is not None and found.name == "twice" and found.dims == ("token",)
    assert found.long_name == "twice the first coordinate" and not found.takes_context
    assert registered(len) is None
    assert "x" in TAKEN and "energy" in TAKEN  # a variable of every run, and a built-in metric
    with pytest.raises((TypeError, ValueError)):
        af.metric(long_name="no dims as text", dims="token")(twice)
