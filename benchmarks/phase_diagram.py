"""Phase-diagram workload: attnflow against batched NumPy and against raw matmul speed.

The configuration of the pair-density phase diagrams ("A mathematical perspective on
transformers", fig. 3): Q = K = V = I, SA dynamics on the sphere, n = 32 tokens,
2048 members, Euler on the unprojected field followed by renormalization, h = 0.1,
t in [0, 30], float32, the pair density P(<x_i, x_j> > 1 - eps) recorded after every
step. Five measurements, taken in interleaved rounds (a new random order each round,
so that the machine's changing load falls on all of them alike):

1. attnflow (`solve_ensemble`, compiled once beforehand, a new beta every call), on its
   default devices: on a CPU one JAX device per usable core (`cpu_devices`, set by
   `--cpu-devices` here), the members shared out over them; and on one device alone
   (`attnflow 1 dev`: the same program as the hand-tuned JAX's below);
2. the same algorithm in batched NumPy, written the way public phase-diagram code
   does it (stacked `@` products over all members, one Python loop over steps), from
   attnflow's own initial states;
3. the same algorithm in hand-tuned JAX (`hand_jax_phase_diagram`: the tricks a JAX
   expert would write for this one workload; `--hand-chunk` and `--hand-broadcast` try
   two more), from the same initial states, on one device as written (`hand/1dev`: its
   time over attnflow's on one device; below 1: faster than attnflow) and with its
   members sharded over the same devices as attnflow's (`sharded/attn`, its time over
   attnflow's default), and its share of the exp rate (one device);
4. a large float32 matrix multiply (the best of NumPy and XLA): the machine's matmul
   throughput in that round, against which the attnflow run's flop rate is compared;
5. the exp rate of XLA on the default device (a jitted sum of exp over 2^24 numbers):
   at small d the workload is bound by its n^2 exps per member and step, not by matmul.

The table gives medians over the rounds: of the times, of the per-round speed-up
(NumPy / attnflow), of the per-round share of matmul throughput and of the per-round
share of the exp rate. Flops counted: 4 n^2 d per member and step (Gram matrix and
attention mixing) plus 2 n^2 d per member and record (the Gram matrix of the pair
density); exps counted: n^2 per member and step.

Nothing here assumes a CPU: on a GPU the same command times the same workload (XLA's
matmul and exp rates are then the GPU's, NumPy's stays the host's), with float32
products at the precision a run uses (`matmul_precision`, highest by default).

    python benchmarks/phase_diagram.py                  # d in {2, 32, 128}, 5 rounds
    python benchmarks/phase_diagram.py --dims 2 3 --cpu-devices 1   # one device for all
    python benchmarks/phase_diagram.py --dims 128 --members 512 --rounds 3
    python benchmarks/phase_diagram.py --dims 2 --rounds 1 --profile  # time per XLA kernel
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from machine import describe

import attnflow as af


def numpy_phase_diagram(x0: np.ndarray, beta: float, dt: float, steps: int, eps: float) -> np.ndarray:
    """Batched NumPy: x of shape (members, n, d); returns the pair density (members, steps+1)."""
    x = x0.copy()
    n = x.shape[1]
    off_diagonal = ~np.eye(n, dtype=bool)

    def density(x):
        g = x @ x.transpose(0, 2, 1)
        return (g[:, off_diagonal] > 1 - eps).mean(axis=1)

    out = [density(x)]
    for _ in range(steps):
        logits = beta * (x @ x.transpose(0, 2, 1))
        logits -= logits.max(axis=-1, keepdims=True)
        a = np.exp(logits)
        a /= a.sum(axis=-1, keepdims=True)
        x = x + dt * (a @ x)
        x /= np.linalg.norm(x, axis=-1, keepdims=True)
        out.append(density(x))
    return np.stack(out, axis=1)


def hand_jax_phase_diagram(dt: float, steps: int, eps: float, chunk: int | None = None, broadcast: bool = False):
    """The same workload in hand-written JAX, tuned for this one case: a `vmap` over members
    and a `lax.scan` over steps, the row maximum of the logits known in advance (beta, on
    the diagonal of unit tokens), and the softmax normalised after the mixing (one division
    per token, not per pair). Two more tricks are options, off by default because they did
    not pay on the 2-core CPU of docs/performance.md (2048 members): `broadcast=True` forms
    the Gram matrix and the mixing by broadcast products instead of matrix products (even
    at d = 2, 1.14x the time at d = 3), and `chunk` solves the members in chunks of that
    many with `lax.map`, so that a chunk's states stay in cache (1.2-1.5x the time at 64 to
    512 members). Returns a compiled map from x of shape (members, n, d) and beta to the
    pair density (members, steps+1)."""

    def gram(x):
        if broadcast:
            return sum(x[:, None, k] * x[None, :, k] for k in range(x.shape[-1]))
        return x @ x.T

    def member(x, beta):
        n = x.shape[0]
        index = jnp.arange(n)
        off_diagonal = index[:, None] != index[None, :]  # an index comparison fuses into the count

        def density(g):
            return jnp.sum(jnp.sum(((g > 1 - eps) & off_diagonal).astype(g.dtype), axis=1)) / (n * (n - 1))

        def step(x, _):
            e = jnp.exp(beta * (gram(x) - 1))  # the row maximum, beta, subtracted
            if broadcast:
                mixed = jnp.stack([jnp.sum(e * x[None, :, k], axis=1) for k in range(x.shape[-1])], axis=-1)
            else:
                mixed = e @ x
            x = x + dt * mixed / jnp.sum(e, axis=-1, keepdims=True)
            x = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
            return x, density(gram(x))

        _, out = jax.lax.scan(step, x, None, length=steps)
        return jnp.concatenate([density(gram(x))[None], out])

    every = jax.vmap(member, in_axes=(0, None))

    @jax.jit
    def run(x0, beta):
        members = x0.shape[0]
        if chunk is None or chunk >= members:
            return every(x0, beta)
        count = -(-members // chunk)
        padded = jnp.concatenate([x0, jnp.broadcast_to(x0[:1], (count * chunk - members,) + x0.shape[1:])])
        out = jax.lax.map(lambda xs: every(xs, beta), padded.reshape((count, chunk) + x0.shape[1:]))
        return out.reshape(count * chunk, -1)[:members]

    return run


def kernel_times(run, top: int = 6) -> str:
    """XLA's time per fused kernel (summed over the steps) of one call of `run`, from a
    `jax.profiler` trace (its Perfetto export): the largest `top`, in ms, and their sum."""
    import glob
    import gzip
    import tempfile
    from collections import Counter

    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder, create_perfetto_trace=True):
            run()
        (path,) = glob.glob(f"{folder}/plugins/profile/*/perfetto_trace.json.gz")
        with gzip.open(path) as f:
            events = json.load(f)["traceEvents"]
    kernels = Counter()
    for e in events:
        if e.get("ph") == "X" and ("fusion" in e["name"] or e["name"].startswith(("copy", "dot", "reduce"))):
            kernels[e["name"]] += e.get("dur", 0) / 1e3
    listed = " ".join(f"{name} {ms:.0f}" for name, ms in kernels.most_common(top))
    return f"{listed}; all {sum(kernels.values()):.0f} ms"


def matmul_throughput(size: int = 2048, repeats: int = 3) -> float:
    """Best float32 GEMM rate (flop/s) of NumPy and XLA, measured now."""
    a = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
    rates = []
    for f, arg in ((np.matmul, a), (jax.jit(jnp.matmul), jnp.asarray(a))):
        jax.block_until_ready(f(arg, arg))
        start = time.perf_counter()
        for _ in range(repeats):
            jax.block_until_ready(f(arg, arg))
        rates.append(2 * size**3 * repeats / (time.perf_counter() - start))
    return max(rates)


def exp_throughput(size: int = 2**24, repeats: int = 3) -> float:
    """XLA's exp rate (exps per second) in float32 on the default device, measured now."""
    a = jnp.asarray(np.random.default_rng(1).uniform(-4, 0, size).astype(np.float32))
    f = jax.jit(lambda a: jnp.sum(jnp.exp(a)))
    jax.block_until_ready(f(a))
    start = time.perf_counter()
    for _ in range(repeats):
        jax.block_until_ready(f(a))
    return size * repeats / (time.perf_counter() - start)


