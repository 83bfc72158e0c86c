"""Ensembles, schedules, initial conditions and the config-driven study."""

import collections
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnflow as af


def _small(**overrides):
    cfg = dict(n=6, d=3, members=5, beta=[0.5, 2.0], t1=2.0, dt=0.1, saves=5, dtype="float64")
    cfg.update(overrides)
    return cfg


# --- ensembles -----------------------------------------------------------------------


def test_vmap_over_members_equals_a_python_loop():
    cfg = af.validate_config(_small(weights={"shared": False, "q": {"kind": "random"}, "k": {"kind": "random"}},
                                    metrics=["energy", "pair_density", "clusters"], save_states=True))
    system = af.build_system(cfg)
    keys = jax.random.split(jax.random.key(3), cfg.members)
    betas = jnp.asarray([0.5, 2.0])
    batched = af.solve_ensemble(system, keys, betas, t1=2.0, dt=0.1, save_every=5, solver="rk4")

    @jax.jit  # one member's solve, compiled once for the loop (an eager call compiles each time)
    def member(key, beta):
        field, y0, rec = system(key, beta)
        return af.simulate(field, y0, t1=2.0, dt=0.1, save_every=5, solver="rk4", record=rec)

    for b, beta in enumerate(betas):
        for m, key in enumerate(keys):
            one = member(key, beta)
            for name in ("x", "energy", "pair_density", "clusters"):
                np.testing.assert_allclose(batched.stats[name][b, m], one.stats[name], rtol=1e-12, atol=1e-13)


def test_chunked_ensemble_equals_one_vmap():
    cfg = af.validate_config(_small(members=7, save_states=True))
    system = af.build_system(cfg)
    keys = jax.random.split(jax.random.key(4), 7)
    run = lambda chunk: af.solve_ensemble(system, keys, jnp.asarray([0.5, 2.0]), t1=2.0, dt=0.1, save_every=5,
                                          solver="heun", chunk_size=chunk).stats["x"]
    whole = run(None)
    np.testing.assert_allclose(run(3), whole, rtol=1e-13)
    np.testing.assert_allclose(run(14), whole, rtol=1e-13)


def test_beta_sweep_compiles_once():
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kw: compiles.append(event) if event == "/jax/core/compile/backend_compile_duration" else None
    )
    cfg = af.validate_config(_small(n=5, members=3, d=4, metrics=["energy"]))
    system = af.build_system(cfg)
    keys = jax.random.split(jax.random.key(5), 3)
    solve = lambda betas: af.solve_ensemble(system, keys, jnp.asarray(betas), t1=2.0, dt=0.1, save_every=5,
                                            solver="euler_renorm")
    first = solve([1.0, 2.0])
    before = len(compiles)
    assert before > 0  # the listener sees compilations
    second = solve([3.0, 9.0])
    third = solve([0.1, 0.2])
    assert len(compiles) == before, "a new beta recompiled the ensemble"
    assert not np.allclose(first.stats["energy"], second.stats["energy"])
    assert third.stats["energy"].shape == first.stats["energy"].shape
    # run(config) with other betas (same count) reuses the same program too.
    af.run(_small(n=5, members=3, d=4, metrics=["energy"], beta=[1.0, 2.0], solver="euler_renorm"))
    before = len(compiles)
    af.run(_small(n=5, members=3, d=4, metrics=["energy"], beta=[4.0, 5.0], solver="euler_renorm"))
    solve_compiles = len(compiles) - before
    assert solve_compiles <= 2, solve_compiles  # at most small host-side helpers, not the solve


