"""`attnflow.running._study`: a study run end to end, what identifies it, and its results' notes."""

from __future__ import annotations

import warnings

import attnflow as af
from attnflow.running._build import validate_config
from attnflow.running._study import run_identity, time_axis


def test_a_study_runs_to_results_with_its_config_and_identity():
    cfg = {"n": 4, "d": 3, "members": 2, "t1": 0.5, "dt": 0.1, "saves": 2}
    ds = af.run(cfg)
    assert ds.sizes["member"] == 2 and ds.sizes["time"] == 2 and "energy" in ds
    assert "n: 4" in ds.attrs["config"]
    same, other = run_identity(validate_config(cfg)), run_identity(validate_config({**cfg, "seed": 1}))
    assert same == run_identity(validate_config(cfg)) and same != other
    assert "c = 2 " in time_axis(2.0) and "log(beta)" in time_axis("log_beta")


def test_a_switch_outside_the_run_is_noted_not_refused():
    cfg = {"n": 4, "d": 3, "members": 1, "t1": 0.5, "dt": 0.1, "saves": 2,
           "weights": {"v": {"switch_times": [5.0], "factors": [1.0, -1.0]}}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = af.run(cfg)
    assert "outside the run's interval" in ds.attrs["notes"]
    assert any(issubclass(w.category, af.RunNote) for w in caught)
