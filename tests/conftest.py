"""Test-wide settings: float64 is available to every test (each picks its dtype), and
the session's processes (both workers and every `attnflow` subprocess) share one JAX
compilation cache in a temporary folder (never the user's own cache).

The test process compiles thousands of programs, and JAX keeps every program it has
compiled for the life of the process. Each compiled CPU program holds memory mappings
of its own (measured: about 100 more a second through tests/core/test_config.py), so one
long process passed Linux's limit on mappings per process (`vm.max_map_count`, 65530
here) and died inside XLA (a segmentation fault or an abort while compiling or
serializing a large differentiated solve, late in the run). So JAX's caches are cleared
after every test module, which returns the mappings (test_config.py ends near 7500
with them, and each module starts again near 1500). A program cleared with them would be
compiled again by the next module that needs it, and the other worker compiles it too:
so the programs that take a second or more to compile (JAX's default threshold; the
small ones would cost more to write than to compile) go to the session's persistent
cache (`$ATTNFLOW_CACHE_DIR/jit`), and every process of the session reads them from
there. Measured on this 2-core machine, one default run each, together with the
optimized tests below: 21:24 -> 18:20.

The suite compiles far more than it computes (tiny sizes, thousands of programs), so its
processes, and the `attnflow` subprocesses they start, compile with XLA's backend
optimizations off (JAX's `jax_disable_most_optimizations`, from the environment variable
JAX_DISABLE_MOST_OPTIMIZATIONS=1 that subprocesses inherit; a value given is kept).
Measured on this 2-core machine, 3 and 2 interleaved rounds, CPU seconds: a small study,
a gradient and a Lyapunov spectrum 24.5 -> 17.0 (0.69x); 300 tiny training steps 54 ->
34 (0.62x). The few tests that compute more than they compile turn them back on: the
marker `@pytest.mark.optimized` for a test, the fixture `xla_optimizations` (a context
manager) around a module fixture's run (measured, one process: the fig. 5 panels 45 ->
24 s, the metastability staircase 53 -> 21 s, the Lyapunov beta run 35 -> 19 s). The programs are the same HLO: only the
machine code differs, so no result changes beyond rounding, and benchmarks/ (which time
the real thing) never set it."""

import contextlib
import gc
import os
import tempfile

# Before JAX is imported (it reads the variable then); subprocesses inherit it.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
os.environ.setdefault("ATTNFLOW_CACHE_DIR", tempfile.mkdtemp(prefix="attnflow-test-cache-"))

import jax  # noqa: E402
import pytest

jax.config.update("jax_enable_x64", True)
# One CPU device in the test processes, whichever test runs first: a run's `cpu_devices`
# (one device per core by default) takes effect only before JAX starts, so without this
# the device count of a worker would depend on the order of its tests. The `attnflow`
# subprocesses start afresh and take the default; tests of several devices set their own.
with contextlib.suppress(RuntimeError):
    jax.config.update("jax_num_cpu_devices", 1)
# (again here: a plugin may have imported JAX before this file set the variable)
_OPTIMIZATIONS_OFF = os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"].lower() in ("1", "true")
jax.config.update("jax_disable_most_optimizations", _OPTIMIZATIONS_OFF)
# One persistent cache of compiled programs for the session's processes (both workers,
# every module, the subprocesses): the programs that take a second or more to compile
# (JAX's default threshold) are compiled once per session.
jax.config.update("jax_compilation_cache_dir", os.path.join(os.environ["ATTNFLOW_CACHE_DIR"], "jit"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
# As diffrax's suite does: an implicit promotion between dtypes (int32 + int64, float32 +
# float64, an int array times a Python float) or between ranks (an (n, d) array plus a
# (d,) one) is an error, so that mixed dtypes and unintended broadcasts in attnflow
# fail its tests instead of silently widening or broadcasting in its users' runs.
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")


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


@contextlib.contextmanager
def _optimizations_on():
    previous = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", previous)


@pytest.fixture(scope="session")
def xla_optimizations():
    """A context manager: programs compiled inside it get XLA's optimizations, for a
    module fixture that computes more than it compiles (`with xla_optimizations(): ...`)."""
    return _optimizations_on


@pytest.fixture(autouse=True)
def _optimized_marker(request):
    """`@pytest.mark.optimized`: the test's own programs compile with XLA's optimizations."""
    if request.node.get_closest_marker("optimized") is None:
        yield
    else:
        with _optimizations_on():
            yield


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
