"""Start-up: a trivial `attnflow` run against importing JAX and compiling one function.

Each variant is a fresh process, timed from start to exit, and the variants run in
interleaved rounds (a new random order each round) so that the machine's changing
load falls on all of them alike; the table gives medians and the ratio of each median
to the baseline's:

- `bare jax`: `import jax`, then compile and run one small jitted function (the floor
  any JAX program pays);
- `imports of a run`: what a plot-free fixed-step run imports (JAX, equinox, Hydra,
  OmegaConf, netCDF4 and attnflow's own modules), without running anything;
- `attnflow, cold cache`: the trivial run with an empty compilation cache;
- `attnflow, cached`: the same run again, its programs in JAX's persistent cache;
- `attnflow, cache off`: `compilation_cache=false`.

The trivial run is `attnflow n=4 d=3 members=2 t1=0.1 dt=0.1 saves=2 plot=false`.

    python benchmarks/startup.py --rounds 7
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import describe

TRIVIAL = ["n=4", "d=3", "members=2", "t1=0.1", "dt=0.1", "saves=2", "plot=false"]
BARE_JAX = "import jax, jax.numpy as jnp; jax.jit(lambda x: x @ x + 1)(jnp.ones((4, 4))).block_until_ready()"
IMPORTS = "import attnflow.cli, attnflow._study, attnflow._build, hydra.main, netCDF4"


def timed(command: list[str], env: dict) -> float:
    start = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{proc.stderr}")
    return elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
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
    timed([attnflow, *TRIVIAL, run_dir()], dict(env, ATTNFLOW_CACHE_DIR=str(warm_cache)))  # fills the warm cache
    times: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    for _ in range(args.rounds):
        random.shuffle(order)
        for name in order:
            times[name].append(variants[name]())
    shutil.rmtree(work, ignore_errors=True)

    base = statistics.median(times["bare jax"])
    print(f"machine: {describe()}")
    print(f"{args.rounds} interleaved rounds; medians, and their ratio to the bare-JAX baseline")
    print(f"{'variant':24s} {'median s':>9s} {'min s':>7s} {'max s':>7s} {'x baseline':>11s}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:24s} {median:9.2f} {min(values):7.2f} {max(values):7.2f} {median / base:10.2f}x")


if __name__ == "__main__":
    main()
