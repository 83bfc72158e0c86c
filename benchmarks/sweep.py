"""A 16-job sweep on Hydra's joblib launcher against the same sweep on the basic launcher.

The sweep is `attnflow -m beta=b1,...,b16` over the phase-diagram workload (Q = K = V =
I on the sphere, n = 32 tokens, 2048 members per job, Euler with renormalization,
h = 0.1, t in [0, 30], the pair density recorded every 10 steps): 16 jobs of a few
seconds each. The basic launcher runs them one after another in one process; the joblib
launcher in `--n-jobs` parallel worker processes (default: one per usable core), each
with JAX's own default threads. Each sweep is a fresh `attnflow` process writing into
a fresh folder (nothing is skipped) and is timed from start to exit; JAX's compilation
cache is shared and warmed by an untimed sweep of each variant first, as a user's is
after the first sweep.

The variants run in interleaved rounds (a new random order each round, so that the
machine's changing load falls on all of them alike), beside a float32 matmul rate
measured in the same round. The table gives, per d, the median time of each launcher,
the median over rounds of the per-round ratio (basic / joblib: above 1, joblib is
faster), the median CPU time the sweep's processes used (user + system; above the
wall time, more than one core worked) and the matmul rate.

    python benchmarks/sweep.py                          # d in {2, 32}, 3 rounds
    python benchmarks/sweep.py --dims 2 --rounds 5 --n-jobs 2 --members 1024
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import describe
from phase_diagram import matmul_throughput

JOBS = 16


def sweep_command(d: int, members: int, launcher: list[str], folder: Path) -> list[str]:
    attnflow = shutil.which("attnflow") or str(Path(sys.executable).with_name("attnflow"))
    betas = ",".join(f"{0.5 + 0.5 * i:g}" for i in range(JOBS))
    return [attnflow, "-m", f"beta={betas}", f"d={d}", "n=32", f"members={members}", "t1=30", "dt=0.1",
            "saves=31", "metrics=[pair_density]", "solver=euler_renorm", "plot=false", *launcher,
            f"hydra.sweep.dir={folder}"]


def timed(command: list[str], env: dict) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process and every process it waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{proc.stderr}")
    written = proc.stdout.count("attnflow: wrote ")
    if written != JOBS:
        raise RuntimeError(f"the sweep wrote {written} results instead of {JOBS}:\n{proc.stdout}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[2, 32])
    parser.add_argument("--members", type=int, default=2048)
    parser.add_argument("--n-jobs", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="attnflow-sweep-"))
    env = dict(os.environ, JAX_PLATFORMS="cpu", ATTNFLOW_CACHE_DIR=str(work / "cache"))
    env.pop("HYDRA_FULL_ERROR", None)
    launchers = {"basic": [], "joblib": ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={args.n_jobs}"]}
    folders = iter(range(10**6))
    print(f"machine: {describe()}")
    print(f"{JOBS} jobs of {args.members} members, joblib n_jobs={args.n_jobs}; {args.rounds} interleaved rounds, "
          "medians (min-max of the matmul rate)")
    print(f"{'d':>4} {'basic s':>9} {'joblib s':>9} {'basic/joblib':>13} {'basic CPU s':>12} {'joblib CPU s':>13} "
          f"{'matmul GFLOP/s':>18} {'load':>6}")
    rows = []
    try:
        for d in args.dims:
            def run(name: str, d: int = d) -> tuple[float, float]:
                folder = work / f"sweep-{next(folders)}"
                result = timed(sweep_command(d, args.members, launchers[name], folder), env)
                shutil.rmtree(folder, ignore_errors=True)
                return result

            for name in launchers:
                run(name)  # warms the compilation cache
            samples = {name: [] for name in launchers}
            matmul, load = [], []
            for _ in range(args.rounds):
                load.append(os.getloadavg()[0])
                order = [*launchers, "matmul"]
                random.shuffle(order)
                for name in order:
                    if name == "matmul":
                        matmul.append(matmul_throughput())
                    else:
                        samples[name].append(run(name))
            wall = {name: statistics.median(w for w, _ in samples[name]) for name in launchers}
            cpu = {name: statistics.median(c for _, c in samples[name]) for name in launchers}
            ratio = statistics.median(b[0] / j[0] for b, j in zip(samples["basic"], samples["joblib"]))
            row = dict(d=d, jobs=JOBS, members=args.members, n_jobs=args.n_jobs, basic_s=wall["basic"],
                       joblib_s=wall["joblib"], ratio=ratio, basic_cpu_s=cpu["basic"], joblib_cpu_s=cpu["joblib"],
                       basic_samples=samples["basic"], joblib_samples=samples["joblib"],
                       matmul_gflops=statistics.median(matmul) / 1e9,
                       matmul_gflops_range=[min(matmul) / 1e9, max(matmul) / 1e9], load=load, rounds=args.rounds)
            rows.append(row)
            rate = f"{row['matmul_gflops']:.0f} ({min(matmul) / 1e9:.0f}-{max(matmul) / 1e9:.0f})"
            print(f"{d:>4} {wall['basic']:>9.1f} {wall['joblib']:>9.1f} {ratio:>12.2f}x {cpu['basic']:>12.1f} "
                  f"{cpu['joblib']:>13.1f} {rate:>18} {statistics.median(load):>6.1f}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(machine=describe(), rows=rows), f, indent=2)


if __name__ == "__main__":
    main()
