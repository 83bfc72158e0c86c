"""Test-wide settings: float64 is available to every test (each picks its dtype), and
every `attnflow` subprocess of the session shares one JAX compilation cache in a
temporary folder (never the user's own cache).

The test process compiles thousands of programs, and JAX keeps every program it has
compiled for the life of the process. Each compiled CPU program holds memory mappings
of its own (measured: about 100 more a second through tests/core/test_config.py), so one
long process passed Linux's limit on mappings per process (`vm.max_map_count`, 65530
here) and died inside XLA (a segmentation fault or an abort while compiling or
serializing a large differentiated solve, late in the run). So JAX's caches are cleared
after every test module, which returns the mappings (test_config.py ends near 7500
with them, and each module starts again near 1500). The process also never writes
compiled programs to the persistent cache (JAX's `jax_enable_compilation_cache` is off
here): it would not save time, as each program is compiled once per process anyway.
attnflow's own exported piece programs still go to the session's folder when a test
switches the cache folder on.

The suite compiles far more than it computes (tiny sizes, thousands of programs), so its
processes, and the `attnflow` subprocesses they start, compile with XLA's LLVM backend
optimizations off (`--xla_backend_optimization_level=0`, added to any XLA_FLAGS given).
Measured on this 2-core machine, 3 and 2 interleaved rounds, CPU seconds: a small study,
a gradient and a Lyapunov spectrum 24.5 -> 17.0 (0.69x); 300 tiny training steps 54 ->
34 (0.62x). The programs are the same HLO: only the machine code is less optimized, so
no result changes beyond rounding, and benchmarks/ (which time the real thing) never
set it."""

import gc
import os
import tempfile

# Before JAX starts its backend (it reads XLA_FLAGS once, at the first computation).
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()

import jax  # noqa: E402
import pytest

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_enable_compilation_cache", False)
# As diffrax's suite does: an implicit promotion between dtypes (int32 + int64, float32 +
# float64, an int array times a Python float) or between ranks (an (n, d) array plus a
# (d,) one) is an error, so that mixed dtypes and unintended broadcasts in attnflow
# fail its tests instead of silently widening or broadcasting in its users' runs.
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")
os.environ.setdefault("ATTNFLOW_CACHE_DIR", tempfile.mkdtemp(prefix="attnflow-test-cache-"))


# The heaviest modules first (seconds of one worker, measured on a 2-core CI machine:
# 250, 200, 160, 160, 150, 130, 120, 110, 100, 90): with `--dist loadscope` the workers
# take whole modules in collection order, and a heavy module collected last would run
# alone at the end while the other worker idles.
_HEAVY_FIRST = (
    "tests/diffeqformer/test_diffeqformer_studies.py",
    "tests/docs/test_examples.py",
    "tests/core/test_solvers.py",
    "tests/core/test_ensemble.py",
    "tests/experiments/test_lyapunov_experiments.py",
    "tests/cli/test_cli.py",
    "tests/diffeqformer/test_diffeqformer.py",
    "tests/core/test_dynamics.py",
    "tests/experiments/test_phase_diagram.py",
    "tests/checkpoints/test_checkpoint_flow.py",
    "tests/checkpoints/test_checkpoint_gguf.py",
)


def pytest_collection_modifyitems(items):
    order = {path: rank for rank, path in enumerate(_HEAVY_FIRST)}
    items.sort(key=lambda item: order.get(item.nodeid.split("::")[0], len(order)))  # stable: a module keeps its order


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """After each module, drop the compiled programs (and their memory mappings)."""
    yield
    jax.clear_caches()
    gc.collect()


@pytest.fixture
def ctrl_c():
    """Ctrl-C handled as Python does by default (KeyboardInterrupt), in this process and in
    the processes it starts, for the tests that send it. A shell starts a background job
    with SIGINT ignored (POSIX, without job control: `(pytest &)`, `nohup ... &` in a
    script), and a process inherits that: such a test would then see no interrupt at all."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
