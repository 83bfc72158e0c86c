"""The default study, drawn for the README: clustering on S^2 across beta.

Q = K = V = I softmax self-attention on the sphere (the post-LN limit), n = 32 tokens
in d = 3, 256 members, beta in {0.5, 1, 2, 4, 9}, Euler + renormalization with
h = 0.1 up to t = 30 -- the defaults of `conf/config.yaml`, i.e. what a bare
`attnflow` runs. Small beta collapses to one cluster quickly (theorem 4.2 of the
survey); large beta stalls in several clusters (metastability).

    python experiments/beta_sweep.py            # writes figures/beta_sweep.png
"""

from pathlib import Path

import attnflow as af

if __name__ == "__main__":
    ds = af.run({})
    out = Path(__file__).resolve().parents[1] / "figures" / "beta_sweep.png"
    af.plot_summary(ds, out, title="SA on S^2, Q = K = V = I, n = 32, d = 3, 256 members")
    print(f"wrote {out}")
