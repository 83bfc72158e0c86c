"""The four time-dependence and causal experiments of "A Survey of Continuous Time
Dynamics of Transformers" (sec. 5.2, fig. 3-5, theorem 4.3), each reduced (fewer members,
tokens or output times, larger steps) and run through `run_experiment`, the code path of
`attnflow experiment=NAME`. Each test asserts the property its figure is about; the
last one draws all four from their NetCDF files, as `attnflow plot` does."""

from __future__ import annotations

import numpy as np
import pytest
from commands import assert_cf

from attnflow import load_results, write_results
from attnflow.experiments import draw_experiment, run_experiment

FAST = {"compilation_cache": False}


@pytest.fixture(scope="module")
def random_qk():
    # Random Q, K redrawn every unit of time; one cluster forms near t = 7 (fig. 3 run).
    return run_experiment("random_qk", {**FAST, "members": 6, "t1": 12.0, "dt": 0.1, "saves": 13})


@pytest.fixture(scope="module")
def bouncing():
    # 32 members (their first 32 of the figure's 256), coarser steps and output.
    return run_experiment("bouncing", {**FAST, "members": 32, "dt": 0.05, "saves": 21})


@pytest.fixture(scope="module")
def token_detection():
    return run_experiment("token_detection", {**FAST, "dt": 0.05, "saves": 41})


@pytest.fixture(scope="module")
def causal():
    return run_experiment("causal", {**FAST, "members": 8, "n": 6, "t1": 30.0, "dt": 0.1, "saves": 31})


def test_random_qk_clusters_with_v_identity_only(random_qk):
    ds = random_qk
    assert int(ds["failed_members"].sum()) == 0
    with_identity, negated = ds.sel(v_sign=1.0), ds.sel(v_sign=-1.0)
    # V = I: every member ends in one cluster, whatever its random Q(t), K(t).
    assert np.all(with_identity["final_clusters"].values == 1)
    assert float(with_identity["one_cluster_fraction"]) == 1.0
    assert with_identity["pair_density_q10"].isel(time=-1) == 1.0
    # The same Q, K with V = -I: no member gathers into one point; the tokens spread over
    # the sphere, |mean x_i| below 0.04 in 90% of the figure's members at t = 30 (0.06 here).
    assert np.all(negated["final_clusters"].values > 1)
    assert float(negated["order_parameter_q90"].isel(time=-1)) < 0.15
    # Only the drawn member's states are kept.
    assert ds["x_member"].dims == ("v_sign", "time", "token", "dim")


def test_bouncing_gathers_scatters_and_gathers_elsewhere(bouncing):
    ds = bouncing
    t = ds["time"].values
    switch = float(ds["switch_time"])
    order = ds["order_parameter_all"].transpose("member", "time").values
    at_switch = int(np.argmin(np.abs(t - switch)))
    after = t > switch
    # The figure run (256 members), medians over members of the order parameter |mean x_i|:
    # 0.16 at t = 0, 0.99 at the flip, 0.58 at its lowest after it, 0.96 at t = 10.
    # Before the flip the tokens gather ...
    assert np.all(order[:, at_switch] > order[:, 0] + 0.1), order[:, [0, at_switch]]
    assert np.median(order[:, at_switch]) > 0.95
    # ... right after it they fly apart (at once, and by a clear margin) ...
    assert np.all(order[:, at_switch + 1] < order[:, at_switch])
    assert np.all(order[:, after].min(1) < order[:, at_switch] - 0.1)
    assert np.median(order[:, after].min(1)) < 0.75
    # ... and then gather again.
    assert np.all(order[:, -1] > order[:, after].min(1))
    assert np.median(order[:, -1]) > 0.85  # 0.90 to 0.97 over the eight blocks of 32 members
    # Elsewhere: first in the +1 directions of V(0) (median share of the squared norm 0.99 at the
    # flip), then in the others (0.06 at the end) ...
    share = ds["attracting_share_median"].values
    assert share[at_switch] > 0.95 and share[-1] < 0.15, share[[at_switch, -1]]
    # ... so the mean direction at the end is about orthogonal to the one at the flip: the
    # median cosine is 0.03 over the 256 members (|cos| below 0.12 in 90% of them).
    cos = ds["centre_cos"].values
    assert abs(np.median(cos)) < 0.08 and np.quantile(np.abs(cos), 0.9) < 0.3, np.sort(np.abs(cos))
    # The view of the figure: principal components of the initial tokens.
    assert ds["pc"].dims == ("time", "token", "component")


