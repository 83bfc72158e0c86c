"""The phase-diagram figures ("A mathematical perspective on Transformers", figs. 3-5):
the equiangular time t_eps(beta) against an independent SciPy solve, the transition
of the pair density following that curve more closely as d grows, the random-matrix
panels, and two and three clusters on the circle. Each experiment runs reduced (fewer
members and betas) through `run_experiment`, the code path of the command line."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.integrate import solve_ivp

import attnflow as af
from attnflow.schema._errors import ConfigError
from attnflow.experiments import (
    compose_experiment,
    draw_experiment,
    plan_experiment,
    run_experiment,
)
from commands import assert_cf


def _scipy_time(beta: float, n: int, eps: float) -> float:
    """The first t with rho(t) = 1 - eps, integrating rho' in t with a terminal event."""

    def rate(t, rho):
        r = rho[0]
        return [2 * np.exp(beta * r) * (1 - r) * (1 + (n - 1) * r) / (np.exp(beta) + (n - 1) * np.exp(beta * r))]

    def reached(t, rho):
        return rho[0] - (1 - eps)

    reached.terminal = True
    reached.direction = 1
    solution = solve_ivp(rate, (0.0, 1e5), [0.0], method="DOP853", events=reached, rtol=1e-13, atol=1e-15)
    return float(solution.t_events[0][0])


@pytest.mark.parametrize("n,eps", [(32, 1e-3), (2, 1e-2), (5, 1e-6)])
def test_equiangular_time_matches_an_independent_scipy_solve(n, eps):
    betas = np.array([0.1, 1.0, 3.0, 6.0, 9.0])
    times = np.asarray(af.equiangular_time(betas, n, eps))
    expected = np.array([_scipy_time(b, n, eps) for b in betas])
    np.testing.assert_allclose(times, expected, rtol=1e-8)
    assert np.all(np.diff(times) > 0)  # a larger beta slows the collapse
    # Any shape of beta; one beta alone gives a scalar.
    assert af.equiangular_time(betas.reshape(5, 1), n, eps).shape == (5, 1)
    np.testing.assert_allclose(float(af.equiangular_time(3.0, n, eps)), expected[2], rtol=1e-8)


def test_equiangular_time_refuses_impossible_input():
    with pytest.raises(ValueError, match="n >= 2"):
        af.equiangular_time(1.0, 1)
    with pytest.raises(ValueError, match="eps must lie in"):
        af.equiangular_time(1.0, 8, eps=1.5)


def test_phase_diagram_follows_the_equiangular_curve_more_closely_in_higher_dimension(tmp_path):
    betas = np.linspace(0.1, 9.0, 10).tolist()
    ds = run_experiment("phase_diagram", {"d": [2, 8, 32, 128], "members": 32, "beta": betas,
                                          "compilation_cache": False})
    assert list(ds["d"].values) == [2, 8, 32, 128]
    # The stored curve is the equiangular time for the config's n and the option's eps.
    np.testing.assert_allclose(ds["equiangular_time"].values, af.equiangular_time(np.array(betas), 32, 1e-3))
    density = ds["pair_density_mean"]
    assert density.dims == ("d", "beta", "time") and ds.sizes["time"] == 301
    assert float(density.min()) >= 0 and float(density.max()) <= 1
    assert "member" not in ds.dims  # the ensemble is summarized
    # Uniform tokens start unclustered; at the smallest beta every member collapses by t = 30.
    assert float(density.isel(time=0).max()) < 0.05
    np.testing.assert_allclose(density.isel(beta=0, time=-1), 1.0)
    # The transition follows the equiangular step more closely as d grows: the figure run
    # (2048 members, 90 betas) has mismatches 0.317, 0.167, 0.052, 0.016 for d = 2, 8, 32,
    # 128, each at most 0.53 times the one before; here 0.308, 0.159, 0.042, 0.015.
    mismatch = ds["curve_mismatch"].values
    assert np.all(mismatch[1:] < 0.65 * mismatch[:-1]), mismatch
    np.testing.assert_allclose(mismatch, [0.317, 0.167, 0.052, 0.016], rtol=0.3)
    # The crossing times agree too, from d = 2 to 32 (at d = 128 the crossing error stays
    # near that of d = 32: 0.057 against 0.052 here; the mismatch still falls).
    log_error = ds["crossing_log_error"].values
    assert log_error[2] < 0.5 * log_error[1] < 0.25 * log_error[0], log_error
    # The figure redraws from results.nc alone, which passes the CF checker.
    path = af.write_results(ds, tmp_path / "results.nc")
    assert_cf(tmp_path, path)
    paths = draw_experiment(af.load_results(path), tmp_path)
    assert {p.name for p in paths} == {"phase_diagram.png", "phase_diagram.pdf"}
    assert all(p.stat().st_size > 0 for p in paths)


