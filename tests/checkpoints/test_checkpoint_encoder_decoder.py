"""Encoder-decoder checkpoints (T5 v1.0 and v1.1, BART, Marian): read into the canonical
form and run as the decoder's depth flow, the encoder's output a fixed source of its
cross-attention, held to `transformers`' hidden states of both stacks; and the two parts
of the core they need, held to their formulas and to `transformers`: T5's relative-position
bias on the self-attention logits and the gated-GELU MLP. `attnflow experiment=checkpoint`
and `experiment=sensitivity` run the decoder on the encoder's reading of the text."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from checkpoint_models import (
    DEPTH,
    DIM,
    ENCODER_DECODERS,
    VOCAB,
    assert_same_stream,
    reference,
    relative,
    seq2seq_states,
    write_tiny,
    write_word_tokenizer,
)
from commands import assert_cf, command, one_sentence  # noqa: F401 (command: a fixture)
from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding
from transformers.models.t5.modeling_t5 import T5Attention, T5LayerNorm

import attnflow as af
from attnflow.checkpoints import (
    Forward,
    depth_flow,
    forward,
    load_checkpoint,
    load_tokenizer,
    run_depth,
    save_checkpoint,
    teacher_forced,
    with_source,
)
from attnflow.checkpoints.marian import sinusoids
from attnflow.numerics._schedules import Constant
from attnflow.numerics._terms import MLP, RelativePositionBias, SelfAttention
from attnflow.schema._errors import CheckpointError, ConfigError

IDS = np.random.default_rng(2).integers(2, VOCAB - 1, size=11)  # clear of the special ids 0, 1 and VOCAB - 1


# --------------------------------------------------------------------------------------
# The core's parts: the relative-position bias and the gated GELU
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("buckets, distance", [(32, 128), (8, 16), (6, 20), (64, 4096)])
def test_relative_position_buckets_are_transformers(buckets, distance, bidirectional):
    """Every offset from -5000 to 5000 falls in transformers' bucket, the logarithmic
    buckets' edges included (32 buckets to 128: offsets 16, 32 and 64 lie on edges)."""
    offsets = np.arange(-5000, 5001)
    ours = RelativePositionBias(jnp.zeros((buckets, 2)), bidirectional, distance).buckets(offsets)
    theirs = T5Attention._relative_position_bucket(torch.as_tensor(offsets), bidirectional=bidirectional,
                                                   num_buckets=buckets, max_distance=distance)
    assert np.array_equal(ours, theirs.numpy())


def test_position_bias_is_added_to_the_logits():
    """Softmax attention with a position bias is its double sum, bias added after beta,
    causal or not; the queries of some rows alone are those rows of the whole."""
    rng = np.random.default_rng(0)
    heads, n, d, k = 2, 9, 4, 3
    q, key, v = (rng.normal(size=(heads, k, d)) for _ in range(3))
    o, x, table = rng.normal(size=(heads, d, k)), rng.normal(size=(n, d)), rng.normal(size=(8, heads))
    beta = 0.7
    for causal in (False, True):
        bias = RelativePositionBias(jnp.asarray(table), bidirectional=not causal, max_distance=6)
        term = SelfAttention(query=Constant(jnp.asarray(q)), key=Constant(jnp.asarray(key)),
                             value=Constant(jnp.asarray(v)), output=Constant(jnp.asarray(o)), beta=jnp.asarray(beta),
                             alibi=None, heads=heads, causal=causal, position_bias=bias)
        expected = np.zeros((n, d))
        for h in range(heads):
            for i in range(n):
                keys = range(i + 1) if causal else range(n)
                logits = np.array([beta * (q[h] @ x[i]) @ (key[h] @ x[j]) + table[bias.buckets(np.array(j - i)), h]
                                   for j in keys])
                a = np.exp(logits - logits.max())
                expected[i] += o[h] @ sum(a[j] * (v[h] @ x[j]) for j in keys) / a.sum()
        whole = jax.jit(lambda x: term(0.0, x))(jnp.asarray(x))
        call = jax.jit(lambda x, rows: term(0.0, x, rows=rows))
        np.testing.assert_allclose(whole, expected, rtol=1e-12, atol=1e-12)
        rows = jnp.array([6, 2])  # traced: the lookup over every offset
        np.testing.assert_allclose(call(jnp.asarray(x), rows), whole[rows], rtol=1e-12, atol=1e-12)
    plain = dict(query=Constant(jnp.asarray(q)), key=Constant(jnp.asarray(key)), value=Constant(jnp.asarray(v)),
                 output=Constant(jnp.asarray(o)), beta=jnp.asarray(beta), alibi=None, heads=heads)
    for refused, said in ((dict(kind="hardmax"), "does not apply"), (dict(block=4), "not tiled")):
        with pytest.raises(ConfigError, match=said):
            SelfAttention(**plain, position_bias=bias, **refused)
    with pytest.raises(ConfigError, match="3 heads"):
        SelfAttention(**plain, position_bias=RelativePositionBias(jnp.zeros((8, 3)), True, 6))


