"""The DiffEqFormer: its vector field is the core's terms and matches the paper's
equations evaluated independently; its populated layers are its Euler solve; its
weights are smooth in time and, from initialisation, really depend on it (the time
scale of the paper's code); it learns; its folders, training state and LoRA
fine-tuning behave as promised."""

import dataclasses
import json
import logging
import math
import subprocess
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy.special import erf

from commands import command  # noqa: F401 (a fixture)

from attnflow import MLP, CheckpointError, ConfigError, SelfAttention, VectorField
from attnflow.checkpoints import forward, load_checkpoint, load_tokenizer
from attnflow.diffeqformer import (DiffEqFormer, DiffEqFormerConfig, Sinusoidal, TimeWeight, checkpoint_logits,
                                   diffeqformer_config, gpt, load_diffeqformer, lora, populate, save_model, train,
                                   train_config)

CONFIG = DiffEqFormerConfig(vocab=20, dim=16, heads=2, hidden=24, context=12, d_emb=8, frequencies=4, steps=4,
                            horizon=2.0, dtype="float64")
IDS = np.array([3, 1, 4, 1, 5, 9, 2, 6, 5, 3])
# A tiny run on the text corpus: a few dozen steps, with a validation at step 0.
RUN = dict(model="diffeqformer", corpus="reference", vocab=300, dim=16, heads=2, hidden=32, context=16, d_emb=8,
           frequencies=4, steps=4, batch=8, train_steps=30, lr=0.03, warmup=0.0, eval_every=30, eval_batches=2,
           save_every=10)


@pytest.fixture(scope="module")
def model():
    """A small DiffEqFormer as initialised (its weights depend on time from the start)."""
    return DiffEqFormer(CONFIG, key=jax.random.key(0))


states = eqx.filter_jit(lambda m, ids: m.states(ids))
logits = eqx.filter_jit(lambda m, ids: m(ids))


def _weight(w: TimeWeight, t: float, time_scale: float = CONFIG.time_scale) -> np.ndarray:
    """$W(t) = P\\,\\mathrm{MLP}(\\mathrm{Sinusoidal}(t)) + C$ by hand (appendix A, with
    the paper's code's time scale $s$: $(t, \\sin(w s t), \\cos(w s t))$)."""
    F = w.sinusoidal.frequencies
    freq = np.exp(-np.log(1e4) * np.arange(F) / F) * time_scale
    e = np.concatenate([[t], np.sin(freq * t), np.cos(freq * t)])
    h = np.asarray(w.mlp_in_weight) @ e + np.asarray(w.mlp_in_bias)
    h = h / (1 + np.exp(-h))  # SiLU
    z = np.asarray(w.mlp_out_weight) @ h + np.asarray(w.mlp_out_bias)
    return np.asarray(w.proj_weight) @ z + np.asarray(w.proj_bias)


def _layer_norm(x, gain, shift, eps):
    centred = x - x.mean(-1, keepdims=True)
    return centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + eps) * gain + shift


