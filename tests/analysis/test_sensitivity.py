"""Token-pair Lyapunov sensitivity (eq. 7 of "Neural ODE Transformers"): a linear
interaction against the closed form of its Euler products, the one-step blocks of
softmax attention against the Jacobian of appendix B written out in numpy, exact zeros
for a token-wise field, the causal mask of a tiny checkpoint, first-order convergence
to the continuous tangent equation solved by SciPy, vmap against a loop, and
`attnflow experiment=sensitivity` end to end."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from checkpoint_models import write_tiny
from commands import assert_cf
from scipy.integrate import solve_ivp

import attnflow as af
from attnflow import MLP, Constant, SelfAttention, TokenNorm, VectorField
from attnflow.checkpoints import depth_flow, load_checkpoint
from attnflow.numerics._simulate import step_map
from attnflow.analysis.pair_exponents import _attention, _tangent_maps, token_sensitivity


def _attention_field(rng, d: int, beta: float) -> tuple[VectorField, tuple[np.ndarray, ...]]:
    """One head of softmax attention, scheme none, random Q, K, V, no MLP."""
    q, k, v = (rng.normal(size=(d, d)) for _ in range(3))
    one = lambda w: Constant(jnp.asarray(w[None]))
    attention = SelfAttention(query=one(q), key=one(k), value=one(v), output=None, beta=jnp.asarray(beta),
                              alibi=None, heads=1)
    return VectorField(terms=(attention,), scheme="none"), (q, k, v)


def _appendix_b_jacobian(x, q_mat, k_mat, v_mat, beta):
    """d f_j / d x_i for f_j = sum_m a_jm V x_m, a_jm = softmax_m(beta <Q x_j, K x_m>):
    a_ji V + beta a_ji (v_i - f_j) q_j^T K, plus, for i = j, the query's own term
    beta sum_m a_jm (v_m - f_j) k_m^T Q."""
    n, d = x.shape
    q, k, v = x @ q_mat.T, x @ k_mat.T, x @ v_mat.T
    s = beta * q @ k.T
    a = np.exp(s - s.max(axis=1, keepdims=True))
    a /= a.sum(axis=1, keepdims=True)
    f = a @ v
    jac = np.zeros((n, n, d, d))
    for j in range(n):
        for i in range(n):
            jac[j, i] = a[j, i] * v_mat + beta * a[j, i] * np.outer(v[i] - f[j], q[j]) @ k_mat
        jac[j, j] += beta * sum(a[j, m] * np.outer(v[m] - f[j], k[m]) for m in range(n)) @ q_mat
    return jac


def _top_log_singular(m: np.ndarray) -> float:
    return float(np.log(np.linalg.svd(m, compute_uv=False)[0]))


def test_linear_interaction_matches_the_euler_products():
    # velocity_j = sum_i B[j, i] x_i: J_ji = B[j, i] everywhere, so the Euler tangent
    # step of eq. 7 is I + h B[j, i] at every step and lambda_ji is
    # (1/T) log sigma_max((I + h B[j, i])^N), for i = j and i != j alike.
    rng = np.random.default_rng(0)
    n, d, h, steps = 4, 3, 0.1, 30
    blocks = 0.8 * rng.normal(size=(n, n, d, d))
    field = lambda t, x, args: jnp.einsum("jiab,ib->ja", blocks, x)
    x0 = rng.normal(size=(n, d))
    expected = np.array([[_top_log_singular(np.linalg.matrix_power(np.eye(d) + h * blocks[j, i], steps))
                          for i in range(n)] for j in range(n)]) / (h * steps)
    result = token_sensitivity(field, x0, t1=h * steps, dt=h)
    assert result.exponents.dtype == jnp.float64 and result.attention is None
    np.testing.assert_allclose(result.exponents, expected, rtol=0, atol=1e-10)
    np.testing.assert_allclose(result.times, h * np.arange(1, steps + 1), atol=1e-12)
    # Rows picked by (negative) position, renormalised every 5 steps: the same numbers
    # (the renormalisation divides by powers of two, exactly).
    picked = token_sensitivity(field, x0, t1=h * steps, dt=h, outputs=[-1, 1], normalize_every=5)
    assert picked.outputs.tolist() == [n - 1, 1]
    np.testing.assert_allclose(picked.exponents, expected[[n - 1, 1]], rtol=0, atol=1e-10)
    np.testing.assert_allclose(picked.exponents, result.exponents[jnp.array([n - 1, 1])], rtol=0, atol=1e-14)


def test_one_euler_step_is_the_attention_jacobian_of_appendix_b():
    rng = np.random.default_rng(1)
    n, d, beta, h = 5, 3, 0.7, 0.01
    field, (q, k, v) = _attention_field(rng, d, beta)
    x = rng.normal(size=(n, d))
    expected = _appendix_b_jacobian(x, q, k, v, beta)
    _, maps = _tangent_maps(step_map(field, "euler", h), 0.0, jnp.asarray(x), jnp.arange(n))
    blocks = (np.asarray(maps) - np.eye(d)) / h  # M_ji = I + h J_ji for every pair
    np.testing.assert_allclose(blocks, expected, rtol=0, atol=1e-10 * np.abs(expected).max())
    # One step of the whole computation: lambda_ji = (1/h) log sigma_max(I + h J_ji).
    result = token_sensitivity(field, x, t1=h, dt=h, outputs=[0, 3])
    want = np.array([[_top_log_singular(np.eye(d) + h * expected[j, i]) for i in range(n)] for j in (0, 3)]) / h
    np.testing.assert_allclose(result.exponents, want, rtol=0, atol=1e-10)
    # An ensemble of states under vmap equals a loop over them.
    batch = jnp.asarray(rng.normal(size=(3, n, d)))
    run = lambda x: token_sensitivity(field, x, t1=4 * h, dt=h, outputs=[1, -1]).exponents
    np.testing.assert_allclose(jax.vmap(run)(batch), jnp.stack([run(x) for x in batch]), rtol=1e-12, atol=1e-12)
    # The attention map is the softmax of that single state.
    s = beta * (x @ q.T) @ (x @ k.T).T
    a = np.exp(s - s.max(axis=1, keepdims=True))
    np.testing.assert_allclose(result.attention, (a / a.sum(axis=1, keepdims=True))[[0, 3]], atol=1e-14)


def test_token_wise_field_has_exactly_zero_off_diagonal_exponents():
    rng = np.random.default_rng(2)
    n, d, hidden = 4, 3, 5
    mlp = MLP(w1=Constant(jnp.asarray(rng.normal(size=(hidden, d)))), w2=Constant(jnp.asarray(rng.normal(size=(d, hidden)))),
              b1=Constant(jnp.asarray(rng.normal(size=hidden))), activation="gelu")
    field = VectorField(terms=(mlp,), scheme="pre", norm=TokenNorm("rms"))
    result = token_sensitivity(field, rng.normal(size=(n, d)), t1=1.0, dt=0.1, solver="rk4")
    off = ~np.eye(n, dtype=bool)
    assert np.all(np.asarray(result.exponents)[off] == 0.0)
    assert np.all(np.abs(np.diagonal(result.exponents)) > 1e-3)  # each token's own dynamics
    assert result.attention is None  # no attention term to compare with


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return write_tiny("llama", tmp_path_factory.mktemp("tiny") / "llama")


def test_causal_checkpoint_masks_later_tokens(tiny_llama):
    checkpoint = load_checkpoint(tiny_llama, dtype="float64")
    flow = depth_flow(checkpoint)
    x0 = checkpoint.embed_tokens(jnp.array([3, 14, 15, 92, 65, 35]))
    n = x0.shape[0]
    full = token_sensitivity(flow, x0)  # t1 = depth, dt = 1, the model's own Lie split
    exponents, attention = np.asarray(full.exponents), np.asarray(full.attention)
    upper = np.triu_indices(n, 1)
    assert np.all(np.isnan(exponents[upper]))
    assert np.all(np.isfinite(exponents[np.tril_indices(n)]))
    np.testing.assert_allclose(attention.sum(axis=1), 1.0, atol=1e-12)
    assert np.all(attention[upper] == 0)
    # The masked pairs are those whose one-step tangent map is exactly the identity
    # (J_ji = 0: token j never reads token i > j), in every layer.
    step = step_map(flow.field, "euler", 1.0, split=flow.split, retractions=flow.retractions)
    one_layer = jax.jit(lambda x, layer: _tangent_maps(step, layer, x, jnp.arange(n)))
    x, later = x0, np.triu(np.ones((n, n), dtype=bool), 1)
    for layer in range(checkpoint.depth):
        x, maps = one_layer(x, jnp.asarray(layer, x0.dtype))
        identity = np.all(np.asarray(maps) == np.eye(x0.shape[1]), axis=(-2, -1))
        np.testing.assert_array_equal(identity, later)
    last = token_sensitivity(flow, x0, outputs=[-1])
    assert last.outputs.tolist() == [n - 1]
    np.testing.assert_allclose(last.exponents[0], exponents[-1], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(last.attention[0], attention[-1], rtol=1e-12, atol=1e-14)


def _continuous_exponents(field, x0, t1: float, outputs) -> np.ndarray:
    """lambda_ji of eq. 7 itself: X and every Y_ji solved together by SciPy's DOP853,
    with the Jacobian blocks from `jax.jacfwd` of the field."""
    n, d = x0.shape
    jacobian = jax.jit(jax.jacfwd(lambda x: field(0.0, x)))  # (n, d, n, d)

    def rhs(t, state):
        x = state[: n * d].reshape(n, d)
        y = state[n * d:].reshape(len(outputs), n, d, d)
        jac = np.asarray(jacobian(jnp.asarray(x)))
        blocks = np.stack([np.transpose(jac[j], (1, 0, 2)) for j in outputs])  # (m, n, d, d): [j, i] = J_ji
        dx = np.asarray(field(0.0, jnp.asarray(x)))
        return np.concatenate([dx.ravel(), np.einsum("jiab,jibc->jiac", blocks, y).ravel()])

    y0 = np.broadcast_to(np.eye(d), (len(outputs), n, d, d))
    solution = solve_ivp(rhs, (0.0, t1), np.concatenate([x0.ravel(), y0.ravel()]), method="DOP853",
                         rtol=1e-11, atol=1e-12)
    y = solution.y[n * d:, -1].reshape(len(outputs), n, d, d)
    return np.log(np.linalg.svd(y, compute_uv=False)[..., 0]) / t1


def test_refined_steps_converge_to_the_tangent_equation_at_first_order():
    rng = np.random.default_rng(3)
    n, d, t1 = 3, 2, 1.0
    field, _ = _attention_field(rng, d, 0.9)
    x0 = rng.normal(size=(n, d))
    outputs = [0, 2]
    exact = _continuous_exponents(field, x0, t1, outputs)
    for solver in ("euler", "rk4"):
        errors = np.array([float(np.abs(token_sensitivity(field, x0, t1=t1, dt=t1 / steps, outputs=outputs,
                                                          solver=solver).exponents - exact).max())
                           for steps in (20, 40, 80)])
        ratios = errors[:-1] / errors[1:]
        assert np.all((ratios > 1.7) & (ratios < 2.3)), (solver, errors)


def test_bad_arguments_stop_in_one_sentence():
    field = lambda t, x, args: -x
    x0 = np.ones((3, 2))
    with pytest.raises(af.ConfigError, match="outputs"):
        token_sensitivity(field, x0, t1=1.0, dt=0.5, outputs=[3])
    with pytest.raises(af.ConfigError, match="normalize_every"):
        token_sensitivity(field, x0, t1=1.0, dt=0.25, normalize_every=3)
    with pytest.raises(af.ConfigError, match="t1"):
        token_sensitivity(field, x0, dt=0.25)
    with pytest.raises(af.ConfigError, match="plain callable"):
        token_sensitivity(field, x0, t1=1.0, dt=0.5, split="lie")


def _word_tokenizer(folder, vocabulary: int) -> list[str]:
    """A word-level tokenizer.json for a tiny checkpoint: `w0 ... w{V-1}`."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = [f"w{i}" for i in range(vocabulary)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.save(str(folder / "tokenizer.json"))
    return words