def test_geglu_is_its_formula():
    """`geglu`: W2 (gelu_tanh(W1 x) * (W3 x)), T5 v1.1's gated unit; it needs its gate."""
    rng = np.random.default_rng(1)
    w1, w2, gate, x = rng.normal(size=(8, 3)), rng.normal(size=(3, 8)), rng.normal(size=(8, 3)), rng.normal(size=(5, 3))
    c = lambda a: Constant(jnp.asarray(a))
    h = x @ w1.T
    gelu = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))
    got = MLP(c(w1), c(w2), gate=c(gate), activation="geglu")(0.0, jnp.asarray(x))
    np.testing.assert_allclose(got, (gelu * (x @ gate.T)) @ w2.T, rtol=1e-12)
    with pytest.raises(ConfigError, match="gate matrix"):
        MLP(c(w1), c(w2), activation="geglu")


@pytest.mark.parametrize("places, d", [(16, 8), (10, 7)])
def test_marian_positions_are_transformers(places, d):
    """The sinusoids that transformers makes when it loads a Marian model, bit for bit."""
    theirs = MarianSinusoidalPositionalEmbedding(places, d).create_weight().numpy()
    assert np.array_equal(sinusoids(places, d), theirs)


# --------------------------------------------------------------------------------------
# Tiny encoder-decoders against transformers
# --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The four variants' folders; T5's and BART's with a word tokenizer of their family."""
    root = tmp_path_factory.mktemp("seq2seq")
    folders = {name: write_tiny(family, root / name.replace(" ", "_"), seed=3, **overrides)
               for name, (family, overrides) in ENCODER_DECODERS.items()}
    for family in ("t5", "bart"):
        write_word_tokenizer(folders[family], family)
    return folders


def compare(model, checkpoint, tol: float, decoder_ids=None):
    """Both stacks' hidden states and the LM logits of `checkpoint` reading `IDS`
    against `model`'s, the decoder reading `decoder_ids` (teacher-forced on `IDS` by
    default): the relative errors."""
    if decoder_ids is None:
        bound, decoder_ids = teacher_forced(checkpoint, IDS)
        assert decoder_ids.tolist() == [checkpoint.decoder_start, *IDS.tolist()]
    else:
        bound = with_source(checkpoint, IDS)
    encoder, decoder = seq2seq_states(model, IDS, decoder_ids)
    errors = assert_same_stream(forward(checkpoint.encoder, IDS), encoder, checkpoint.encoder.final_norm is not None,
                                tol)
    ours = forward(bound, decoder_ids)
    assert ours.hidden.shape == (DEPTH + 1, len(decoder_ids), DIM)
    errors += assert_same_stream(ours, decoder, bound.final_norm is not None, tol)
    with torch.no_grad():
        logits = model(input_ids=torch.as_tensor(IDS)[None], decoder_input_ids=torch.as_tensor(decoder_ids)[None])
    error = relative(bound.logits(ours.hidden[-1]), logits.logits[0].numpy())
    assert error < tol, error
    return errors + [error]


def _t5_norm_in_float64(self, h):
    """T5LayerNorm as transformers writes it, but with its mean square in the model's
    dtype (transformers takes it in float32 even in a float64 model)."""
    return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


# Every variant in float32 (to 1e-5) and in float64 (to 1e-12); the default run has each
# variant once and both dtypes, the rest is slow.
CASES = [("t5", "float64"), ("t5 v1.1", "float32"), ("bart", "float32"), ("marian", "float32")] + [
    pytest.param(*case, marks=pytest.mark.slow)
    for case in (("t5", "float32"), ("t5 v1.1", "float64"), ("bart", "float64"), ("marian", "float64"))]


