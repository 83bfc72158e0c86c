"""Small and medium d: the member chunk of the phase-diagram workload.

The workload of benchmarks/phase_diagram.py (Q = K = V = I on the sphere, n = 32,
2048 members, Euler with renormalization, h = 0.1, t in [0, 30], float32, the pair
density recorded after every step), solved by `solve_ensemble` in several ways:

- `default`: the plan attnflow makes by itself (`default_chunk`);
- a fixed chunk of members solved at once (`--chunks`);

beside the same-run baselines: the same algorithm in batched NumPy (from attnflow's
initial states), a large float32 matmul and XLA's exp rate. Every measurement of a d is
taken in interleaved rounds, a new random order each round, so that the machine's
changing load falls on all of them alike; the table gives medians.

Columns: the median time; its ratio to the fastest fixed chunk of that d (the default
should be at most 1.00: as fast as the best chunk chosen by hand); the speed-up over
batched NumPy (per round, then the median); the share of the matmul rate (4 n^2 d
flops per member and step plus 2 n^2 d per record) and of the exp rate (n^2 exps per
member and step).

A second table (`--rank`) times the cost of the `attention_rank` metric: the default
study (n = 32, d = 3, 256 members, five betas, 301 steps, 151 records, float32) with
its default metrics, and with `attention_rank` added, counted by an SVD per head and
record (as before) and by a QR factorization with column pivoting (attnflow's
`numerical_rank` now); ratios to the run without the metric.

    python benchmarks/layout.py                                # d in {2, 8, 32, 128}
    python benchmarks/layout.py --dims 2 --chunks 128 256 --rounds 3
    python benchmarks/layout.py --rank --dims                  # the rank table only
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from machine import describe
from phase_diagram import (attnflow_phase_diagram, exp_throughput, matmul_throughput, numpy_phase_diagram, phase_config,
                           workload)

import attnflow as af
from attnflow.running._ensemble import EnsemblePlan
from attnflow.numerics._metrics import Recorder, numerical_rank


def default_chunk(d: int, members: int, n: int, dt: float, t1: float, eps: float) -> int:
    """The chunk of attnflow's own plan for the workload."""
    cfg = phase_config(d, members, n, dt, t1, eps)
    keys = jax.random.split(jax.random.key(0), members)
    plan = EnsemblePlan(af.build_system(cfg), keys, np.asarray([1.0], np.float32),
                        af.time_grid(t1=t1, dt=dt, save_every=1), solver="euler_renorm")
    return plan.piece_size


class _SvdRank(eqx.Module):
    """A Recorder whose `attention_rank` counts singular values (the method before)."""

    record: Recorder

    def __call__(self, t, x, field=None):
        plain = dataclasses.replace(self.record, metrics=tuple(m for m in self.record.metrics
                                                                if m != "attention_rank"))
        out = plain(t, x, field)
        a = field.attention_weights(t, x)
        out["attention_rank"] = jax.vmap(lambda ah: numerical_rank(ah, method="svd"))(a).astype(jnp.int32)
        return out


def _with_svd_rank(system):
    def member(key, beta):
        field, y0, record = system(key, beta)
        return field, y0, _SvdRank(record)

    return member


def section_rank(rounds: int) -> list[dict]:
    """The default study without and with `attention_rank`, by SVD and by pivoted QR."""
    from attnflow.running._study import plan_study

    base = dict(members=256, t1=30.0, dt=0.1, compilation_cache=False)
    runs = {}
    for name, metrics, svd in (("without attention_rank", None, False), ("attention_rank by SVD", "rank", True),
                               ("attention_rank by pivoted QR", "rank", False)):
        study = phase_rank_config(base, metrics)
        plan, cfg = plan_study(study), study.config
        system = _with_svd_rank(plan.system) if svd else plan.system
        keys, betas = plan.keys, plan.betas

        def solve(system=system, keys=keys, betas=betas, cfg=cfg):
            return jax.block_until_ready(af.solve_ensemble(system, keys, betas, t1=cfg.t1, dt=cfg.dt,
                                                           save_steps=plan.options["save_steps"],
                                                           solver=cfg.solver.value).stats)
        solve()
        runs[name] = solve
    samples = {name: [] for name in runs}
    order = list(runs)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            samples[name].append(_timed(runs[name]))
    print(f"\nattention_rank: the default study ({base['members']} members, five betas, 151 records); "
          f"{rounds} interleaved rounds, medians")
    print(f"{'run':>30} {'time s':>8} {'x without':>10}")
    rows = []
    for name, times in samples.items():
        ratio = statistics.median(t / w for t, w in zip(times, samples["without attention_rank"]))
        rows.append(dict(run=name, seconds=statistics.median(times), over_without=ratio))
        print(f"{name:>30} {statistics.median(times):>8.2f} {ratio:>9.2f}x", flush=True)
    return rows