def _reference_logits(m: DiffEqFormer, ids, steps: int) -> np.ndarray:
    """Eq. 4-6 with pre-LN gains and N Euler steps of size T/N, in numpy: per-head
    softmax attention over the earlier tokens, the GELU MLP, then the final LayerNorm
    and the tied unembedding."""
    c = m.config
    embed = np.asarray(m.embed)
    x = embed[ids] + np.asarray(m.positions)[: len(ids)]
    n = len(ids)
    causal = np.tril(np.ones((n, n), bool))
    dt = c.horizon / steps
    for k in range(steps):
        t = k * dt
        W = {name: _weight(getattr(m, name), t) for name in ("query", "key", "value", "output", "output_bias", "w1",
                                                              "b1", "w2", "b2", "attn_gain", "attn_shift", "mlp_gain",
                                                              "mlp_shift")}
        a = _layer_norm(x, W["attn_gain"], W["attn_shift"], c.eps)
        attention = np.zeros_like(x) + W["output_bias"]
        for h in range(c.heads):
            q, kk, v = a @ W["query"][h].T, a @ W["key"][h].T, a @ W["value"][h].T
            logits = np.where(causal, q @ kk.T / np.sqrt(c.head_dim), -np.inf)
            p = np.exp(logits - logits.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            attention += (p @ v) @ W["output"][h].T
        u = _layer_norm(x, W["mlp_gain"], W["mlp_shift"], c.eps) @ W["w1"].T + W["b1"]
        mlp = (0.5 * u * (1 + erf(u / np.sqrt(2)))) @ W["w2"].T + W["b2"]
        x = x + dt * (attention + mlp)
    final = _layer_norm(x, np.asarray(m.final_norm.gamma), np.asarray(m.final_norm.shift), c.eps)
    return final @ embed.T


def test_the_field_is_the_core_terms_and_matches_the_equations(model):
    field = model.field()
    assert isinstance(field, VectorField) and field.scheme == "pre"
    assert isinstance(field.terms[0], SelfAttention) and field.terms[0].causal
    assert isinstance(field.terms[1], MLP) and field.terms[1].activation == "gelu"
    np.testing.assert_allclose(logits(model, jnp.asarray(IDS)), _reference_logits(model, IDS, CONFIG.steps),
                               rtol=1e-10, atol=1e-12)


def test_populated_layers_are_the_euler_solve(model):
    checkpoint = populate(model, CONFIG.steps)
    assert (checkpoint.family, checkpoint.arrangement, checkpoint.depth) == ("diffeqformer", "parallel", CONFIG.steps)
    run = forward(checkpoint, IDS)
    xs = states(model, jnp.asarray(IDS))
    np.testing.assert_allclose(run.hidden, xs, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(run.final, model.final_norm(xs[-1]), rtol=1e-12, atol=1e-12)


def test_time_weights_are_the_hypernetwork_and_smooth(model):
    w = model.w1
    at = jax.jit(jax.vmap(w))
    np.testing.assert_allclose(at(jnp.array([0.0, 0.3, 1.0])), [_weight(w, t) for t in (0.0, 0.3, 1.0)],
                               rtol=1e-12, atol=1e-14)
    # Smooth: centred differences converge to the derivative at second order (steps
    # well below the shortest period of the embedding, 2 pi / time_scale).
    t, hs = 0.4, jnp.array([1e-4, 5e-5])
    derivative = jax.jit(jax.jacfwd(w))(t)
    errors = [float(jnp.abs(d - derivative).max()) for d in (at(t + hs) - at(t - hs)) / (2 * hs[:, None, None])]
    assert 3.5 < errors[0] / errors[1] < 4.5


MATRICES = ("query", "key", "value", "output", "w1", "w2")


@pytest.fixture(scope="module")
def default_model():
    """A DiffEqFormer of the default sizes (F = 64, d_emb = 32, d = 64, 18 steps) as
    initialised, and the GPT baseline of the same sizes."""
    config = DiffEqFormerConfig(vocab=32)
    return DiffEqFormer(config, key=jax.random.key(0)), gpt(jax.random.key(0), config)


def test_at_initialisation_the_weights_depend_on_time(default_model):
    """The paper's code scales t by 1000 before the sines and cosines, and its
    hypernetworks put the whole initial matrix in the time-dependent part. Unscaled, the
    embedding over [0, 1] has numerical rank 3 and every W(t) is nearly affine in t."""
    m, _ = default_model
    config = m.config
    assert config.time_scale == 1000.0 and train_config().time_scale == 1000.0
    grid = jnp.linspace(0.0, 1.0, 1001)
    singular = np.linalg.svd(np.asarray(jax.vmap(Sinusoidal(config.frequencies, config.time_scale))(grid)),
                             compute_uv=False)
    assert int(np.sum(singular > 1e-3 * singular[0])) > 20  # measured: 61 (3 with time_scale 1)
    grid = grid[::5]  # 201 times
    fit = np.stack([np.ones(grid.size), np.asarray(grid)], axis=1)
    for name in MATRICES:
        w = getattr(m, name)
        at = np.asarray(jax.vmap(w)(grid), np.float64).reshape(grid.size, -1)
        first, last = at[0], at[-1]
        # W(1) differs from W(0) by more than 10% of |W(0)| (measured: 0.89-1.65; with
        # time_scale 1 still 0.13-0.59, but then the embedding has rank 3 and:)
        assert np.linalg.norm(last - first) > 0.1 * np.linalg.norm(first), name
        # Not nearly affine: the best affine fit in t misses more than 30% of W over [0, 1]
        # (measured: 0.70-0.83; with time_scale 1: 0.005-0.013).
        residual = at - fit @ np.linalg.lstsq(fit, at, rcond=None)[0]
        assert np.linalg.norm(residual) > 0.3 * np.linalg.norm(at), name
        # W(0) has GPT-2's initial law: N(0, 0.02^2) entries (0.02 / sqrt(2 L) for O and W2).
        std = 0.02 / (math.sqrt(2 * config.steps) if name in ("output", "w2") else 1.0)
        assert abs(first.std() / std - 1) < 4 / math.sqrt(first.size), name
    # The biases are time-dependent and of size 1e-4; the LayerNorm gains and shifts
    # start at 1 and 0 without a time-dependent part (the paper's time-dependent LayerNorm).
    bias = np.asarray(m.b1(0.0), np.float64)
    assert np.all(np.asarray(m.b1.proj_bias) == 0) and abs(bias.std() / 1e-4 - 1) < 4 / math.sqrt(bias.size)
    for name, constant in (("attn_gain", 1.0), ("mlp_gain", 1.0), ("attn_shift", 0.0), ("mlp_shift", 0.0)):
        w = getattr(m, name)
        assert np.all(np.asarray(w.proj_weight) == 0) and np.all(np.asarray(w(0.7)) == constant), name


def test_at_initialisation_neighbouring_layers_differ_as_much_as_independent_ones(default_model):
    """The untrained control of the roughness study (README, "A trained DiffEqFormer
    against its GPT baseline"): at the 18 layer times t = l/18 the initial weights of
    the DiffEqFormer differ between neighbours about as much as the GPT's independently
    drawn layers (measured: QK/OV spectra 0.55/0.62 against 0.44/0.46, matrices
    1.24/1.28 against 1.41/1.41; 0.02-0.03 with time_scale 1, ratios 0.01-0.06)."""
    from attnflow.checkpoints import head_spectra
    from attnflow.experiments import diffeqformer_vs_gpt as study

    m, baseline = default_model
    rough = {}
    for name, checkpoint in (("diffeqformer", study.hypernetwork_checkpoint(m, m.config.steps)), ("gpt", baseline)):
        spectra, matrices = head_spectra(checkpoint), study._matrices(checkpoint)
        rough[name] = np.array([study.spectral_variation(spectra[f"{p}_eig_real"].values,
                                                         spectra[f"{p}_eig_imag"].values).mean() for p in ("qk", "ov")]
                               + [study.matrix_variation(matrices[p]).mean() for p in ("qk", "ov")])
    ratio = rough["diffeqformer"] / rough["gpt"]
    assert np.all((ratio > 0.5) & (ratio < 2)), ratio


def test_saved_models_load_back_bitwise(model, tmp_path):
    save_model(model, tmp_path / "dfq")
    loaded = load_diffeqformer(tmp_path / "dfq")
    assert loaded.config == model.config
    assert jnp.array_equal(states(loaded, jnp.asarray(IDS)), states(model, jnp.asarray(IDS)))
    # The populated form in the same folder is what load_checkpoint reads.
    assert load_checkpoint(tmp_path / "dfq").depth == CONFIG.steps
    baseline = gpt(jax.random.key(1), CONFIG)
    save_model(baseline, tmp_path / "gpt")
    again = load_checkpoint(tmp_path / "gpt")
    assert (again.family, again.arrangement, again.depth) == ("gpt2", "sequential", CONFIG.steps)
    assert jnp.array_equal(checkpoint_logits(again, IDS), checkpoint_logits(baseline, IDS))


def test_model_folders_record_the_time_scale_and_old_ones_read_as_one(model, tmp_path):
    save_model(model, tmp_path / "dfq")
    record = json.loads((tmp_path / "dfq" / "diffeqformer.json").read_text())
    assert record["config"]["time_scale"] == 1000.0
    assert json.loads((tmp_path / "dfq" / "config.json").read_text())["extra"]["diffeqformer"]["time_scale"] == 1000.0
    # A folder written before the setting existed holds no time_scale: its embedding read
    # t unscaled, and it is read back that way.
    del record["config"]["time_scale"]
    (tmp_path / "dfq" / "diffeqformer.json").write_text(json.dumps(record))
    assert diffeqformer_config(tmp_path / "dfq").time_scale == 1.0
    old = load_diffeqformer(tmp_path / "dfq")
    np.testing.assert_allclose(old.w1(0.3), _weight(model.w1, 0.3, time_scale=1.0), rtol=1e-12, atol=1e-14)
    assert not np.allclose(old.w1(0.3), model.w1(0.3), rtol=1e-3)
    with pytest.raises(ConfigError, match="time_scale must be a positive number"):
        DiffEqFormerConfig(vocab=4, time_scale=0.0)


def test_bad_model_folders_say_what_is_wrong(model, tmp_path):
    with pytest.raises(CheckpointError, match="no diffeqformer.json"):
        load_diffeqformer(tmp_path)
    save_model(model, tmp_path / "dfq")
    (tmp_path / "dfq" / "diffeqformer.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        load_diffeqformer(tmp_path / "dfq")


def test_lora_with_zero_b_is_the_populated_model(model):
    checkpoint = populate(model, CONFIG.steps)
    adapted = lora(checkpoint, 2, key=jax.random.key(2))
    merged = adapted.merged()
    assert all(jnp.array_equal(a, b) for a, b in zip(jax.tree.leaves(merged), jax.tree.leaves(checkpoint)))
    np.testing.assert_array_equal(forward(merged, IDS).final, forward(checkpoint, IDS).final)
    # Each adapter is a rank-r update of the right matrix: O's columns are head-major.
    b = jax.random.normal(jax.random.key(3), adapted.adapters["output"].b.shape)
    moved = eqx.tree_at(lambda m: m.adapters["output"].b, adapted, b).merged()
    delta = (moved.blocks.attention.output - checkpoint.blocks.attention.output)  # (L, H, d, d_k)
    full = jnp.concatenate([delta[:, h] for h in range(CONFIG.heads)], axis=-1)  # (L, d, H d_k)
    np.testing.assert_allclose(full, adapted.adapters["output"].a @ b, rtol=1e-12, atol=1e-14)
    assert int(jnp.linalg.matrix_rank(full[0])) == 2


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny DiffEqFormer trained straight through on the text corpus."""
    out = tmp_path_factory.mktemp("runs") / "straight"
    return train(train_config(dict(RUN, out=str(out))))


def test_a_tiny_diffeqformer_learns(run):
    first, last = run.metrics[0], run.metrics[-1]
    assert first["step"] == 0 and last["step"] == RUN["train_steps"]
    # At initialisation the logits are small: the loss is that of a uniform guess.
    assert abs(first["val_loss"] - math.log(RUN["vocab"])) < 0.05
    assert last["val_loss"] < first["val_loss"] - 1.0
    lines = [json.loads(line) for line in (run.out / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, RUN["train_steps"]]
    snapshots = sorted(p.name for p in (run.out / "snapshots").iterdir())
    assert snapshots == [f"step-{s:06d}" for s in (0, 1, 2, 4, 8, 16, 30)]
    # The final folder is a DiffEqFormer, a checkpoint and a tokenizer at once.
    assert jnp.array_equal(load_diffeqformer(run.out / "model").embed, run.model.embed)
    assert load_checkpoint(run.out / "model").family == "diffeqformer"
    assert load_tokenizer(run.out / "model").decode(load_tokenizer(run.out / "model").encode("lambda x")) == "lambda x"


def test_an_interrupted_run_resumes_to_the_same_weights(run, tmp_path, capsys):
    cfg = train_config(dict(RUN, out=str(tmp_path / "resumed")))

    def stop(step, info):
        if step == 14:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg, on_step=stop)
    assert "state of step 10" in capsys.readouterr().err
    assert json.loads((tmp_path / "resumed" / "state" / "state.json").read_text())["step"] == 10
    # `out=` alone finds the stored settings; the run continues from step 10.
    resumed = train(train_config([f"out={tmp_path / 'resumed'}"]))
    assert "resuming" in capsys.readouterr().out
    for a, b in zip(jax.tree.leaves(resumed.model), jax.tree.leaves(run.model)):
        np.testing.assert_array_equal(a, b)
    assert [m["step"] for m in resumed.metrics] == [0, RUN["train_steps"]]
    with pytest.raises(ConfigError, match="holds a run with lr=0.03"):
        train(train_config(dict(RUN, out=str(tmp_path / "resumed"), lr=0.01)))


def test_runs_of_other_lengths_share_the_compiled_step_at_their_own_learning_rate(run, caplog):
    """The learning-rate schedule is data of the training step: a run that differs only
    in lr, warmup or length (a fine-tuning run of the model's shape) reuses the compiled
    step, and each step updates at its own schedule's rate at the state's count (AdamW's
    update is the rate times a direction that does not depend on it)."""
    from attnflow.diffeqformer._data import load_corpus
    from attnflow.diffeqformer._store import tokenizer_text
    from attnflow.diffeqformer._train import optimizer, training_step

    pretraining = train_config(dict(RUN))
    tuning = train_config(dict(RUN, lr=0.01, warmup=0.1, train_steps=60))
    steps = [training_step(optimizer(cfg), RUN["batch"], RUN["context"], "euler") for cfg in (pretraining, tuning)]
    assert steps[0].program is steps[1].program
    params, static = eqx.partition(run.model, eqx.is_inexact_array)
    corpus, _, _ = load_corpus("reference", vocab=RUN["vocab"], context=RUN["context"],
                               tokenizer_json=tokenizer_text(run.out / "model"))
    count = 15
    moved, rates = [], []
    for cfg, step in zip((pretraining, tuning), steps):
        tx = optimizer(cfg)
        state = optax.tree_utils.tree_set(tx.init(params), count=jnp.asarray(count, jnp.int32))
        with jax.log_compiles(), caplog.at_level(logging.WARNING, logger="jax"):
            new, _, _ = step(params, static, state, corpus, jax.random.key(0))
        moved.append(np.concatenate([np.ravel(a - b) for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(params))]))
        rates.append(float(tx.schedule(count)))
    # The run's own step, compiled by the fixture: neither schedule compiles another.
    assert not [r.getMessage() for r in caplog.records if "Compiling jit(step)" in r.getMessage()]
    assert abs(rates[0] / rates[1] - 1) > 0.5  # lr 0.03 decaying over 30 steps; 0.01 over 60
    ratio = moved[0] @ moved[1] / (moved[1] @ moved[1])
    np.testing.assert_allclose(ratio, rates[0] / rates[1], rtol=1e-4)


def test_lora_fine_tuning_changes_only_the_adapters(run, tmp_path):
    cfg = train_config(dict(RUN, init=str(run.out), lora_rank=2, steps=3, corpus="reference-b", train_steps=3,
                            eval_every=3, out=str(tmp_path / "lora")))
    tuned = train(cfg).model
    base = populate(run.model, 3)
    assert all(jnp.array_equal(a, b) for a, b in zip(jax.tree.leaves(tuned.base), jax.tree.leaves(base)))
    assert all(float(jnp.abs(adapter.b).max()) > 0 for adapter in tuned.adapters.values())
    assert load_checkpoint(tmp_path / "lora" / "model").depth == 3


def test_weight_decay_acts_on_matrices_and_embeddings_only(model):
    from attnflow.diffeqformer._train import decay_mask

    mask = decay_mask(model)
    assert mask.w1.proj_bias and mask.w1.proj_weight and mask.embed and mask.query.mlp_in_weight
    assert not (mask.b1.proj_bias or mask.attn_gain.proj_bias or mask.final_norm.gamma or mask.w1.mlp_in_bias)
    baseline = dataclasses.replace(gpt(jax.random.key(1), CONFIG), unembed=None)
    mask = decay_mask(baseline)
    attention, mlp = mask.blocks.attention, mask.blocks.mlp
    assert attention.query and attention.output and mlp.w2 and mask.embed and mask.positions
    assert not (attention.query_bias or mlp.b1 or mask.blocks.attn_norm.gamma or mask.final_norm.shift)


def test_bad_settings_are_one_sentence_and_exit_code_2(command):
    result = subprocess.run([sys.executable, "-m", "attnflow.cli", "train", "depth=3"], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "unknown setting depth of attnflow train" in result.stderr
    # The process behaviour is shown above; another refusal in this process (no second start-up).
    code, lines = command("train", "lora_rank=2")
    assert code == 2 and len(lines) == 1 and "init=FOLDER" in lines[0]
