"""`attnflow.running._build`: a config checked and resolved once, and the members it builds."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import attnflow as af
from attnflow.running._build import build_system, non_finite_advice, recorded_metrics, resolve_study
from attnflow.schema._errors import ConfigError


def test_a_study_is_resolved_once_into_its_betas_times_and_output_size():
    study = resolve_study({"beta": [1, 4], "members": 3, "t1": 2.0, "dt": 0.5, "saves": 3, "n": 4, "d": 3})
    np.testing.assert_array_equal(study.betas, [1.0, 4.0])
    assert study.beta_is_list and study.pairs == 6 and study.config.beta == [1.0, 4.0]
    assert study.grid.num_steps == 4 and study.output_bytes > 0
    with pytest.raises(ConfigError, match="t1 must be greater than t0"):
        resolve_study({"t0": 2.0, "t1": 1.0})


def test_a_member_is_its_field_tokens_and_recorder_and_the_same_seed_gives_the_same_member():
    system = build_system({"n": 5, "d": 3, "mlp": {"enabled": True}, "init": {"kind": "caps", "k": 2}})
    field, y0, recorder = system(jax.random.key(0), 1.0)
    assert len(field.terms) == 2 and y0.shape == (5, 3)
    again = build_system({"n": 5, "d": 3, "mlp": {"enabled": True}, "init": {"kind": "caps", "k": 2}})
    np.testing.assert_array_equal(again(jax.random.key(0), 1.0)[1], y0)
    assert recorded_metrics(af.validate_config({"attention_kind": "sinkhorn"}))[-1] == "marginal_error"


def test_what_a_run_that_blew_up_may_change_is_only_what_its_config_accepts():
    assert non_finite_advice(af.validate_config({})) == "use a smaller dt, an adaptive solver, float64 or a smaller beta"
    noisy = af.validate_config({"noise": {"sigma": 0.1}, "dtype": "float64"})
    assert "adaptive" not in non_finite_advice(noisy) and "noise.sigma" in non_finite_advice(noisy)
