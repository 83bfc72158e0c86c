"""Long sequences: the tiled attention path against the dense one and against the machine's exp rate.

The workload is the attention term of the theory model, Q = K = V = I softmax
attention on tokens uniform on the sphere (beta = 1), evaluated once (one field
evaluation: n^2 exps per head). Its cost is bound by exp, so every timing is reported
as the exp rate it reaches (n^2 heads / time) over the machine's own exp throughput,
measured next to it: a jitted `sum(exp(a))` over 2^24 numbers of the same dtype. Each
measurement is paired with a baseline measurement taken right before it; the pairs run
in interleaved rounds (a new random order each round) and the tables give medians.

Sections (`--sections`, all by default):

- `dense`: dense against tiled at n = 512 ... 16384 (d = 3): times, their ratio, and the
  temporary memory of the compiled programs (XLA's own count, exact and repeatable);
- `block`: tile sizes 128 ... 2048 at n = 16384, d = 3, float32 and float64;
- `rowmax`: the row maximum searched for, against the one known in advance for unit
  tokens (beta, the diagonal): dense at n = 1024 (the dense softmax written out both
  ways), and tiled at 16384: `SelfAttention` with `unit_rows=False` and `True`, and the
  known maximum alone (the row-tile kernel given `row_max`) apart from the symmetric
  pairs of tiles that `unit_rows=True` also brings (each tile exponentiated once for its
  rows and its columns);
- `large`: one step of `simulate` (euler_renorm, the field plus the retraction) at
  n = 100000, d = 2 and 3, float32 and float64, and the default recorded statistics
  (energy, pair density, clusters, order parameter) of that state;

    python benchmarks/tiled.py                      # every section, 3 rounds
    python benchmarks/tiled.py --sections large --rounds 2 --json tiled.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from machine import describe

import attnflow as af
from attnflow.numerics import _tiled

jax.config.update("jax_enable_x64", True)
DIMS_DENSE = (512, 1024, 2048, 4096, 8192, 16384)
MIN_SECONDS = 0.3
BLOCKS = (128, 256, 512, 1024, 2048)


def exp_baseline(dtype, seconds: float = 0.3):
    """A function measuring the machine's exp rate now (exps per second) in `dtype`: a
    jitted `sum(exp(a))` over 2^24 numbers, repeated for at least `seconds`."""
    a = jnp.asarray(np.random.default_rng(0).uniform(-5.0, 0.0, 2**24), dtype)
    f = jax.jit(lambda a: jnp.sum(jnp.exp(a)))
    f(a).block_until_ready()

    def rate() -> float:
        start = time.perf_counter()
        calls = 0
        while calls < 2 or time.perf_counter() - start < seconds:
            f(a).block_until_ready()
            calls += 1
        return calls * a.size / (time.perf_counter() - start)

    return rate


def tokens(n: int, d: int, dtype):
    return af.UniformSphere()(jax.random.key(0), n, d, jnp.dtype(dtype))


def attention_term(d: int, dtype, block: int, unit_rows: bool = False) -> af.SelfAttention:
    eye = af.Identity(1, d, jnp.dtype(dtype).name)
    return af.SelfAttention(eye, eye, eye, None, jnp.asarray(1.0, dtype), None, heads=1, block=block,
                            unit_rows=unit_rows)


def compiled(f, *args):
    """`f` jitted and compiled for `args`, and its temporary memory in bytes."""
    program = jax.jit(f).lower(*args).compile()
    return program, program.memory_analysis().temp_size_in_bytes


class Rounds:
    """Interleaved measurements: `add(name, run, exps)` registers a timed call; `run(r)`
    times every registered call `r` times in a new random order each round, between two
    measurements of the exp rate in its dtype (their mean is the call's baseline). A call
    shorter than `MIN_SECONDS` is repeated for that long; its time is the mean."""

    def __init__(self):
        self.calls = {}
        self.baselines = {}
        self.samples = {}

    def add(self, name, run, exps: float, dtype):
        key = jnp.dtype(dtype).name
        if key not in self.baselines:
            self.baselines[key] = exp_baseline(dtype)
        run()  # compiled and warm
        self.calls[name] = (run, exps, key)
        self.samples[name] = []

    def run(self, rounds: int):
        for _ in range(rounds):
            order = list(self.calls)
            random.shuffle(order)
            for name in order:
                run, exps, key = self.calls[name]
                before = self.baselines[key]()
                start = time.perf_counter()
                calls = 0
                while calls < 1 or time.perf_counter() - start < MIN_SECONDS:  # short calls: repeated
                    run()
                    calls += 1
                seconds = (time.perf_counter() - start) / calls
                base = (before + self.baselines[key]()) / 2
                self.samples[name].append((seconds, exps / seconds / base, base))

    def time(self, name) -> float:
        return statistics.median(s for s, _, _ in self.samples[name])

    def share(self, name) -> float:
        return statistics.median(f for _, f, _ in self.samples[name])

    def exp_rate(self, key: str) -> float:
        return statistics.median(b for name, samples in self.samples.items() for _, _, b in samples
                                 if self.calls[name][2] == key)


def _resident() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_child(n: int, d: int, dtype: str, block: int) -> None:
    """In a fresh process: compile one field evaluation, then run it once while a thread
    samples the resident memory every millisecond; prints the peak over the start."""
    x = tokens(n, d, jnp.dtype(dtype))
    program, _ = compiled(lambda x: attention_term(d, jnp.dtype(dtype), block)(0.0, x), x)
    before = _resident()
    peak, done = [before], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _resident())
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    program(x).block_until_ready()
    done.set()
    sampler.join()
    print(max(peak[0], _resident()) - before)


def peak_memory(n: int, d: int, dtype: str, block: int) -> int:
    """The peak resident memory of one field evaluation over the process's own (bytes)."""
    out = subprocess.run([sys.executable, __file__, "--peak-child", str(n), str(d), dtype, str(block)],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


def field_call(term, x):
    program, temp = compiled(lambda x: term(0.0, x), x)  # a SelfAttention, or f(t, x)
    return (lambda: program(x).block_until_ready()), temp


def section_dense(rounds: int) -> list[dict]:
    print("\n## dense against tiled: one field evaluation, d = 3, float32; peak memory of the evaluation (the "
          "resident memory sampled every ms, in a fresh process)")
    bench = Rounds()
    memory = {}
    for n in DIMS_DENSE:
        x = tokens(n, 3, jnp.float32)
        for path, block in (("dense", 0), ("tiled", _tiled.DEFAULT_BLOCK)):
            run, _ = field_call(attention_term(3, jnp.float32, block), x)
            bench.add((n, path), run, n * n, jnp.float32)
            memory[n, path] = peak_memory(n, 3, "float32", block)
    bench.run(rounds)
    rows = []
    print(f"{'n':>6} {'dense s':>9} {'tiled s':>9} {'dense/tiled':>12} {'dense exp share':>16} "
          f"{'tiled exp share':>16} {'dense MiB':>10} {'tiled MiB':>10}")
    for n in DIMS_DENSE:
        dense, tiled = bench.time((n, "dense")), bench.time((n, "tiled"))
        ratio = statistics.median(a[0] / b[0] for a, b in zip(bench.samples[n, "dense"], bench.samples[n, "tiled"]))
        row = dict(n=n, dense_s=dense, tiled_s=tiled, dense_over_tiled=ratio, dense_exp_share=bench.share((n, "dense")),
                   tiled_exp_share=bench.share((n, "tiled")), dense_peak_bytes=memory[n, "dense"],
                   tiled_peak_bytes=memory[n, "tiled"])
        rows.append(row)
        print(f"{n:>6} {dense:>9.4f} {tiled:>9.4f} {ratio:>11.2f}x {row['dense_exp_share']:>16.0%} "
              f"{row['tiled_exp_share']:>16.0%} {memory[n, 'dense'] / 2**20:>10.1f} "
              f"{memory[n, 'tiled'] / 2**20:>10.1f}", flush=True)
    print(f"exp rate (float32, median): {bench.exp_rate('float32') / 1e9:.2f} G/s")
    return rows


def section_block(rounds: int, n: int = 16384) -> list[dict]:
    print(f"\n## tile size: one field evaluation at n = {n}, d = 3")
    bench = Rounds()
    for dtype in (jnp.float32, jnp.float64):
        x = tokens(n, 3, dtype)
        for block in BLOCKS:
            run, _ = field_call(attention_term(3, dtype, block), x)
            bench.add((jnp.dtype(dtype).name, block), run, n * n, dtype)
    bench.run(rounds)
    rows = []
    print(f"{'dtype':>8} {'block':>6} {'time s':>8} {'exp share':>10}")
    for (dtype, block) in bench.calls:
        row = dict(dtype=dtype, block=block, seconds=bench.time((dtype, block)), exp_share=bench.share((dtype, block)))
        rows.append(row)
        print(f"{dtype:>8} {block:>6} {row['seconds']:>8.3f} {row['exp_share']:>10.0%}", flush=True)
    for key in ("float32", "float64"):
        print(f"exp rate ({key}, median): {bench.exp_rate(key) / 1e9:.2f} G/s")
    return rows


def dense_softmax(x, known):
    """The dense path's softmax mixing for Q = K = V = I, beta = 1, with the row maximum
    searched for (`known=None`) or given (the diagonal of unit tokens)."""
    scores = x @ x.T
    top = jnp.max(scores, axis=-1, keepdims=True) if known is None else known
    e = jnp.exp(scores - top)
    return (e @ x) / jnp.sum(e, axis=-1, keepdims=True)


def section_rowmax(rounds: int) -> list[dict]:
    print("\n## the row maximum searched for against known in advance (unit tokens), d = 2 and 3")
    bench = Rounds()
    cases = []
    for path, n, block in (("dense", 1024, 0), ("tiled", 16384, _tiled.DEFAULT_BLOCK)):
        for d in (2, 3):
            for dtype in (jnp.float32, jnp.float64):
                x = tokens(n, d, dtype)
                name = jnp.dtype(dtype).name
                if path == "dense":
                    # SelfAttention searches the maximum on the dense path; this measures why.
                    variants = {"searched": lambda t, x: dense_softmax(x, None),
                                "known": lambda t, x: dense_softmax(x, 1.0)}
                else:
                    variants = {"searched": attention_term(d, dtype, block),
                                "known": attention_term(d, dtype, block, True)}
                if path == "tiled":
                    top = jnp.ones(n, dtype)
                    variants["known, row tiles"] = lambda t, x, top=top, block=block: _tiled.attention(
                        x, x, x, 1.0, block=block, row_max=top)
                for variant, f in variants.items():
                    run, _ = field_call(f, x)
                    bench.add((path, n, d, name, variant), run, n * n, dtype)
                cases.append((path, n, d, name, list(variants)))
    bench.run(rounds)
    rows = []
    print(f"{'path':>6} {'n':>6} {'d':>2} {'dtype':>8} {'variant':>17} {'time s':>8} {'speed-up':>9} {'exp share':>10}")
    for path, n, d, name, variants in cases:
        base = bench.samples[path, n, d, name, "searched"]
        for variant in variants:
            key = (path, n, d, name, variant)
            speedup = statistics.median(a[0] / b[0] for a, b in zip(base, bench.samples[key]))
            row = dict(path=path, n=n, d=d, dtype=name, variant=variant, seconds=bench.time(key), speedup=speedup,
                       exp_share=bench.share(key))
            rows.append(row)
            print(f"{path:>6} {n:>6} {d:>2} {name:>8} {variant:>17} {row['seconds']:>8.4f} {speedup:>8.2f}x "
                  f"{row['exp_share']:>10.0%}", flush=True)
    return rows


def section_large(rounds: int, n: int = 100_000) -> list[dict]:
    print(f"\n## one euler_renorm step of simulate at n = {n} (tiles of {_tiled.DEFAULT_BLOCK}, the row maximum "
          "known: unit tokens), and the default statistics of that state (timed once)")
    bench = Rounds()
    cases = []
    for d in (2, 3):
        for dtype in (jnp.float32, jnp.float64):
            name = jnp.dtype(dtype).name
            x = tokens(n, d, dtype)
            field = af.VectorField((attention_term(d, dtype, None, unit_rows=True),), scheme="sphere")
            step, temp = compiled(lambda x, field=field: af.simulate(field, x, t1=0.1, dt=0.1, solver="euler_renorm",
                                                                     save_every=1).xs[-1], x)
            bench.add(("step", d, name), lambda step=step, x=x: step(x).block_until_ready(), n * n, dtype)
            cases.append((d, name, temp, field, x))
    bench.run(rounds)
    rows = []
    print(f"{'d':>2} {'dtype':>8} {'step s':>8} {'exp share':>10} {'temp MiB':>9} {'statistics s':>13}")
    for d, name, temp, field, x in cases:
        recorder = af.Recorder(jnp.asarray(1.0, x.dtype), jnp.asarray(1e-2, x.dtype))
        record, _ = compiled(lambda x, recorder=recorder, field=field: recorder(0.0, x, field), x)
        start = time.perf_counter()
        stats = jax.block_until_ready(record(x))
        seconds = time.perf_counter() - start
        row = dict(n=n, d=d, dtype=name, step_s=bench.time(("step", d, name)), exp_share=bench.share(("step", d, name)),
                   step_temp_bytes=temp, statistics_s=seconds, clusters=int(stats["clusters"]),
                   pair_density=float(stats["pair_density"]))
        rows.append(row)
        print(f"{d:>2} {name:>8} {row['step_s']:>8.2f} {row['exp_share']:>10.0%} {temp / 2**20:>9.1f} "
              f"{seconds:>13.2f}", flush=True)
    for key in ("float32", "float64"):
        print(f"exp rate ({key}, median): {bench.exp_rate(key) / 1e9:.2f} G/s")
    return rows


SECTIONS = {"dense": section_dense, "block": section_block, "rowmax": section_rowmax, "large": section_large}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", nargs="+", choices=list(SECTIONS), default=list(SECTIONS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--peak-child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peak_child:
        n, d, dtype, block = args.peak_child
        return peak_child(int(n), int(d), dtype, int(block))
    print(f"machine: {describe()}")
    print(f"{args.rounds} interleaved rounds; medians; exp share = (n^2 exps / time) / the exp rate measured "
          "right before")
    results = {name: SECTIONS[name](args.rounds) for name in args.sections}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(machine=describe(), rounds=args.rounds, **results), f, indent=2)


if __name__ == "__main__":
    main()
