"""Experiments diffeqformer and adaptive_depth on tiny trained runs: experiment
diffeqformer trains them itself (one command from nothing), its energy and unigram
divergence match the DiffEqFormer's own Euler solve evaluated independently, the KL
and the spectral variation meet their closed forms, the spectra of the hypernetwork
weights are those of the populated layers with the step T/N taken out, the
attention-only fields are the learned term rescaled in time, frozen or without
drift; adaptive_depth's zero-shot loss at the trained number of steps is the training
run's own last validation, fine-tuning lowers it; both redraw from their results
file; bad options are refused in one sentence."""

from __future__ import annotations

import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import rel_entr

from attnflow import ConfigError, VectorField
from attnflow._store import load_results, write_results
from attnflow.checkpoints import head_spectra
from attnflow.diffeqformer import load_diffeqformer, populate
from attnflow.experiments import (
    compose_experiment,
    draw_experiment,
    plan_experiment,
    run_experiment,
)
from attnflow.experiments import diffeqformer as study

# Both tiny runs train on the copying task (no tokenizer to train, and the fine-tuning
# runs below have the shapes of the pretraining ones).
TRAIN = {"corpus": "induction", "vocab": 8, "dim": 16, "heads": 2, "hidden": 32, "context": 16, "d_emb": 8,
         "frequencies": 4, "steps": 4, "batch": 8, "train_steps": 8, "lr": 0.03, "warmup": 0.0, "eval_every": 4,
         "eval_batches": 2, "save_every": 4}