def test_sensitivity_experiment_on_a_tiny_checkpoint(tiny_llama, tmp_path):
    words = _word_tokenizer(tiny_llama, 97)
    text = " ".join(words[i] for i in (5, 17, 42, 8, 60, 23, 71))
    overrides = {"checkpoint": str(tiny_llama), "text": text, "dtype": "float64",
                 "experiment": {"options": {"outputs": None}}}
    ds = af.run_experiment("sensitivity", overrides)
    n = 7
    assert ds.exponent.dims == ("output", "token") and ds.exponent.shape == (n, n)
    assert [str(s) for s in ds.token_string.values] == text.split()
    exponents = ds.exponent.values
    assert np.all(np.isnan(exponents[np.triu_indices(n, 1)])) and np.all(np.isfinite(exponents[np.tril_indices(n)]))
    np.testing.assert_allclose(ds.attention.sum("token"), 1.0, atol=1e-12)
    # The stored map is token_sensitivity on the model's embedded sentence.
    checkpoint = load_checkpoint(tiny_llama, dtype="float64")
    direct = token_sensitivity(depth_flow(checkpoint), checkpoint.embed_tokens(jnp.asarray(ds.token_id.values)),
                               outputs=[-1])
    np.testing.assert_allclose(exponents[-1], direct.exponents[0], rtol=1e-12, atol=1e-12)
    assert ds.attrs["prediction"] in words
    assert_cf(tmp_path, af.write_results(ds, tmp_path / "results.nc"))
    paths = af.draw_experiment(ds, tmp_path)
    assert {p.name for p in paths} == {"sentence.png", "sentence.pdf", "maps.png", "maps.pdf"}
    # Both maps name the tokens on both axes and carry a colour bar.
    maps = af.experiment_figures(ds)["maps"]
    images = [ax for ax in maps.axes if ax.images]
    bars = [ax for ax in maps.axes if ax.get_label() == "<colorbar>"]
    assert len(images) == 2 and len(bars) == 2
    for ax in images:
        assert [t.get_text() for t in ax.get_xticklabels()] == text.split()
        assert [t.get_text() for t in ax.get_yticklabels()] == text.split()
    # The default, the last output only: one figure.
    ds = af.run_experiment("sensitivity", {"checkpoint": str(tiny_llama), "text": text, "dtype": "float64"})
    assert ds.output.values.tolist() == [n - 1]
    np.testing.assert_allclose(ds.exponent.values[0], exponents[-1], rtol=1e-12, atol=1e-12)
    assert {p.name for p in af.draw_experiment(ds, tmp_path / "last")} == {"sentence.png", "sentence.pdf"}