def test_same_seed_same_result_and_other_seed_differs():
    a = af.run(_small(seed=1))
    b = af.run(_small(seed=1))
    c = af.run(_small(seed=2))
    np.testing.assert_array_equal(a["energy"].values, b["energy"].values)
    assert not np.array_equal(a["energy"].values, c["energy"].values)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dtypes(dtype):
    ds = af.run(_small(dtype=dtype, save_states=True, beta=1.0))
    assert ds["x"].dtype == np.dtype(dtype)
    assert ds["energy"].dtype == np.dtype(dtype)
    assert "beta" not in ds.dims and float(ds["beta"]) == 1.0
    np.testing.assert_allclose(np.linalg.norm(ds["x"].values, axis=-1), 1.0, atol=1e-6 if dtype == "float32" else 1e-13)


def test_shared_and_per_member_weights():
    def q_of(shared):
        cfg = af.validate_config(_small(weights={"shared": shared, "q": {"kind": "random", "law": "goe"}}))
        system = af.build_system(cfg)
        keys = jax.random.split(jax.random.key(6), 2)
        return [np.asarray(system(k, 1.0)[0].terms[0].query(0.0)) for k in keys]

    a, b = q_of(True)
    np.testing.assert_array_equal(a, b)
    a, b = q_of(False)
    assert not np.allclose(a, b)


def test_output_times_on_the_grid_unless_exact_times_are_asked_for():
    # 20 steps and saves=4: the stride 7 records at t = 0, 0.7, 1.4 and 2 on the step
    # grid (the times used are the coordinate); exact_times gives 0, 2/3, 4/3, 2,
    # interpolated between the grid states and retracted to the sphere.
    grid = af.run(_small(saves=4, beta=1.0, save_states=True))
    np.testing.assert_allclose(grid["time"].values, [0.0, 0.7, 1.4, 2.0])
    every = af.run(_small(saves=21, beta=1.0, save_states=True))
    np.testing.assert_array_equal(grid["x"].values, every["x"].sel(time=grid["time"].values, method="nearest").values)
    exact = af.run(_small(saves=4, beta=1.0, save_states=True, exact_times=True))
    np.testing.assert_allclose(exact["time"].values, np.linspace(0, 2, 4))
    np.testing.assert_allclose(np.linalg.norm(exact["x"].values, axis=-1), 1.0, atol=1e-13)
    np.testing.assert_allclose(exact["x"].values[:, -1], grid["x"].values[:, -1], atol=1e-14)
    log = af.run(_small(saves=6, save_spacing="log", beta=1.0, adaptive=True, solver="tsit5", t1=50.0))
    t = log["time"].values
    assert t[0] == 0 and np.isclose(t[-1], 50) and np.allclose(np.diff(np.log(t[1:])), np.log(t[2] / t[1]))


# --- schedules -----------------------------------------------------------------------


def test_piecewise_constant_switches_at_the_given_times():
    s = af.PiecewiseConstant(jnp.asarray([1.0, 5.0]), jnp.asarray([10.0, 20.0, 30.0]))
    assert [float(s(t)) for t in (0.0, 0.999, 1.0, 4.9, 5.0, 7.0)] == [10, 10, 20, 20, 30, 30]
    with pytest.raises(af.ConfigError, match="needs 3 pieces"):
        af.PiecewiseConstant(jnp.asarray([1.0, 5.0]), jnp.asarray([1.0, 2.0]))


def test_value_sign_flip_and_polynomial_magnitude_from_config():
    cfg = af.validate_config(_small(weights={"v": {"kind": "identity", "switch_times": [5.0], "factors": [1.0, -1.0]},
                                             "q": {"kind": "identity", "poly": [0.0, 0.0, 0.5]}}))
    field = af.build_field(cfg, jax.random.key(0), 1.0, jnp.float64)
    attention = field.terms[0]
    np.testing.assert_allclose(attention.value(4.99)[0], np.eye(3))
    np.testing.assert_allclose(attention.value(5.0)[0], -np.eye(3))
    np.testing.assert_allclose(attention.query(2.0)[0], 2.0 * np.eye(3))  # 0.5 t^2 at t = 2
    x = af.UniformSphere()(jax.random.key(1), 6, 3, jnp.float64)
    # V -> -V flips the attention term exactly (the weights do not involve V).
    unflipped = af.build_field(af.validate_config(_small(weights={"q": {"kind": "identity", "poly": [0, 0, 0.5]}})),
                               jax.random.key(0), 1.0, jnp.float64)
    np.testing.assert_allclose(field(6.0, x), -unflipped(6.0, x), rtol=1e-12)