def test_token_detection_is_causal_and_answers_yes_from_the_zero_on(token_detection):
    ds = token_detection
    t = ds["time"].values
    at_switch = int(np.argmin(np.abs(t - float(ds["switch_time"]))))
    baseline = 1 / (np.exp(float(ds["readout_beta"])) + ds.sizes["vocabulary"] - 1)  # a one-hot token's other words
    found = [label for label in ds["panel"].values if int(ds.sel(panel=label)["zero_position"]) > 0]
    missing = [label for label in ds["panel"].values if int(ds.sel(panel=label)["zero_position"]) == 0]
    assert found and missing
    for label in found:
        part = ds.sel(panel=label)
        sequence = part["sequence"].values
        z = int(part["zero_position"]) - 1  # 0-based
        p = part["probability"].values  # (time, position, vocabulary)
        # Stage 1: the positions before the first 0 have not moved at all (causality),
        # the 0 and every later position now reads as token 0.
        np.testing.assert_allclose(p[at_switch, :z], p[0, :z], atol=1e-12)
        assert np.all(p[at_switch, :z].argmax(-1) == sequence[:z])
        assert np.all(p[at_switch, z:].argmax(-1) == 0)
        assert int(part["detected_from"]) == z + 1
        # Stage 2: before the 0, no probability on YES (3) and the answer NO (4); from the 0 on,
        # probability moves onto YES, growing along the sequence, and YES wins after the 0.
        yes = p[-1, :, 3]
        np.testing.assert_allclose(yes[:z], baseline, atol=0.02)
        assert np.all(part["answer"].values[:z] == 4)
        assert np.all(yes[z:] > baseline + 0.15)
        assert np.all(np.diff(yes[z:]) > 0)
        assert np.all(part["answer"].values[z + 1:] == 3)
    for label in missing:
        part = ds.sel(panel=label)
        # Without a 0 no token ever gains a component along e_0 or e_3, and every position answers NO.
        x = part["x"].values
        assert np.all(np.abs(x[..., [0, 3]]) < 1e-12)
        assert np.all(part["answer"].values == 4)


def test_causal_tokens_converge_to_the_first_token_at_rate_one_half(causal):
    ds = causal
    # x_1 never moves (eq. 38), in every member.
    assert np.all(ds["x1_drift"].values < 1e-12)
    # Every token is still closing in on x_1 at the end (positive decay rate), and almost
    # every member is already there; a member whose second token starts near the antipode
    # of x_1 lingers there for a while.
    rate = ds["rate"].values[:, 1:]
    assert np.all(rate > 0), rate
    assert float(ds["converged"].mean()) >= 0.75
    # Linearized at the limit: one rate, 1/2, for every token, and token i lags i - 1
    # times as far behind as token 2 (medians over members).
    np.testing.assert_allclose(np.median(rate, 0), 0.5, atol=0.05)
    tokens = ds["token"].values[1:]
    np.testing.assert_allclose(np.median(ds["lag"].values[:, 1:], 0) / (tokens - 1), 1.0, atol=0.15)
    # Later tokens end farther from x_1 (median member).
    assert np.all(np.diff(ds["distance_median"].isel(time=-1).values[1:]) > 0)


@pytest.mark.parametrize("name", ["random_qk", "bouncing", "token_detection", "causal"])
def test_figures_are_drawn_from_the_results_file_which_passes_the_cf_checker(name, request, tmp_path):
    path = write_results(request.getfixturevalue(name), tmp_path / "results.nc")
    assert_cf(tmp_path, path)
    ds = load_results(path)
    paths = draw_experiment(ds, tmp_path)
    expected = {f"{name}.png", f"{name}.pdf"} | ({"causal.html", "causal.gif"} if name == "causal" else set())
    assert {p.name for p in paths} == expected
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths)


def test_a_matrix_per_piece_must_match_the_switch_times():
    # Token detection's V switches between two matrices: `value` holds one per piece.
    from attnflow import ConfigError, validate_config

    eye, zero = np.eye(2).tolist(), np.zeros((2, 2)).tolist()
    ok = validate_config({"d": 2, "weights": {"v": {"kind": "matrix", "value": [eye, zero], "switch_times": [1.0]}}})
    assert ok.weights.v.factors == []
    with pytest.raises(ConfigError, match=r"weights\.v\.value .*one matrix per piece.*\(2, 2, 2\).*got \(3, 2, 2\)"):
        validate_config({"d": 2, "weights": {"v": {"kind": "matrix", "value": [eye, zero, eye], "switch_times": [1.0]}}})
