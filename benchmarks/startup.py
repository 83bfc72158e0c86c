"""Start-up: a trivial `attnflow` run against importing JAX and compiling one function.

Each variant is a fresh process, timed from start to exit, and the variants run in
interleaved rounds (a new random order each round) so that the machine's changing
load falls on all of them alike; the table gives medians and the ratio of each median
to the baseline's, for the wall-clock time and for the CPU time of the process (user
and system: on a shared machine it changes far less with the load):

- `bare jax`: `import jax`, then compile and run one small jitted function (the floor
  any JAX program pays);
- `imports of a run`: what a plot-free fixed-step run imports (JAX, equinox, Hydra,
  OmegaConf, netCDF4, xarray and attnflow's own modules), without running anything;
- `attnflow, cold cache`: the trivial run with an empty compilation cache;
- `attnflow, cached`: the same run again, its programs in JAX's persistent cache;
- `attnflow, cache off`: `compilation_cache=false`.

The trivial run is `attnflow n=4 d=3 members=2 t1=0.1 dt=0.1 saves=2 plot=false`.

With `--against SOURCE` (a folder holding another version of the `attnflow` package,
e.g. a `git worktree` of another commit) the table is the bare-JAX baseline and the
cached run of this tree and of SOURCE, each imported from its own folder (PYTHONPATH)
by the same launcher, with the ratio of their medians.

    python benchmarks/startup.py --rounds 7
    python benchmarks/startup.py --rounds 9 --against ../other-checkout
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from machine import describe

TRIVIAL = ["n=4", "d=3", "members=2", "t1=0.1", "dt=0.1", "saves=2", "plot=false"]
BARE_JAX = "import jax, jax.numpy as jnp; jax.jit(lambda x: x @ x + 1)(jnp.ones((4, 4))).block_until_ready()"
IMPORTS = "import attnflow.cli, attnflow.running._study, attnflow.running._build, hydra.main, netCDF4, xarray"
LAUNCHER = "import sys; from attnflow.cli import main; sys.argv[0] = 'attnflow'; sys.exit(main())"
HERE = Path(__file__).resolve().parents[1]


def timed(command: list[str], env: dict) -> tuple[float, float]:
    """The wall-clock seconds of the process and its CPU seconds (user and system, its
    threads added up): on a shared machine the CPU time changes less with the load."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{proc.stderr}")
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--against", metavar="SOURCE", help="time the cached run of this attnflow source tree too")
    args = parser.parse_args()
    attnflow = shutil.which("attnflow") or str(Path(sys.executable).with_name("attnflow"))
    work = Path(tempfile.mkdtemp(prefix="attnflow-startup-"))
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    warm_cache = work / "warm-cache"
    runs = iter(range(10**6))

    def run_dir() -> str:
        return f"hydra.run.dir={work / f'run{next(runs)}'}"  # a new folder: never a skip

    variants = {
        "bare jax": lambda: timed([sys.executable, "-c", BARE_JAX], env),
        "imports of a run": lambda: timed([sys.executable, "-c", IMPORTS], env),
        "attnflow, cold cache": lambda: timed(
            [attnflow, *TRIVIAL, run_dir()], dict(env, ATTNFLOW_CACHE_DIR=str(work / f"cold{next(runs)}"))),
        "attnflow, cached": lambda: timed([attnflow, *TRIVIAL, run_dir()], dict(env, ATTNFLOW_CACHE_DIR=str(warm_cache))),
        "attnflow, cache off": lambda: timed([attnflow, *TRIVIAL, "compilation_cache=false", run_dir()], env),
    }
    if args.against:
        def cached(source: Path) -> Callable[[], tuple[float, float]]:
            cache = dict(env, ATTNFLOW_CACHE_DIR=str(work / f"warm-{len(variants)}"), PYTHONPATH=str(source))
            timed([sys.executable, "-c", LAUNCHER, *TRIVIAL, run_dir()], cache)  # fills its warm cache
            return lambda: timed([sys.executable, "-c", LAUNCHER, *TRIVIAL, run_dir()], cache)

        variants = {"bare jax": variants["bare jax"]}
        variants["attnflow, cached (this tree)"] = cached(HERE)
        variants[f"attnflow, cached ({args.against})"] = cached(Path(args.against).resolve())
    else:
        timed([attnflow, *TRIVIAL, run_dir()], dict(env, ATTNFLOW_CACHE_DIR=str(warm_cache)))  # fills the warm cache
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    order = list(variants)
    for _ in range(args.rounds):
        random.shuffle(order)
        for name in order:
            times[name].append(variants[name]())
    shutil.rmtree(work, ignore_errors=True)

    median = lambda values, i: statistics.median(v[i] for v in values)
    base = [median(times["bare jax"], i) for i in (0, 1)]
    width = max(map(len, times))
    print(f"machine: {describe()}")
    print(f"{args.rounds} interleaved rounds; medians of the wall-clock and of the CPU time (user + system), "
          "and their ratios to the bare-JAX baseline")
    print(f"{'variant':{width}s} {'median s':>9s} {'min s':>7s} {'max s':>7s} {'x baseline':>11s} {'CPU s':>7s} "
          f"{'x baseline':>11s}")
    for name, values in times.items():
        wall, cpu = median(values, 0), median(values, 1)
        print(f"{name:{width}s} {wall:9.2f} {min(v[0] for v in values):7.2f} {max(v[0] for v in values):7.2f} "
              f"{wall / base[0]:10.2f}x {cpu:7.2f} {cpu / base[1]:10.2f}x")
    if args.against:
        here, there = list(times.values())[1:]
        print(f"this tree / {args.against}: wall {median(here, 0) / median(there, 0):.3f}, "
              f"CPU {median(here, 1) / median(there, 1):.3f}")

if __name__ == "__main__":
    main()
