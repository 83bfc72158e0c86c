"""Fixed steps: attnflow's hand-written `lax.scan` against diffrax's constant-step solve.

The question of issue 19: should a fixed-step run go through `diffrax.diffeqsolve`
(`ConstantStepSize`, `SaveAt`, the `Retracted` wrapper) instead of the scan over
`step_map` in `attnflow.numerics._simulate`? Both are timed on the phase-diagram workload
(`benchmarks/phase_diagram.py`): Q = K = V = I softmax attention on the sphere, n = 32
tokens, Euler on the unprojected field followed by the retraction (`euler_renorm`),
h = 0.1 on [0, 30], float32, the pair density recorded after every step, M members
under one `jax.vmap`, one jitted program each:

1. `scan`: `simulate(field, y0, ..., solver="euler_renorm", save_every=1, record=...)`,
   what `solve_ensemble` runs per member;
2. `diffrax`: `diffeqsolve(ODETerm(field), Retracted(Euler(), Sphere()), ...,
   stepsize_controller=ConstantStepSize(), saveat=SaveAt(t0=True, steps=True, fn=...))`
   with `max_steps` the step count: the same steps, the same statistics.

`--solver rk4` times the classical RK4 method instead (attnflow's `RK4` diffrax class
on the diffrax side, the projected field on both).

Both are compiled beforehand (a first call each; the compile time reported is that
call's time less the median run), then timed in interleaved rounds (a new random order
each round, so that the machine's changing load falls on both alike). The table gives
the medians of the times and of the per-round ratio diffrax / scan (above 1: the scan
is faster), and the largest gap between the two pair-density curves (they agree to
float32 rounding).

    python benchmarks/fixed_steps.py                       # d in {2, 32}, M = 256, 7 rounds
    python benchmarks/fixed_steps.py --dims 2 --members 64 --rounds 5 --solver rk4
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np
from machine import describe
from phase_diagram import phase_config

import attnflow as af
from attnflow.numerics._adaptive import RK4, Retracted

DIFFRAX = {"euler_renorm": dfx.Euler, "rk4": RK4}


def programs(d: int, members: int, n: int, dt: float, t1: float, eps: float, solver: str):
    """The two jitted solves of M members, `beta -> pair density (members, steps + 1)`."""
    cfg = phase_config(d, members, n, dt, t1, eps, solver)
    system = af.build_system(cfg)
    keys = jax.random.split(jax.random.key(0), members)
    steps = round(t1 / dt)

    def scan(key, beta):
        field, y0, record = system(key, beta)
        sol = af.simulate(field, y0, t1=t1, dt=dt, solver=solver, save_every=1, record=record)
        return sol.stats["pair_density"]

    def diffrax(key, beta):
        field, y0, record = system(key, beta)
        y0 = field.geometry.retract(y0)
        sol = dfx.diffeqsolve(dfx.ODETerm(field), Retracted(DIFFRAX[solver](), field.geometry), t0=0.0, t1=t1, dt0=dt,
                              y0=y0, stepsize_controller=dfx.ConstantStepSize(), max_steps=steps,
                              saveat=dfx.SaveAt(t0=True, steps=True, fn=lambda t, y, args: record(t, y, field)))
        return sol.ys["pair_density"]

    batched = lambda one: jax.jit(lambda beta: jax.vmap(one, in_axes=(0, None))(keys, beta))
    return {"scan": batched(scan), "diffrax": batched(diffrax)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[2, 32])
    parser.add_argument("--members", type=int, default=256)
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--beta", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--solver", choices=list(DIFFRAX), default="euler_renorm")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    dt, t1, eps = 0.1, 30.0, 1e-2
    print(f"machine: {describe()}")
    print(f"{args.solver}, {args.rounds} interleaved rounds per d, M = {args.members} members, n = {args.n}; medians")
    print(f"{'d':>4} {'scan s':>8} {'diffrax s':>10} {'diffrax/scan':>13} {'compile scan':>13} "
          f"{'compile diffrax':>16} {'|dP|':>8}")
    rows = []
    for d in args.dims:
        solves = programs(d, args.members, args.n, dt, t1, eps, args.solver)
        compile_s, curves = {}, {}
        for name, solve in solves.items():
            start = time.perf_counter()
            curves[name] = np.asarray(jax.block_until_ready(solve(jnp.float32(args.beta))))
            compile_s[name] = time.perf_counter() - start
        gap = float(np.max(np.abs(curves["scan"] - curves["diffrax"])))
        samples = {name: [] for name in solves}
        for r in range(args.rounds):
            beta = jnp.float32(args.beta + 1e-3 * (r + 1))  # a new beta: no recompilation
            order = list(solves)
            random.shuffle(order)
            for name in order:
                start = time.perf_counter()
                jax.block_until_ready(solves[name](beta))
                samples[name].append(time.perf_counter() - start)
        scan_s, diffrax_s = statistics.median(samples["scan"]), statistics.median(samples["diffrax"])
        ratio = statistics.median(b / a for a, b in zip(samples["scan"], samples["diffrax"]))
        row = dict(solver=args.solver, d=d, members=args.members, n=args.n, scan_s=scan_s, diffrax_s=diffrax_s, ratio=ratio,
                   compile_scan_s=compile_s["scan"] - scan_s, compile_diffrax_s=compile_s["diffrax"] - diffrax_s,
                   max_density_gap=gap, rounds=args.rounds)
        rows.append(row)
        print(f"{d:>4} {scan_s:>8.3f} {diffrax_s:>10.3f} {ratio:>12.2f}x {row['compile_scan_s']:>13.2f} "
              f"{row['compile_diffrax_s']:>16.2f} {gap:>8.1e}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(machine=describe(), rows=rows), f, indent=2)


if __name__ == "__main__":
    main()
