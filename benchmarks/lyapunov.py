"""Lyapunov spectra of an ensemble: one vmapped call against a per-member loop.

The workload of experiment=lyapunov: Q = K = V = I softmax attention on the sphere,
n tokens on S^2 (8 and 32), beta = 1, the k = 3 leading exponents by the QR method
(`attnflow.lyapunov_spectrum`), RK4 with h = 0.1 on [0, 20], a QR factorization every
10 steps, float64. Three ways to get M members' spectra, all compiled beforehand (a
warm-up call each; the compile time reported is that call's time less the median run):

1. `vmap`: one jitted `jax.vmap` of the member's spectrum over all M member keys, one
   call (what the experiment does per piece);
2. `loop`: a Python loop calling a jitted single-member spectrum M times (JAX dispatches
   asynchronously, so the loop waits once, on the last results);
3. `map`: `jax.lax.map` over the members inside one jitted program (one member after
   the other, compiled once): the loop's per-member program without its dispatches.

All three are timed in interleaved rounds (a new random order each round, so that the
machine's changing load falls on all alike); the table gives the medians of the times
and of the per-round ratios loop / vmap and map / vmap (above 1: vmap is faster), and
checks that all three give the same exponents.

    python benchmarks/lyapunov.py                    # n in {8, 32}, M in {16, 64, 256}, 5 rounds
    python benchmarks/lyapunov.py --n 32 --members 64 --rounds 7
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import jax
import numpy as np
from machine import describe

import attnflow as af


def workload(n: int, t1: float, dt: float, k: int, every: int):
    """`spectrum(key) -> exponents (k,)` of one member of the theory model at beta = 1."""
    jax.config.update("jax_enable_x64", True)
    cfg = af.validate_config({"n": n, "d": 3, "beta": 1.0, "members": 1, "t1": t1, "dt": dt, "solver": "rk4",
                              "dtype": "float64", "compilation_cache": False})
    system = af.build_system(cfg)

    def spectrum(key):
        field, y0, _ = system(key, 1.0)
        return af.lyapunov_spectrum(field, y0, t1=t1, dt=dt, k=k, solver="rk4", reorthonormalize_every=every,
                                    key=jax.random.fold_in(key, 3)).exponents

    return spectrum


def programs(spectrum) -> dict:
    """The three ways, each a function of the member keys."""
    batched = jax.jit(jax.vmap(spectrum))
    mapped = jax.jit(lambda keys: jax.lax.map(spectrum, keys))
    single = jax.jit(spectrum)
    return {"vmap": batched, "loop": lambda keys: [single(key) for key in keys], "map": mapped}


def measure(ways: dict, keys, rounds: int) -> dict:
    """Interleaved rounds: the times of each way (their compilation done before)."""
    samples = {name: [] for name in ways}
    for _ in range(rounds):
        for name in random.sample(list(ways), len(ways)):
            start = time.perf_counter()
            jax.block_until_ready(ways[name](keys))
            samples[name].append(time.perf_counter() - start)
    return samples


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--n", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--t1", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    dt, k, every = 0.1, 3, 10
    print(f"machine: {describe()}")
    print(f"d = 3, k = {k}, rk4 h = {dt} on [0, {args.t1:g}], QR every {every} steps, float64; "
          f"{args.rounds} interleaved rounds, medians")
    print(f"{'n':>3} {'M':>5} {'vmap s':>8} {'loop s':>8} {'map s':>8} {'loop/vmap':>10} {'map/vmap':>9} "
          f"{'vmap ms/member':>15} {'loop ms/member':>15} {'compile vmap s':>15} {'compile loop s':>15} "
          f"{'max |diff|':>11}")
    rows = []
    for n in args.n:
        ways = programs(workload(n, args.t1, dt, k, every))
        for i, members in enumerate(args.members):
            keys = jax.random.split(jax.random.key(0), members)
            first = {}
            for name, way in ways.items():  # compile (the single-member program once per n)
                start = time.perf_counter()
                first[name] = np.asarray(jax.block_until_ready(way(keys)))
                first[name + "_s"] = time.perf_counter() - start
            gap = max(float(np.abs(first[name] - first["vmap"]).max()) for name in ("loop", "map"))
            samples = measure(ways, keys, args.rounds)
            median = {name: statistics.median(values) for name, values in samples.items()}
            ratio = {name: statistics.median(a / v for a, v in zip(samples[name], samples["vmap"]))
                     for name in ("loop", "map")}
            row = {"n": n, "members": members, **{f"{name}_s": median[name] for name in ways},
                   "loop_over_vmap": ratio["loop"], "map_over_vmap": ratio["map"],
                   "compile_vmap_s": first["vmap_s"] - median["vmap"],
                   "compile_loop_s": first["loop_s"] - median["loop"] if i == 0 else None,
                   "max_diff": gap, "rounds": args.rounds, "samples": samples}
            rows.append(row)
            loop_compile = "cached" if row["compile_loop_s"] is None else f"{row['compile_loop_s']:.2f}"
            print(f"{n:>3} {members:>5} {median['vmap']:>8.2f} {median['loop']:>8.2f} {median['map']:>8.2f} "
                  f"{ratio['loop']:>9.2f}x {ratio['map']:>8.2f}x "
                  f"{1e3 * median['vmap'] / members:>15.1f} {1e3 * median['loop'] / members:>15.1f} "
                  f"{row['compile_vmap_s']:>15.2f} {loop_compile:>15} {gap:>11.1e}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": describe(), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