@pytest.mark.parametrize("variant, dtype", CASES)
def test_tiny_encoder_decoder_matches_transformers(tiny, variant, dtype, monkeypatch):
    """attnflow against float64 transformers: every hidden state of the encoder and of
    the decoder (one Lie-Trotter step per layer: self-attention, cross-attention to the
    encoder's output, MLP), and the logits.

    float32: docs/checkpoints.md says below 1e-5 relative (measured: T5 1.8e-6, T5
    v1.1 6.4e-6, BART 4.5e-7, Marian 7.4e-7; T5 is the widest, its logits not divided by
    sqrt(d_k) on these random weights). float64: 1e-12 (measured 7e-16 to 1.6e-14), every
    weight, bias, bucket, position and scale being the one transformers reads; there
    T5LayerNorm takes its mean square in float64 (transformers takes it in float32 even
    in a float64 model, which leaves 1e-6)."""
    family = ENCODER_DECODERS[variant][0]
    checkpoint = load_checkpoint(tiny[variant], dtype=dtype)
    assert (checkpoint.family, checkpoint.encoder.family) == (family, family)
    assert (checkpoint.arrangement, checkpoint.causal, checkpoint.encoder.causal) == (
        "sequential" if family == "t5" else "post", True, False)
    if dtype == "float64":
        monkeypatch.setattr(T5LayerNorm, "forward", _t5_norm_in_float64)
    compare(reference(tiny[variant]), checkpoint, 1e-12 if dtype == "float64" else 1e-5)


def test_marian_with_a_vocabulary_of_its_own_for_the_decoder(tmp_path):
    """`share_encoder_decoder_embeddings` false: the decoder reads and predicts its own
    vocabulary (80 tokens against the encoder's 97): its embedding and LM head are the
    model's, bit for bit, and the text's ids, which name other tokens there, are
    refused by teacher_forced."""
    folder = write_tiny("marian", tmp_path / "marian", seed=4, share_encoder_decoder_embeddings=False,
                        decoder_vocab_size=80, pad_token_id=79, decoder_start_token_id=79, scale_embedding=False)
    checkpoint, model = load_checkpoint(folder), reference(folder)
    for ours, theirs in ((checkpoint.embed, model.model.decoder.embed_tokens), (checkpoint.unembed, model.lm_head),
                         (checkpoint.encoder.embed, model.model.encoder.embed_tokens)):
        assert np.array_equal(ours, theirs.weight.detach().float().numpy())
    assert checkpoint.embed.shape == (80, DIM) and checkpoint.unembed_bias.shape == (80,)
    with pytest.raises(ConfigError, match="vocabulary of its own"):
        teacher_forced(checkpoint, IDS)


@pytest.mark.slow
def test_marian_decoder_of_its_own_vocabulary_matches_transformers(tmp_path):
    """Reading ids of its own vocabulary, that decoder is transformers' to rounding in
    float64 (slow: the shared Marian above runs the same layers in the default run)."""
    folder = write_tiny("marian", tmp_path / "marian", seed=4, share_encoder_decoder_embeddings=False,
                        decoder_vocab_size=80, pad_token_id=79, decoder_start_token_id=79)
    compare(reference(folder), load_checkpoint(folder, dtype="float64"), 1e-12,
            decoder_ids=np.array([79, 5, 77, 40, 3, 12, 0]))


def test_a_decoder_reads_its_source_first(tiny, tmp_path):
    checkpoint = load_checkpoint(tiny["bart"])
    with pytest.raises(ConfigError, match="with_source"):
        depth_flow(checkpoint)
    with pytest.raises(ConfigError, match="not an encoder-decoder"):
        with_source(checkpoint.encoder, IDS)
    with pytest.raises(ConfigError, match="outside the embedding of the encoder of bart"):
        teacher_forced(checkpoint, np.array([3, VOCAB]))
    with pytest.raises(CheckpointError, match="cannot be saved"):
        save_checkpoint(checkpoint, tmp_path / "saved")
    # the same source, bound by with_source, gives the decoder teacher_forced gives
    bound, decoder_ids = teacher_forced(checkpoint, IDS)
    assert np.array_equal(forward(with_source(checkpoint, IDS), decoder_ids).hidden, forward(bound, decoder_ids).hidden)


@pytest.mark.slow
def test_refined_decoder_depth_converges_at_first_order(tiny):
    """The T5 decoder's Lie-Trotter split of three terms (self-attention, cross-attention
    to the fixed source, MLP), refined, converges at first order to the adaptive solve
    of its unsplit field (slow: the dt = 1 test above holds the same terms in the
    default run)."""
    bound, ids = teacher_forced(load_checkpoint(tiny["t5"], dtype="float64"), IDS)
    flow, x0 = depth_flow(bound), bound.embed_tokens(ids)
    limit = run_depth(flow, x0, adaptive=True, solver="dopri8", rtol=1e-11, atol=1e-12)
    errors = [float(jnp.abs(run_depth(flow, x0, steps_per_layer=m)[-1] - limit[-1]).max()) for m in (256, 512)]
    assert abs(np.log2(errors[0] / errors[1]) - 1) < 0.2, errors
    assert flow.field.terms[1].source is bound.source  # the second term reads the encoder's output


