"""The noise-driven transition of unnormalized attention (Q = K = V = I) on the circle at
a small size: below 0.8 sigma_c the tokens gather (order parameter well above the floor
of uniform tokens), above 1.2 sigma_c the order parameter is the finite-n fluctuation of
the uniform law, E|m|^2 = 1/(n (1 - sigma_c^2/sigma^2)), and the threshold measured from
it sits at the predicted sigma_c = sqrt(2 I_1(beta)/beta)."""

from __future__ import annotations

import numpy as np
import pytest

import attnflow as af
from attnflow.experiments import experiment_figures, run_experiment

# The default run's size: one n, five sigmas, 8 members.
SMALL = {"experiment": {"options": {"sizes": [48], "ratios": [0.6, 0.8, 1.25, 1.5, 1.8], "late": 0.5}},
         "members": 8, "t1": 30.0, "dt": 30 / 256, "saves": 31, "compilation_cache": False}


@pytest.fixture(scope="module")
def small():
    return run_experiment("noise_transition", SMALL)


def test_the_transition_sits_at_the_predicted_critical_sigma(small):
    ds = small
    sigma_c = float(ds["critical_sigma"])
    assert sigma_c == pytest.approx(np.sqrt(2 * af.attention_mode(1.0, 2)))
    order, floor = ds["order"].values[0], float(ds["floor"].values[0])
    ratio = ds["ratio"].values
    n = int(ds["n"].values[0])
    # the floor is that of n uniform points on the circle, E|m| = sqrt(pi/(4n))
    assert floor == pytest.approx(np.sqrt(np.pi / (4 * n)), rel=0.25)
    assert (order[ratio <= 0.8] > 3 * floor).all(), (order, floor)
    # above 1.2 sigma_c: the fluctuation of the uniform law, amplified as sigma_c nears
    above = ratio >= 1.2
    amplified = n * ds["order_square"].values[0][above] * (1 - ratio[above] ** -2.0)
    assert (abs(amplified - 1) < 0.3).all(), amplified
    assert (order[above] < 2 * floor / np.sqrt(1 - 1.2**-2)).all()
    measured = float(ds["measured_threshold"].values[0])
    assert abs(measured / sigma_c - 1) < 0.06, (measured, sigma_c)


def test_the_figure_draws(small):
    figures = experiment_figures(small)
    assert list(figures) == ["noise_transition"]


def test_settings_outside_the_prediction_are_refused():
    with pytest.raises(af.ConfigError, match="dynamics=usa"):
        run_experiment("noise_transition", {**SMALL, "dynamics": "sa"})
    with pytest.raises(af.ConfigError, match="increasing positive numbers"):
        run_experiment("noise_transition", {**SMALL, "experiment": {"options": {"ratios": [1.2, 0.5]}}})


@pytest.mark.slow
def test_the_full_run_sharpens_with_n_at_the_predicted_threshold():
    """The gallery's run (n = 32, 128, 512): the measured threshold within 5% of sigma_c
    at every n, the order parameter at 0.9 sigma_c the same at every n (0.69), and at
    1.1 sigma_c falling as n grows (0.32, 0.20, 0.11)."""
    ds = run_experiment("noise_transition", {"compilation_cache": False})
    sigma_c = float(ds["critical_sigma"])
    assert (abs(ds["measured_threshold"].values / sigma_c - 1) < 0.05).all(), ds["measured_threshold"].values
    ratio = ds["ratio"].values
    below, above = ds["order"].values[:, ratio == 0.9][:, 0], ds["order"].values[:, ratio == 1.1][:, 0]
    assert (abs(below - 0.69) < 0.05).all(), below
    assert (np.diff(above) < 0).all() and above[-1] < 0.5 * above[0], above
