"""Trained checkpoints handed over by a hostile user (issue 18): token ids the
embedding has no row for, sentences longer than the model's positions, shard indexes
that point out of the folder, config.json values of the wrong type or size, GGUF
metadata that divides by zero, weights too large for the memory, and pickles.

Each case ends in one sentence (a `ConfigError`, `CheckpointError` included) before
anything is computed: JAX clamps an index past the end of an array to its last row, so
an unchecked id or position gives finite, wrong numbers instead of an error.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import equinox as eqx
import gguf
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from commands import assert_one_error_line, attnflow, one_sentence
from tokenizers import Tokenizer, models, pre_tokenizers

from attnflow.schema._errors import CheckpointError, ConfigError
from attnflow.running import _ensemble
from attnflow.checkpoints._flow import forward
from attnflow.checkpoints._load import load_checkpoint, load_tokenizer
from attnflow.checkpoints._locate import installed_model
from attnflow.checkpoints.gguf import load_gguf, load_gguf_tokenizer
from attnflow.experiments import compose_experiment, plan_experiment

from checkpoint_models import POSITIONS, VOCAB, write_tiny

ADDED = "attnflowium"  # the token added to MiniLM's tokenizer, at id 30522


def word_tokenizer(folder: Path, words: int) -> None:
    """A `tokenizer.json` of whitespace-separated words `w0 w1 ...`, `w{i}` at id i."""
    backend = Tokenizer(models.WordLevel({f"w{i}": i for i in range(words)}, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.save(str(folder / "tokenizer.json"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Tiny BERT and GPT-2 (sharded) checkpoints; BERT's word tokenizer knows one word
    more (`w97`) than its embedding has rows."""
    root = tmp_path_factory.mktemp("hostile")
    bert = write_tiny("bert", root / "bert")
    word_tokenizer(bert, VOCAB + 1)
    return {"bert": bert, "gpt2": write_tiny("gpt2", root / "gpt2", sharded=True), "root": root}


@pytest.fixture(scope="module")
def minilm_plus(tmp_path_factory):
    """The packaged MiniLM (its weights linked, not copied) with one token added to
    `tokenizer.json` at id 30522, one past its 30522 embedding rows."""
    source, folder = installed_model("minilm"), tmp_path_factory.mktemp("minilm") / "minilm-plus"
    folder.mkdir()
    for name in ("config.json", "tokenizer_config.json", "vocab.txt"):
        shutil.copy(source / name, folder)
    (folder / "model.safetensors").symlink_to(source / "model.safetensors")
    tokenizer = json.loads((source / "tokenizer.json").read_text())
    tokenizer["added_tokens"].append({"id": 30522, "content": ADDED, "special": False, "single_word": False,
                                      "lstrip": False, "rstrip": False, "normalized": True})
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    return folder


# --------------------------------------------------------------- token ids and positions


def test_an_added_token_beyond_minilms_embedding_is_refused(minilm_plus):
    """Issue 18, case 1: the tokenizer gives id 30522, the embedding has rows 0..30521.
    `forward` names the id and the size; the checkpoint experiment stops at its check
    (before any computing), naming the token too."""
    ids = load_tokenizer(minilm_plus).encode(f"the {ADDED} cat")
    assert 30522 in ids.tolist()
    checkpoint = load_checkpoint(minilm_plus)
    with pytest.raises(ConfigError) as error:
        forward(checkpoint, ids)
    assert "30522" in one_sentence(error) and "30522 rows" in str(error.value)
    cfg = compose_experiment("checkpoint", {"checkpoint": str(minilm_plus), "text": f"the {ADDED} cat"})
    with pytest.raises(ConfigError) as error:
        plan_experiment(cfg)
    assert ADDED in one_sentence(error) and "30522" in str(error.value)