def test_panels_are_planned_as_the_figures_need_and_bad_options_stop_early():
    full = plan_experiment(compose_experiment("phase_diagram", {"members": 2}))
    assert [study.config.d for study, _ in full.studies.values()] == [2, 8, 32, 128]
    for study, _ in full.studies.values():
        cfg = study.config
        assert (cfg.n, len(cfg.beta), cfg.members, cfg.t1, cfg.dt, cfg.solver, cfg.cluster_eps) == (
            32, 90, 2, 30.0, 0.1, "euler_renorm", 1e-3)
    np.testing.assert_allclose(cfg.beta, np.linspace(0.1, 9.0, 90), rtol=1e-12)
    assert list(plan_experiment(compose_experiment("phase_diagram", {"d": 8})).studies) == ["main"]
    with pytest.raises(ConfigError, match="experiment.options.eps"):
        plan_experiment(compose_experiment("phase_diagram", {"experiment": {"options": {"eps": 1.0}}}))
    with pytest.raises(ConfigError, match="experiment.options.snapshots"):
        plan_experiment(compose_experiment("circle", {"experiment": {"options": {"snapshots": [1e3]}}}))
    plan = plan_experiment(compose_experiment("phase_diagram_random", {"members": 2}))
    assert list(plan.studies) == ["product_wishart", "goe_wishart", "v_plus_qtk", "v_minus_qtk"]
    for study, _ in plan.studies.values():
        cfg = study.config
        assert cfg.d == 128 and not cfg.weights.shared and cfg.weights.per_beta
        assert (cfg.n, len(cfg.beta), cfg.members, cfg.t1, cfg.dt, cfg.solver, cfg.cluster_eps) == (
            32, 90, 2, 30.0, 0.1, "euler_renorm", 1e-3)
    weights = plan.studies["goe_wishart"][0].config.weights
    assert (weights.q.kind, weights.k.law, weights.v.law) == ("identity", "goe", "wishart")
    assert plan.studies["product_wishart"][0].config.weights.k.law == "product"
    tied = [plan.studies[p][0].config.weights.v for p in ("v_plus_qtk", "v_minus_qtk")]
    assert [(v.kind, v.sign, v.transpose) for v in tied] == [("tied", 1.0, True), ("tied", -1.0, True)]
    np.testing.assert_allclose([v.scale for v in tied], 1 / np.sqrt(128), rtol=1e-15)
    with pytest.raises(ConfigError, match=r"experiment.options.panels\[0\] must be one of product_wishart"):
        plan_experiment(compose_experiment("phase_diagram_random", {"experiment": {"options": {"panels": ["gue"]}}}))


def test_random_logits_alone_keep_clusters_apart_at_large_beta():
    """The paper's law at d = 128 with V = I: the logits <x, B y> have variance 1, so beta
    is the real inverse temperature. At t = 30 every pair has gathered at beta = 1, while
    at beta = 9 most pairs are still apart (a metastable zone). With the Ginibre Q, K of
    the previous release (logits of variance 1/d) the density was 1 at every beta."""
    ds = run_experiment("phase_diagram_random", {
        "members": 24, "beta": [1.0, 9.0], "experiment": {"options": {"panels": ["product_identity"]}}})
    final = ds["final_pair_density"].sel(panel="product_identity")
    assert float(final.sel(beta=1.0)) >= 0.95, final.values
    assert float(final.sel(beta=9.0)) <= 0.6, final.values