def phase_rank_config(base: dict, metrics):
    """The default study's resolved config, with `attention_rank` added when `metrics`."""
    study = af.resolve_study(base)
    if metrics:
        study = af.resolve_study({**base, "metrics": [m.value for m in study.config.metrics] + ["attention_rank"]})
    return study


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="*", default=[2, 8, 32, 128])
    parser.add_argument("--chunks", type=int, nargs="+", default=[64, 128, 256, 512, 1024, 2048])
    parser.add_argument("--members", type=int, default=2048)
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--beta", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-numpy", action="store_true", help="leave out the NumPy baseline (slow at large d)")
    parser.add_argument("--rank", action="store_true", help="also time the attention_rank metric")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    dt, t1, eps = 0.1, 30.0, 1e-2
    steps = round(t1 / dt)
    print(f"machine: {describe()}")
    print(f"{args.members} members, n = {args.n}, {steps} steps; {args.rounds} interleaved rounds per d, medians")
    results = []
    for d in args.dims:
        chunk = default_chunk(d, args.members, args.n, dt, t1, eps)
        variants = {("default", str(chunk)): {}}
        for size in args.chunks:
            variants[("fixed", str(size))] = dict(chunk_size=size)
        solves, x0 = {}, None
        for key, options in variants.items():
            solve, _, system, keys = attnflow_phase_diagram(d, args.members, args.n, dt, t1, eps, **options)
            solves[key] = solve
            if x0 is None:
                x0 = np.asarray(jax.vmap(lambda k: system(k, args.beta)[1])(keys))
        flops, exps = workload(args.members, args.n, d, steps)
        samples = {key: [] for key in solves}
        baselines = {"numpy": [], "matmul": [], "exp": []}
        tasks = [(key, lambda solve=solve, key=key: samples[key].append(_timed(lambda: solve(args.beta))))
                 for key, solve in solves.items()]
        tasks += [("matmul", lambda: baselines["matmul"].append(matmul_throughput())),
                  ("exp", lambda: baselines["exp"].append(exp_throughput()))]
        if not args.no_numpy:
            tasks.append(("numpy", lambda: baselines["numpy"].append(
                _timed(lambda: numpy_phase_diagram(x0, args.beta, dt, steps, eps)))))
        for _ in range(args.rounds):
            random.shuffle(tasks)
            for _, task in tasks:
                task()
        fixed = {key: statistics.median(v) for key, v in samples.items() if key[0] != "default"}
        best = min(fixed, key=fixed.get)
        print(f"\nd = {d}: fastest fixed chunk {best[1]}; matmul "
              f"{statistics.median(baselines['matmul']) / 1e9:.0f} GFLOP/s, exp "
              f"{statistics.median(baselines['exp']) / 1e9:.2f} G/s"
              + ("" if args.no_numpy else f", NumPy {statistics.median(baselines['numpy']):.2f} s"))
        print(f"{'plan':>8} {'chunk':>6} {'time s':>8} {'/ best':>7} {'vs NumPy':>9} {'of matmul':>10} "
              f"{'of exp':>7}")
        for key, times in samples.items():
            row = dict(d=d, plan=key[0], chunk=key[1], seconds=statistics.median(times),
                       over_best=statistics.median(times) / fixed[best],
                       matmul_fraction=statistics.median(flops / t / m for t, m in zip(times, baselines["matmul"])),
                       exp_fraction=statistics.median(exps / t / e for t, e in zip(times, baselines["exp"])))
            if not args.no_numpy:
                row["speedup_over_numpy"] = statistics.median(n / t for n, t in zip(baselines["numpy"], times))
            results.append(row)
            versus = f"{row['speedup_over_numpy']:>8.1f}x" if "speedup_over_numpy" in row else f"{'-':>9}"
            print(f"{key[0]:>8} {key[1]:>6} {row['seconds']:>8.2f} {row['over_best']:>7.2f} {versus} "
                  f"{row['matmul_fraction']:>10.1%} {row['exp_fraction']:>7.1%}", flush=True)
    rank = section_rank(args.rounds) if args.rank else []
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(machine=describe(), rows=results, rank=rank), f, indent=2)


def _timed(f) -> float:
    start = time.perf_counter()
    f()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