def test_periodic_redraw_and_random_laws():
    cfg = af.validate_config(_small(t1=3.0, d=4, weights={"k": {"kind": "random", "law": "goe", "redraw_every": 1.0},
                                                          "v": {"kind": "random", "law": "wishart"}}))
    attention = af.build_field(cfg, jax.random.key(2), 1.0, jnp.float64).terms[0]
    k = [np.asarray(attention.key(t))[0] for t in (0.0, 0.5, 1.0, 2.5)]
    np.testing.assert_array_equal(k[0], k[1])
    assert not np.allclose(k[1], k[2]) and not np.allclose(k[2], k[3])
    for m in k:
        np.testing.assert_allclose(m, m.T)  # GOE: symmetric
    v = np.asarray(attention.value(0.0))[0]
    np.testing.assert_allclose(v, v.T, atol=1e-14)
    assert np.linalg.eigvalsh(v).min() > -1e-12  # Wishart: positive semi-definite


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_value_tied_to_query_key(sign):
    cfg = af.validate_config(_small(weights={"q": {"kind": "random"}, "k": {"kind": "random"},
                                             "v": {"kind": "tied", "sign": sign}}, heads=2))
    attention = af.build_field(cfg, jax.random.key(3), 1.0, jnp.float64).terms[0]
    q, k, v = (np.asarray(s(0.0)) for s in (attention.query, attention.key, attention.value))
    for h in range(2):
        np.testing.assert_allclose(v[h], sign * q[h].T @ k[h], rtol=1e-12)


# --- initial conditions --------------------------------------------------------------


def test_initial_conditions():
    key = jax.random.key(7)
    centres = jnp.asarray([[1.0, 0, 0], [0, 0, 1.0]])
    given = jnp.arange(6.0).reshape(2, 3)

    @jax.jit  # every draw in one program (one compile; eager draws compile op by op)
    def draws(key):
        return (af.UniformSphere()(key, 4000, 3, jnp.float64), af.Orthonormal()(key, 3, 5, jnp.float64),
                af.SphericalCaps(2, jnp.asarray(0.2), centres)(key, 50, 3, jnp.float64),
                af.UniformCube(jnp.asarray(-2.0), jnp.asarray(2.0))(key, 500, 3, jnp.float64),
                af.GaussianMixture(2, jnp.asarray(0.01), jnp.asarray(1.0), centres)(key, 40, 3, jnp.float64),
                af.Given(given)(key, 2, 3, jnp.float64))

    u, orthonormal, caps, cube, mix, drawn = map(np.asarray, draws(key))
    np.testing.assert_allclose(np.linalg.norm(u, axis=1), 1.0, rtol=1e-12)
    assert np.abs(u.mean(0)).max() < 0.05  # uniform: mean ~ 0 (std 1/sqrt(3 * 4000))
    np.testing.assert_array_equal(orthonormal, np.eye(3, 5))
    angles = np.arccos(np.clip(np.sum(caps * np.asarray(centres)[np.arange(50) % 2], 1), -1, 1))
    assert angles.max() <= 0.2 + 1e-12 and angles.max() > 0.1
    np.testing.assert_allclose(np.linalg.norm(caps, axis=1), 1.0, rtol=1e-12)
    assert cube.min() >= -2 and cube.max() <= 2 and cube.min() < -1.9 and cube.max() > 1.9
    assert np.abs(mix - np.asarray(centres)[np.arange(40) % 2]).max() < 0.06
    np.testing.assert_array_equal(drawn, given)


