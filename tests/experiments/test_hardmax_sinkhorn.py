"""The hardmax_sinkhorn experiment, reduced (12 tokens, 4 members, t1 = 10, two betas,
two k-gons): every claim of docs/gallery/hardmax_sinkhorn.md at a smaller size. The
softmax and Sinkhorn cluster counts grow with beta, hardmax with self-attention is
frozen, hardmax without it merges tokens, every case starts from the same tokens, the
Sinkhorn columns sum to 1 within the tolerance, and in the k-gons the vertices stay put
while interior tokens run straight to the vertex of their (Voronoi) cell."""

from __future__ import annotations

import numpy as np
import pytest

from attnflow.experiments import draw_experiment, run_experiment

REDUCED = {"n": 12, "members": 4, "t1": 10.0, "beta": [1.0, 16.0], "compilation_cache": False,
           "experiment": {"options": {"polygons": 2, "interior": 8}}}


@pytest.fixture(scope="module")
def reduced():
    return run_experiment("hardmax_sinkhorn", REDUCED)


def test_cluster_counts_and_pair_cosines(reduced):
    ds = reduced
    assert float(ds["initial_token_spread"]) == 0.0  # the same initial tokens in every case
    final, initial = ds["final_clusters"], ds["initial_clusters"]
    for family in ("softmax", "sinkhorn"):
        low, high = (final.sel(case=f"{family} beta={b:g}").values for b in (1.0, 16.0))
        assert np.median(high) > np.median(low), (family, low, high)
        # Softmax and Sinkhorn agree within one cluster in every member at both betas.
    for b in (1.0, 16.0):
        soft, sink = (final.sel(case=f"{f} beta={b:g}").values for f in ("softmax", "sinkhorn"))
        assert np.all(np.abs(soft - sink) <= 1), (b, soft, sink)
    np.testing.assert_array_equal(final.sel(case="hardmax"), initial.sel(case="hardmax"))  # frozen
    assert np.all(final.sel(case="hardmax_no_self").values < initial.sel(case="hardmax_no_self").values)
    hist = ds["pair_cosine_histogram"]
    np.testing.assert_allclose(hist.sum("cosine"), 1.0)
    # One cluster at beta = 1: every pair in the top bin.
    assert float(hist.sel(case="softmax beta=1").isel(cosine=-1)) == pytest.approx(1.0)
    tol = 1e-2
    sinkhorn = ds["sinkhorn_marginal_error"].sel(case=[c for c in ds["case"].values if c.startswith("sinkhorn")])
    assert np.all(sinkhorn.values <= tol), sinkhorn.values


def test_kgon_tokens_run_straight_to_the_vertex_of_their_voronoi_cell(reduced):
    ds = reduced
    assert float(ds["kgon_vertex_motion"]) < 1e-6
    assert float(ds["kgon_line_error"]) < 1e-6
    k = ds.sizes["vertex"]
    vertices, x0 = ds["kgon_vertices"].values, ds["kgon_x"].isel(grid=0).values[:, k:]
    nearest = np.argmin(np.linalg.norm(x0[:, :, None] - vertices[:, None], axis=-1), axis=-1)
    np.testing.assert_array_equal(ds["kgon_cell"].values, nearest)
    final = ds["kgon_x"].isel(grid=-1).values[:, k:]
    target = np.take_along_axis(vertices, ds["kgon_cell"].values[..., None], axis=1)
    t1 = float(ds["grid"][-1])
    assert np.max(np.linalg.norm(final - target, axis=-1)) < 2 * np.exp(-t1) + 1e-6


def test_draw_writes_the_figure(reduced, tmp_path):
    paths = draw_experiment(reduced, tmp_path)
    assert {p.name for p in paths} >= {"hardmax_sinkhorn.png"}