def test_sensitivity_experiment_refuses_bad_input_in_one_sentence(tiny_llama):
    _word_tokenizer(tiny_llama, 97)
    with pytest.raises(af.ConfigError, match="text"):
        af.run_experiment("sensitivity", {"checkpoint": str(tiny_llama), "text": "  "})
    with pytest.raises(af.ConfigError, match="has 3 tokens"):
        af.run_experiment("sensitivity", {"checkpoint": str(tiny_llama), "text": "w1 w2 w3",
                                          "experiment": {"options": {"outputs": [3]}}})
    with pytest.raises(af.ConfigError, match="steps"):
        af.run_experiment("sensitivity", {"checkpoint": str(tiny_llama), "text": "w1 w2",
                                          "experiment": {"options": {"steps": 0}}})


# --- The paper's BIGBANG example on SmolLM2 (README "Which words the next word depends on") ---
# The default sentence of experiment=sensitivity is the passage of fig. 3a / app. F, fig. 25
# of "Neural ODE Transformers", whose next word there is "its". Its 53 SmolLM2 tokens take
# 30 layers x 576 pullbacks of a 53-token layer for the last output: minutes on two CPU
# cores, so the exponents are asserted by the slow test below; the fast one checks the
# passage, the prediction and the attention map that the figure sets beside them.