SENTENCE = "s1 s5 s2 s7 s3 s1 s5 s2"
FINETUNE = {k: TRAIN[k] for k in ("lr", "warmup", "eval_every", "eval_batches", "batch", "save_every")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """experiment=diffeqformer from nothing: it trains both runs, then analyses them."""
    out = tmp_path_factory.mktemp("diffeqformer-runs")
    options = {"out": str(out), "train": TRAIN, "sentence": SENTENCE, "tokens": 64, "spectra_steps": TRAIN["steps"],
               "cluster_horizon": 2.0}
    ds = run_experiment("diffeqformer", {"experiment": {"options": options}})
    return out, ds


@pytest.fixture(scope="module")
def adaptive(runs):
    """experiment=adaptive_depth on those runs: zero-shot at two numbers of steps, and
    (a second run) full fine-tuning at the trained one, whose programs the pretraining
    compiled already (fine-tuning at another depth is covered in test_diffeqformer.py)."""
    out, _ = runs
    options = {"pretrained": str(out / "diffeqformer"), "baseline": str(out / "gpt"), "finetune_steps": 8,
               "corpus": "induction", "train": FINETUNE}
    zero = run_experiment("adaptive_depth", {"experiment": {"options": {**options, "steps": [2, 4], "methods": []}}})
    tuned = run_experiment("adaptive_depth", {"experiment": {"options": {**options, "steps": [4], "methods": ["full"]}}})
    return out, zero, tuned


def test_the_experiment_trains_missing_runs_and_reads_their_losses(runs):
    out, ds = runs
    for name in study.MODELS:
        assert study.finished(out / name)
        lines = study.read_metrics(out / name)
        assert int(ds.val_loss.sel(model=name).dropna("eval_step").eval_step[-1]) == TRAIN["train_steps"]
        assert float(ds.val_loss.sel(model=name, eval_step=lines[-1]["step"])) == lines[-1]["val_loss"]
    # A finished run is read as it is, and one with other settings is refused in one sentence.
    assert study.trained_run(out / "gpt", "gpt", TRAIN) == out / "gpt"
    with pytest.raises(ConfigError, match=r"dim=16, not 32") as error:
        study.trained_run(out / "diffeqformer", "diffeqformer", {**TRAIN, "dim": 32})
    assert "\n" not in str(error.value)


def test_energy_and_divergence_per_snapshot_match_the_euler_solve(runs):
    out, ds = runs
    for name in study.MODELS:
        part = ds.sel(model=name).dropna("snapshot_step", subset=["energy"])
        assert list(part.snapshot_step.values) == sorted(study.snapshots(out / name)) == [0, 1, 2, 4, 8]
        for key in ("energy", "kl", "sample_loss"):
            assert np.all(np.isfinite(part[key].values))
        # (1/n^2) sum_ij exp(cos) lies between e^-1 and e; a divergence is not negative.
        assert np.all((part.energy > np.exp(-1)) & (part.energy <= np.e + 1e-6))
        assert np.all(part.kl >= -1e-6)
    # An independent evaluation of the last snapshot: the DiffEqFormer's own Euler solve
    # (simulate, not the populated layers), numpy's energy, and for the uniform symbols of
    # the copying task KL(p || uniform) = log V - H(p).
    model = load_diffeqformer(out / "diffeqformer" / "model")
    _, inputs, _, log_u = study._validation_sample(out / "diffeqformer", 64, 0)
    np.testing.assert_allclose(log_u, np.full(TRAIN["vocab"], -np.log(TRAIN["vocab"])))
    solve = eqx.filter_jit(lambda m, ids: jax.vmap(lambda i: (m.states(i, save_steps=[m.config.steps])[-1], m(i)))(ids))
    states, logits = (np.asarray(a, np.float64) for a in solve(model, jnp.asarray(inputs)))
    energies, divergences = [], []
    for x, z in zip(states, logits):
        u = x / np.linalg.norm(x, axis=1, keepdims=True)
        energies.append(np.mean(np.exp(u @ u.T)))
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        divergences.append(np.mean(np.log(TRAIN["vocab"]) + np.sum(p * np.log(p), axis=1)))
    last = ds.sel(model="diffeqformer", snapshot_step=TRAIN["train_steps"])
    np.testing.assert_allclose(float(last.energy), np.mean(energies), rtol=1e-5)
    np.testing.assert_allclose(float(last.kl), np.mean(divergences), rtol=1e-4, atol=1e-6)


def test_unigram_divergence_closed_forms():
    rng = np.random.default_rng(0)
    counts = rng.integers(1, 50, size=7).astype(float)
    log_u = np.log(counts / counts.sum())
    # A model that predicts the unigram everywhere (its logits are log u, up to a constant).
    np.testing.assert_allclose(study.unigram_kl(jnp.asarray(log_u + 3.0)[None], jnp.asarray(log_u)), 0.0, atol=1e-12)
    logits = rng.normal(size=(5, 7)) * 2
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    expected = rel_entr(p, np.exp(log_u)[None]).sum(1)
    np.testing.assert_allclose(study.unigram_kl(jnp.asarray(logits), jnp.asarray(log_u)), expected, rtol=1e-10)
    assert np.all(expected > 0)
    # Two symbols: a log(a/b) + (1-a) log((1-a)/(1-b)).
    a, b = 0.3, 0.8
    kl = study.unigram_kl(jnp.log(jnp.asarray([a, 1 - a])), jnp.log(jnp.asarray([b, 1 - b])))
    np.testing.assert_allclose(kl, a * np.log(a / b) + (1 - a) * np.log((1 - a) / (1 - b)), rtol=1e-12)
    # Add-one smoothing of the token counts.
    corpus = type("C", (), {"train": np.array([0, 0, 2]), "vocab": 4})()
    np.testing.assert_allclose(study.log_unigram(corpus), np.log(np.array([3, 1, 2, 1]) / 7))


def test_hypernetwork_spectra_are_the_populated_ones_without_the_step(runs):
    out, ds = runs
    model = load_diffeqformer(out / "diffeqformer" / "model")
    steps, horizon = TRAIN["steps"], model.config.horizon
    populated = head_spectra(populate(model, steps))
    # Q^T K is the same matrix; the populated O carries the step T/N, so O V's
    # eigenvalues are N/T times the populated ones.
    for part in ("real", "imag"):
        trained = ds.sel(state="trained")
        np.testing.assert_allclose(trained[f"dfq_qk_eig_{part}"].values, populated[f"qk_eig_{part}"].values,
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(trained[f"dfq_ov_eig_{part}"].values,
                                   populated[f"ov_eig_{part}"].values * steps / horizon, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(ds.t.values, np.arange(steps) * horizon / steps)
    # And those are the eigenvalues of O_h(t) V_h(t) of the hypernetwork at t, by numpy.
    t = ds.t.values[1]
    ov = np.einsum("hdr,hre->hde", np.asarray(model.output(t), np.float64), np.asarray(model.value(t), np.float64))
    eig = np.linalg.eigvals(ov)
    top = np.take_along_axis(eig, np.argsort(-np.abs(eig), axis=-1), axis=-1)[:, : ds.sizes["ov_rank"]]
    at = ds.sel(t=t, state="trained")
    np.testing.assert_allclose(np.sort(np.abs(top), -1), np.sort(np.hypot(at.dfq_ov_eig_real, at.dfq_ov_eig_imag).values,
                                                                 -1), rtol=1e-4)
    # The untrained control is the run's snapshot at step 0: the model as initialised.
    initial = load_diffeqformer(study.snapshots(out / "diffeqformer")[0])
    control = head_spectra(study.hypernetwork_checkpoint(initial, steps))
    np.testing.assert_allclose(ds.sel(state="untrained").dfq_qk_eig_real.values, control.qk_eig_real.values, rtol=1e-5,
                               atol=1e-7)
    assert not np.allclose(ds.sel(state="untrained").dfq_qk_eig_real, ds.sel(state="trained").dfq_qk_eig_real)


def test_spectral_variation_closed_forms():
    rng = np.random.default_rng(1)
    values = rng.normal(size=(1, 3, 6)) + 1j * rng.normal(size=(1, 3, 6))
    scale = 1.3
    # Constant spectra do not vary; scaled by c their distance is |c - 1| |lambda| and
    # the identity matching is optimal (Cauchy-Schwarz): 2 |c - 1| / (1 + c).
    steady = np.concatenate([values, values])
    np.testing.assert_allclose(study.spectral_variation(steady.real, steady.imag), 0.0, atol=1e-14)
    grown = np.concatenate([values, scale * values[:, :, rng.permutation(6)]])
    np.testing.assert_allclose(study.spectral_variation(grown.real, grown.imag), 2 * (scale - 1) / (1 + scale),
                               rtol=1e-12)
    matrices = rng.normal(size=(1, 2, 4, 4))
    np.testing.assert_allclose(study.matrix_variation(np.concatenate([matrices, scale * matrices])),
                               2 * (scale - 1) / (1 + scale), rtol=1e-12)


def test_sensitivity_and_attention_rows(runs):
    _, ds = runs
    n = len(SENTENCE.split())
    assert ds.sizes["token"] == n and list(ds.token_string.values) == SENTENCE.split()
    for name in study.MODELS:
        for state in study.STATES:
            part = ds.sel(sens_model=name, state=state)
            assert np.all(np.isfinite(part.exponent.values))
            # The last token's attention, averaged over heads and steps, is a distribution.
            np.testing.assert_allclose(float(part.sens_attention.sum()), 1.0, rtol=1e-5)
            np.testing.assert_allclose(part.log_stretch, part.exponent * float(part.depth_span), rtol=1e-12)
    assert np.all(ds.depth_span.sel(sens_model="gpt") == TRAIN["steps"])


def test_attention_only_fields_are_the_learned_term_rescaled_frozen_or_without_drift(runs):
    out, ds = runs
    model = load_diffeqformer(out / "diffeqformer" / "model")
    horizon, stretch = model.config.horizon, 2.0
    learned = model.field()
    alone = VectorField(terms=(learned.terms[0],), scheme="pre", norm=learned.norm)
    x = jax.random.normal(jax.random.key(0), (6, TRAIN["dim"]), jnp.float32)
    moving = study.learned_attention_field(model, stretch)
    frozen = study.learned_attention_field(model, stretch, frozen_at=0.5)
    still = study.learned_attention_field(model, stretch, drift=False)
    for tau in (0.0, 0.3, 0.9):
        np.testing.assert_allclose(moving(tau, x), stretch / horizon * alone(tau, x), rtol=2e-5, atol=1e-5)
        np.testing.assert_allclose(frozen(tau, x), moving(0.5 * horizon, x), rtol=2e-5, atol=1e-5)
        drift = np.asarray(moving(tau, x) - still(tau, x))
        np.testing.assert_allclose(drift, np.broadcast_to(drift[0], drift.shape), rtol=1e-4, atol=1e-5)
    # The four runs of a model start from the same embedded tokens.
    for state in study.STATES:
        start = ds.sel(state=state).isel(theory_time=0)
        assert np.unique(start.clusters.values).size == 1 and np.unique(start.mean_cosine.values).size == 1
    assert np.all((ds.clusters >= 1) & (ds.clusters <= len(SENTENCE.split())))
    assert np.all(ds.mean_cosine <= 1 + 1e-6)


def test_adaptive_depth_zero_shot_and_fine_tuning(runs, adaptive):
    out, zero, tuned = adaptive
    # At the trained number of steps, the zero-shot loss on the pretraining corpus is
    # the training run's own last validation (the same held-out batches).
    last = study.read_metrics(out / "diffeqformer")[-1]["val_loss"]
    np.testing.assert_allclose(float(zero.zero_shot.sel(eval_corpus="pretraining", steps=TRAIN["steps"])), last,
                               rtol=1e-5)
    gpt_last = study.read_metrics(out / "gpt")[-1]["val_loss"]
    np.testing.assert_allclose(float(zero.gpt_zero_shot.sel(eval_corpus="pretraining")), gpt_last, rtol=1e-5)
    assert np.all(np.isfinite(zero.zero_shot)) and zero.sizes["tuning"] == 0
    np.testing.assert_allclose(tuned.zero_shot.sel(steps=4), zero.zero_shot.sel(steps=4), rtol=1e-6)
    # Each fine-tuning run starts from the zero-shot model, and ends lower.
    np.testing.assert_allclose(tuned.finetune_start.sel(tuning="full"), tuned.zero_shot.sel(eval_corpus="finetune"),
                               rtol=1e-5)
    assert np.all(tuned.finetuned.sel(tuning="full") < tuned.zero_shot.sel(eval_corpus="finetune"))
    assert float(tuned.gpt_finetuned.sel(tuning="full")) < float(tuned.gpt_zero_shot.sel(eval_corpus="finetune"))
    folder = out / "finetune" / "induction-8steps" / "diffeqformer-s4-full"
    assert json.loads((folder / "train.json").read_text())["config"]["init"] == str(out / "diffeqformer")
    assert study.finished(folder)


def test_both_redraw_from_their_results_file(runs, adaptive, tmp_path):
    for ds, expected in ((runs[1], {"losses.md", "losses.png", "training_energy.png", "spectra.png", "sensitivity.png",
                                    "clustering.png"}),
                         (adaptive[1], {"adaptive_depth.md", "adaptive_depth.png"}),
                         (adaptive[2], {"adaptive_depth.md", "adaptive_depth.png"})):
        folder = tmp_path / f"{ds.attrs['experiment']}-{ds.sizes.get('tuning', 0)}"
        path = write_results(ds, folder / "results.nc")
        written = {p.name for p in draw_experiment(load_results(path), folder)}
        assert expected <= written
        assert all((folder / name).stat().st_size > 0 for name in written)


@pytest.mark.parametrize("name, options, words", [
    ("diffeqformer", {"sentence": " "}, "sentence"),
    ("diffeqformer", {"tokens": 0}, "tokens"),
    ("diffeqformer", {"train": {"out": "elsewhere"}}, "sets out itself"),
    ("diffeqformer", {"train": {"width": 3}}, "unknown setting"),
    ("diffeqformer", {"frozen_at": 1.5}, "frozen_at"),
    ("adaptive_depth", {"steps": []}, "steps"),
    ("adaptive_depth", {"methods": ["qlora"]}, "methods"),
    ("adaptive_depth", {"train": {"steps": 3}}, "sets steps"),
    ("adaptive_depth", {"corpus": "wikitext"}, "unknown corpus"),
])
def test_bad_options_are_one_sentence(name, options, words, tmp_path):
    with pytest.raises(ConfigError, match=words) as error:
        plan_experiment(compose_experiment(name, {"experiment": {"options": {"out": str(tmp_path), **options}}}))
    message = str(error.value)
    assert "\n" not in message and message.endswith(".")


def test_a_gpt_run_is_no_pretrained_diffeqformer(runs):
    out, _ = runs
    with pytest.raises(ConfigError, match="holds no DiffEqFormer"):
        plan_experiment(compose_experiment("adaptive_depth", {"experiment": {"options": {"pretrained": str(out / "gpt")}}}))