@pytest.mark.optimized
def test_the_four_panels_of_fig5_as_the_full_run_measured(tmp_path):
    """What the README reads off the full-size fig. 5 (2048 members per beta, run on an
    H200), at 16 members and two betas: with V Wishart, (a) and (b), every pair has
    gathered by t = 30 at small beta and a share stays apart at beta = 9 (full run: 0.93
    and 0.85); with V tied to the form, (c) and (d), nothing gathers before t = 5, at
    small beta everything collapses by t = 10, and at beta = 9 the tokens stay split
    (full run: 0.19 for +B, 0.40 for -B)."""
    ds = run_experiment("phase_diagram_random", {"members": 16, "beta": [0.3, 9.0]})
    rho = ds["pair_density_mean"]
    at = lambda panel, beta, t: float(rho.sel(panel=panel, beta=beta).sel(time=t, method="nearest"))
    for panel in ("product_wishart", "goe_wishart"):
        assert at(panel, 0.3, 30.0) >= 0.99, panel
        assert 0.7 <= at(panel, 9.0, 30.0) <= 0.98, (panel, at(panel, 9.0, 30.0))
    for panel in ("v_plus_qtk", "v_minus_qtk"):
        assert at(panel, 0.3, 5.0) <= 0.05 and at(panel, 0.3, 10.0) >= 0.95, panel
        assert at(panel, 9.0, 5.0) <= 0.05 and at(panel, 9.0, 30.0) <= 0.65, (panel, at(panel, 9.0, 30.0))
    assert_cf(tmp_path, af.write_results(ds, tmp_path / "results.nc"))


def test_circle_holds_two_clusters_at_beta_4_and_three_at_beta_9(tmp_path):
    """The figure run (256 members) has 2 clusters at beta = 4 in 239 members (93%) and 3 at
    beta = 9 in 198 (77%) at t = 100. The members are drawn one key each, so these 64 are the
    figure's first 64; the bounds are its shares give or take three binomial standard
    deviations of 64 members. Long-lived: the median count is already 2 and 3 at t = 20 and
    still at t = 100 (the figure ends there: later merges are neither run nor claimed)."""
    ds = run_experiment("circle", {"members": 64, "compilation_cache": False})
    assert list(ds["beta"].values) == [4.0, 9.0]
    np.testing.assert_array_equal(ds["final_clusters_median"].values, [2, 3])
    final = ds["clusters"].isel(time=-1).values
    assert 0.83 <= np.mean(final[0] == 2) <= 1.0, np.bincount(final[0])
    assert 0.61 <= np.mean(final[1] == 3) <= 0.93, np.bincount(final[1])
    # Away from the modal count, one more or one fewer.
    assert np.all(np.abs(final[0] - 2) <= 1) and np.all(np.abs(final[1] - 3) <= 1)
    t = ds["time"].values
    held = (t >= 20) & (t <= 100)
    medians = np.median(ds["clusters"].values[..., held], axis=1)  # (beta, time)
    assert np.all(medians[0] == 2) and np.all(medians[1] == 3), medians
    # The member drawn is typical, and its final state has that many clusters.
    for b, expected in enumerate((2, 3)):
        member = int(ds["shown_member"].values[b])
        assert int(ds["clusters"].isel(beta=b, member=member, time=-1)) == expected
        assert len(np.unique(ds["final_cluster"].isel(beta=b).values)) == expected
    # Drawn from every sixth saved time and the last (the animations' frames cost most of
    # this test otherwise; the figure's snapshots are the saved times nearest 0, 3, 10, 100).
    times = ds.sizes["time"]
    paths = draw_experiment(ds.isel(time=np.unique(np.r_[np.arange(0, times, 6), times - 1])), tmp_path)
    assert {p.name for p in paths} == {"circle.png", "circle.pdf", "circle_beta4.gif", "circle_beta9.gif"}
    assert_cf(tmp_path, af.write_results(ds, tmp_path / "results.nc"))
