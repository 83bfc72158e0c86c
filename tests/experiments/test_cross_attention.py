"""Cross-attention (experiment cross_attention, docs/gallery/cross_attention.md): target
tokens choosing among three source clusters (caps around orthonormal directions), and
the phase diagram of the order parameter over (beta, beta_c).

Reduced (16 members, betas 0.1, 1.78 and 31.6, beta_c 1, 3.98, 6.31 and 100; the
figure's n, m, source and time): every regime the page names, and the ordering of the
diagram, with thresholds from the figure's run and this one. The slow test at the end
runs the figure itself and asserts the page's numbers."""

from __future__ import annotations

import numpy as np
import pytest
from commands import assert_cf

from attnflow import load_results, write_results
from attnflow.experiments import draw_experiment, run_experiment
from attnflow.experiments.cross_attention import orthonormal_threshold
from attnflow.schema._errors import ConfigError

BETAS = [0.1, 1.78, 31.6]
CROSS_BETAS = [1.0, 3.98, 6.31, 100.0]
REDUCED = {
    "compilation_cache": False,
    "members": 16,
    "beta": BETAS,
    "experiment": {"options": {"cross_betas": CROSS_BETAS, "cases": [[0.1, 100.0], [31.6, 100.0]]}},
}


@pytest.fixture(scope="module")
def reduced():
    return run_experiment("cross_attention", REDUCED)


def cell(ds, name, beta, cross_beta):
    """A per-member statistic (or a mean) of one cell of the grid."""
    return ds[name].sel(beta=beta, cross_beta=cross_beta).values


def held_off_angle(k: int = 3) -> float:
    """The angle between a group of target tokens and its source cluster when the target
    splits equally among k orthonormal clusters, at beta -> 0 (the target's attention is
    its mean) and beta_c -> infinity (the source's pull is the centre c of the nearest
    cluster): each group sits where its field has no tangent part, y_k parallel to
    c_k + mean_j y_j, solved by iteration."""
    centres = np.eye(k)
    y = centres.copy()
    for _ in range(1000):
        y = centres + y.mean(0)
        y /= np.linalg.norm(y, axis=1, keepdims=True)
    return float(np.arccos(y[0, 0]))


def test_the_held_off_angle_of_equal_shares():
    assert held_off_angle() == pytest.approx(0.4420, abs=1e-4)
    assert 1 - np.cos(held_off_angle()) > 0.09  # nine times cluster_eps: not captured


def test_the_threshold_is_drawn_for_orthonormal_cap_centres_only():
    assert orthonormal_threshold([[2.0, 0.0, 0.0], [0.0, 0.0, 0.5]]) == pytest.approx(np.sqrt(2))
    assert np.isnan(orthonormal_threshold([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]]))
    assert np.isnan(orthonormal_threshold(None))


def test_below_sqrt_k_every_target_token_ends_at_the_direction_of_the_source_mean(reduced):
    """Three orthonormal source clusters: the direction of their mean is a maximum of the
    source's potential for beta_c < sqrt(3) only; below, the whole target ends there
    (one label, none captured) whatever beta; above, it leaves it."""
    ds = reduced
    assert float(ds["mean_direction_threshold"]) == pytest.approx(np.sqrt(3))
    assert ds["source_mean_angle"].sel(cross_beta=1.0).max() < 0.05  # figure: mean 0.018
    assert np.all(ds["largest_share"].sel(cross_beta=1.0) == 1.0)
    assert np.all(ds["final_capture"].sel(cross_beta=1.0) == 0.0)
    assert ds["source_mean_angle"].sel(cross_beta=3.98).min() > 0.5  # figure: mean 0.92


def test_between_the_threshold_and_the_split_the_target_goes_together_to_one_source_cluster(reduced):
    ds = reduced
    for beta in (0.1, 1.78):
        assert np.all(cell(ds, "largest_share", beta, 3.98) == 1.0), beta
        assert np.all(cell(ds, "final_capture", beta, 3.98) == 1.0), beta
        assert np.all(cell(ds, "chosen_clusters", beta, 3.98) == 1), beta
        # One cluster for all: only the tokens that started nearest it (figure: 0.42).
        assert cell(ds, "start_agreement_mean", beta, 3.98) < 0.6, beta
    # A local self-attention (beta = 31.6) no longer holds it together there.
    assert cell(ds, "largest_share_mean", 31.6, 3.98) < 0.6  # figure: 0.43


def test_a_strong_pull_splits_the_target_by_where_each_token_starts(reduced):
    """At beta_c = 100 each target token ends at the source cluster nearest it at t = 0,
    whatever beta: the share of each cluster at t1 is its initial (Voronoi) share, so
    the order parameter equals the largest initial share, member by member."""
    ds = reduced
    for beta in BETAS:
        assert cell(ds, "start_agreement_mean", beta, 100.0) >= 0.99, beta  # figure: 0.998 to 0.999
        same = cell(ds, "largest_share", beta, 100.0) == cell(ds, "initial_largest_share", beta, 100.0)
        assert same.mean() >= 0.9, (beta, same)
        assert cell(ds, "largest_share_mean", beta, 100.0) < 0.5  # figure: 0.426 = the initial share
    # The drawn members of the two cases: every token at its initial nearest cluster.
    np.testing.assert_array_equal(ds["case_cluster1"].values, ds["case_cluster0"].values)