SECOND_BIGBANG = [49, 50, 51]  # " BIG", "B", "ANG" before the final " and"


@pytest.fixture(scope="module")
def bigbang():
    from attnflow.experiments import compose_experiment

    return compose_experiment("sensitivity", {})


def test_the_default_sentence_is_the_papers_bigbang_example_and_its_attention(bigbang):
    """README: SmolLM2 continues the passage with " BIG", not the paper's "its"; the
    attention of the last token (" and"), averaged over heads and layers as
    token_sensitivity averages it, puts 0.36 on the first token (the sink, "B" of the
    first "BIGBANG") and 0.10 on " the", the next."""
    from attnflow.checkpoints import forward, load_tokenizer

    assert bigbang.checkpoint == "smollm2" and list(bigbang.experiment.options["outputs"]) == [-1]
    text = str(bigbang.text)
    assert text.startswith("BIGBANG is one of those musical entities") and text.endswith("electronic dance, BIGBANG and")
    checkpoint, tokenizer = load_checkpoint("smollm2"), load_tokenizer("smollm2")
    ids = np.asarray(tokenizer.encode(text))
    tokens = tokenizer.tokens(ids)
    assert len(tokens) == 53 and tokens[:4] == ["B", "IG", "B", "ANG"]
    assert [tokens[i] for i in SECOND_BIGBANG] == [" BIG", "B", "ANG"] and tokens[-1] == " and"
    hidden = forward(checkpoint, ids).hidden
    assert tokenizer.tokens([int(jnp.argmax(checkpoint.logits(hidden[-1])[-1]))]) == [" BIG"]
    flow = depth_flow(checkpoint)
    step = step_map(flow.field, "euler", 1.0, split=flow.split, retractions=flow.retractions)
    attention = np.mean([np.asarray(_attention(step, float(l), hidden[l]))[-1] for l in range(checkpoint.depth)],
                        axis=0)
    np.testing.assert_allclose(attention.sum(), 1.0, rtol=1e-5)
    order = np.argsort(-attention[:-1])
    assert order[0] == 0 and attention[0] == pytest.approx(0.36, abs=0.006)
    assert tokens[order[1]] == " the" and attention[order[1]] == pytest.approx(0.099, abs=0.002)


