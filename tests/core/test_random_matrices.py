"""The random laws of the weights have the means and variances docs/model.md (section 7)
gives them, and the panels of the random-matrix phase diagram ("A mathematical
perspective on Transformers", fig. 5) draw them as the paper's code does: the bilinear
form B = Q^T K of logit variance 1, V applied as the transpose of the code's row-vector
V, fresh draws for every member and every beta (tests/README.md, section 16)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnflow as af
from attnflow.experiments import compose_experiment, plan_experiment

D = 128


def _draws(law: str, count: int, d: int = D, seed: int = 0) -> np.ndarray:
    return np.asarray(af.draw_matrix(law, jax.random.key(seed), (count, d, d), 1.0, jnp.float64))


def _unit(key, count: int, d: int = D) -> np.ndarray:
    x = np.asarray(jax.random.normal(key, (count, d), jnp.float64))
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _close(sample: np.ndarray, expected: float, sigma: float, what: str) -> None:
    """The sample mean of `sample` is `expected` within 5 standard errors (`sigma` is the
    standard deviation of one value)."""
    error = 5 * sigma / np.sqrt(sample.size)
    assert abs(sample.mean() - expected) < error, f"{what}: {sample.mean():.5f} vs {expected} +- {error:.5f}"


def _entry_moments(draws: np.ndarray):
    d = draws.shape[-1]
    diagonal = draws[:, np.arange(d), np.arange(d)]
    off = draws[:, ~np.eye(d, dtype=bool)]
    return diagonal, off


@pytest.mark.parametrize("law,diag_mean,diag_var,off_var", [
    ("gaussian", 0.0, 1 / D, 1 / D),
    ("product", 0.0, 1.0, 1.0),
    ("goe", 0.0, 2.0, 1.0),
    ("wishart", np.sqrt(D), 2.0, 1.0),
])
def test_every_law_has_its_documented_mean_and_variance(law, diag_mean, diag_var, off_var):
    draws = _draws(law, 40)
    diagonal, off = _entry_moments(draws)
    _close(diagonal, diag_mean, np.sqrt(diag_var), f"{law} diagonal mean")
    _close(off, 0.0, np.sqrt(off_var), f"{law} off-diagonal mean")
    # Variances: the sample variance of N values has a relative standard error about
    # sqrt(2/N) for Gaussian entries (a little more for the heavier-tailed product and
    # Wishart entries, whose excess kurtosis is 6/d); 10% is more than 5 of them here.
    assert abs(diagonal.var() / diag_var - 1) < 0.1, (law, diagonal.var())
    assert abs(off.var() / off_var - 1) < 0.02, (law, off.var())
    if law in ("goe", "wishart"):
        np.testing.assert_allclose(draws, np.swapaxes(draws, -1, -2), atol=1e-12)


def test_the_product_law_gives_logits_of_unit_variance_at_d_128():
    """<x, B y> for unit x, y and B = G1 G2 / sqrt(d) has variance exactly 1 (docs/model.md,
    section 7); the Ginibre Q, K of the previous release gave 1/d, a beta divided by sqrt(d)."""
    count = 400
    b = _draws("product", count, seed=1)
    kx, ky = jax.random.split(jax.random.key(2))
    x, y = _unit(kx, count), _unit(ky, count)
    logits = np.einsum("ma,mab,mb->m", x, b, y)
    # The standard deviation of a sample standard deviation is about sigma / sqrt(2 N).
    assert abs(logits.std() - 1.0) < 5 / np.sqrt(2 * count), logits.std()
    q, k = (np.asarray(af.draw_matrix("gaussian", key, (count, D, D), 1.0, jnp.float64))
            for key in jax.random.split(jax.random.key(3)))
    ginibre = np.einsum("mca,mcb,ma,mb->m", q, k, x, y)
    assert abs(ginibre.std() * np.sqrt(D) - 1.0) < 5 / np.sqrt(2 * count), ginibre.std()


def _panel_weights(panel: str, d: int = D, betas=(1.0, 5.0), members: int = 2):
    """The attention matrices of two members at two betas, built as the experiment builds
    its panel (through its plan, `build_system` and the members' keys)."""
    plan = plan_experiment(compose_experiment("phase_diagram_random", {
        "d": d, "members": members, "beta": list(betas), "experiment": {"options": {"panels": [panel]}}}))
    cfg = plan.studies[panel][0].config
    system = af.build_system(cfg)
    keys = jax.random.split(jax.random.key(cfg.seed), members)
    out = {}
    for m, key in enumerate(keys):
        for beta in betas:
            field, y0, _ = system(key, beta)
            attention = field.terms[0]
            out[m, beta] = (np.asarray(attention.query(0.0))[0], np.asarray(attention.key(0.0))[0],
                            np.asarray(attention.value(0.0))[0], np.asarray(y0))
    return cfg, out


def test_the_panels_draw_the_laws_of_the_papers_code_per_member_and_per_beta():
    cfg, w = _panel_weights("v_plus_qtk")
    assert cfg.weights.per_beta and not cfg.weights.shared
    q, b, v, y0 = w[0, 1.0]
    np.testing.assert_array_equal(q, np.eye(D))
    # V acts on column vectors as the transpose of the code's row-vector V = B / sqrt(d).
    np.testing.assert_allclose(v, b.T / np.sqrt(D), rtol=1e-12)
    assert np.abs(v - v.T).max() > 0.1  # B is not symmetric: the side matters
    # A fresh B for every member and every beta; the same initial tokens at every beta.
    assert not np.allclose(w[0, 1.0][1], w[0, 5.0][1]) and not np.allclose(w[0, 1.0][1], w[1, 1.0][1])
    np.testing.assert_array_equal(w[0, 1.0][3], w[0, 5.0][3])
    minus = _panel_weights("v_minus_qtk")[1]
    np.testing.assert_allclose(minus[0, 1.0][2], -minus[0, 1.0][1].T / np.sqrt(D), rtol=1e-12)
    _, goe = _panel_weights("goe_wishart")
    q, b, v, _ = goe[0, 1.0]
    np.testing.assert_array_equal(q, np.eye(D))
    np.testing.assert_allclose(b, b.T)
    np.testing.assert_allclose(v, v.T, atol=1e-9)
    assert np.linalg.eigvalsh(v).min() > -1e-9
    # Wishart V = G G^T / sqrt(d): trace d sqrt(d) on average, standard deviation sqrt(2 d).
    assert abs(np.trace(v) / (D * np.sqrt(D)) - 1) < 5 * np.sqrt(2) / D


def test_per_beta_draws_are_opt_in_and_transpose_is_checked():
    base = {"n": 4, "d": 3, "members": 2, "beta": [1.0, 2.0],
            "weights": {"shared": False, "k": {"kind": "random", "law": "product"}}}
    for per_beta in (False, True):
        cfg = af.validate_config({**base, "weights": {**base["weights"], "per_beta": per_beta}})
        system = af.build_system(cfg)
        key = jax.random.key(0)
        k1, k2 = (np.asarray(system(key, beta)[0].terms[0].key(0.0)) for beta in (1.0, 2.0))
        assert np.array_equal(k1, k2) != per_beta
    with pytest.raises(af.ConfigError, match="weights.v.transpose needs a square matrix"):
        af.validate_config({"d": 3, "d_v": 2, "weights": {"v": {"kind": "random", "transpose": True},
                                                          "o": {"kind": "random"}}})
    with pytest.raises(af.ConfigError, match="weights.q.transpose does not apply to weights.q.kind=identity"):
        af.validate_config({"weights": {"q": {"transpose": True}}})
    with pytest.raises(af.ConfigError, match="weights.per_beta does not apply with no random weights"):
        af.validate_config({"weights": {"per_beta": True}})
    with pytest.raises(af.ConfigError, match="the product law needs square matrices"):
        af.validate_config({"d": 3, "d_k": 2, "weights": {"q": {"kind": "random"}, "k": {"kind": "random", "law": "product"}}})


@pytest.mark.parametrize("panel", ["v_plus_qtk", "goe_wishart"])
def test_a_panel_steps_exactly_as_the_papers_code_does(panel):
    """An independent NumPy transcription of the published step of "A mathematical
    perspective on Transformers" (its `phase-diagrams.py`, rows are tokens): logits
    beta (M B) M^T, softmax over rows, M2 = eta (A M) V, then M <- normalize(M + M2),
    with the code's row-vector V. Fed attnflow's own draws (B = K, and the code's V =
    the transpose of attnflow's), it follows attnflow's Euler-renormalize run to
    round-off: the logits, the side V acts on and the scheme are the paper's."""
    d, n, beta, eta, steps = 16, 8, 3.0, 0.1, 40
    plan = plan_experiment(compose_experiment("phase_diagram_random", {
        "d": d, "n": n, "members": 1, "beta": beta, "t1": eta * steps, "saves": steps + 1, "save_states": True,
        "metrics": ["pair_density"], "experiment": {"options": {"panels": [panel]}}}))
    cfg = plan.studies[panel][0].config
    field, y0, _ = af.build_system(cfg)(jax.random.key(5), beta)
    attention = field.terms[0]
    b = np.asarray(attention.key(0.0))[0]
    # The code's V: randomV=2 is BF / sqrt(d) (BF the product law); randomV=1 the Wishart
    # G G^T / sqrt(d), symmetric, taken from attnflow's draw (its law is tested above).
    v_code = b / np.sqrt(d) if panel == "v_plus_qtk" else np.asarray(attention.value(0.0))[0]
    ours = np.asarray(af.simulate(field, y0, t1=eta * steps, dt=eta, solver="euler_renorm", save_every=1).xs)
    m = np.asarray(y0)
    for step in range(steps):
        logits = beta * (m @ b) @ m.T
        a = np.exp(logits - logits.max(axis=1, keepdims=True))
        a /= a.sum(axis=1, keepdims=True)
        m2 = eta * (a @ m) @ v_code + m
        m = m2 / np.linalg.norm(m2, axis=1, keepdims=True)
        np.testing.assert_allclose(ours[step + 1], m, atol=1e-11, err_msg=f"step {step + 1}")