# --------------------------------------------------------------------------------------
# The experiments on an encoder-decoder folder
# --------------------------------------------------------------------------------------

TEXT = "w5 w17 w42 w8 w60"


@pytest.mark.parametrize("variant, framed", [("t5", [5, 17, 42, 8, 60, 1]), ("bart", [0, 5, 17, 42, 8, 60, 2])])
def test_checkpoint_experiment_runs_the_decoder_on_the_encoders_reading(tiny, variant, framed, command, monkeypatch,
                                                                      tmp_path):
    """`attnflow experiment=checkpoint` on a T5 (pre-LN) and a BART (post-LN) folder: the
    encoder reads the text (framed by the family's special tokens), the decoder its start
    token (T5's "<pad>", BART's "</s>") and the same ids. The stored stream is
    transformers' decoder's on that input (float64 run, stored in float32), one step per
    layer is it exactly (`depth_error` 0), a refined run is not, and the results say that
    the run is the decoder's, its source the encoder's output on the text."""
    code, errors = command("experiment=checkpoint", f"checkpoint={tiny[variant]}", f"text={TEXT}", "dtype=float64",
                           "experiment.options.steps=[1,2]", "experiment.options.probes=false",
                           "experiment.options.adaptive=false", "hydra.run.dir=run")
    assert code == 0, errors
    (ds,) = assert_cf(tmp_path, tmp_path / "run" / "results.nc")  # an encoder-decoder's attributes: CF too
    assert load_tokenizer(tiny[variant]).encode(TEXT).tolist() == framed
    start = load_checkpoint(tiny[variant]).decoder_start
    assert ds.token_id.values.tolist() == [start, *framed]
    assert [str(t) for t in ds.token_string.values] == ["<pad>" if variant == "t5" else "</s>",
                                                        *load_tokenizer(tiny[variant]).tokens(framed)]
    assert ds.attrs["encoder_tokens"] == len(framed) and ds.attrs["decoder_start_id"] == start
    assert "encoder's output" in ds.attrs["decoder_input"] and "decoder's input" in ds.token_id.attrs["long_name"]
    assert float(np.abs(ds.depth_error.sel(run="dt=1")).max()) == 0.0
    assert float(ds.depth_error.sel(run="dt=1/2").isel(depth=-1)) > 1e-3
    monkeypatch.setattr(T5LayerNorm, "forward", _t5_norm_in_float64)
    _, decoder = seq2seq_states(reference(tiny[variant]), np.asarray(framed), ds.token_id.values)
    assert_same_stream(Forward(ds.hidden.values, ds.final.values), decoder, variant == "t5", 1e-6)
    assert {p.name for p in Path("run").glob("*.png")} == {"depth.png", "pair_cosines.png", "cosine_distance.png",
                                                           "attention.png"}
    caption = " ".join(af.experiment_figures(ds)["depth"].texts[-1].get_text().split())  # the words, however wrapped
    assert "decoder of an encoder-decoder" in caption


def test_sensitivity_experiment_runs_the_decoder_with_its_source_fixed(tiny):
    """`experiment=sensitivity` on the T5 folder reads the same decoder input; every
    exponent of the last output is finite (the decoder's mask is causal and the output
    last), its prediction is transformers' greedy next token after the text."""
    ds = af.run_experiment("sensitivity", {"checkpoint": str(tiny["t5"]), "text": TEXT, "dtype": "float64"})
    framed = [5, 17, 42, 8, 60, 1]
    assert ds.token_id.values.tolist() == [0, *framed] and ds.attrs["encoder_tokens"] == len(framed)
    assert ds.exponent.shape == (1, len(framed) + 1) and np.isfinite(ds.exponent.values).all()
    with torch.no_grad():
        logits = reference(tiny["t5"])(input_ids=torch.as_tensor([framed]),
                                       decoder_input_ids=torch.as_tensor(ds.token_id.values)[None]).logits
    assert ds.attrs["prediction_id"] == int(logits[0, -1].argmax())
    assert "source (the encoder's output on the text, 6 tokens) is held fixed" in \
        af.experiment_figures(ds)["sentence"].texts[-1].get_text()


def test_the_experiments_refuse_a_marian_folder_without_a_tokenizer_json(tiny):
    """Marian ships its tokenizer as sentencepiece files and a `vocab.json` without
    merges, which attnflow does not read (docs/checkpoints.md): one sentence, before
    any computing."""
    (tiny["marian"] / "vocab.json").write_text('{"w5": 5}')
    with pytest.raises(CheckpointError, match="has no tokenizer") as error:
        af.run_experiment("checkpoint", {"checkpoint": str(tiny["marian"]), "text": TEXT})
    one_sentence(error)
