"""Silence: how long an `attnflow` command on a terminal shows nothing.

Each command runs as a fresh process whose stderr is a pseudo-terminal (the progress
lines are drawn only on a terminal) and whose stdout is a pipe; every chunk either
writes is timestamped. The table gives, per command, the medians over interleaved
rounds of

- `first stderr s`: the seconds from the start of the process to its first output on
  stderr (a status line, a bar, or a message);
- `longest silence s`: the longest stretch with no output on either stream, from the
  start of the process to its exit, and the line written just before it (where the
  silence fell).

The commands: a small run (empty compilation cache, plot=true: compiling and drawing
the summary figure) and the single_cluster experiment, reduced (four figures: PNG,
PDF, an HTML page, a GIF animation).

With `--against SOURCE` (a folder holding another version of the `attnflow` package,
e.g. `git archive` of another commit) each command runs for this tree and for SOURCE,
imported through PYTHONPATH by the same launcher, in interleaved rounds.

    python benchmarks/silence.py --rounds 3
    python benchmarks/silence.py --rounds 3 --against /tmp/before
"""

from __future__ import annotations

import argparse
import os
import pty
import random
import re
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import describe

HERE = Path(__file__).resolve().parents[1]
LAUNCHER = "import sys; from attnflow.cli import main; sys.argv[0] = 'attnflow'; sys.exit(main())"
COMMANDS = {
    "small run, plot=true": ["n=8", "d=3", "members=4", "beta=[0.5,2]", "t1=2", "dt=0.1", "saves=5", "plot=true"],
    "experiment=single_cluster, reduced": ["experiment=single_cluster", "members=2", "t1=2", "saves=21"],
}
_CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\r\x1b]")


def watched(command: list[str], env: dict) -> tuple[float, float, str]:
    """(seconds to the first stderr output, the longest silence, the last line before it)."""
    main, child = pty.openpty()
    start = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=child, stdin=subprocess.DEVNULL)
    os.close(child)
    streams = {main: "err", proc.stdout.fileno(): "out"}
    first, last, longest, where, text = None, start, 0.0, "", ""
    while streams:
        ready, _, _ = select.select(list(streams), [], [], 0.05)
        now = time.perf_counter()
        for fd in ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the pseudo-terminal closes with the process
                chunk = b""
            if not chunk:
                del streams[fd]
                continue
            if streams[fd] == "err" and first is None:
                first = now - start
            if now - last > longest:
                longest, where = now - last, text
            last = now
            lines = [line.strip() for line in _CONTROL.sub("\n", chunk.decode(errors="replace")).splitlines()]
            text = next((line for line in reversed(lines) if line), text)
    proc.wait()
    end = time.perf_counter()
    if end - last > longest:
        longest, where = end - last, text
    os.close(main)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {proc.returncode}")
    return (end - start if first is None else first), longest, where[:60]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", metavar="SOURCE", help="the same commands with another attnflow source tree")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="attnflow-silence-"))
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("HYDRA_FULL_ERROR", None)
    trees = {"this tree": HERE}
    if args.against:
        trees[args.against] = Path(args.against).resolve()
    runs = iter(range(10**6))

    def variant(tree: Path, overrides: list[str]):
        def run():
            number = next(runs)
            # An empty compilation cache each time: what a first run pays.
            return watched([sys.executable, "-c", LAUNCHER, *overrides, f"hydra.run.dir={work / f'run{number}'}"],
                           dict(env, PYTHONPATH=str(tree), ATTNFLOW_CACHE_DIR=str(work / f"cache{number}")))
        return run

    variants = {(name, label): variant(tree, overrides) for name, overrides in COMMANDS.items()
                for label, tree in trees.items()}
    times = {key: [] for key in variants}
    order = list(variants)
    for _ in range(args.rounds):
        random.shuffle(order)
        for key in order:
            times[key].append(variants[key]())
    print(f"machine: {describe()}")
    print(f"{args.rounds} interleaved rounds; medians (each run's own values in brackets)")
    for (name, label), values in times.items():
        first = statistics.median(v[0] for v in values)
        silence = statistics.median(v[1] for v in values)
        where = sorted(values, key=lambda v: v[1])[len(values) // 2][2]
        print(f"{name} [{label}]: first stderr {first:.2f} s {[round(v[0], 2) for v in values]}; longest silence "
              f"{silence:.2f} s {[round(v[1], 2) for v in values]}, after {where!r}")


if __name__ == "__main__":
    main()
