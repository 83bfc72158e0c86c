"""The pair density and the clusters of tokens on the circle: sorted angles against tiles.

The workload is the recorder's `pair_density`, `clusters` and `cluster_sizes` of one state
of n tokens on the circle (d = 2, float32, eps = 1e-2), half of them spread uniformly and
half in 8 clusters 0.05 rad wide: `Recorder(on_circle=True)` (sorted angles, O(n log n),
attnflow/numerics/_circle_metrics.py) against the tiled path (`block=None`, tiles of
`_tiled.DEFAULT_BLOCK`, O(n^2)). Both are compiled before timing; the calls run in
interleaved rounds (a new random order each round); the table gives medians and the
median ratio tiled / sorted of the rounds, and how the two paths' values compare: the
clusters and their sizes (equal or not) and the pair density (relative difference: in
float32 a few pairs lie within rounding of the threshold, where the rounded cosine and
the rounded angle may disagree, about 1e-6 of the pairs at n = 1e4). The tiled path runs only at the sizes in
`--tiled` (at n = 1e6 it would take hours).

    python benchmarks/circle_metrics.py                       # n = 1e4, 1e5, 1e6, 3 rounds
    python benchmarks/circle_metrics.py --sizes 10000 100000 --tiled 10000 --rounds 2
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from machine import describe

import attnflow as af

METRICS = ("pair_density", "clusters", "cluster_sizes")


def tokens(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    spread = rng.uniform(-np.pi, np.pi, n - n // 2)
    clustered = rng.integers(0, 8, n // 2) * (2 * np.pi / 8) + rng.uniform(-0.025, 0.025, n // 2)
    theta = rng.permutation(np.concatenate([spread, clustered]))
    return jnp.asarray(np.stack([np.cos(theta), np.sin(theta)], -1), jnp.float32)


def program(n: int, on_circle: bool):
    recorder = af.Recorder(jnp.asarray(1.0, jnp.float32), jnp.asarray(1e-2, jnp.float32), metrics=METRICS,
                           on_circle=on_circle)
    x = tokens(n)
    compiled = jax.jit(lambda x: recorder(0.0, x)).lower(x).compile()
    out = jax.block_until_ready(compiled(x))  # warm
    return (lambda: jax.block_until_ready(compiled(x))), out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--tiled", type=int, nargs="*", default=[10_000, 100_000],
                        help="the sizes at which the tiled path runs too")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"machine: {describe()}")
    print(f"{args.rounds} interleaved rounds; medians; float32, eps = 1e-2")
    calls, samples, outs = {}, {}, {}
    for n in args.sizes:
        for path in ("sorted", "tiled") if n in args.tiled else ("sorted",):
            start = time.perf_counter()
            calls[n, path], outs[n, path] = program(n, path == "sorted")
            print(f"compiled and warmed n = {n} {path} in {time.perf_counter() - start:.1f} s", flush=True)
            samples[n, path] = []
    for _ in range(args.rounds):
        order = list(calls)
        random.shuffle(order)
        for key in order:
            start = time.perf_counter()
            calls[key]()
            samples[key].append(time.perf_counter() - start)
    print(f"{'n':>8} {'sorted s':>9} {'tiled s':>9} {'tiled/sorted':>13} {'clusters':>9} {'pair density':>13} {'same clusters':>14} {'density rel. diff':>18}")
    for n in args.sizes:
        out = outs[n, "sorted"]
        sorted_s = statistics.median(samples[n, "sorted"])
        if (n, "tiled") in calls:
            tiled_s = f"{statistics.median(samples[n, 'tiled']):9.3f}"
            ratio = f"{statistics.median(t / s for t, s in zip(samples[n, 'tiled'], samples[n, 'sorted'])):12.0f}x"
            same = str(all(np.array_equal(out[m], outs[n, "tiled"][m]) for m in ("clusters", "cluster_sizes")))
            tiled_density = float(outs[n, "tiled"]["pair_density"])
            diff = f"{abs(float(out['pair_density']) - tiled_density) / tiled_density:18.1e}"
        else:
            tiled_s, ratio, same, diff = f"{'-':>9}", f"{'-':>13}", "-", f"{'-':>18}"
        print(f"{n:>8} {sorted_s:>9.4f} {tiled_s} {ratio} {int(out['clusters']):>9} "
              f"{float(out['pair_density']):>13.6f} {same:>14} {diff}", flush=True)


if __name__ == "__main__":
    main()
