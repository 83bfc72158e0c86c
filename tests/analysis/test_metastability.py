"""Metastability: the plateau and merge detector on series whose plateaus, partitions and
merges are known (and on drifts, which have no plateau), and the experiment: two clusters
persist, then merge when the two-cluster reduction says; the published energy staircase
climbs the levels of its cluster partitions."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
import yaml
from commands import assert_cf
from systems import published_staircase

import attnflow as af
from attnflow.experiments import draw_experiment, run_experiment
from attnflow.experiments.metastability import STAIRCASE, merge_brackets, published_angles

# t0 = 0, then 20 samples per decade from 1e-2 to 1e4 (sample k >= 1 at 10^(-2 + (k-1)/20)).
T = np.concatenate([[0.0], np.geomspace(1e-2, 1e4, 121)])
LOG_T = np.log10(T[1:])


def staircase(centres, heights, width):
    """Steps of the given heights, smooth over log t: tanh((log10 t - centre) / width)."""
    s = np.zeros(T.size)
    for centre, height in zip(centres, heights):
        s[1:] += height * 0.5 * (1 + np.tanh((LOG_T - centre) / width))
    return s


def brute_force_plateaus(t, s, tol, min_length):
    """The definition, window by window: the longest window spanning at most tol * range
    (earliest among equals) lasting min_length is a plateau; then left and right of it."""
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
        if best is not None and log_t[best[1]] - log_t[best[0]] >= min_length:
            found.append(best)
            pending += [(lo, best[0] - 1), (best[1] + 1, hi)]
    return sorted((keep[i], keep[j]) for i, j in found)


def test_plateaus_of_a_sharp_noisy_staircase_are_its_steps():
    rng = np.random.default_rng(0)
    levels = np.repeat([0.0, 1.0, 3.0, 4.0], [31, 40, 25, 26])  # steps after samples 30, 70, 95
    s = levels + rng.uniform(-0.01, 0.01, T.size)  # noise far inside tol * range = 0.08
    p = af.plateaus(T, s, tol=0.02, min_length=0.5)
    np.testing.assert_array_equal(p.first, [1, 31, 71, 96])  # sample 0 (t = t0) has no log time
    np.testing.assert_array_equal(p.last, [30, 70, 95, 121])
    np.testing.assert_array_equal(p.start, T[p.first])
    np.testing.assert_allclose(p.level, [0, 1, 3, 4], atol=0.01)
    # a stricter tolerance than the noise finds nothing; a longer minimum keeps only the
    # one step lasting 39/20 decades (the others last 29/20, 24/20 and 25/20)
    assert len(af.plateaus(T, s, tol=0.001).first) == 0
    np.testing.assert_array_equal(af.plateaus(T, s, min_length=1.5).first, [31])


@pytest.mark.parametrize("noise", [0.0, 0.003])
def test_plateaus_of_smooth_steps_are_the_windows_of_the_definition(noise):
    s = staircase([-0.5, 1.5, 2.75], [1.0, 2.0, 1.0], width=0.15)
    s += noise * np.random.default_rng(1).standard_normal(T.size)
    p = af.plateaus(T, s, tol=0.02, min_length=0.5)
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
    p = af.plateaus(T, s, tol=0.02, min_length=0.5)
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
    m = af.merges(T, counts, hold_length=0.2)
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
    with pytest.raises(ValueError, match="hold_length must be a number of decades >= 0"):
        af.merges([1.0, 2.0], [2, 1], hold_length=-1)
    with pytest.raises(ValueError, match="the Dataset has no variable 'clusters'"):
        af.detect_metastability(xr.Dataset({"energy": ("time", [1.0, 2.0])}, coords={"time": [1.0, 2.0]}),
                                ["energy", "clusters"])


    with pytest.raises(ValueError, match="axis must be one of log, linear"):
        af.plateaus([1.0, 2.0], [0.0, 0.0], axis="loglog")
    with pytest.raises(ValueError, match="sizes must have one row of cluster sizes per time"):
        af.plateaus([1.0, 2.0], [0.0, 0.0], sizes=[[1, 1]])
    with pytest.raises(ValueError, match=r"min_length=0.01 must exceed tol times the span of the linear axis"):
        af.plateaus(np.linspace(0, 1, 11), np.zeros(11), axis="linear", min_length=0.01)


# Linear time: 201 samples on [0, 1] (a run in rescaled time).
S = np.linspace(0.0, 1.0, 201)


def _sizes(*runs):
    """Cluster-size rows (zero-padded to 5 tokens), `(partition, samples)` in turn."""
    rows = [list(partition) + [0] * (5 - len(partition)) for partition, count in runs for _ in range(count)]
    return np.array(rows)


def test_plateaus_hold_while_the_partition_holds_and_carry_its_level():
    rng = np.random.default_rng(2)
    sizes = _sizes(((2, 1, 1, 1), 60), ((3, 1, 1), 60), ((3, 2), 81))
    s = np.repeat([0.28, 0.44, 0.52], [60, 60, 81]) + rng.uniform(-1e-3, 1e-3, S.size)
    s[55:60] = np.linspace(0.30, 0.43, 5)  # the approach before a merge: a ramp inside (2, 1, 1, 1)
    p = af.plateaus(S, s, sizes=sizes, tol=0.02, min_length=0.05, axis="linear")
    assert p.partition.tolist() == [[2, 1, 1, 1, 0], [3, 1, 1, 0, 0], [3, 2, 0, 0, 0]]
    np.testing.assert_allclose(p.partition_level, [7 / 25, 11 / 25, 13 / 25], rtol=1e-15)
    np.testing.assert_allclose(p.level, [0.28, 0.44, 0.52], atol=1e-3)
    assert p.first.tolist() == [0, 60, 120] and p.last.tolist() == [54, 119, 200]  # the ramp is not held
    np.testing.assert_allclose(af.partition_level([[2, 1, 1, 1, 0], [5, 0, 0, 0, 0], [8, 8, 0, 0, 0]]),
                               [7 / 25, 1.0, 0.5])
    # a flat series is cut where its partition changes: one plateau per partition held
    flat = af.plateaus(S, np.full(S.size, 0.5), sizes=_sizes(((8, 8), 100), ((16,), 101)), min_length=0.05,
                       axis="linear")
    assert flat.first.tolist() == [0, 100] and flat.partition[:, :2].tolist() == [[8, 8], [16, 0]]


def test_a_drift_is_never_a_plateau():
    # changing steadily: a ramp on the linear axis, or in log time on the log axis, whatever
    # the partition does, and with the defaults of either axis
    rng = np.random.default_rng(3)
    ramp = S + 1e-4 * rng.standard_normal(S.size)
    held = _sizes(((3, 2), S.size))
    assert af.plateaus(S, ramp, sizes=held, tol=0.02, min_length=0.05, axis="linear").first.size == 0
    assert af.plateaus(T, np.log10(np.maximum(T, 1e-2))).first.size == 0
    # changing while no partition holds: a flat series whose partition flickers sample by
    # sample has no plateau, where the same series with its partition held is one
    flicker = _sizes(*[(((3, 2), 1), ((2, 2, 1), 1))[k % 2] for k in range(S.size)])
    flat = np.full(S.size, 0.4)
    assert af.plateaus(S, flat, sizes=flicker, min_length=0.05, axis="linear").first.size == 0
    assert af.plateaus(S, flat, sizes=held, min_length=0.05, axis="linear").first.size == 1
    # steady steps between plateaus: the ramps between the levels of a staircase are no
    # plateaus, whatever the partition says during them
    stairs = np.interp(S, [0, 0.2, 0.3, 0.5, 0.6, 1.0], [0.2, 0.2, 0.6, 0.6, 1.0, 1.0])
    p = af.plateaus(S, stairs, sizes=held, tol=0.02, min_length=0.05, axis="linear")
    np.testing.assert_allclose(p.level, [0.2, 0.6, 1.0])
    assert all(np.ptp(stairs[a : b + 1]) <= 0.02 * 0.8 for a, b in zip(p.first, p.last))


@pytest.fixture(scope="module")
def experiment(xla_optimizations):
    # The figure's setup for its first 4 members (members 0-3 of the 16 drawn: the member
    # keys do not depend on the member count): panel (a) at beta = 10 to t = 1e5, and
    # the published staircase (6 betas) in full.
    with xla_optimizations():
        return run_experiment("metastability", {"members": 4, "compilation_cache": False})


def test_the_staircase_climbs_the_partition_levels_of_the_published_setup(experiment):
    ds = experiment
    assert ds["staircase_time"].attrs["description"].startswith("saved times: rescaled time s, not t")
    assert ds["staircase_time"].attrs["long_name"] == "saved times"
    partitions = [list(p) + [0] * (5 - len(p)) for p in STAIRCASE]
    levels = list(STAIRCASE.values())
    for b, beta in enumerate(ds["beta"].values):
        count = int(ds["staircase_relative_energy_plateau_count"][b])
        assert count == 4  # four plateaus, no drift among them
        assert ds["staircase_relative_energy_plateau_partition"].values[b, :count].tolist() == partitions
        np.testing.assert_allclose(ds["staircase_relative_energy_plateau_partition_level"].values[b, :count], levels,
                                   rtol=1e-15)
        measured = ds["staircase_relative_energy_plateau_level"].values[b, :count]
        if beta >= 1000:  # clusters well separated: the measured levels are the partitions' to 1e-3
            np.testing.assert_allclose(measured, levels, atol=1e-3)
        else:  # beta = 500: the clusters still interact; the first level sits above 7/25
            np.testing.assert_allclose(measured, [0.2845, *levels[1:]], atol=1e-3)
        merges = ds["staircase_merge_from"].values[b].tolist(), ds["staircase_merge_to"].values[b].tolist()
        assert merges == ([5, 4, 3, 2], [4, 3, 2, 1])
    # at beta = 4000 the levels are 7/25, 11/25, 13/25 and 1 to 1e-8
    np.testing.assert_allclose(ds["staircase_relative_energy_plateau_level"].values[-1], levels, atol=1e-8)
    # the staircase is complete by s = 0.125 (its last merge between s = 0.09 and 0.125),
    # earlier the larger beta is
    last = ds["staircase_merge_time"].values[:, -1]
    assert (0.09 < last).all() and (last < 0.125).all() and (np.diff(last) < 0).all()


def test_the_staircase_is_that_of_the_published_algorithm(experiment):
    # The published procedure in angles (tests/systems.py), against attnflow's run on the
    # sphere with its own collisions: the plateau levels over the detected windows agree
    # to 1e-4 and the energy crosses the middles between levels within 5e-4 of s.
    ds = experiment
    s = ds["staircase_time"].values
    middles = [(7 / 25 + 11 / 25) / 2, (11 / 25 + 13 / 25) / 2, (13 / 25 + 1) / 2]
    references = published_staircase(published_angles(), ds["beta"].values, 20000)  # every beta in one loop
    for b, reference in enumerate(references):
        at = np.r_[np.nan, reference[9::10]]  # after 10 k steps: s = k 1e-4, the saved times
        ours = ds["staircase_energy"].values[b]
        starts, ends = (ds[f"staircase_relative_energy_plateau_{f}"].values[b] for f in ("start", "end"))
        for a, e, level in zip(starts, ends, ds["staircase_relative_energy_plateau_level"].values[b]):
            assert abs(np.median(at[(s >= a) & (s <= e)]) - level) < 1e-4
        for middle in middles:
            published = 1e-5 * (1 + np.argmax(reference > middle))
            assert abs(s[np.argmax(ours > middle)] - published) < 5e-4


def test_the_staircase_starts_at_the_published_angles(experiment):
    panel = yaml.safe_load(experiment.attrs["panel_configs"])["staircase"]
    size = np.log(2000) / np.sqrt(2000)
    angles = 0.5 * np.array([0.0, 0.5, 2.0, 4.0, 7.0]) * size
    value = np.array(panel["init"]["value"])
    np.testing.assert_allclose(np.arctan2(value[:, 1], value[:, 0]), angles, rtol=1e-15, atol=1e-17)
    np.testing.assert_allclose(published_angles(), angles, rtol=1e-15)
    assert panel["beta"] == [500.0, 1000.0, 1500.0, 2000.0, 3000.0, 4000.0] and panel["attention_kind"] == "usa"
    assert panel["time_change"] == {"speed": "log_beta", "collisions": 1e-3} and panel["dt"] == 1e-5
    np.testing.assert_allclose(experiment["staircase_angles"].values[:, 0], np.tile(angles, (6, 1)), atol=1e-15)


def test_two_clusters_form_persist_then_merge_when_the_reduction_says(experiment):
    ds = experiment
    before, after, predicted = merge_brackets(ds)
    for m in ds["member"].values:
        q = ds.sel(member=m)
        k = int(q["merge_count"])
        to, times = q["merge_to"].values[:k], q["merge_time"].values[:k]
        assert to[-1] == 1 and q["merge_from"].values[k - 1] == 2
        formed = times[np.flatnonzero(to == 2)[0]]
        assert 1.5 < formed < 2.45  # two clusters by t = 1.5 to 2.4
        assert 2.3 < np.log10(times[-1] / formed) < 3.4  # that persist 2.3 to 3.4 decades, then merge
        parts = q["relative_energy_plateau_partition"].values
        levels = q["relative_energy_plateau_level"].values
        held = np.isfinite(levels)
        assert parts[held, :2].tolist() == [[8, 8], [16, 0]]  # the plateaus: two clusters of 8, then one
        np.testing.assert_allclose(levels[held], [0.5, 1.0], atol=1e-4)
        assert 400 < times[-1] < 5000
        # the two-cluster reduction's merge time lies between the samples around the detected
        # merge (40 samples a decade: 6%)
        assert before[m] <= predicted[m] <= after[m]


def test_the_figure_is_drawn_from_results_nc_alone_which_passes_the_cf_checker(experiment, tmp_path):
    assert_cf(tmp_path, af.write_results(experiment, tmp_path / "results.nc"))
    paths = draw_experiment(af.load_results(tmp_path / "results.nc"), tmp_path)
    assert sorted(p.name for p in paths) == ["metastability.pdf", "metastability.png"]
    assert all(p.stat().st_size > 0 for p in paths)


@pytest.mark.parametrize("options, message", [
    ({"staircase_detector": {"min_length": 0.003}}, r"min_length=0.003 must exceed tol x the span of the time axis"),
    ({"staircase": 3}, "experiment.options.staircase must be a mapping"),
])
def test_bad_experiment_options_are_one_sentence_before_solving(options, message):
    with pytest.raises(af.ConfigError, match=message):
        run_experiment("metastability", {"experiment": {"options": options}})