_SHARDED = """
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
import attnflow as af
assert jax.device_count() == 3
cfg = af.validate_config(dict(n=6, d=3, members=5, beta=[0.5, 2.0], t1=2.0, dt=0.1, saves=5, dtype="float64",
                              save_states=True))
system = af.build_system(cfg)
keys = jax.random.split(jax.random.key(0), 5)
run = lambda devices, chunk=None: af.solve_ensemble(system, keys, jnp.asarray([0.5, 2.0]), t1=2.0, dt=0.1,
                                                    save_every=5, solver="rk4", devices=devices,
                                                    chunk_size=chunk).stats["x"]
one = run(jax.devices()[:1])
np.testing.assert_array_equal(run(None), one)      # 10 pairs over 3 devices (padded)
np.testing.assert_array_equal(run(None, 2), one)   # and chunked on each device
print("sharded ok")
"""


def test_ensemble_sharded_over_devices_equals_one_device():
    """Three host devices (XLA's forced device count) share the (beta, member) pairs."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=3", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _SHARDED], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sharded ok" in proc.stdout


_CPU_DEVICES = """
import sys
import jax
import numpy as np
import attnflow as af
count = None if sys.argv[1] == "auto" else int(sys.argv[1])
ds = af.run(dict(n=6, d=3, members=5, beta=[0.5, 2.0], t1=2.0, dt=0.1, saves=5, dtype="float64", solver="rk4",
                 save_states=True, cpu_devices=count, compilation_cache=True, plot=False))
np.save(sys.argv[2], ds["x"].values)
ds = af.run(dict(n=6, d=3, members=5, beta=[0.5, 2.0], t1=2.0, dt=0.1, saves=5, dtype="float64", solver="rk4",
                 save_states=True, cpu_devices=count, compilation_cache=True, plot=False))  # the exported program