def phase_config(d: int, members: int, n: int = 32, dt: float = 0.1, t1: float = 30.0, eps: float = 1e-2,
                 solver: str = "euler_renorm"):
    """The benchmark's study config, with the JAX settings a run of it would have."""
    from attnflow.running._study import prepare_jax

    cfg = af.validate_config(
        dict(n=n, d=d, members=members, t1=t1, dt=dt, solver=solver, metrics=["pair_density"],
             cluster_eps=eps, saves=round(t1 / dt) + 1, dtype="float32", beta=1.0, compilation_cache=False)
    )
    prepare_jax(cfg)
    return cfg


def attnflow_phase_diagram(d: int, members: int, n: int, dt: float, t1: float, eps: float, **options):
    """A solve of the workload (compiled by a first call, whose time is returned too);
    `options` go to `solve_ensemble` (chunk_size, devices)."""
    cfg = phase_config(d, members, n, dt, t1, eps)
    system = af.build_system(cfg)
    keys = jax.random.split(jax.random.key(0), members)

    def solve(beta):
        result = af.solve_ensemble(system, keys, jnp.asarray([beta], jnp.float32), t1=t1, dt=dt,
                                   save_every=1, solver="euler_renorm", **options)
        return jax.block_until_ready(result)

    start = time.perf_counter()
    solve(0.5)
    compile_and_run = time.perf_counter() - start
    return solve, compile_and_run, system, keys


