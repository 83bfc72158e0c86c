"""Many heads: the compile time, the temporary memory (XLA's own count) and the time of
one evaluation of the attention field with H = 256 random heads averaged with 1/H
(`heads_combine=mean`; Q = I, K the product law, V Wishart, d = 16, float32), on the
dense path (n = 256, logits formed whole) and the tiled one (n = 2048, tiles of 512).
The heads are one axis of every array (an einsum over them on the dense path, a vmap
on the tiled one), so one program serves any H.

    python benchmarks/heads.py
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

import attnflow as af

D, HEADS = 16, 256
WEIGHTS = {"q": {"kind": "identity"}, "k": {"kind": "random", "law": "product"},
           "v": {"kind": "random", "law": "wishart"}}


def main() -> None:
    for n, block in ((256, 0), (2048, 512)):
        cfg = af.validate_config({"n": n, "d": D, "heads": HEADS, "heads_combine": "mean", "dtype": "float32",
                                  "attention_block": block, "weights": WEIGHTS})
        field = af.build_field(cfg, jax.random.key(0), 1.0, jnp.float32)
        x = af.UniformSphere()(jax.random.key(1), n, D, jnp.float32)
        evaluate = jax.jit(lambda field, x: field(0.0, x))
        start = time.perf_counter()
        compiled = evaluate.lower(field, x).compile()
        compile_s = time.perf_counter() - start
        temp = compiled.memory_analysis().temp_size_in_bytes / 2**20
        compiled(field, x).block_until_ready()
        start = time.perf_counter()
        compiled(field, x).block_until_ready()
        run_s = time.perf_counter() - start
        path = "dense" if block == 0 else f"tiled ({block})"
        print(f"n = {n:5d} {path:12s} H = {HEADS}: compile {compile_s:.2f} s, temporaries {temp:.0f} MiB, "
              f"one evaluation {1e3 * run_s:.0f} ms")


if __name__ == "__main__":
    main()
