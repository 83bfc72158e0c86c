"""Checkpoint loaders: Hugging Face folders of every family read into canonical form.

References are independent of attnflow: tiny models written and run by `transformers`
(`tests/checkpoint_models.py`), the real MiniLM checkpoint and its `transformers`
tokenizer, and exact identities of the fused-projection layouts. The second part holds
the reference forward pass (`_flow.forward`) against `transformers`' hidden states.
"""

from __future__ import annotations

import json
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from attnflow.schema._errors import CheckpointError
from attnflow.checkpoints._load import load_checkpoint, load_tokenizer
from attnflow.checkpoints._locate import installed_model
from attnflow.checkpoints.neox import split_query_key_value

from checkpoint_models import (DEPTH, DIM, FAMILIES, HEADS, assert_same_stream, hidden_states, reference, relative,
                               write_tiny)

SENTENCE = "The quick brown fox jumps over the lazy dog, and then it sleeps."


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One tiny checkpoint folder per family (GPT-2's sharded)."""
    root = tmp_path_factory.mktemp("tiny")
    return {family: write_tiny(family, root / family, sharded=family == "gpt2") for family in FAMILIES}


def same_arrays(a, b) -> bool:
    """Two checkpoints hold equal arrays (names aside)."""
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(leaves_a) == len(leaves_b) and all(jnp.array_equal(x, y) for x, y in zip(leaves_a, leaves_b))


# --------------------------------------------------------------------------------------
# Part 1: loading (weights, layouts, tokenizers, errors)
# --------------------------------------------------------------------------------------

def torch_layer(model, family: str, l: int):
    """Layer `l` of a `transformers` model as functions of a float64 tensor `x (n, d)`:
    per-head queries, keys, values `(H, n, d_k)` (grouped key/value heads repeated the
    way `repeat_kv` does), the output projection of per-head values, the MLP, and the
    two normalizations (first, second) of the block."""
    n_heads = lambda y: y.view(y.shape[0], -1, DIM // HEADS).transpose(0, 1)
    if family == "gpt2":
        block = model.transformer.h[l]
        qkv = lambda x: tuple(n_heads(p) for p in block.attn.c_attn(x).split(DIM, dim=-1))
        return qkv, block.attn.c_proj, block.mlp, (block.ln_1, block.ln_2)
    if family == "gpt_neox":
        layer = model.gpt_neox.layers[l]
        # transformers' own split of the fused projection: (n, H, 3 d_k), then thirds
        qkv = lambda x: layer.attention.query_key_value(x).view(x.shape[0], HEADS, -1).transpose(0, 1).chunk(3, dim=-1)
        return qkv, layer.attention.dense, layer.mlp, (layer.input_layernorm, layer.post_attention_layernorm)
    if family == "bert":
        layer = model.bert.encoder.layer[l]
        own = layer.attention.self
        qkv = lambda x: (n_heads(own.query(x)), n_heads(own.key(x)), n_heads(own.value(x)))
        mlp = lambda x: layer.output.dense(layer.intermediate(x))
        return qkv, layer.attention.output.dense, mlp, (layer.attention.output.LayerNorm, layer.output.LayerNorm)
    layer = model.model.layers[l]
    own = layer.self_attn
    groups = HEADS // model.config.num_key_value_heads
    qkv = lambda x: (n_heads(own.q_proj(x)), n_heads(own.k_proj(x)).repeat_interleave(groups, dim=0),
                     n_heads(own.v_proj(x)).repeat_interleave(groups, dim=0))
    return qkv, own.o_proj, layer.mlp, (layer.input_layernorm, layer.post_attention_layernorm)


ACTIVATIONS = {"gelu": lambda z: jax.nn.gelu(z, approximate=False), "gelu_tanh": lambda z: jax.nn.gelu(z, approximate=True)}


def canonical_mlp(mlp, l: int, x):
    """The canonical MLP of layer `l`, written out: `W2 act(W1 x + b1) + b2` or SwiGLU."""
    h = x @ mlp.w1[l].T + (0 if mlp.b1 is None else mlp.b1[l][None])
    h = jax.nn.silu(h) * (x @ mlp.gate[l].T) if mlp.activation == "swiglu" else ACTIVATIONS[mlp.activation](h)
    return h @ mlp.w2[l].T + (0 if mlp.b2 is None else mlp.b2[l][None])


@pytest.mark.parametrize("family", FAMILIES)
def test_canonical_layers_reproduce_transformers_modules(tiny, family):
    """Per head, the canonical Q, K, V (and biases) give the projections of the torch
    modules; O of per-head values, the MLP and both norms agree too (float64)."""
    model, checkpoint = reference(tiny[family]), load_checkpoint(tiny[family], dtype=jnp.float64)
    att, rng = checkpoint.blocks.attention, np.random.default_rng(0)
    x = rng.normal(size=(7, DIM))
    tx = torch.as_tensor(x)
    for l in range(DEPTH):
        qkv, output, mlp, norms = torch_layer(model, family, l)
        with torch.no_grad():
            expected = [p.numpy() for p in qkv(tx)]
            for got_w, got_b, want in zip((att.query, att.key, att.value), (att.query_bias, att.key_bias, att.value_bias), expected):
                got = jnp.einsum("hkd,nd->hnk", got_w[l], x) + (0 if got_b is None else got_b[l][:, None, :])
                assert relative(got, want) < 1e-12
            values = rng.normal(size=(HEADS, 7, DIM // HEADS))
            want = output(torch.as_tensor(values).transpose(0, 1).reshape(7, DIM)).numpy()
            got = jnp.einsum("hek,hnk->ne", att.output[l], values) + (0 if att.output_bias is None else att.output_bias[l][None])
            assert relative(got, want) < 1e-12
            assert relative(canonical_mlp(checkpoint.blocks.mlp, l, x), mlp(tx).numpy()) < 1e-12
            layer = checkpoint.blocks.layer(l)
            for mine, theirs in zip((layer.attn_norm, layer.mlp_norm), norms):
                # LlamaRMSNorm upcasts to float32 (not float64), hence its wider tolerance
                assert relative(mine(jnp.asarray(x)), theirs(tx).numpy()) < (1e-6 if family == "llama" else 1e-12)


def test_grouped_heads_and_tied_embedding(tiny):
    """Llama's 2 key/value heads serve 2 query heads each; the LM head is the embedding."""
    checkpoint = load_checkpoint(tiny["llama"])
    att = checkpoint.blocks.attention
    assert (att.kv_heads, att.heads) == (2, HEADS)
    assert jnp.array_equal(att.key[:, 0], att.key[:, 1]) and not jnp.array_equal(att.key[:, 1], att.key[:, 2])
    assert checkpoint.unembed is not None and jnp.array_equal(checkpoint.unembed, checkpoint.embed)
    assert checkpoint.rotary.dims == DIM // HEADS


def test_neox_fused_projection_is_split_per_head():
    """A fused GPT-NeoX weight built from known per-head Q, K, V in the `(H, 3, d_k)`
    row layout splits back exactly; permuting its head blocks permutes the heads; and
    transformers' attention reads the same heads from it."""
    rng = np.random.default_rng(1)
    heads, dk, d = 3, 4, 12
    parts = rng.normal(size=(3, heads, dk, d))
    biases = rng.normal(size=(3, heads, dk))
    fused = np.stack(parts, axis=1).reshape(3 * heads * dk, d)  # head h: its q, k, v rows
    fused_bias = np.stack(biases, axis=1).reshape(-1)
    (q, k, v), (bq, bk, bv) = split_query_key_value(fused, fused_bias, heads)
    for got, want in zip((q, k, v, bq, bk, bv), (*parts, *biases)):
        assert np.array_equal(got, want)
    order = np.array([2, 0, 1])
    permuted = fused.reshape(heads, 3 * dk, d)[order].reshape(fused.shape)
    (pq, pk, pv), _ = split_query_key_value(permuted, None, heads)
    assert np.array_equal(pq, q[order]) and np.array_equal(pk, k[order]) and np.array_equal(pv, v[order])

    config = transformers.GPTNeoXConfig(hidden_size=d, num_attention_heads=heads, num_hidden_layers=1,
                                        intermediate_size=8, vocab_size=10)
    layer = transformers.GPTNeoXForCausalLM(config).gpt_neox.layers[0].attention
    with torch.no_grad():
        layer.query_key_value.weight.copy_(torch.as_tensor(fused))
        layer.query_key_value.bias.zero_()
        x = rng.normal(size=(5, d))
        # transformers' forward: view (n, H, 3 d_k), transpose heads first, chunk in thirds
        theirs = layer.query_key_value(torch.as_tensor(x, dtype=torch.float32)).view(5, heads, -1).transpose(0, 1).chunk(3, -1)
    for got, want in zip((q, k, v), theirs):
        assert np.allclose(np.einsum("hkd,nd->hnk", got, x), want.numpy(), atol=1e-5)


def test_sharded_checkpoint_equals_single_file(tiny, tmp_path):
    """The same GPT-2 weights read from six shards and an index or from one file."""
    assert (tiny["gpt2"] / "model.safetensors.index.json").is_file()
    single = load_checkpoint(write_tiny("gpt2", tmp_path / "single"))
    sharded = load_checkpoint(tiny["gpt2"])
    assert same_arrays(single, sharded)


def test_bfloat16_tensors_are_widened_exactly(tmp_path):
    """bfloat16 weights (numpy has no such type) come back as their exact float32 values."""
    model = reference(write_tiny("llama", tmp_path / "f32")).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "bf16")
    checkpoint = load_checkpoint(tmp_path / "bf16")
    assert checkpoint.embed.dtype == jnp.float32
    assert np.array_equal(checkpoint.embed, model.model.embed_tokens.weight.detach().float().numpy())
    assert np.array_equal(checkpoint.blocks.mlp.w2[1], model.model.layers[1].mlp.down_proj.weight.detach().float().numpy())


def test_trusted_pickle_equals_safetensors(tiny, tmp_path):
    """`pytorch_model.bin` is refused, naming the flag; trusted, it gives the same weights."""
    folder = tmp_path / "pickled"
    folder.mkdir()
    shutil.copy(tiny["bert"] / "config.json", folder)
    torch.save(reference(tiny["bert"]).float().state_dict(), folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(folder)
    assert "trust_pickle=True" in one_sentence(error) and "pytorch_model.bin" in str(error.value)
    trusted, safe = load_checkpoint(folder, trust_pickle=True), load_checkpoint(tiny["bert"])
    assert same_arrays(trusted, safe)


def test_pickle_without_torch_says_so(tiny, tmp_path, monkeypatch):
    folder = tmp_path / "pickled"
    folder.mkdir()
    shutil.copy(tiny["gpt2"] / "config.json", folder)
    torch.save({"wte.weight": torch.zeros(2, 2)}, folder / "model.pt")
    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(folder / "model.pt", trust_pickle=True)
    assert "needs torch" in one_sentence(error)


def test_minilm_loads_with_its_shape():
    checkpoint = load_checkpoint("minilm")
    assert (checkpoint.family, checkpoint.arrangement, checkpoint.causal) == ("bert", "post", False)
    assert (checkpoint.depth, checkpoint.dim, checkpoint.heads, checkpoint.head_dim) == (6, 384, 12, 32)
    assert checkpoint.embed.shape == (30522, 384) and checkpoint.positions.shape == (512, 384)
    assert checkpoint.blocks.mlp.w1.shape == (6, 1536, 384) and checkpoint.unembed is None
    assert checkpoint.blocks.attn_norm.eps == 1e-12 and checkpoint.name == "minilm"


@pytest.mark.parametrize("text", [SENTENCE, "Résumé of naïve tokens: 東京, e-mail and URLs (https://x.org)!"])
def test_minilm_tokenizer_agrees_with_transformers(text, tmp_path):
    """tokenizer.json, and the vocab.txt fallback, give transformers' ids exactly."""
    folder = installed_model("minilm")
    expected = transformers.AutoTokenizer.from_pretrained(folder)(text)["input_ids"]
    tokenizer = load_tokenizer("minilm")
    assert tokenizer.encode(text).tolist() == expected
    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copy(folder / name, tmp_path)
    assert load_tokenizer(tmp_path).encode(text).tolist() == expected
    tokens = tokenizer.tokens(expected)
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and len(tokens) == len(expected)
    assert tokenizer.decode(expected) == transformers.AutoTokenizer.from_pretrained(folder).decode(
        expected, skip_special_tokens=True)


def test_byte_level_bpe_fallback_agrees_with_transformers(tmp_path):
    """vocab.json + merges.txt are read as GPT-2's byte-level BPE, like `GPT2Tokenizer`."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([SENTENCE, "Tokens flow like particles; clusters form!", "café 東京"] * 4,
                            vocab_size=300, min_frequency=1, show_progress=False)
    bpe.save_model(str(tmp_path))
    theirs = transformers.GPT2Tokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))
    ours = load_tokenizer(tmp_path)
    for text in ("The lazy fox, clustered!", " particles  flow\n(café)"):
        ids = ours.encode(text)
        assert ids.tolist() == theirs(text)["input_ids"]
        assert ours.decode(ids) == text and "".join(ours.tokens(ids)) == text


def test_installed_model_names():
    assert (installed_model("minilm") / "config.json").is_file()
    with pytest.raises(CheckpointError) as error:
        installed_model("gpt5")
    assert "minilm" in one_sentence(error)


def _edit_json(path, change):
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


def _drop_shard(folder):
    next(iter(sorted(folder.glob("model-*.safetensors")))).unlink()


def _list_ghost_tensor(folder):
    index = folder / "model.safetensors.index.json"
    _edit_json(index, lambda c: c | {"weight_map": c["weight_map"] | {"transformer.h.9.extra": "model-00001-of-00006.safetensors"}})


def _truncate(folder):
    path = sorted(folder.glob("model-*.safetensors"))[-1]
    path.write_bytes(path.read_bytes()[:-7])


def _garble_header(folder):
    path = sorted(folder.glob("model-*.safetensors"))[0]
    path.write_bytes(b"\xff" * 16 + path.read_bytes()[16:])


ERRORS = {
    "missing shard": (_drop_shard, "missing"),
    "index lists a tensor a shard lacks": (_list_ghost_tensor, "transformer.h.9.extra"),
    "truncated safetensors": (_truncate, "truncated"),
    "corrupt header": (_garble_header, "truncated or not a safetensors file"),
    "shape against config": (lambda f: _edit_json(f / "config.json", lambda c: c | {"n_inner": 40}), "(32, 40)"),
    "unknown model_type": (lambda f: _edit_json(f / "config.json", lambda c: c | {"model_type": "mamba"}), "gpt_neox"),
    "config not JSON": (lambda f: (f / "config.json").write_text("{model_type: gpt2"), "not valid JSON"),
    "no config": (lambda f: (f / "config.json").unlink(), "no config.json"),
    "missing tensor": (lambda f: _edit_json(f / "config.json", lambda c: c | {"n_layer": 3}), "transformer.h.2."),
    "no weights": (lambda f: [p.unlink() for p in f.glob("model*")], "has no weights"),
}


@pytest.mark.parametrize("case", ERRORS)
def test_broken_checkpoints_give_one_sentence(tiny, tmp_path, case):
    """Every way a folder can be broken ends in one CheckpointError sentence that says what."""
    folder = shutil.copytree(tiny["gpt2"], tmp_path / "gpt2")
    breaking, said = ERRORS[case]
    breaking(folder)
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(folder)
    assert said in one_sentence(error)


def test_missing_paths_and_odd_configs(tmp_path, tiny):
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(tmp_path / "nowhere")
    assert "does not exist" in one_sentence(error)
    folder = shutil.copytree(tiny["llama"], tmp_path / "llama")
    _edit_json(folder / "config.json", lambda c: c | {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}})
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(folder)
    assert "yarn" in one_sentence(error)


# --------------------------------------------------------------------------------------
# Part 2: the reference forward pass against transformers' hidden states
# --------------------------------------------------------------------------------------

from attnflow.checkpoints._flow import forward  # noqa: E402
from commands import one_sentence

VARIANTS = {
    "gpt2": ("gpt2", {}),
    "gpt2 scaled by layer": ("gpt2", {"scale_attn_by_inverse_layer_idx": True}),
    "neox parallel, rotary 1/4": ("gpt_neox", {}),
    "neox sequential, rotary 1/2": ("gpt_neox", {"use_parallel_residual": False, "rotary_pct": 0.5}),
    "bert": ("bert", {}),
    "llama gqa tied": ("llama", {}),
    "llama biases untied": ("llama", {"attention_bias": True, "tie_word_embeddings": False}),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_tiny_forward_matches_transformers(tmp_path, variant):
    """float32 attnflow against float64 transformers, every layer, and the LM logits."""
    family, overrides = VARIANTS[variant]
    folder = write_tiny(family, tmp_path / family, seed=3, **overrides)
    model, checkpoint = reference(folder), load_checkpoint(folder)
    ids = np.random.default_rng(2).integers(0, 97, size=11)
    ours = forward(checkpoint, ids)
    assert ours.hidden.shape == (DEPTH + 1, 11, DIM)
    # README: "at most 8e-7 relative" (measured 3e-7 to 8.2e-7 over the variants, float32
    # round-off); a dropped RMSNorm epsilon gives 1.4e-5 to 1.8e-5 on the llama variants.
    assert_same_stream(ours, hidden_states(model, ids), checkpoint.final_norm is not None, 2e-6)
    if checkpoint.unembed is not None:
        with torch.no_grad():
            logits = model(input_ids=torch.as_tensor(ids)[None]).logits[0].numpy()
        assert relative(checkpoint.logits(ours.hidden[-1]), logits) < 1e-5


def test_minilm_forward_matches_transformers():
    """The real MiniLM on a real sentence, every layer: README "at most 4e-7" relative
    (measured 3.6e-7), asserted below 1e-6."""
    folder = installed_model("minilm")
    ids = load_tokenizer("minilm").encode(SENTENCE)
    model = transformers.AutoModel.from_pretrained(folder, dtype=torch.float64).eval()
    ours = forward(load_checkpoint("minilm"), ids)
    assert_same_stream(ours, hidden_states(model, ids), has_final_norm=False, tol=1e-6)
