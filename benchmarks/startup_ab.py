"""Start-up of this checkout against a baseline checkout of the package, side by side.

Each variant is a fresh process timed from start to exit, for both trees, in
interleaved rounds (a new random order each round), so that the machine's changing
load falls on both alike; the table gives medians and the ratio of this tree's median
to the baseline's:

- `import attnflow`: the package alone (its public names load on first use);
- `imports of a run`: what a plot-free fixed-step run imports (`startup.IMPORTS`);
- `attnflow, cached`: the trivial run of `startup.py` (`startup.TRIVIAL`), its
  programs in a warm compilation cache.

The baseline is a folder holding an `attnflow` package (with its `conf` folder inside,
as an installed package has it), put first on PYTHONPATH, e.g.:

    mkdir -p /tmp/base && git archive main attnflow conf | tar -x -C /tmp/base
    cp -r /tmp/base/conf /tmp/base/attnflow/conf
    python benchmarks/startup_ab.py --baseline /tmp/base --rounds 9
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from machine import describe
from startup import IMPORTS, TRIVIAL, timed

ROOT = Path(__file__).resolve().parents[1]
RUN = "import sys; from attnflow.cli import main; sys.argv[0] = 'attnflow'; main()"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="attnflow-startup-ab-"))
    trees = {"baseline": args.baseline.resolve(), "this tree": ROOT}
    envs = {name: dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(path), ATTNFLOW_CACHE_DIR=str(work / name))
            for name, path in trees.items()}
    runs = iter(range(10**6))

    def run(env):
        return timed([sys.executable, "-c", RUN, *TRIVIAL, f"hydra.run.dir={work / f'run{next(runs)}'}"], env)

    variants = {
        "import attnflow": lambda env: timed([sys.executable, "-c", "import attnflow"], env),
        "imports of a run": lambda env: timed([sys.executable, "-c", IMPORTS], env),
        "attnflow, cached": run,
    }
    for env in envs.values():
        run(env)  # fills each tree's warm cache
    times = {(variant, tree): [] for variant in variants for tree in trees}
    order = list(times)
    for _ in range(args.rounds):
        random.shuffle(order)
        for variant, tree in order:
            times[variant, tree].append(variants[variant](envs[tree]))
    shutil.rmtree(work, ignore_errors=True)

    print(f"machine: {describe()}")
    print(f"{args.rounds} interleaved rounds; medians, and the ratio of this tree's to the baseline's")
    print(f"{'variant':20s} {'baseline s':>11s} {'this tree s':>12s} {'ratio':>7s}")
    for variant in variants:
        base, new = (statistics.median(times[variant, tree]) for tree in trees)
        print(f"{variant:20s} {base:11.3f} {new:12.3f} {new / base:7.3f}")


if __name__ == "__main__":
    main()
