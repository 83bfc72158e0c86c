"""A checkpoint as dynamics over depth: the layer map is the model, smaller steps and
an adaptive solver converge to its continuous-depth limit at the orders of their
schemes, and `attnflow experiment=checkpoint` stores and draws the comparison."""

import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

import attnflow as af
from attnflow.checkpoints import depth_flow, forward, load_checkpoint, run_depth
from checkpoint_models import write_tiny

IDS = np.array([3, 14, 15, 92, 65, 35, 8, 9])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    return {family: load_checkpoint(write_tiny(family, folder / family), dtype="float64")
            for family in ("gpt2", "gpt_neox", "llama", "bert")}


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "llama"])
def test_refined_depth_converges_at_the_order_of_the_scheme(tiny, family):
    checkpoint = tiny[family]
    flow = depth_flow(checkpoint)
    x0 = checkpoint.embed_tokens(jnp.asarray(IDS))
    limit = run_depth(flow, x0, adaptive=True, solver="dopri8", rtol=1e-11, atol=1e-12)
    # Lie-Trotter with Euler sub-steps (and NeoX's plain Euler step): first order, once
    # the steps are small against these random weights.
    errors = [float(jnp.abs(run_depth(flow, x0, steps_per_layer=m)[-1] - limit[-1]).max()) for m in (128, 256, 512)]
    orders = np.log2(np.asarray(errors[:-1]) / np.asarray(errors[1:]))
    assert np.all(np.abs(orders - 1) < 0.2), orders
    if family != "gpt_neox":
        # Strang with RK4 sub-steps: second order.
        errors = [float(jnp.abs(run_depth(flow, x0, steps_per_layer=m, split="strang", solver="rk4")[-1]
                                - limit[-1]).max()) for m in (128, 256, 512)]
        orders = np.log2(np.asarray(errors[:-1]) / np.asarray(errors[1:]))
        assert np.all(np.abs(orders - 2) < 0.3), orders


@pytest.mark.parametrize("interpolation", ["linear", "cubic"])
def test_interpolated_weights_keep_the_layer_map_at_unit_steps(tiny, interpolation):
    checkpoint = tiny["llama"]
    x0 = checkpoint.embed_tokens(jnp.asarray(IDS))
    exact = forward(checkpoint, IDS).hidden
    np.testing.assert_allclose(run_depth(depth_flow(checkpoint, interpolation), x0), exact, rtol=1e-12, atol=1e-12)
    # Between layers the interpolated weights differ from the held ones.
    held = run_depth(depth_flow(checkpoint), x0, steps_per_layer=4)
    moving = run_depth(depth_flow(checkpoint, interpolation), x0, steps_per_layer=4)
    assert float(jnp.abs(held[-1] - moving[-1]).max()) > 1e-6


def test_post_ln_refuses_an_adaptive_solve_and_parallel_refuses_a_split(tiny):
    x0 = tiny["bert"].embed_tokens(jnp.asarray(IDS))
    with pytest.raises(af.ConfigError, match="post-LN"):
        run_depth(depth_flow(tiny["bert"]), x0, adaptive=True)
    with pytest.raises(af.ConfigError, match="parallel"):
        run_depth(depth_flow(tiny["gpt_neox"]), x0, split="strang")
    with pytest.raises(af.ConfigError, match="steps_per_layer"):
        run_depth(depth_flow(tiny["bert"]), x0, steps_per_layer=0)


def test_checkpoint_experiment_on_minilm(tmp_path):
    overrides = {"checkpoint": "minilm", "text": "Attention moves tokens on a sphere.",
                 "experiment": {"options": {"steps": [1, 2], "probes": False}}}
    ds = af.run_experiment("checkpoint", overrides)
    n = ds.sizes["token"]
    assert ds.hidden.dims == ("layer", "token", "dim") and ds.sizes["layer"] == 7 and ds.sizes["dim"] == 384
    assert str(ds.token_string.values[0]) == "[CLS]" and str(ds.token_string.values[-1]) == "[SEP]"
    # One step per layer is the model; the refined run is not.
    np.testing.assert_allclose(ds.simulated.sel(run="dt=1"), ds.hidden, rtol=1e-5, atol=1e-5)
    assert float(ds.depth_error.sel(run="dt=1").max()) < 1e-5
    assert float(ds.depth_error.sel(run="dt=1/2").isel(layer=-1)) > 1e-3
    assert "adaptive" not in ds.run.values  # post-LN: no unsplit field
    assert float(np.abs(ds.cosine_distance.sel(source="model")).max()) < 1e-6
    np.testing.assert_allclose(ds.pair_cosines.sum("bin"), 1.0, rtol=1e-5)
    assert set(np.unique(ds.clusters.values)) <= set(range(1, n + 1))
    np.testing.assert_allclose(ds.attention.sum("key"), 1.0, rtol=1e-5)
    # The theory run stays on the sphere and its energy does not decrease (beta = 1).
    theory = ds.simulated.sel(run="theory").values
    np.testing.assert_allclose(np.linalg.norm(theory, axis=-1), 1.0, rtol=1e-5)
    assert np.all(np.diff(ds.energy.sel(source="theory").values) >= -1e-6)
    paths = af.draw_experiment(ds, tmp_path)
    assert {p.name for p in paths} >= {"depth.png", "pair_cosines.png", "attention.png"}


def test_checkpoint_experiment_refuses_bad_input_in_one_sentence(tmp_path):
    with pytest.raises(af.ConfigError, match="text"):
        af.run_experiment("checkpoint", {"checkpoint": "minilm", "text": "  "})
    with pytest.raises(af.ConfigError, match="experiments on trained models only"):
        af.run({"checkpoint": "minilm"})
    missing = tmp_path / "nowhere"
    proc = subprocess.run([sys.executable, "-m", "attnflow.cli", "experiment=checkpoint", f"checkpoint={missing}",
                           f"hydra.run.dir={tmp_path / 'run'}"], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and str(missing) in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 2, proc.stderr
