"""Tiny synthetic checkpoints of every Hugging Face family, written by `transformers`
itself (`save_pretrained`, safetensors), for the checkpoint tests.

`write_tiny(family, folder)` writes one (2 layers, d = 32, 4 heads, a vocabulary of 97)
and returns its folder; `reference(folder)` loads it back as the `transformers` model,
in float64 and eval mode, the independent implementation the tests hold attnflow
against. Every parameter is redrawn (norm gains near 1, all biases non-zero) so that no
weight is a default value a loader could get right by accident.

The encoder-decoders (`ENCODER_DECODERS`: T5 v1.0 and v1.1, BART, Marian) are written
the same way (2 + 2 layers); `seq2seq_states(model, ids, decoder_ids)` gives both
stacks' hidden states, and `write_word_tokenizer(folder, family)` gives a T5 or BART
folder a `tokenizer.json` with that family's special tokens (for experiment=checkpoint).
"""

from __future__ import annotations

from pathlib import Path

import json

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, processors

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

FAMILIES = ("gpt2", "gpt_neox", "bert", "llama")
# name -> (model_type, overrides): T5 v1.0 (ReLU, tied and scaled LM head) and v1.1 (gated GELU)
ENCODER_DECODERS = {"t5": ("t5", {}), "t5 v1.1": ("t5", {"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}),
                    "bart": ("bart", {}), "marian": ("marian", {})}
VOCAB, DIM, HEADS, DEPTH, HIDDEN, POSITIONS = 97, 32, 4, 2, 48, 64


def tiny_config(family: str, **overrides) -> transformers.PretrainedConfig:
    """A small config of `family` in that family's own naming; `overrides` change it."""
    if family == "gpt2":
        settings = dict(vocab_size=VOCAB, n_embd=DIM, n_head=HEADS, n_layer=DEPTH, n_inner=HIDDEN,
                        n_positions=POSITIONS, activation_function="gelu_new", layer_norm_epsilon=1e-5,
                        bos_token_id=0, eos_token_id=0)
        return transformers.GPT2Config(**(settings | overrides))
    if family == "gpt_neox":
        settings = dict(vocab_size=VOCAB, hidden_size=DIM, num_attention_heads=HEADS, num_hidden_layers=DEPTH,
                        intermediate_size=HIDDEN, max_position_embeddings=POSITIONS, hidden_act="gelu",
                        use_parallel_residual=True, rotary_pct=0.25, rotary_emb_base=10000, layer_norm_eps=1e-5,
                        tie_word_embeddings=False)
        return transformers.GPTNeoXConfig(**(settings | overrides))
    if family == "bert":
        settings = dict(vocab_size=VOCAB, hidden_size=DIM, num_attention_heads=HEADS, num_hidden_layers=DEPTH,
                        intermediate_size=HIDDEN, max_position_embeddings=POSITIONS, type_vocab_size=2,
                        hidden_act="gelu", layer_norm_eps=1e-12)
        return transformers.BertConfig(**(settings | overrides))
    if family == "llama":
        settings = dict(vocab_size=VOCAB, hidden_size=DIM, num_attention_heads=HEADS, num_key_value_heads=2,
                        num_hidden_layers=DEPTH, intermediate_size=HIDDEN, max_position_embeddings=POSITIONS,
                        rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True, attention_bias=False)
        return transformers.LlamaConfig(**(settings | overrides))
    if family == "t5":
        # 8 buckets up to distance 16: the logarithmic buckets are reached within 11 tokens
        settings = dict(vocab_size=VOCAB, d_model=DIM, d_kv=DIM // HEADS, num_heads=HEADS, num_layers=DEPTH,
                        d_ff=HIDDEN, relative_attention_num_buckets=8, relative_attention_max_distance=16,
                        feed_forward_proj="relu", layer_norm_epsilon=1e-6, decoder_start_token_id=0)
        return transformers.T5Config(**(settings | overrides))
    seq2seq = dict(vocab_size=VOCAB, d_model=DIM, encoder_layers=DEPTH, decoder_layers=DEPTH,
                   encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=HIDDEN,
                   decoder_ffn_dim=HIDDEN, max_position_embeddings=POSITIONS)
    if family == "bart":
        settings = seq2seq | dict(activation_function="gelu", scale_embedding=True, pad_token_id=1,
                                  decoder_start_token_id=2)
        return transformers.BartConfig(**(settings | overrides))
    if family == "marian":
        settings = seq2seq | dict(activation_function="swish", scale_embedding=True, pad_token_id=VOCAB - 1,
                                  decoder_start_token_id=VOCAB - 1, eos_token_id=0)
        return transformers.MarianConfig(**(settings | overrides))
    raise ValueError(f"no tiny {family} model; choose one of {', '.join(FAMILIES)}")


MODELS = {"gpt2": "GPT2LMHeadModel", "gpt_neox": "GPTNeoXForCausalLM", "bert": "BertForMaskedLM",
          "llama": "LlamaForCausalLM", "t5": "T5ForConditionalGeneration", "bart": "BartForConditionalGeneration",
          "marian": "MarianMTModel"}


# The special tokens of the encoder-decoders' own tokenizers, at their ids, and where each
# puts them around a text: T5's "<pad>" 0 (its decoder's start) and "</s>" 1 after the
# text; BART's "<s>" 0, "<pad>" 1 and "</s>" 2 (its decoder's start) around it.
SPECIAL_TOKENS = {"t5": (("<pad>", "</s>", "<unk>"), "$A </s>"),
                  "bart": (("<s>", "<pad>", "</s>", "<unk>"), "<s> $A </s>")}


def write_word_tokenizer(folder: str | Path, family: str) -> None:
    """A `tokenizer.json` in `folder` for a tiny `family` model (`SPECIAL_TOKENS`): its
    special tokens at their ids, then the words `w{i}` at id i up to VOCAB - 1, split at
    spaces, a text framed as the family frames it."""
    specials, template = SPECIAL_TOKENS[family]
    vocab = {token: i for i, token in enumerate(specials)} | {f"w{i}": i for i in range(len(specials), VOCAB)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[(token, vocab[token]) for token in specials if token in template])
    backend.add_special_tokens(list(specials))
    backend.save(str(Path(folder) / "tokenizer.json"))


def tiny_model(family: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """A randomly initialized tiny model (float32), every parameter redrawn."""
    torch.manual_seed(seed)
    model = getattr(transformers, MODELS[family])(tiny_config(family, **overrides))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "embed_positions" in name and family == "marian":
                continue  # sinusoidal, not saved: transformers makes it anew when it loads the model
            if "norm" in name.lower() or name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                parameter.copy_(1 + 0.2 * torch.randn_like(parameter)) if name.endswith("weight") \
                    else parameter.copy_(0.1 * torch.randn_like(parameter))
            else:
                parameter.copy_(0.3 * torch.randn_like(parameter))
        for name, buffer in model.named_buffers():
            if name == "final_logits_bias":  # BART's and Marian's bias of the LM head (zeros when made)
                buffer.copy_(0.1 * torch.randn_like(buffer))
    return model.eval()


def write_tiny(family: str, folder: str | Path, sharded: bool = False, seed: int = 0, **overrides) -> Path:
    """Write a tiny `family` checkpoint into `folder` with `save_pretrained` (several
    shards and an index when `sharded`); return the folder."""
    folder = Path(folder)
    model = tiny_model(family, seed, **overrides)
    model.save_pretrained(folder, max_shard_size="20KB" if sharded else "10GB")
    return folder


def reference(folder: str | Path) -> torch.nn.Module:
    """The checkpoint in `folder` read back by `transformers`, float64, eval mode."""
    family = json.loads((Path(folder) / "config.json").read_text())["model_type"]
    model = getattr(transformers, MODELS[family]).from_pretrained(folder, dtype=torch.float64,
                                                                  attn_implementation="eager")
    return model.eval()


def hidden_states(model: torch.nn.Module, ids: np.ndarray) -> np.ndarray:
    """`transformers`' `output_hidden_states` for one sequence, `(L + 1, n, d)`."""
    with torch.no_grad():
        out = model(input_ids=torch.as_tensor(np.asarray(ids, dtype=np.int64))[None], output_hidden_states=True)
    return np.stack([h[0].double().numpy() for h in out.hidden_states])


def seq2seq_states(model: torch.nn.Module, ids: np.ndarray, decoder_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An encoder-decoder's `output_hidden_states` for one source and one decoder
    input: the encoder's `(L_e + 1, m, d)` and the decoder's `(L_d + 1, n, d)`."""
    as_batch = lambda a: torch.as_tensor(np.asarray(a, dtype=np.int64))[None]
    with torch.no_grad():
        out = model(input_ids=as_batch(ids), decoder_input_ids=as_batch(decoder_ids), output_hidden_states=True)
    stack = lambda states: np.stack([h[0].double().numpy() for h in states])
    return stack(out.encoder_hidden_states), stack(out.decoder_hidden_states)


def relative(a, b) -> float:
    """The largest entry of `a - b` relative to the largest of `b`."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def assert_same_stream(ours, theirs: np.ndarray, has_final_norm: bool, tol: float):
    """`hidden[0..L]` of attnflow's `Forward` `ours` against transformers' hidden states;
    where transformers' last one is after the final norm, `hidden[1..L-1]` and `final`
    against it instead."""
    depth = theirs.shape[0] - 1
    compared = depth if has_final_norm else depth + 1
    errors = [relative(ours.hidden[l], theirs[l]) for l in range(compared)]
    if has_final_norm:
        errors.append(relative(ours.final, theirs[depth]))
    assert max(errors) < tol, errors
    return errors