np.testing.assert_array_equal(ds["x"].values, np.load(sys.argv[2]))
print("devices", jax.device_count())
"""


def test_cpu_devices_give_the_same_results_as_one_device(tmp_path):
    """`cpu_devices` splits the CPU into that many JAX devices before JAX starts (a fresh
    process, as the command line is): the members are shared out over them, the
    results are those of one device, bit for bit, first run and rerun (the piece program
    exported with its shardings); unset, there is one device per usable core."""
    import os
    import subprocess
    import sys

    from attnflow.running._study import usable_cores

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    counts = {}
    for count in ("1", "3", "auto"):
        proc = subprocess.run([sys.executable, "-c", _CPU_DEVICES, count, str(tmp_path / f"{count}.npy")], env=env,
                              capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        counts[count] = int(proc.stdout.split("devices")[-1])
    assert counts == {"1": 1, "3": 3, "auto": usable_cores()}
    one = np.load(tmp_path / "1.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "3.npy"), one)
    np.testing.assert_array_equal(np.load(tmp_path / "auto.npy"), one)


def test_cpu_devices_share_the_memory_and_never_outnumber_the_pairs():
    """On a CPU the devices share the host's memory: each holds half as many members of a
    tight memory with two devices as one device does. A plan uses no more devices than it
    has pairs, nor more than members fit in half the memory."""
    from attnflow.running._ensemble import EnsemblePlan, _pieces

    plan = _plan(2)
    tight = 64 * plan.footprint.total
    pieces = lambda devices, platform="cpu": _pieces(plan.member, plan.footprint, 512, devices, 10**6, tight, platform)
    assert pieces(1) == (32, 16) and pieces(2) == (32, 16)  # 32 members per device alone, 16 each on two
    assert pieces(2, "gpu") == (64, 8)  # a GPU's memory is its own
    cfg = af.validate_config(_small(members=1, beta=1.0))
    one_pair = EnsemblePlan(af.build_system(cfg), jax.random.split(jax.random.key(0), 1), np.asarray([1.0]),
                            af.time_grid(t1=1.0, dt=0.1), solver="euler", devices=jax.devices() * 4)
    assert one_pair.mesh is None and one_pair.piece_size == 1
    keys = jax.random.split(jax.random.key(0), 8)
    crowded = EnsemblePlan(af.build_system(cfg), keys, np.asarray([1.0]), af.time_grid(t1=1.0, dt=0.1),
                           solver="euler", devices=jax.devices() * 4, memory=3 * one_pair.footprint.total)
    assert crowded.mesh is None and crowded.piece_size == 1 and crowded.pieces == 8


def test_token_norm_gamma_and_shift_from_config():
    cfg = af.validate_config(_small(scheme="pre", token_norm={"kind": "layer", "eps": 1e-5, "gamma": [1.0, 2.0, 3.0],
                                                            "shift": 0.5}))
    field = af.build_field(cfg, jax.random.key(0), 1.0, jnp.float64)
    x = np.asarray(jax.random.normal(jax.random.key(1), (6, 3)))
    centred = x - x.mean(-1, keepdims=True)
    expected = centred / np.sqrt(centred.var(-1, keepdims=True) + 1e-5) * np.array([1.0, 2.0, 3.0]) + 0.5
    np.testing.assert_allclose(field.norm(jnp.asarray(x)), expected, rtol=1e-12)
    with pytest.raises(af.ConfigError, match="token_norm.shift"):
        af.validate_config(_small(scheme="pre", token_norm={"kind": "rms", "shift": 1.0}))
    with pytest.raises(af.ConfigError, match="token_norm.gamma"):
        af.validate_config(_small(scheme="peri", token_norm={"kind": "layer", "gamma": [1.0, 2.0]}))


# --- data versus structure, pieces ------------------------------------------------------


def _count_compiles():
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kw: compiles.append(event)
        if event == "/jax/core/compile/backend_compile_duration" else None
    )
    return compiles


def test_new_values_of_a_config_reuse_the_compiled_program():
    """Switch times, factors, scales, matrices, eps and initial-condition parameters
    are data: a study that changes only them does not compile its solve again."""
    compiles = _count_compiles()

    def study(tau, scale, eps, radius, value):
        return af.run(_small(n=5, members=3, beta=1.0, init={"kind": "caps", "k": 2, "radius": radius}, cluster_eps=eps,
                             weights={"q": {"kind": "matrix", "value": value, "scale": scale},
                                      "v": {"switch_times": [tau], "factors": [1.0, -1.0]}}))

    first = study(0.5, 1.5, 0.01, 0.2, np.eye(3).tolist())
    before = len(compiles)
    second = study(1.3, 0.5, 0.05, 0.4, (2 * np.eye(3)).tolist())
    assert len(compiles) - before <= 2, compiles[before:]  # small host-side helpers at most
    assert not np.allclose(first["energy"].values, second["energy"].values)


def test_an_interrupted_run_resumes_from_its_finished_pieces(tmp_path, monkeypatch):
    """With a pieces folder, every finished piece is kept; a second run with the same
    config solves only the missing ones and gives the same numbers as one clean run."""
    from attnflow.running._ensemble import EnsemblePlan

    config = _small(members=12, chunk_size=2, beta=[0.5, 2.0], save_states=True)
    clean = af.run(config)
    solved = []
    original = EnsemblePlan.solve
    monkeypatch.setattr(EnsemblePlan, "solve", lambda self, i: solved.append(i) or original(self, i))
    af.run(config, pieces=tmp_path)
    pieces = sorted(tmp_path.glob("piece-*.npz"))
    assert len(solved) == len(pieces) == 12  # 24 (beta, member) pairs, 2 per piece
    for lost in pieces[5:]:
        lost.unlink()  # as if the run had been killed after five pieces
    solved.clear()
    resumed = af.run(config, pieces=tmp_path)
    assert solved == list(range(5, 12))
    for name in ("x", "energy", "clusters"):
        np.testing.assert_array_equal(resumed[name].values, clean[name].values)
    # A different config does not reuse another run's pieces: they are refused, naming
    # the setting, and discarded only with overwrite.
    solved.clear()
    with pytest.raises(af.ConfigError, match=r"seed=0 \(this one has seed=1\)"):
        af.run({**config, "seed": 1}, pieces=tmp_path)
    af.run({**config, "seed": 1, "overwrite": True}, pieces=tmp_path)
    assert solved == list(range(12))


def test_exported_programs_give_the_numbers_of_a_direct_solve(monkeypatch):
    """With the compilation cache on, a piece program is exported once and loaded by
    later runs instead of traced again; the numbers are those of a direct solve, and a
    damaged exported file is traced again, not trusted."""
    from pathlib import Path

    from jax import export

    from attnflow.running._build import resolve_study
    from attnflow.running._ensemble import _LOADED, EnsemblePlan
    from attnflow.running._study import plan_study, prepare_jax, solve_study

    study = resolve_study(_small(n=7, d=5, members=3, beta=[0.5, 2.0], save_states=True))  # a structure of its own
    prepare_jax(study.config)  # switches on the session's cache folder (conftest)
    folder = Path(jax.config.jax_compilation_cache_dir) / "attnflow-exported"
    solve = lambda: solve_study(study, plan_study(study)).to_xarray()

    with monkeypatch.context() as patch:
        patch.setattr(EnsemblePlan, "_exported", lambda *args: None)
        direct = solve()
    _LOADED.clear()
    first = solve()
    # The program this run exported (other test processes share the folder and may
    # export theirs meanwhile): the one it keeps in memory, by its key.
    (key,) = _LOADED
    program = folder / f"{key}.bin"
    assert program.is_file()
    _LOADED.clear()  # as in a new process
    with monkeypatch.context() as patch:
        patch.setattr(export, "export", lambda *a, **k: pytest.fail("traced again instead of loaded"))
        loaded = solve()
    program.write_bytes(b"damaged")
    _LOADED.clear()  # as in a new process
    retraced = solve()
    assert program.read_bytes() != b"damaged"
    for ds in (first, loaded, retraced):
        np.testing.assert_array_equal(ds["x"].values, direct["x"].values)
        np.testing.assert_array_equal(ds["energy"].values, direct["energy"].values)


def test_a_one_piece_run_says_how_long_its_piece_took_last_time(monkeypatch):
    """The time left of a run of one piece: the first run keeps the solve time of a
    piece (compiling aside) beside its exported program; the next run of the same
    program says, once compiled, about how long the piece will take."""
    from attnflow.running import _ensemble
    from attnflow.running._build import resolve_study
    from attnflow.running._ensemble import _LOADED
    from attnflow.running._study import plan_study, prepare_jax, solve_study

    study = resolve_study(_small(n=9, d=4, members=2, beta=[1.0]))  # a structure of its own
    prepare_jax(study.config)
    said = []

    class Line:  # the status line, as what it says
        def __init__(self, text):
            said.append(text)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def describe(self, text):
            said.append(text)

    monkeypatch.setattr(_ensemble, "status", Line)
    _LOADED.clear()
    plan = plan_study(study)
    assert plan.pieces == 1
    plan._timing and plan._timing.unlink(missing_ok=True)
    solve_study(study, plan)
    assert said == ["first piece: compiling, then solving"]  # nothing measured before
    seconds = plan.measured_seconds
    assert seconds is not None and 0 < seconds < 60
    _LOADED.clear()  # as in a new process
    said.clear()
    plan = plan_study(study)
    solve_study(study, plan)
    # (how long is what the last solve measured: a second or so, more on a loaded machine)
    estimate = re.compile(r"first piece: solving, about \d+ s \(as long as last time\)")
    assert said[0] == "first piece: compiling, then solving" and len(said) == 2 and estimate.fullmatch(said[1]), said
    said.clear()  # a second plan of the same program in this process (an experiment's next panel)
    solve_study(study, plan_study(study))
    assert said[0] == "first piece: compiling, then solving" and len(said) == 2 and estimate.fullmatch(said[1]), said
    plan._timing.write_text("not a number")  # a damaged file: no estimate, no failure
    assert plan.measured_seconds is None
    assert [_ensemble._duration(s) for s in (0.2, 42.0, 400.0, 9000.0)] == ["1 s", "42 s", "7 min", "2.5 h"]


def test_an_edit_anywhere_in_the_package_changes_the_key_of_exported_programs(tmp_path):
    """The exported programs are keyed on every source file of the package: an edit in
    a subpackage (a checkpoint loader, an experiment) or to a YAML file invalidates them,
    as an edit in the core does; an unchanged copy keeps the key."""
    import shutil
    from pathlib import Path

    from attnflow.running import _ensemble

    root = tmp_path / "attnflow"
    shutil.copytree(Path(_ensemble.__file__).parent.parent, root, ignore=shutil.ignore_patterns("__pycache__"))
    original = _ensemble._source_hash(root)
    assert _ensemble._source_hash(Path(_ensemble.__file__).parent.parent) == original  # the copy is the package
    keys = [original]
    for edited in ("running/_ensemble.py", "checkpoints/native.py", "experiments/polytope.py", "conf/extra.yaml"):
        path = root / edited
        path.parent.mkdir(exist_ok=True)
        path.write_text((path.read_text() if path.exists() else "") + "\n# an edit\n")
        _ensemble._source_hash.cache_clear()
        keys.append(_ensemble._source_hash(root))
        assert keys[-1] not in keys[:-1], f"an edit of {edited} kept the key"


def test_the_loaded_programs_of_a_process_are_bounded(monkeypatch):
    """A long notebook session keeps the most recently used `_LOADED_MOST` piece programs,
    not every one it ever ran; a program used again moves to the end."""
    from attnflow.running import _ensemble

    monkeypatch.setattr(_ensemble, "_LOADED", collections.OrderedDict())
    for k in range(_ensemble._LOADED_MOST):
        _ensemble._remember(f"p{k}", k)
    _ensemble._LOADED.move_to_end("p0")  # p0 used again: p1 is now the oldest
    for k in range(_ensemble._LOADED_MOST, _ensemble._LOADED_MOST + 3):
        assert _ensemble._remember(f"p{k}", k).program == k
    assert len(_ensemble._LOADED) == _ensemble._LOADED_MOST
    assert "p0" in _ensemble._LOADED and not {"p1", "p2", "p3"} & set(_ensemble._LOADED)


# --- chunks and the memory of a member ------------------------------------------------


def _plan(d: int, n: int = 32, **options):
    from attnflow.running._ensemble import EnsemblePlan

    cfg = af.validate_config(dict(n=n, d=d, members=512, beta=1.0, t1=1.0, dt=0.1, saves=11, dtype="float32",
                                  solver="euler_renorm", metrics=["pair_density"]))
    keys = jax.random.split(jax.random.key(0), cfg.members)
    return EnsemblePlan(af.build_system(cfg), keys, np.asarray([1.0], np.float32),
                        af.time_grid(t1=1.0, dt=0.1, save_every=1), solver="euler_renorm", **options)


def test_a_members_footprint_counts_state_stages_heads_and_pairs():
    """The working set grows as n d with the state (one more n d per Runge-Kutta stage)
    and as n^2 with the logits (per head unless Q and K are the identity) and the
    statistics; on the tiled path it grows linearly in n."""
    from attnflow.running._ensemble import member_footprint

    def footprint(stages=1, **overrides):
        cfg = af.validate_config({**dict(n=32, d=8, members=1, beta=1.0, dtype="float32",
                                         metrics=["pair_density"]), **overrides})
        member = jax.eval_shape(lambda: af.build_system(cfg)(jax.random.key(0), jnp.float32(1.0)))
        return member_footprint(member, stages, saves=11)

    base = footprint()
    item, n, d = 4, 32, 8
    assert footprint(stages=4).working - base.working == 3 * item * n * d  # three more slopes
    assert footprint(d=16).state == 2 * base.state
    assert footprint(n=64).pairwise == 4 * base.pairwise
    # Random Q and K: logits per head, queries and keys per head.
    two = footprint(heads=2, weights={"q": {"kind": "random"}, "k": {"kind": "random"}})
    assert two.pairwise - base.pairwise == 2 * item * n * n  # one more head's logits and exps
    assert two.attention - base.attention == item * 2 * n * (2 * d) + item * n * d  # q, k per head; mixed per head
    # Tiles: the pairwise memory per token is the same at 4096 and 8192 tokens.
    tiled = [footprint(n=m, d=2).pairwise / m for m in (4096, 8192)]
    assert tiled[0] == tiled[1] < 4096 * item


def test_default_chunk_fills_the_cpu_cache_or_a_quarter_of_an_accelerators_memory():
    from attnflow.running._ensemble import CPU_CHUNK_BYTES, MemberFootprint, default_chunk

    member = MemberFootprint(state=10_000, attention=5_000, pairwise=25_000, output=1_000)
    cpu = default_chunk("cpu", 64 * 2**30, member)
    assert cpu == default_chunk("cpu", 2**30, member)  # not the memory's to decide
    assert cpu & (cpu - 1) == 0  # a power of two: lanes and threads share it evenly
    assert cpu * member.working <= CPU_CHUNK_BYTES < 2 * cpu * member.working
    gpu = [default_chunk("gpu", memory, member) for memory in (2**30, 2**34)]
    assert gpu == [2**30 // (4 * 40_000), 2**34 // (4 * 40_000)]
    assert default_chunk("gpu", 1000, member) == default_chunk("cpu", 1000, MemberFootprint(10**9, 0, 0, 0)) == 1
    # The plans follow: the chunk shrinks as the member grows with d.
    sizes = [_plan(d).piece_size for d in (2, 32, 128)]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > sizes[-1]
    for d, size in zip((2, 32, 128), sizes):
        assert size * _plan(d).footprint.working <= CPU_CHUNK_BYTES


def test_rank_by_pivoted_qr_counts_what_the_svd_counts_on_low_rank_and_clustered_maps():
    """`attention_rank` reads the rank off a QR factorization with column pivoting: on
    rank-r products (float32 and float64) and on the attention maps of tokens sitting in
    k clusters (k distinct rows), and on a near-identity map, it equals the SVD's count."""
    from attnflow.numerics._metrics import numerical_rank
    from systems import identity_field

    rng = np.random.default_rng(5)
    for dtype in (np.float32, np.float64):
        for r in (1, 2, 5, 9, 12):
            a = jnp.asarray(rng.standard_normal((12, r)) @ rng.standard_normal((r, 12)), dtype)
            assert int(numerical_rank(a)) == int(numerical_rank(a, method="svd")) == r
    for k, beta in ((1, 3.0), (3, 3.0), (5, 30.0)):
        centres = rng.standard_normal((k, 4))
        x = jnp.asarray(centres[rng.integers(0, k, 16)] / np.linalg.norm(centres, axis=1).max())
        x = x.at[:k].set(centres / np.linalg.norm(centres, axis=1).max())  # every cluster present
        a = identity_field(4, beta).attention_weights(0.0, x / jnp.linalg.norm(x, axis=1, keepdims=True))[0]
        assert int(numerical_rank(a)) == int(numerical_rank(a, method="svd")) == k
    a = identity_field(8, 40.0).attention_weights(0.0, jnp.eye(8))[0]
    assert int(numerical_rank(a)) == int(numerical_rank(a, method="svd")) == 8
    with pytest.raises(af.ConfigError, match="unknown rank method"):
        numerical_rank(a, method="lu")