@pytest.mark.slow
def test_bigbang_sensitivity_points_at_the_repeated_name_not_the_sink(bigbang, tmp_path):
    """README (figures/sensitivity/sentence.png), experiment=sensitivity with its
    defaults: " and" responds most to itself (0.20 per layer), then to the comma before
    the second "BIGBANG" (0.11) and the two periods (0.071, 0.070); the pieces of the
    second "BIGBANG" come 4th, 5th and 8th of the 52 earlier tokens (0.061, 0.057,
    0.048), of the first one "IG" 7th (0.052); the first token, which holds 0.36 of the
    attention, has 0.021 (37th). Slow (minutes); the fast tests cover the computation
    (closed forms, the tiny checkpoint) and the attention map of this passage."""
    ds = af.run_experiment("sensitivity", {})
    assert ds.attrs["prediction"] == " BIG" and ds.output.values.tolist() == [52]
    exponent = ds.exponent.values[0]
    attention = ds.attention.values[0]
    assert exponent[52] == pytest.approx(0.198, abs=0.002)
    others = exponent[:-1]
    rank = np.argsort(np.argsort(-others)) + 1  # 1 = the most sensitive earlier token
    assert rank[48] == 1 and sorted(rank[[13, 32]].tolist()) == [2, 3]
    np.testing.assert_allclose(others[[48, 13, 32]], [0.113, 0.071, 0.070], atol=0.002)
    assert rank[SECOND_BIGBANG].tolist() == [5, 8, 4]
    np.testing.assert_allclose(others[SECOND_BIGBANG], [0.057, 0.048, 0.061], atol=0.002)
    assert rank[1] == 7 and others[1] == pytest.approx(0.052, abs=0.002)
    assert rank[0] == 37 and others[0] == pytest.approx(0.021, abs=0.002)
    assert np.argmax(attention[:-1]) == 0 and attention[0] == pytest.approx(0.36, abs=0.006)
    assert {p.name for p in af.draw_experiment(ds, tmp_path)} == {"sentence.png", "sentence.pdf"}
