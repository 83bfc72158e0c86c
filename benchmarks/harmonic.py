"""Harmonic summation against direct summation: one field evaluation at large n.

The workload is the attention term of the theory model, Q = K = V = I softmax attention
on tokens uniform on the circle (d = 2) or the sphere (d = 3), beta = 4, float32, no
mask: the direct path is `SelfAttention` as a run builds it on the sphere (tiled above
1024 tokens, `unit_rows=True`: the known row maximum and the symmetric pairs of tiles, its
fastest path), the harmonic path `attnflow.numerics._harmonic.attention` at the degree of
`summation_tol` = 1e-7. Each call is compiled first; the calls of a size run in
interleaved rounds (a new random order each round), and the table gives medians, the
ratio direct / harmonic (above 1 where harmonic is faster), the cost slope in n between
successive sizes (log time / log n: 2 for direct, 1 wanted for harmonic) and the relative
error of the harmonic field against the direct one (max_i |err_i| / max_i |field_i|, float32
rounding included). Direct runs up to `--direct-max` tokens.

    python benchmarks/harmonic.py                         # n = 4096 ... 1048576, d = 2 and 3
    python benchmarks/harmonic.py --dims 2 --sizes 4096 65536 1048576 --rounds 2
    python benchmarks/harmonic.py --dtype float64 --beta 9 --sizes 4096 16384 --direct-max 16384
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time

import jax
import jax.numpy as jnp
from machine import describe

import attnflow as af
from attnflow.numerics import _harmonic
from attnflow.schema import _harmonic_degree

SIZES = (4096, 16384, 65536, 262144, 1048576)
MIN_SECONDS = 0.3


def tokens(n: int, d: int, dtype: str = "float32"):
    return af.UniformSphere()(jax.random.key(0), n, d, jnp.dtype(dtype))


def direct_term(d: int, beta: float, dtype: str):
    eye = af.Identity(1, d, dtype)
    return af.SelfAttention(eye, eye, eye, None, jnp.asarray(beta, dtype), None, heads=1, unit_rows=True)


def direct_call(x, beta: float):
    term = direct_term(x.shape[1], beta, x.dtype.name)
    program = jax.jit(lambda x: term(0.0, x)).lower(x).compile()
    return lambda: program(x).block_until_ready()


def harmonic_call(x, beta: float, degree: int):
    program = jax.jit(lambda x: _harmonic.attention(beta * x, x, x, degree=degree)).lower(x).compile()
    return lambda: program(x).block_until_ready()


def timed(run) -> float:
    start, calls = time.perf_counter(), 0
    while calls < 1 or time.perf_counter() - start < MIN_SECONDS:
        run()
        calls += 1
    return (time.perf_counter() - start) / calls


def slope(previous: dict | None, n: int, seconds: float, name: str) -> float:
    """log(time / previous time) / log(n / previous n): the cost's exponent in n."""
    if previous is None or not math.isfinite(previous[name]) or not math.isfinite(seconds):
        return math.nan
    return math.log(seconds / previous[name]) / math.log(n / previous["n"])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dims", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--direct-max", type=int, default=32768)
    parser.add_argument("--beta", type=float, default=4.0)
    parser.add_argument("--tol", type=float, default=1e-7)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    jax.config.update("jax_enable_x64", args.dtype == "float64")
    print(describe())
    rows = []
    for d in args.dims:
        degree = _harmonic_degree.degree(args.beta, args.tol, d)
        tail = _harmonic_degree.error_bound(args.beta, degree, d)
        print(f"\n## d = {d}, beta = {args.beta}, {args.dtype}, degree {degree} "
              f"({_harmonic.basis_size(degree, d)} harmonics, tail {tail:.1e})")
        print(f"{'n':>8} {'direct s':>10} {'harmonic s':>11} {'direct/harm':>12} {'direct slope':>13} "
              f"{'harm slope':>11} {'rel. error':>11}")
        previous = None
        for n in args.sizes:
            x = tokens(n, d, args.dtype)
            calls = {"harmonic": harmonic_call(x, args.beta, degree)}
            error = math.nan
            if n <= args.direct_max:
                calls["direct"] = direct_call(x, args.beta)
                reference = direct_term(d, args.beta, args.dtype)(0.0, x)
                field = _harmonic.attention(args.beta * x, x, x, degree=degree)
                error = float(jnp.max(jnp.abs(field - reference)) / jnp.max(jnp.abs(reference)))
            samples = {name: [] for name in calls}
            for _ in range(args.rounds):
                order = list(calls)
                random.shuffle(order)
                for name in order:
                    samples[name].append(timed(calls[name]))
            harm = statistics.median(samples["harmonic"])
            direct = statistics.median(samples["direct"]) if "direct" in samples else math.nan
            ratio = (statistics.median(a / b for a, b in zip(samples["direct"], samples["harmonic"]))
                     if "direct" in samples else math.nan)
            row = dict(d=d, n=n, degree=degree, direct_s=direct, harmonic_s=harm, direct_over_harmonic=ratio,
                       direct_slope=slope(previous, n, direct, "direct_s"),
                       harmonic_slope=slope(previous, n, harm, "harmonic_s"), relative_error=error)
            rows.append(row)
            previous = row
            print(f"{n:>8} {direct:>10.4f} {harm:>11.4f} {ratio:>11.1f}x {row['direct_slope']:>13.2f} "
                  f"{row['harmonic_slope']:>11.2f} {error:>11.1e}", flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(dict(machine=describe(), rows=rows), out, indent=1)


if __name__ == "__main__":
    main()
