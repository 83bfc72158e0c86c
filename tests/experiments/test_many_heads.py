"""Many random heads averaged with 1/H (experiment many_heads), reduced to 8 members and
H = 1, 64 and run through `run_experiment`: the trends of the gallery figure, law by
law (docs/gallery/many_heads.md; tests/README.md)."""

from __future__ import annotations

import numpy as np
import pytest

from attnflow import load_results, write_results
from attnflow.schema._errors import ConfigError
from attnflow.experiments import draw_experiment, run_experiment
from commands import assert_cf

FAST = {"compilation_cache": False, "members": 8, "experiment": {"options": {"heads": [1, 64]}}}


@pytest.fixture(scope="module")
def many_heads():
    return run_experiment("many_heads", FAST)


def test_wishart_heads_reach_one_cluster_later_as_h_grows_and_tied_heads_stop_reaching_it(many_heads):
    ds = many_heads
    assert int(ds["failed_members"].sum()) == 0
    wishart, tied = ds.sel(law="product_wishart"), ds.sel(law="v_plus_qtk")
    time = lambda part, h: float(part["one_cluster_time_median"].sel(heads=h))
    fraction = lambda part, h: float(part["one_cluster_fraction"].sel(heads=h))
    # The held count: the longest plateau's count, or the count at t1 where none holds.
    held = lambda part, h: float(part["metastable_clusters_median"].sel(heads=h))
    # V Wishart (mean sqrt(d) I): every member of 64 heads ends in one cluster, with a
    # held count of 1, and later than with one head (figure, medians of 32 members:
    # time 1.2 at H = 1, 2.0 at H = 64).
    assert fraction(wishart, 64) == 1.0
    assert np.all(wishart["metastable_clusters"].sel(heads=64).values == 1)
    assert time(wishart, 64) > time(wishart, 1) + 0.4, (time(wishart, 1), time(wishart, 64))
    # V = +B/sqrt(d), tied to each head's form (mean zero over the law): one head brings
    # some members into one cluster, later than a Wishart head; 64 heads bring none there,
    # and the held count rises: most tokens have not met by t1 (figure: 2 at H = 1).
    assert fraction(tied, 1) > 0
    assert time(wishart, 1) < time(tied, 1)
    assert fraction(tied, 64) == 0
    assert held(tied, 64) > held(tied, 1) + 4, (held(tied, 1), held(tied, 64))


def test_the_figure_is_drawn_from_the_results_file_which_passes_the_cf_checker(many_heads, tmp_path):
    path = write_results(many_heads, tmp_path / "results.nc")
    assert_cf(tmp_path, path)
    ds = load_results(path)
    paths = draw_experiment(ds, tmp_path)
    assert {p.name for p in paths} == {"many_heads.png", "many_heads.pdf"}


@pytest.mark.parametrize("options, says", [
    ({"heads": [4, 2]}, "must increase"),
    ({"heads": [0, 2]}, "whole numbers >= 1"),
    ({"laws": []}, "non-empty list"),
])
def test_bad_options_are_refused_before_any_run(options, says):
    with pytest.raises(ConfigError, match=says):
        run_experiment("many_heads", {"compilation_cache": False, "experiment": {"options": options}})


def test_the_statistics_on_constructed_cluster_counts():
    import xarray as xr

    from attnflow.analysis.plateaus import detect_metastability
    from attnflow.experiments.many_heads import metastable_count, one_cluster_time

    t = np.array([0.0, 1.0, 2.0, 3.0])
    counts = np.array([[3, 2, 1, 1], [3, 1, 2, 1], [3, 2, 2, 2]])
    np.testing.assert_array_equal(one_cluster_time(counts, t), [2.0, 3.0, np.nan])
    # Log time from 0.01 to 100: 8 tokens, 4 clusters held for three decades, then 1 for one;
    # a member where no two tokens meet; one still merging at the end (no plateau below n).
    t = np.logspace(-2, 2, 41)
    held = np.where(t < 0.02, 8, np.where(t < 30, 4, 1))
    apart = np.full(t.size, 8)
    merging = np.maximum(8 - np.arange(t.size) // 5, 1)
    ds = xr.Dataset({"clusters": (("member", "time"), np.stack([held, apart, merging]).astype(float))},
                    coords={"time": t})
    found = detect_metastability(ds, ["clusters"], clusters=None, sizes=None, origin=0.0)
    count = metastable_count(found, ds["clusters"].isel(time=-1, drop=True), 8)
    np.testing.assert_array_equal(count.values, [4.0, 8.0, float(merging[-1])])
