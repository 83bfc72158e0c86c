"""attnflow's own checkpoint format: a saved checkpoint reads back as the same model,
and a damaged folder gives one sentence."""

import json

import jax
import numpy as np
import pytest
from checkpoint_models import FAMILIES, write_tiny

from attnflow import CheckpointError
from attnflow.checkpoints import forward, load_checkpoint, load_tokenizer, save_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("native")
    return {family: load_checkpoint(write_tiny(family, folder / family), dtype="float64") for family in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_is_exact(tiny, family, tmp_path):
    original = tiny[family]
    save_checkpoint(original, tmp_path / "saved", extra={"note": "round trip"})
    again = load_checkpoint(tmp_path / "saved")
    assert jax.tree.structure(again) == jax.tree.structure(original)  # same static facts, same arrays present
    for a, b in zip(jax.tree.leaves(original), jax.tree.leaves(again)):
        assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))
    ids = np.array([3, 1, 4, 1, 5, 9, 2, 6])
    assert np.array_equal(np.asarray(forward(original, ids).hidden), np.asarray(forward(again, ids).hidden))
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert config["model_type"] == "attnflow" and config["extra"] == {"note": "round trip"}
    assert not list((tmp_path / "saved").glob(".*partial"))


def test_tokenizer_travels_with_the_checkpoint(tiny, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    backend = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    save_checkpoint(tiny["gpt2"], tmp_path, tokenizer_json=backend.to_str())
    assert load_tokenizer(tmp_path).encode("a b c").tolist() == [1, 2, 0]


def test_loading_as_another_dtype(tiny, tmp_path):
    save_checkpoint(tiny["llama"], tmp_path)
    assert load_checkpoint(tmp_path, dtype="float32").embed.dtype == np.float32


def _damage(folder, edit):
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c.update(format_version=99), "format version 99"),
        (lambda c: c.update(heads=c["heads"] + 1), "has shape"),
        (lambda c: c.update(family="mystery"), "unknown family"),
        (lambda c: c.pop("norms"), "no 'norms' setting"),
    ],
)
def test_a_damaged_config_is_one_sentence(tiny, tmp_path, edit, message):
    save_checkpoint(tiny["gpt2"], tmp_path)
    _damage(tmp_path, edit)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(tmp_path)


def test_a_missing_tensor_is_named(tiny, tmp_path):
    from safetensors.numpy import load_file, save_file

    save_checkpoint(tiny["gpt2"], tmp_path)
    arrays = load_file(str(tmp_path / "model.safetensors"))
    del arrays["blocks.attention.query"]
    save_file(arrays, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="no tensor blocks.attention.query"):
        load_checkpoint(tmp_path)
