"""The flow-matching surrogate of the attention flow (survey section 5.3), reduced.

A field of time and one token, trained on the training members' (token, image) pairs,
carries the held-out members' tokens to nearly the attention flow's end law, by
nearly straight paths: close at the end, apart on the way."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr
from commands import assert_cf

from attnflow import ConfigError, write_results
from attnflow.experiments import (
    compose_experiment,
    draw_experiment,
    plan_experiment,
    run_experiment,
)
from attnflow.analysis.surrogate import FlowMatchingField

REDUCED = {"members": 64, "experiment": {"options": {"train_steps": 1000, "distance_times": 5}}}


@pytest.fixture(scope="module")
def runs():
    return run_experiment("flow_matching", REDUCED), run_experiment("flow_matching", REDUCED)


def test_surrogate_reaches_the_attention_flows_end_law(runs):
    ds, _ = runs
    end, reference = float(ds["end_distance"]), float(ds["reference_distance"])
    # The two end ensembles of held-out tokens are close on the scale of how far the
    # attention flow moved the tokens: 0.066 against 0.505 here (48 training members,
    # 1000 steps), 0.035 against 0.527 at full size (test_full_size_surrogate below).
    assert end < 0.2 * reference
    assert 0.45 < reference < 0.6, reference
    # The distances are between held-out tokens only, and both flows start from them.
    assert ds.sizes["test_member"] == 16 and ds["test_member"].min() == 48
    assert float(ds["surrogate_distance"][0]) < 1e-3 * reference


def test_surrogate_paths_are_straight_where_attention_paths_are_curved(runs):
    ds, _ = runs
    # On the way, straight chords and arcs on the sphere carry different laws...
    assert float(ds["surrogate_distance"].max()) > 2 * float(ds["end_distance"])
    # ...because the chords cut inside the ball, where the attention flow never goes.
    assert float(ds["surrogate_min_norm"]) < 0.95
    np.testing.assert_allclose(np.linalg.norm(ds["x"].values, axis=-1), 1.0, atol=1e-12)


@pytest.mark.slow
def test_full_size_surrogate():
    """The figure's run (256 members, 2000 steps; about a minute): the Sinkhorn distance of
    the end ensembles is 0.035 against 0.53 between the initial and the final ones; the
    chords dip to |x| = 0.88; on the way the ensembles are up to 0.22 apart."""
    ds = run_experiment("flow_matching", {"compilation_cache": False})
    end, reference = float(ds["end_distance"]), float(ds["reference_distance"])
    assert 0.025 < end < 0.05 and 0.5 < reference < 0.56, (end, reference)
    assert float(ds["surrogate_min_norm"]) < 0.92
    assert float(ds["surrogate_distance"].max()) > 4 * end


def test_training_lowers_the_loss(runs):
    ds, _ = runs
    for name in ("train_loss", "test_loss"):
        loss = ds[name].values
        assert np.isfinite(loss).all()
        assert loss[-100:].mean() < 0.5 * loss[:10].mean(), name


def test_same_seed_same_result(runs):
    first, second = runs
    # Identical but for when they ran (`history`: the time, then the same call).
    times = [ds.attrs["history"].split(" ", 1) for ds in (first, second)]
    assert times[0][1] == times[1][1]
    xr.testing.assert_identical(first.drop_attrs(deep=False).assign_attrs(
        {k: v for k, v in first.attrs.items() if k != "history"}),
        second.drop_attrs(deep=False).assign_attrs({k: v for k, v in second.attrs.items() if k != "history"}))


def test_field_sees_one_token_at_a_time():
    field = FlowMatchingField(3, width=16, depth=2, key=jax.random.key(0), dtype=jnp.float64)
    x = jax.random.normal(jax.random.key(1), (5, 3), jnp.float64)
    others_moved = x.at[jnp.array([0, 1, 3, 4])].multiply(-2.0)
    velocity = jax.jit(lambda x: field(0.3, x))
    np.testing.assert_array_equal(velocity(x)[2], velocity(others_moved)[2])
    assert not np.allclose(velocity(x)[0], velocity(others_moved)[0])


@pytest.mark.parametrize("override, message", [
    ({"beta": [1.0, 4.0]}, "one number"),
    ({"experiment": {"options": {"test_fraction": 1.0}}}, "test_fraction"),
    ({"save_states": False}, "save_states"),
])
def test_bad_settings_stop_early(override, message):
    with pytest.raises(ConfigError, match=message):
        plan_experiment(compose_experiment("flow_matching", override))


def test_draw_from_the_stored_file_which_passes_the_cf_checker(runs, tmp_path):
    ds, _ = runs
    assert_cf(tmp_path, write_results(ds, tmp_path / "results.nc"))
    paths = draw_experiment(xr.load_dataset(tmp_path / "results.nc"), tmp_path)
    assert {p.name for p in paths} == {"flow_matching.png", "flow_matching.pdf"}
    assert all(p.stat().st_size > 0 for p in paths)
