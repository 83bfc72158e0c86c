"""The default study, drawn for the README: clustering on S^2 across beta.

Q = K = V = I softmax self-attention on the sphere (the post-LN limit), n = 32 tokens
in d = 3, 256 members, beta in {0.5, 1, 2, 4, 9}, Euler + renormalization with
h = 0.1 up to t = 30 -- the defaults of `conf/config.yaml`, i.e. what a bare
`attnflow` runs. Theorem 4.2 (1) of the survey gives one cluster as t -> infinity at
every beta when d >= 3; by t = 30 that end is reached at beta <= 1 (and by 90% of the
members at beta = 2), while beta = 4 and 9 still hold 2 and 4 clusters in the median
member, metastable states that merge much later (tests/core/test_beta_sweep.py).

    python experiments/beta_sweep.py            # writes figures/beta_sweep.png
"""

from pathlib import Path

import attnflow as af

if __name__ == "__main__":
    ds = af.run({})
    out = Path(__file__).resolve().parents[1] / "figures" / "beta_sweep.png"
    af.plot_summary(ds, out, title="SA on S^2, Q = K = V = I, n = 32, d = 3, 256 members")
    print(f"wrote {out}")