def workload(members: int, n: int, d: int, steps: int) -> tuple[int, int]:
    """(flops, exps) of the workload: 4 n^2 d flops per member and step (logits and
    mixing) plus 2 n^2 d per record (the Gram matrix, recorded at every step and at
    t = 0), and n^2 exps per member and step."""
    return members * n**2 * d * (4 * steps + 2 * (steps + 1)), members * n**2 * steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[2, 32, 128])
    parser.add_argument("--members", type=int, default=2048)
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--beta", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--hand-chunk", type=int, help="the hand-tuned JAX solves its members in chunks of this many")
    parser.add_argument("--hand-broadcast", action="store_true", help="the hand-tuned JAX uses broadcast products")
    parser.add_argument("--cpu-devices", type=int, help="JAX devices on a CPU (default: one per usable core)")
    parser.add_argument("--profile", action="store_true",
                        help="also print XLA's time per fused kernel of attnflow and the hand-tuned JAX, one device")
    args = parser.parse_args()
    from attnflow.running._study import use_cpu_devices

    use_cpu_devices(args.cpu_devices)  # before JAX starts
    devices = jax.local_devices()
    mesh = jax.sharding.Mesh(np.array(devices), ("members",))
    split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("members"))
    dt, t1, eps = 0.1, 30.0, 1e-2
    steps = round(t1 / dt)
    print(f"machine: {describe()}")
    print(f"float32 matmul precision: {jax.config.jax_default_matmul_precision or 'default'}")
    print(f"{len(devices)} {devices[0].platform} device(s); {args.rounds} interleaved rounds per d; medians "
          "(min-max of the matmul rate)")
    header = (f"{'d':>4} {'attnflow s':>11} {'compile s':>10} {'numpy s':>9} {'speed-up':>9} {'GFLOP/s':>8} "
              f"{'matmul GFLOP/s':>18} {'of matmul':>10} {'exp G/s':>8} {'of exp':>7} {'|dP|':>7} {'1 dev s':>8} "
              f"{'hand s':>7} {'hand/1dev':>10} {'hand exp':>9} {'sharded/attn':>13}")
    print(header)
    rows = []
    for d in args.dims:
        solve, compile_s, system, keys = attnflow_phase_diagram(d, args.members, args.n, dt, t1, eps)
        solve_one = attnflow_phase_diagram(d, args.members, args.n, dt, t1, eps, devices=devices[:1])[0]
        # The NumPy run starts from attnflow's own initial states, so both curves agree.
        x0 = np.asarray(jax.vmap(lambda k: system(k, args.beta)[1])(keys))
        flops, exps = workload(args.members, args.n, d, steps)
        reference = np.asarray(solve(args.beta).stats["pair_density"][0])
        samples = {"attnflow": [], "one": [], "numpy": [], "hand": [], "sharded": [], "matmul": [], "exp": []}
        gaps = []
        hand = hand_jax_phase_diagram(dt, steps, eps, args.hand_chunk, args.hand_broadcast)
        x0_device, x0_split = jax.device_put(x0, devices[0]), jax.device_put(x0, split)
        hand_gap = float(np.max(np.abs(np.asarray(hand(x0_device, jnp.float32(args.beta))).mean(0)
                                       - reference.mean(0))))  # compiled here, and the curves agree
        hand_gap = max(hand_gap, float(np.max(np.abs(np.asarray(hand(x0_split, jnp.float32(args.beta))).mean(0)
                                                     - reference.mean(0)))))
        one_gap = float(np.max(np.abs(np.asarray(solve_one(args.beta).stats["pair_density"][0]) - reference)))

        def run_attnflow():
            start = time.perf_counter()
            result = solve(args.beta + 1e-3 * len(samples["attnflow"]))  # a new beta: no recompilation
            samples["attnflow"].append(time.perf_counter() - start)
            return result

        def run_one():
            start = time.perf_counter()
            solve_one(args.beta + 1e-3 * len(samples["one"]))
            samples["one"].append(time.perf_counter() - start)

        def run_sharded():
            start = time.perf_counter()
            jax.block_until_ready(hand(x0_split, jnp.float32(args.beta + 1e-3 * len(samples["sharded"]))))
            samples["sharded"].append(time.perf_counter() - start)

        def run_numpy():
            start = time.perf_counter()
            density = numpy_phase_diagram(x0, args.beta, dt, steps, eps)
            samples["numpy"].append(time.perf_counter() - start)
            gaps.append(float(np.max(np.abs(density.mean(0) - reference.mean(0)))))  # the curves agree

        def run_hand():
            start = time.perf_counter()
            jax.block_until_ready(hand(x0_device, jnp.float32(args.beta + 1e-3 * len(samples["hand"]))))
            samples["hand"].append(time.perf_counter() - start)

        for _ in range(args.rounds):
            order = [run_attnflow, run_numpy, run_hand, run_one, run_sharded,
                     lambda: samples["matmul"].append(matmul_throughput()),
                     lambda: samples["exp"].append(exp_throughput())]
            random.shuffle(order)
            for measure in order:
                measure()
        jax_s, numpy_s = statistics.median(samples["attnflow"]), statistics.median(samples["numpy"])
        speedup = statistics.median(n_ / a for n_, a in zip(samples["numpy"], samples["attnflow"]))
        hand_s = statistics.median(samples["hand"])
        one_s = statistics.median(samples["one"])
        hand_ratio = statistics.median(h / a for h, a in zip(samples["hand"], samples["one"]))
        sharded_ratio = statistics.median(h / a for h, a in zip(samples["sharded"], samples["attnflow"]))
        hand_exp = statistics.median(exps / h / e for h, e in zip(samples["hand"], samples["exp"]))
        share = statistics.median(flops / a / m for a, m in zip(samples["attnflow"], samples["matmul"]))
        exp_share = statistics.median(exps / a / e for a, e in zip(samples["attnflow"], samples["exp"]))
        peak = samples["matmul"]
        row = dict(d=d, attnflow_s=jax_s, compile_s=compile_s - jax_s, numpy_s=numpy_s, speedup=speedup,
                   gflops=flops / jax_s / 1e9, matmul_gflops=statistics.median(peak) / 1e9,
                   matmul_gflops_range=[min(peak) / 1e9, max(peak) / 1e9], matmul_fraction=share,
                   exp_rate=statistics.median(samples["exp"]), exp_fraction=exp_share,
                   max_mean_density_gap=max(gaps), hand_s=hand_s, hand_over_attnflow=hand_ratio,
                   hand_exp_fraction=hand_exp, hand_density_gap=hand_gap, one_device_s=one_s,
                   one_device_density_gap=one_gap, sharded_hand_s=statistics.median(samples["sharded"]),
                   sharded_over_attnflow=sharded_ratio, devices=len(devices), rounds=args.rounds)
        rows.append(row)
        matmul = f"{row['matmul_gflops']:.0f} ({min(peak) / 1e9:.0f}-{max(peak) / 1e9:.0f})"
        print(f"{d:>4} {jax_s:>11.2f} {row['compile_s']:>10.2f} {numpy_s:>9.2f} {speedup:>8.1f}x "
              f"{row['gflops']:>8.1f} {matmul:>18} {share:>9.0%} {row['exp_rate'] / 1e9:>8.2f} {exp_share:>6.0%} "
              f"{max(gaps):>7.3f} {one_s:>8.2f} {hand_s:>7.2f} {hand_ratio:>9.2f}x {hand_exp:>8.0%} "
              f"{sharded_ratio:>12.2f}x", flush=True)
        if args.profile:
            print(f"     kernels, attnflow 1 device: {kernel_times(lambda: solve_one(args.beta))}")
            print(f"     kernels, hand-tuned JAX 1 device: "
                  f"{kernel_times(lambda: jax.block_until_ready(hand(x0_device, jnp.float32(args.beta))))}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(machine=describe(), rows=rows), f, indent=2)


if __name__ == "__main__":
    main()
