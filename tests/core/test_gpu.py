"""GPUs: float32 products at full precision by default, a key to trade it for speed, and
chunks sized to the device's memory.

The rules are tested here on any machine (as functions of the backend, the memory and
a member's footprint); the tests marked `gpu` run the real thing and are skipped, with
the reason, where JAX sees no GPU.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnflow as af
from attnflow.running._study import prepare_jax, use_matmul_precision

gpu = pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU (JAX's backend here is "
                         f"{jax.default_backend()}); install attnflow[cuda] on a machine with one")


@pytest.fixture
def restore_precision():
    before = jax.config.jax_default_matmul_precision
    yield
    jax.config.update("jax_default_matmul_precision", before)


def test_matmul_precision_is_set_on_accelerators_only(restore_precision):
    jax.config.update("jax_default_matmul_precision", None)
    use_matmul_precision("default", platform="cpu")
    assert jax.config.jax_default_matmul_precision is None  # a CPU multiplies float32 in full anyway
    for precision in ("highest", "high", "default"):
        use_matmul_precision(precision, platform="gpu")
        assert jax.config.jax_default_matmul_precision == precision
    assert af.validate_config({}).matmul_precision == "highest"
    with pytest.raises(af.ConfigError, match="matmul_precision must be one of highest, high, default"):
        af.validate_config({"matmul_precision": "tf32"})


def test_the_chunk_on_an_accelerator_follows_its_memory():
    """The plan of a GPU (here: its rule, given a GPU's platform name and memory) solves
    every pair at once when the device holds them, and fewer as the memory shrinks."""
    from attnflow.running._ensemble import _pieces

    cfg = af.validate_config(dict(n=32, d=8, members=2048, beta=1.0, dtype="float32", metrics=["pair_density"],
                                  t1=1.0, dt=0.1, saves=11))
    keys = jax.random.split(jax.random.key(0), cfg.members)
    plan = af.running._ensemble.EnsemblePlan(af.build_system(cfg), keys, np.asarray([1.0], np.float32),
                                     af.time_grid(t1=1.0, dt=0.1, save_every=1), solver="euler_renorm")
    member, footprint = plan.member, plan.footprint
    roomy = _pieces(member, footprint, 2048, 1, None, 80 * 2**30, "gpu")
    assert roomy == (2048, 1)
    small = 64 * 4 * footprint.working  # a quarter of it holds 64 members
    size, pieces = _pieces(member, footprint, 2048, 1, None, max(small, 4 * footprint.total), "gpu")
    assert size <= 64 and pieces * size >= 2048


@gpu
def test_a_run_on_a_gpu_uses_the_highest_precision_by_default(restore_precision):
    prepare_jax(af.validate_config({}))
    assert jax.config.jax_default_matmul_precision == "highest"
    study = af.resolve_study(dict(n=32, d=8, members=64, beta=1.0, t1=1.0, dt=0.1, saves=2, dtype="float32"))
    plan = af.running._study.plan_study(study)
    from attnflow.running._ensemble import available_memory, default_chunk

    assert plan.piece_size == min(64, default_chunk("gpu", available_memory(), plan.footprint))


def _phase_states(precision: str, dtype: str) -> np.ndarray:
    """The final states of the d = 64 phase-diagram system (beta = 4, 100 Euler steps)
    from one start given in float64 (the same numbers in both dtypes: a start drawn in
    each dtype would be two different samples), with float32 products at `precision`."""
    start = np.random.default_rng(0).standard_normal((32, 64))
    start /= np.linalg.norm(start, axis=1, keepdims=True)
    cfg = af.validate_config(dict(n=32, d=64, members=4, beta=4.0, t1=10.0, dt=0.1, saves=2, dtype=dtype,
                                  init=dict(kind="given", value=start.tolist()), save_states=True,
                                  metrics=["energy"], matmul_precision=precision, compilation_cache=False))
    prepare_jax(cfg)
    return af.run(cfg)["x"].values[:, -1].astype(np.float64)


@gpu
def test_float32_on_a_gpu_drifts_from_float64_as_its_matmul_precision_says(restore_precision):
    """Against float64, the highest precision keeps the float32 run at float32 rounding;
    TensorFloat-32 products (precision "default" on an NVIDIA GPU from compute
    capability 8.0) drift by orders of magnitude more."""
    reference = _phase_states("highest", "float64")
    highest = np.abs(_phase_states("highest", "float32") - reference).max()
    fast = np.abs(_phase_states("default", "float32") - reference).max()
    print(f"float32 against float64: {highest:.2e} at precision highest, {fast:.2e} at default")
    assert highest < 1e-4
    capability = float(getattr(jax.devices()[0], "compute_capability", "0") or 0)
    if capability >= 8.0:  # TF32 hardware: 10 mantissa bits instead of 23
        assert fast > 10 * highest
    else:
        assert fast < 1e-4