def test_the_targets_own_mean_holds_the_split_groups_off_the_source_at_small_beta(reduced):
    """Split at beta_c = 100: at beta = 0.1 the target's attention, nearly its mean, holds
    each group off its source cluster by about the equal-share angle 0.442 (none
    captured); at beta = 31.6 it is local and every token is captured."""
    ds = reduced
    assert np.all(cell(ds, "final_capture", 0.1, 100.0) == 0.0)
    assert abs(cell(ds, "source_offset_mean", 0.1, 100.0) - held_off_angle()) < 0.05  # figure: 0.409
    assert np.all(cell(ds, "final_capture", 31.6, 100.0) == 1.0)
    assert cell(ds, "source_offset_mean", 31.6, 100.0) < 0.03  # figure: 0.016, the caps' own radius
    # The drawn member of each case is that cell's: held off at beta = 0.1, captured at 31.6.
    y, source = ds["case_x1"].values, ds["case_source"].values
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
    captured = (np.einsum("cid,cjd->cij", unit(y), unit(source)).max(-1) > 1 - 0.01).mean(-1)
    np.testing.assert_array_equal(captured, [0.0, 1.0])


def test_the_order_parameter_falls_with_beta_c_and_with_beta(reduced):
    """The diagram's ordering: the share of the most chosen source cluster never rises
    with beta_c at fixed beta, nor with beta at fixed beta_c (within 0.02), and at
    beta_c = 6.31 it falls from mostly together to split as beta grows."""
    share = reduced["largest_share_mean"].transpose("cross_beta", "beta").values
    assert np.all(np.diff(share, axis=0) <= 0.02), share
    assert np.all(np.diff(share, axis=1) <= 0.02), share
    row = reduced["largest_share_mean"].sel(cross_beta=6.31).values  # figure: 0.87, 0.59, 0.43
    assert row[0] > 0.75 and row[0] - row[1] > 0.1 and row[1] - row[2] > 0.05, row


def test_the_figure_is_drawn_from_the_results_file_which_passes_the_cf_checker(reduced, tmp_path):
    path = write_results(reduced, tmp_path / "results.nc")
    assert_cf(tmp_path, path)
    ds = load_results(path)
    assert "order parameter" in ds["largest_share_mean"].attrs["long_name"]
    paths = draw_experiment(ds, tmp_path)
    assert {p.name for p in paths} == {"cross_attention.png", "cross_attention.pdf"}


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"cross": {"enabled": False}}, "keep cross.enabled=true"),
        ({"cross": {"beta": 2.0}}, "leave cross.beta null"),
        ({"save_states": False}, "keep save_states=true"),
        ({"metrics": ["source_capture"]}, "reads nearest_source"),
        ({"d": 4}, "d must be 3"),
        ({"experiment": {"options": {"cross_betas": [3.0, 1.0]}}}, "increasing list of positive numbers"),
        ({"experiment": {"options": {"cases": [[0.2, 1.0]]}}}, "pairs [beta, beta_c] of the grid"),
        ({"experiment": {"options": {"cases": []}}}, "1 to 6 cells"),
    ],
)
def test_settings_the_experiment_cannot_use_are_refused_before_any_run(config, says):
    with pytest.raises(ConfigError) as error:
        run_experiment("cross_attention", {"compilation_cache": False, **config})
    assert says in str(error.value)


@pytest.mark.slow
def test_the_figure_run_has_every_number_of_the_page():
    """The figure's own config (128 members, 11 x 11 cells): the numbers the page states
    (30 s on an idle machine)."""
    ds = run_experiment("cross_attention", {"compilation_cache": False})
    share = ds["largest_share_mean"].transpose("cross_beta", "beta")
    capture = ds["final_capture_mean"].transpose("cross_beta", "beta")
    assert int(ds["failed_members"].sum()) == 0
    assert float(ds["initial_largest_share_mean"].max()) == pytest.approx(0.426, abs=0.005)
    # Below sqrt(3): together at the source's mean direction, none captured.
    assert np.all(share.sel(cross_beta=[1.0, 1.58]).values >= 0.99)
    assert np.all(capture.sel(cross_beta=[1.0, 1.58]).values == 0.0)
    assert float(ds["source_mean_angle_mean"].sel(cross_beta=1.0).max()) < 0.03
    # Together at one source cluster: beta_c = 3.98, beta <= 1.78.
    assert np.all(share.sel(cross_beta=3.98).values[:6] == 1.0)
    assert np.all(capture.sel(cross_beta=3.98).values[:6] == 1.0)
    # Split from beta_c = 10 at every beta (and from 2.51 at beta >= 10), by where each starts from 15.8.
    assert np.all(share.sel(cross_beta=slice(10.0, None)).values < 0.47)
    assert np.all(share.sel(cross_beta=2.51).values[8:] < 0.45)
    assert float(ds["start_agreement_mean"].sel(cross_beta=slice(15.8, None)).min()) >= 0.985
    # In the split, captured from beta = 5.62 on, held off (0.38 to 0.41 rad) at beta <= 1.
    split = capture.sel(cross_beta=slice(15.8, None))
    assert np.all(split.sel(beta=slice(5.0, None)).values == 1.0)
    assert np.all(split.sel(beta=slice(None, 1.0)).values <= 0.01)
    offset = ds["source_offset_mean"].sel(cross_beta=slice(10.0, None), beta=0.1).values
    assert np.all((offset > 0.37) & (offset < 0.42)), offset
    # The ordering, within 0.01.
    assert np.all(np.diff(share.values, axis=0) <= 0.01)
    assert np.all(np.diff(share.values, axis=1) <= 0.01)
