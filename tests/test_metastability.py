"""Metastability: the plateau and merge detector on series whose plateaus and merges are
known, and the experiment in which two clusters persist, then merge, and the energy on
the circle climbs a staircase."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
import yaml

import attnflow as af
from attnflow.experiments import draw_experiment, run_experiment

# t0 = 0, then 20 samples per decade from 1e-2 to 1e4 (sample k >= 1 at 10^(-2 + (k-1)/20)).
T = np.concatenate([[0.0], np.geomspace(1e-2, 1e4, 121)])
LOG_T = np.log10(T[1:])


def staircase(centres, heights, width):
    """Steps of the given heights, smooth over log t: tanh((log10 t - centre) / width)."""
    s = np.zeros(T.size)
    for centre, height in zip(centres, heights):
        s[1:] += height * 0.5 * (1 + np.tanh((LOG_T - centre) / width))
    return s


def brute_force_plateaus(t, s, tol, min_decades):
    """The definition, window by window: the longest window spanning at most tol * range
    (earliest among equals) lasting min_decades is a plateau; then left and right of it."""
    keep = np.flatnonzero(t > 0)
    log_t, values = np.log10(t[keep]), s[keep]
    width = tol * (values.max() - values.min())
    found, pending = [], [(0, keep.size - 1)]
    while pending:
        lo, hi = pending.pop()
        best = None
        for i in range(lo, hi + 1):
            for j in range(hi, i - 1, -1):
                if np.ptp(values[i : j + 1]) <= width:
                    if best is None or log_t[j] - log_t[i] > log_t[best[1]] - log_t[best[0]]:
                        best = (i, j)
                    break
        if best is not None and log_t[best[1]] - log_t[best[0]] >= min_decades:
            found.append(best)
            pending += [(lo, best[0] - 1), (best[1] + 1, hi)]
    return sorted((keep[i], keep[j]) for i, j in found)


def test_plateaus_of_a_sharp_noisy_staircase_are_its_steps():
    rng = np.random.default_rng(0)
    levels = np.repeat([0.0, 1.0, 3.0, 4.0], [31, 40, 25, 26])  # steps after samples 30, 70, 95
    s = levels + rng.uniform(-0.01, 0.01, T.size)  # noise far inside tol * range = 0.08
    p = af.plateaus(T, s, tol=0.02, min_decades=0.5)
    np.testing.assert_array_equal(p.first, [1, 31, 71, 96])  # sample 0 (t = t0) has no log time
    np.testing.assert_array_equal(p.last, [30, 70, 95, 121])
    np.testing.assert_array_equal(p.start, T[p.first])
    np.testing.assert_allclose(p.level, [0, 1, 3, 4], atol=0.01)
    # a stricter tolerance than the noise finds nothing; a longer minimum keeps only the
    # one step lasting 39/20 decades (the others last 29/20, 24/20 and 25/20)
    assert len(af.plateaus(T, s, tol=0.001).first) == 0
    np.testing.assert_array_equal(af.plateaus(T, s, min_decades=1.5).first, [31])


@pytest.mark.parametrize("noise", [0.0, 0.003])
def test_plateaus_of_smooth_steps_are_the_windows_of_the_definition(noise):
    s = staircase([-0.5, 1.5, 2.75], [1.0, 2.0, 1.0], width=0.15)
    s += noise * np.random.default_rng(1).standard_normal(T.size)
    p = af.plateaus(T, s, tol=0.02, min_decades=0.5)
    assert list(zip(p.first, p.last)) == brute_force_plateaus(T, s, 0.02, 0.5)
    np.testing.assert_allclose(p.level, [0, 1, 3, 4], atol=0.02)
    width = 0.02 * np.ptp(s[1:])
    for first, last in zip(p.first, p.last):
        assert np.ptp(s[first : last + 1]) <= width
        if first > 1 and first - 1 not in p.last:  # one more sample breaks the tolerance
            assert np.ptp(s[first - 1 : last + 1]) > width
        if last < T.size - 1 and last + 1 not in p.first:
            assert np.ptp(s[first : last + 2]) > width


def test_plateaus_of_a_symmetric_step_pair_are_centred_and_a_constant_is_one_plateau():
    s = staircase([0.0, 2.0], [1.0, 1.0], width=0.2)  # the middle level is centred on log t = 1
    p = af.plateaus(T, s, tol=0.02, min_decades=0.5)
    middle = np.flatnonzero(np.isclose(p.level, 1.0, atol=0.02))[0]
    lo, hi = LOG_T[p.first[middle] - 1], LOG_T[p.last[middle] - 1]
    assert abs((lo + hi) / 2 - 1.0) <= 0.05 / 2 + 1e-12  # symmetric up to one sample (1/20 decade)
    constant = af.plateaus(T, np.full(T.size, 7.0))
    assert (constant.first.tolist(), constant.last.tolist(), constant.level.tolist()) == ([1], [121], [7.0])


def test_merges_are_held_drops_at_the_first_sample_of_the_lower_count():
    counts = np.full(T.size, 2)
    counts[:40] = 5
    counts[40:70] = 4
    counts[70] = 3  # a one-sample flicker down ...
    counts[71:76] = 4
    counts[76:78] = 3  # ... a drop that holds 1/20 decade: 4 -> 2 is one merge
    counts[78:100] = 2
    counts[100] = 3  # a flicker up
    counts[101:] = 2
    counts[-2:] = 1  # a last drop that does not hold
    m = af.merges(T, counts, hold_decades=0.2)
    np.testing.assert_array_equal(m.index, [40, 78])
    np.testing.assert_array_equal(m.time, T[[40, 78]])
    np.testing.assert_array_equal(m.before, [5, 4])
    np.testing.assert_array_equal(m.after, [4, 2])
    # a split that holds (2 -> 3) is no merge; the next drop starts from 3
    split = np.repeat([3, 2, 3, 1], [30, 30, 30, 32])
    m = af.merges(T, split)
    assert (m.index.tolist(), m.before.tolist(), m.after.tolist()) == ([30, 90], [3, 3], [2, 1])


def test_detect_on_a_dataset_pads_to_netcdf_and_matches_the_arrays(tmp_path):
    t = T + 2.0  # a run from t0 = 2, read from its config
    energy = np.stack([staircase([-1, 1], [1, 2], 0.1), staircase([0.5], [3], 0.1)])
    clusters = np.stack([np.repeat([3, 2, 1], [40, 40, 42]), np.repeat([3, 1], [60, 62])])
    ds = xr.Dataset({"energy": (("member", "time"), energy), "clusters": (("member", "time"), clusters)},
                    coords={"member": [0, 1], "time": t}, attrs={"config": yaml.safe_dump({"t0": 2.0})})
    found = af.detect_metastability(ds)
    assert found.attrs["origin"] == 2.0
    assert found.sizes == {"member": 2, "plateau": 3, "merge": 2}
    for m in range(2):
        p = af.plateaus(t, energy[m], origin=2.0)
        k = len(p.first)
        assert int(found["energy_plateau_count"][m]) == k
        np.testing.assert_array_equal(found["energy_plateau_start"][m, :k], p.start)
        assert np.isnan(found["energy_plateau_level"][m, k:]).all()
        merged = af.merges(t, clusters[m], origin=2.0)
        k = len(merged.index)
        np.testing.assert_array_equal(found["merge_time"][m, :k], merged.time)
        assert (found["merge_from"][m, k:] == -1).all() and (found["merge_to"][m, k:] == -1).all()
    assert found["merge_from"].values.tolist() == [[3, 2], [3, -1]]
    found.to_netcdf(tmp_path / "found.nc")
    back = xr.open_dataset(tmp_path / "found.nc").load()
    xr.testing.assert_identical(back, found)


def test_bad_input_is_one_sentence():
    with pytest.raises(ValueError, match="times must increase strictly"):
        af.plateaus([1.0, 1.0, 2.0], [0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match=r"tol is a fraction of the series' range in \[0, 1\), got tol=2"):
        af.plateaus([1.0, 2.0], [0.0, 0.0], tol=2)
    with pytest.raises(ValueError, match="hold_decades must be a number of decades >= 0"):
        af.merges([1.0, 2.0], [2, 1], hold_decades=-1)
    with pytest.raises(ValueError, match="the Dataset has no variable 'clusters'"):
        af.detect_metastability(xr.Dataset({"energy": ("time", [1.0, 2.0])}, coords={"time": [1.0, 2.0]}),
                                ["energy", "clusters"])


@pytest.fixture(scope="module")
def experiment():
    # Panel sphere: 16 tokens in two caps 90 degrees apart at beta = 6 (two clusters by
    # t ~ 2, merged near t ~ 40); panel circle: 5 uniform tokens on the circle, beta = 15.
    return run_experiment("metastability", {"members": 2, "beta": 6.0, "t1": 300.0, "saves": 121,
                                            "compilation_cache": False})


def test_two_clusters_persist_then_merge_when_the_reduction_says(experiment):
    p = experiment.sel(panel="sphere")
    t1 = float(p["time"].max())
    for m in p["member"].values:
        q = p.sel(member=m)
        k = int(q["merge_count"]) - 1
        time = float(q["merge_time"][k])
        assert (int(q["merge_from"][k]), int(q["merge_to"][k])) == (2, 1)
        assert 0 < time < t1
        levels, starts, ends = (q[f"clusters_plateau_{f}"].values for f in ("level", "start", "end"))
        two = np.flatnonzero(levels == 2)
        assert two.size == 1 and ends[two[0]] < time
        assert np.log10(ends[two[0]] / starts[two[0]]) > 1  # two clusters persist over a decade
        one = np.flatnonzero(levels == 1)
        assert one.size == 1 and starts[one[0]] == time and ends[one[0]] == t1
        # the energy relative to one cluster: 1/2 for two clusters of 8 tokens, then 1
        energy = q["relative_energy_plateau_level"].values
        assert np.isclose(energy, 0.5, atol=0.01).any() and np.isclose(energy[np.isfinite(energy)][-1], 1.0)
        # detected on a grid of 10^(1/34) ~ 7%, against the two-point-cluster ODE
        assert abs(np.log(time / float(q["two_cluster_time"]))) < np.log(1.1)


def test_the_circle_climbs_an_energy_staircase_through_merges(experiment):
    p = experiment.sel(panel="circle")
    assert (p["merge_count"] >= 2).all()
    energy = p["energy"].values
    assert (np.diff(energy, axis=-1) >= -1e-9 * energy.max(-1, keepdims=True)).all()  # monotone
    for m in p["member"].values:
        q = p.sel(member=m)
        k = int(q["merge_count"])
        assert (np.diff(q["merge_time"].values[:k]) > 0).all()
        assert (q["merge_from"].values[:k] > q["merge_to"].values[:k]).all()
        assert (q["merge_from"].values[1:k] == q["merge_to"].values[: k - 1]).all()
        levels = q["relative_energy_plateau_level"].values
        assert (np.diff(levels[np.isfinite(levels)]) > 0).all()  # each plateau higher than the last


def test_the_figure_is_drawn_from_results_nc_alone(experiment, tmp_path):
    af.write_results(experiment, tmp_path / "results.nc")
    paths = draw_experiment(af.load_results(tmp_path / "results.nc"), tmp_path)
    assert sorted(p.name for p in paths) == ["metastability.pdf", "metastability.png"]
    assert all(p.stat().st_size > 0 for p in paths)