def test_the_checkpoint_experiment_refuses_the_added_token_in_one_line(minilm_plus, tmp_path):
    """The same from the command line: exit 2, one line, nothing written."""
    proc = attnflow("experiment=checkpoint", f"checkpoint={minilm_plus}", f"text=the {ADDED} cat",
                    f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    line = assert_one_error_line(proc)
    assert proc.returncode == 2 and "30522" in line and ADDED in line
    assert not (tmp_path / "run" / "results.nc").exists()


@pytest.mark.parametrize("ids, said", [
    ([1, VOCAB], f"token id {VOCAB}"),      # one past the end: clamped to the last row
    ([1, -1, 3], "token id -1"),            # negative: wrapped to the last row
    ([2**40], f"token id {2**40}"),         # an OverflowError traceback at the int32 cast
])
def test_forward_refuses_ids_the_embedding_has_no_row_for(tiny, ids, said):
    checkpoint = load_checkpoint(tiny["bert"])
    with pytest.raises(ConfigError) as error:
        forward(checkpoint, np.asarray(ids))
    assert said in one_sentence(error) and f"{VOCAB} rows" in str(error.value)
    # Ids that are not whole numbers were truncated (1.5 read as 1).
    with pytest.raises(ConfigError) as error:
        checkpoint.token_ids([1.5, 2.0])
    assert "whole numbers" in one_sentence(error)


def test_a_token_type_beyond_the_table_is_refused(tiny):
    """BERT's token types (2 rows): type 5 was clamped to row 1."""
    checkpoint = load_checkpoint(tiny["bert"])
    with pytest.raises(ConfigError) as error:
        forward(checkpoint, np.array([1, 2, 3]), token_type=5)
    assert "token type 5" in one_sentence(error) and "2" in str(error.value)


def test_traced_ids_beyond_the_embedding_stop_the_jitted_forward(tiny):
    """Under jit the ids are not known while tracing: a runtime check stops the call
    with the same sentence instead of the clamp."""
    checkpoint = load_checkpoint(tiny["bert"])
    final = eqx.filter_jit(lambda c, ids: forward(c, ids).final)
    assert np.isfinite(np.asarray(final(checkpoint, jnp.asarray([1, VOCAB - 1])))).all()
    with pytest.raises(Exception, match=f"outside the embedding .* {VOCAB} rows"):
        final(checkpoint, jnp.asarray([1, VOCAB]))


def test_a_sentence_longer_than_the_positions_is_refused_before_computing(tiny):
    """64 learned positions: 65 tokens were a broadcasting traceback in `embed_tokens`,
    and the experiments only found out after loading, in `analyse`."""
    checkpoint = load_checkpoint(tiny["bert"])
    with pytest.raises(ConfigError) as error:
        checkpoint.embed_tokens(jnp.ones(POSITIONS + 1, jnp.int32))
    assert f"{POSITIONS + 1} tokens" in one_sentence(error) and f"{POSITIONS} positions" in str(error.value)
    text = " ".join(f"w{i % VOCAB}" for i in range(POSITIONS + 1))
    for experiment in ("checkpoint", "sensitivity"):
        cfg = compose_experiment(experiment, {"checkpoint": str(tiny["bert"]), "text": text})
        with pytest.raises(ConfigError) as error:
            plan_experiment(cfg)
        assert f"{POSITIONS} positions" in one_sentence(error)


def test_the_sensitivity_experiment_names_a_word_beyond_the_embedding(tiny):
    cfg = compose_experiment("sensitivity", {"checkpoint": str(tiny["bert"]), "text": f"w1 w{VOCAB} w2"})
    with pytest.raises(ConfigError) as error:
        plan_experiment(cfg)
    assert f"'w{VOCAB}'" in one_sentence(error) and f"{VOCAB} rows" in str(error.value)


# --------------------------------------------------------------- shard paths


def _point_first_shard(folder: Path, name: str) -> str:
    """Make the index name `name` for every tensor of the first shard; returns the
    shard's own file name."""
    index = folder / "model.safetensors.index.json"
    content = json.loads(index.read_text())
    first = sorted(set(content["weight_map"].values()))[0]
    content["weight_map"] = {k: name if v == first else v for k, v in content["weight_map"].items()}
    index.write_text(json.dumps(content))
    return first


def _outside_relative(folder: Path) -> str:
    first = _point_first_shard(folder, "../outside.safetensors")
    shutil.move(folder / first, folder.parent / "outside.safetensors")
    return "../outside.safetensors"


def _outside_absolute(folder: Path) -> str:
    target = folder.parent / "elsewhere.safetensors"
    shutil.move(folder / _point_first_shard(folder, str(target)), target)
    return str(target)


def _outside_by_link(folder: Path) -> str:
    first = sorted(folder.glob("model-*.safetensors"))[0]
    target = folder.parent / "linked.safetensors"
    shutil.move(first, target)
    first.symlink_to(target)
    return first.name


def _not_a_name(folder: Path) -> str:
    _point_first_shard(folder, 3)
    return "3"


def _link_loop(folder: Path) -> str:
    first = sorted(folder.glob("model-*.safetensors"))[0]
    first.unlink()
    first.symlink_to(first.name)  # a link to itself: resolving it was a RuntimeError
    return first.name


SHARDS = {"../ in the index": _outside_relative, "absolute path in the index": _outside_absolute,
          "symlink out of the folder": _outside_by_link, "a number, not a file name": _not_a_name,
          "a loop of links": _link_loop}


@pytest.mark.parametrize("case", SHARDS)
def test_shard_paths_stay_inside_the_checkpoint_folder(tiny, tmp_path, case):
    """Issue 18, case 13: the index named `../outside.safetensors` and it was opened."""
    folder = shutil.copytree(tiny["gpt2"], tmp_path / "case" / "gpt2")
    shard = SHARDS[case](folder)
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(folder)
    assert shard in one_sentence(error) and "model.safetensors.index.json" in str(error.value)


def test_a_hugging_face_cache_folder_still_loads(tiny, tmp_path):
    """The Hugging Face cache links every file of `snapshots/<revision>/` to
    `../../blobs/`: those links stay inside the model's cache folder and are read."""
    repo = tmp_path / "models--tiny--gpt2"
    snapshot, blobs = repo / "snapshots" / "0123abc", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for path in sorted(tiny["gpt2"].iterdir()):
        shutil.copy(path, blobs / path.name)
        (snapshot / path.name).symlink_to(Path("..", "..", "blobs", path.name))
    assert load_checkpoint(snapshot).depth == 2


# --------------------------------------------------------------- config.json


def _edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


CONFIGS = {
    "n_layer -1": ("gpt2", {"n_layer": -1}, "n_layer"),        # ValueError: negative dimensions
    "n_layer 0": ("gpt2", {"n_layer": 0}, "n_layer"),          # IndexError
    "n_layer 2.5": ("gpt2", {"n_layer": 2.5}, "n_layer"),      # read as 2, silently
    "n_layer '2'": ("gpt2", {"n_layer": "2"}, "n_layer"),      # read as 2, silently
    "n_layer true": ("gpt2", {"n_layer": True}, "n_layer"),    # read as 1, silently
    "n_layer [2]": ("gpt2", {"n_layer": [2]}, "n_layer"),      # TypeError
    "n_head 0": ("gpt2", {"n_head": 0}, "n_head"),             # ZeroDivisionError
    "n_head 1e9": ("gpt2", {"n_head": 10**9}, "attention heads"),  # ValueError: cannot reshape
    "epsilon 'x'": ("gpt2", {"layer_norm_epsilon": "x"}, "layer_norm_epsilon"),  # ValueError
    "epsilon -1": ("gpt2", {"layer_norm_epsilon": -1}, "layer_norm_epsilon"),     # accepted
    "flag 'no'": ("gpt2", {"scale_attn_weights": "no"}, "scale_attn_weights"),   # read as true
    "heads 0 (bert)": ("bert", {"num_attention_heads": 0}, "num_attention_heads"),
    "rope_parameters 'x'": ("llama", {"rope_parameters": "x"}, "rope_parameters"),  # AttributeError
    "rope_theta 'big'": ("llama", {"rope_parameters": None, "rope_theta": "big"}, "rope_theta"),
    "kv heads 0": ("llama", {"num_key_value_heads": 0}, "num_key_value_heads"),  # ZeroDivisionError
    "tie 'no'": ("llama", {"tie_word_embeddings": "no"}, "tie_word_embeddings"),  # read as true
    "model_type a list": ("gpt2", {"model_type": ["gpt2"]}, "model_type"),  # TypeError: unhashable
}


@pytest.fixture(scope="module")
def families(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {"gpt2": write_tiny("gpt2", root / "gpt2"), "bert": tiny["bert"], "llama": write_tiny("llama", root / "llama")}


@pytest.mark.parametrize("case", CONFIGS)
def test_config_values_of_the_wrong_type_or_size_are_one_sentence(families, tmp_path, case):
    family, changes, key = CONFIGS[case]
    folder = shutil.copytree(families[family], tmp_path / family)
    _edit_config(folder, **changes)
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(folder)
    assert key in one_sentence(error) and "config.json" in str(error.value)


def test_attnflows_own_format_checks_its_sizes_too(families, tmp_path):
    from attnflow.checkpoints import save_checkpoint

    folder = save_checkpoint(load_checkpoint(families["gpt2"]), tmp_path / "native")
    _edit_config(folder, layers="2", causal="no")
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(folder)
    assert "layers" in one_sentence(error)


def test_a_dtype_that_is_not_a_float_is_refused(families):
    for dtype, said in (("int32", "int32"), ("no-such-type", "no-such-type")):
        with pytest.raises(ConfigError) as error:
            load_checkpoint(families["gpt2"], dtype=dtype)
        assert said in one_sentence(error)


def test_weights_larger_than_the_memory_are_refused_before_reading(families, monkeypatch):
    """The sizes come from the files' headers: nothing is read before the refusal."""
    monkeypatch.setattr(_ensemble, "available_memory", lambda: 1000)
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(families["llama"])
    assert "GiB" in one_sentence(error) and "available" in str(error.value)


def test_integer_weights_are_refused_not_cast(families, tmp_path):
    """A tensor stored as integers (a quantized export) was cast to float silently."""
    from safetensors.numpy import load_file, save_file

    folder = shutil.copytree(families["gpt2"], tmp_path / "gpt2")
    tensors = load_file(folder / "model.safetensors")
    name = next(n for n in tensors if n.endswith("h.0.mlp.c_fc.weight"))
    tensors[name] = np.round(tensors[name] * 100).astype(np.int32)
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(folder)
    assert name in one_sentence(error) and "int32" in str(error.value)


def test_a_failed_save_leaves_no_temporary_file(families, tmp_path, monkeypatch):
    """A full disk while `save_checkpoint` writes: the error propagates and no
    half-written file stays in the folder (a `.model.safetensors.partial` stayed)."""
    import errno

    import safetensors.numpy

    from attnflow.checkpoints import save_checkpoint

    checkpoint = load_checkpoint(families["gpt2"])

    def full(arrays, path, metadata=None):
        Path(path).write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(safetensors.numpy, "save_file", full)
    with pytest.raises(OSError):
        save_checkpoint(checkpoint, tmp_path / "saved")
    assert sorted(p.name for p in (tmp_path / "saved").iterdir()) == []


def test_a_folder_where_the_weights_file_belongs(families, tmp_path):
    """A directory named model.safetensors was opened as a file ("No such device")."""
    folder = shutil.copytree(families["gpt2"], tmp_path / "gpt2")
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").mkdir()
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(folder)
    assert "has no weights" in one_sentence(error)


# --------------------------------------------------------------- GGUF metadata


def _gguf(path: Path, heads: int = 2, bos: int = 0) -> Path:
    """A GGUF of metadata only (no tensors): llama sizes and a byte-level vocabulary."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_context_length(8)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(8)
    writer.add_head_count(heads)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["a", "b", "ab"])
    writer.add_token_merges(["a b"])
    writer.add_bos_token_id(bos)
    writer.add_add_bos_token(True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_metadata_of_impossible_sizes_is_one_sentence(tmp_path):
    """Zero heads was a ZeroDivisionError; a BOS id past the vocabulary an IndexError."""
    with pytest.raises(CheckpointError) as error:
        load_gguf(_gguf(tmp_path / "heads.gguf", heads=0))
    assert "head_count" in one_sentence(error)
    with pytest.raises(CheckpointError) as error:
        load_gguf_tokenizer(_gguf(tmp_path / "bos.gguf", bos=7))
    assert "bos_token_id" in one_sentence(error) and "3 tokens" in str(error.value)


# --------------------------------------------------------------- pickles


class _Marker:
    """Unpickling this object creates a file: the proof that a pickle ran code."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return os.system, (f"touch {self.path}",)


def test_a_malicious_pickle_never_runs(families, tmp_path):
    """A `pytorch_model.bin` that runs a command when unpickled: refused without
    `trust_pickle`, and with it read by `weights_only` torch, which refuses it too."""
    folder = tmp_path / "evil"
    folder.mkdir()
    shutil.copy(families["gpt2"] / "config.json", folder)
    marker = tmp_path / "ran"
    torch.save({"wte.weight": _Marker(str(marker))}, folder / "pytorch_model.bin")
    for trust in (False, True):
        with pytest.raises(CheckpointError) as error:
            load_checkpoint(folder, trust_pickle=trust)
        assert "pytorch_model.bin" in one_sentence(error)
    assert not marker.exists()
