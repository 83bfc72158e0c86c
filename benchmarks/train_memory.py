"""`attnflow train`'s memory estimate against what XLA plans and what a step really uses.

`attnflow train` refuses a run at once when even its least need (parameters, gradients,
the state at every stage, one stage's attention scores, the logits) exceeds the free
memory of the device, and otherwise, when the full estimate (`memory_need`: the
activations of every stage kept for the backward pass) exceeds it, lets XLA's plan of
the compiled step decide. This script holds the estimate against, per configuration:

1. XLA's plan of one compiled training step (arguments + outputs + temporary buffers,
   `memory_analysis()` of the compiled program);
2. on an accelerator, the peak of the device's memory in use over three real steps
   (`memory_stats()["peak_bytes_in_use"]`; the host's allocator keeps no such count).

The ratios estimate / plan and estimate / peak are printed, with the machine; each
configuration runs in a process of its own. Model sizes are those of
`conf/train.yaml`, with corpus `induction` (synthetic, nothing to read) of 512 symbols.

    python benchmarks/train_memory.py                      # small sizes, a CPU's minutes
    python benchmarks/train_memory.py --contexts 256 1024 2048 4096 --batch 16   # a GPU
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import equinox as eqx
import jax
from machine import describe

from attnflow.diffeqformer import _train


def measure(settings: dict) -> dict:
    cfg = _train.train_config(settings)
    need = _train.memory_need(cfg)
    cfg, s = _train.setup(cfg)
    tx = _train.optimizer(cfg)
    params, static = eqx.partition(s.module, s.trainable)
    step = _train.training_step(tx, cfg.batch, cfg.context, cfg.solver)
    opt_state = tx.init(params)
    compiled = step.lower(params, static, opt_state, s.corpus, jax.random.key(0)).compile()
    stats = compiled.compiled.memory_analysis()
    planned = stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
    row = {"settings": settings, "estimate_gib": need.total / 2**30, "scores_gib": need.scores / 2**30,
           "plan_gib": planned / 2**30, "estimate_over_plan": need.total / planned}
    device = jax.devices()[0]
    if device.platform != "cpu":
        for i in range(3):
            params, opt_state, value = step(params, static, opt_state, s.corpus, jax.random.key(i))
        jax.block_until_ready(value)
        peak = device.memory_stats()["peak_bytes_in_use"]
        row |= {"peak_gib": peak / 2**30, "estimate_over_peak": need.total / peak}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["diffeqformer", "gpt"])
    parser.add_argument("--contexts", nargs="+", type=int, default=[64, 256])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # one configuration, in a process of its own
    args = parser.parse_args()
    if args.one:
        print("json", json.dumps(measure(json.loads(args.one))), flush=True)
        return
    print(describe())
    print(f"{'model':>13} {'context':>7} {'estimate GiB':>12} {'scores GiB':>10} {'XLA plan GiB':>12} "
          f"{'est/plan':>8} {'peak GiB':>8} {'est/peak':>8}")
    for model in args.models:
        for context in args.contexts:
            settings = dict(model=model, corpus="induction", vocab=512, context=context, batch=args.batch,
                            dtype=args.dtype, compilation_cache=False)
            # A process each: the device's peak counts from the start of its process.
            done = subprocess.run([sys.executable, __file__, "--one", json.dumps(settings)], capture_output=True,
                                  text=True)
            lines = [line for line in done.stdout.splitlines() if line.startswith("json ")]
            if done.returncode or not lines:
                print(f"{model:>13} {context:>7} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
                continue
            row = json.loads(lines[-1][5:])
            peak = f"{row['peak_gib']:8.3f} {row['estimate_over_peak']:8.2f}" if "peak_gib" in row else f"{'-':>8} {'-':>8}"
            print(f"{model:>13} {context:>7} {row['estimate_gib']:12.3f} {row['scores_gib']:10.3f} "
                  f"{row['plan_gib']:12.3f} {row['estimate_over_plan']:8.2f} {peak}", flush=True)


if __name__ == "__main__":
    main()
