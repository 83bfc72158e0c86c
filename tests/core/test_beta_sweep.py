"""The default study, the README's opening figure (`experiments/beta_sweep.py`): Q = K = V
= I softmax attention on S^2, n = 32, beta in {0.5, 1, 2, 4, 9}, Euler with
renormalization (h = 0.1) to t = 30. Theorem 4.2 (1) of "A Survey of Continuous Time
Dynamics of Transformers" gives one cluster as t -> infinity for every beta when d >= 3;
what the figure shows at t = 30 is how long that takes. Small beta has collapsed, large
beta sits in a few clusters that merge much later (metastability).

The members are drawn one key per member, so the first 64 members here are the first 64
of the 256 drawn for the figure; the bounds are the figure's shares give or take three
binomial standard deviations of 64 members."""

from __future__ import annotations

import numpy as np
import pytest

import attnflow as af

BETAS = [0.5, 1.0, 2.0, 4.0, 9.0]


@pytest.fixture(scope="module")
def sweep():
    # Exactly the bare `attnflow` study, with 64 of its 256 members.
    return af.run({"members": 64, "compilation_cache": False})


def _final(ds, beta):
    return ds["clusters"].sel(beta=beta).isel(time=-1).values


def test_at_t_30_small_beta_has_collapsed_and_large_beta_holds_several_clusters(sweep):
    ds = sweep
    assert list(ds["beta"].values) == BETAS and ds.sizes["member"] == 64
    assert float(ds["time"][-1]) == 30.0 and np.all(ds["status"].values == 0)
    # beta <= 1: every member is one cluster (256 of 256 in the figure run).
    for beta in (0.5, 1.0):
        assert np.all(_final(ds, beta) == 1), (beta, np.bincount(_final(ds, beta)))
    # beta = 2: most members (230 of 256, 90%), a few still in two clusters.
    share = float(np.mean(_final(ds, 2.0) == 1))
    assert 0.78 <= share <= 0.99, share
    # beta = 4: two clusters in the median member, one cluster in few (14 of 256, 5%).
    assert np.median(_final(ds, 4.0)) == 2
    assert np.mean(_final(ds, 4.0) == 1) <= 0.14, np.bincount(_final(ds, 4.0))
    # beta = 9: no member is one cluster; 4 in the median member, 2 to 6 in all.
    nine = _final(ds, 9.0)
    assert np.all(nine >= 2) and np.all(nine <= 6) and np.median(nine) == 4, np.bincount(nine)
    # The cluster count at t = 30 never falls as beta grows (median member).
    medians = [np.median(_final(ds, beta)) for beta in BETAS]
    assert np.all(np.diff(medians) >= 0), medians


def test_large_beta_clusters_are_metastable_and_merge_later():
    """Theorem 4.2 (1) holds at beta = 4 too: the two clusters seen at t = 30 merge, on a
    time scale of hundreds to thousands (64 members: 22% one cluster at t = 74, 48% at 213,
    78% at 614, 95% at 1770). At beta = 9 the median member still holds 2 clusters at
    t = 2e4 (measured, not tested: a longer run)."""
    ds = af.run({"members": 16, "beta": [4.0], "t1": 3000.0, "saves": 31, "save_spacing": "log",
                 "metrics": ["clusters"], "compilation_cache": False})
    counts = ds["clusters"].sel(beta=4.0).values  # (member, time)
    t = ds["time"].values
    at_30 = counts[:, np.searchsorted(t, 30.0)]
    assert np.mean(at_30 == 1) <= 0.25 and np.median(at_30) == 2, at_30
    assert np.mean(counts[:, -1] == 1) >= 0.75, counts[:, -1]
    # The count of a member never rises (clusters merge, they do not split).
    assert np.all(np.diff(counts[:, np.searchsorted(t, 30.0):], axis=1) <= 0)
