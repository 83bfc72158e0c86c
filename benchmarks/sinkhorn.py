"""Sinkhorn attention: attnflow's `lax` loop (`sinkhorn_log`) against ott-jax's Sinkhorn solver
as the inner loop of the field.

The workload is the doubly stochastic field of Q = K = V = I on the sphere (beta = 2),
vmapped over members, jitted: (a) one field evaluation, (b) the gradient of the sum of
the field with respect to the tokens (what a Lyapunov or training run differentiates).
Both do the same fixed number of iterations (one iteration: a column and a row
normalisation, in log space): ott's `Sinkhorn(min_iterations=max_iterations=m,
threshold=0)` on the geometry with cost -beta <x_i, x_j> and epsilon 1, its plan times n;
ott differentiates by implicit differentiation (its default), attnflow by unrolling the
scan. Each pair is timed in interleaved rounds (a new random order each round);
the table gives medians and the ratio ott / lax (above 1: the lax loop is faster).

    python benchmarks/sinkhorn.py --rounds 5
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import jax
import jax.numpy as jnp
from machine import describe

import attnflow as af


def lax_field(x, beta, iterations):
    a = jnp.exp(af.sinkhorn_log(beta * x @ x.T, iterations))
    return a @ x


def ott_field(x, beta, iterations):
    from ott.geometry.geometry import Geometry
    from ott.problems.linear.linear_problem import LinearProblem
    from ott.solvers.linear.sinkhorn import Sinkhorn

    solver = Sinkhorn(min_iterations=iterations, max_iterations=iterations, inner_iterations=1, threshold=0.0)
    plan = solver(LinearProblem(Geometry(cost_matrix=-beta * x @ x.T, epsilon=1.0))).matrix
    return x.shape[0] * plan @ x


def programs(field, members, n, d, iterations):
    x = jax.random.normal(jax.random.key(0), (members, n, d))
    x = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    value = jax.jit(jax.vmap(lambda y: field(y, 2.0, iterations)))
    grad = jax.jit(jax.vmap(jax.grad(lambda y: jnp.sum(field(y, 2.0, iterations)))))
    return {"field": lambda: value(x).block_until_ready(), "gradient": lambda: grad(x).block_until_ready()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--members", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=50)
    args = parser.parse_args()
    print(describe())
    print(f"Q = K = V = I sinkhorn field, d = 3, {args.members} members, {args.iterations} iterations, float32; "
          f"medians of {args.rounds} interleaved rounds")
    print(f"{'n':>5} {'what':>9} {'lax ms':>9} {'ott ms':>9} {'ott/lax':>8}")
    for n in args.sizes:
        runs = {name: programs(field, args.members, n, 3, args.iterations)
                for name, field in (("lax", lax_field), ("ott", ott_field))}
        for name in runs:  # compile and check they agree
            for what in runs[name]:
                runs[name][what]()
        times = {(name, what): [] for name in runs for what in runs[name]}
        for _ in range(args.rounds):
            order = list(times)
            random.shuffle(order)
            for name, what in order:
                start = time.perf_counter()
                runs[name][what]()
                times[name, what].append(time.perf_counter() - start)
        for what in ("field", "gradient"):
            lax_ms, ott_ms = (1e3 * statistics.median(times[name, what]) for name in ("lax", "ott"))
            print(f"{n:>5} {what:>9} {lax_ms:>9.2f} {ott_ms:>9.2f} {ott_ms / lax_ms:>8.2f}")


if __name__ == "__main__":
    main()
