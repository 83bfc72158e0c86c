"""Training a DiffEqFormer or its GPT baseline: what `attnflow train` runs once its
settings (`_settings`: `TrainConfig`, checked without JAX) are accepted.

Next-token cross-entropy on an offline corpus (`_data`), AdamW (optax) with a linear
warmup and a cosine decay, gradients clipped by their global norm; one jitted step
(`equinox.filter_value_and_grad`). The GPT baseline is a canonical `Checkpoint` trained
through the core's layer map (`attnflow.checkpoints.forward`). Fine-tuning starts from a
model folder (`init`): a DiffEqFormer continues at any number of steps (all its
hypernetwork parameters train), or, with `lora_rank > 0`, its populated layers (or the
GPT's) are frozen and rank-r adapters of every attention and MLP matrix train.

A run folder `out` holds

- `train.json`: the settings and the corpus record; `metrics.jsonl`: one line per
  validation (step, mean training loss since the last line, validation loss, time);
- `state/`: the latest training state (every array of the model and of the optimizer,
  `state.safetensors`, and `state.json` with the step), replaced atomically every
  `save_every` steps;
- `snapshots/step-NNNNNN/`: model folders at steps 0, 1, 2, 4, 8, ... and the last;
- `model/`: the final model folder (`init=` accepts it, `load_checkpoint` reads it).

It is locked while a run trains in it (a second training into it is refused), and what
it holds is read as data: the settings of `state.json` are checked, never interpolated.

The data order is a function of (seed, step), so a run interrupted at any point and
started again with the same `out` continues from its latest state and ends with the
weights an uninterrupted run would have.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple, cast

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..checkpoints._canonical import Checkpoint
from ..checkpoints._load import load_checkpoint
from ..numerics._solvers import tableau
from ..running._ensemble import _gib, available_memory
from ..running._progress import Progress
from ..running._study import use_compilation_cache
from ..schema._errors import CheckpointError, ConfigError, NonFiniteStateError
from ..storage._store import RunDirectory, replacing, write_atomically
from ._data import load_corpus
from ._model import DiffEqFormer, DiffEqFormerConfig, LoRA, checkpoint_logits, gpt, lora, populate
from ._settings import ADDED, STATE_VERSION, TrainConfig, check, corpus_name, read_json, read_state, train_config
from ._store import (
    CONFIG_FILE,
    arrays_by_name,
    diffeqformer_config,
    fill,
    load_diffeqformer,
    read_arrays,
    save_model,
    tokenizer_text,
    write_arrays,
)

ARCHITECTURE = ("vocab", "dim", "heads", "hidden", "context", "d_emb", "frequencies", "time_scale", "horizon")


# --- memory ------------------------------------------------------------------------------


class MemoryNeed(NamedTuple):
    """The bytes a training step works in, estimated from the settings (`memory_need`).

    - `parameters`: every array of the model, trained or frozen;
    - `optimizer`: six copies of the trained arrays: their gradients, AdamW's two
      moments, and the new arrays and moments the step returns beside the old ones (the
      step does not donate its buffers);
    - `activations`: what the backward pass keeps if it stores every stage, of which
      `scores` are the attention scores and probabilities;
    - `least`: what no plan can do without: the parameters, their gradients, the
      state at every stage (the backward pass starts from them), one stage's attention
      scores and the logits (a compiler may recompute the rest in the backward pass
      instead of keeping it).
    """

    parameters: int
    optimizer: int
    activations: int
    scores: int
    least: int

    @property
    def total(self) -> int:
        return self.parameters + self.optimizer + self.activations


def parameter_count(cfg: TrainConfig) -> tuple[int, int]:
    """(all, trained): the number of parameters of the model `cfg` trains, from its sizes.

    Both models have the embedding ($V d$), the positions ($C d$) and a final LayerNorm
    ($2d$). A DiffEqFormer adds 13 hypernetworks (`TimeWeight`), each with
    $d_{emb}(2F + 1) + 2 d_{emb} + d_{emb}^2$ parameters in its MLP and $d_{emb} + 1$ per
    entry of its weight; the weights have $4 d^2 + 2 d h + h + 6 d$ entries ($Q, K, V,
    O$, $W_1$, $W_2$, $b_1$, and six vectors). The GPT baseline adds, per layer,
    $4 d^2 + 2 d h + h + 9 d$ (the same matrices, four attention biases, $b_1$, $b_2$ and
    two LayerNorms), its unembedding tied to the embedding. With `lora_rank` $r$ only
    the adapters train, $r$ (rows + columns) per matrix and layer, $r (10 d + 2 h)$ a
    layer; the frozen base is counted in the GPT form with an unembedding of its own."""
    V, C, d, h, L = cfg.vocab, cfg.context, cfg.dim, cfg.hidden, cfg.steps
    outer = V * d + C * d + 2 * d
    layers = L * (4 * d * d + 2 * d * h + h + 9 * d)
    if cfg.lora_rank:
        trained = L * cfg.lora_rank * (10 * d + 2 * h)
        return outer + V * d + layers + trained, trained
    if cfg.model == "gpt":
        return outer + layers, outer + layers
    e = cfg.d_emb
    total = outer + 13 * (e * (2 * cfg.frequencies + 1) + 2 * e + e * e) + (e + 1) * (4 * d * d + 2 * d * h + h + 6 * d)
    return total, total


def memory_need(cfg: TrainConfig) -> MemoryNeed:
    """The memory one training step of `cfg` works in, estimated from its sizes alone
    (nothing is built or compiled), as `MemoryNeed`.

    If the backward pass keeps every stage it differentiates through (the solver's
    stages at each of `steps` steps for a DiffEqFormer, one per layer for the layer map
    of the GPT baseline and of LoRA), it holds, for each of the `batch` sequences of
    `context` = $n$ tokens: the scores and probabilities of each head ($2 H n^2$, the
    term that grows with the square of the context), and $n(10 d + 2 h)$ for the two
    LayerNorms, queries, keys, values, the mixed values, the attention output, the MLP's
    hidden layer before and after its activation, and the new state. A DiffEqFormer also
    keeps the weights its hypernetworks give at each stage and the products with the
    LayerNorm gains ($2(4 d^2 + 2 d h)$), LoRA the merged matrices of every layer. Last
    come the logits, their softmax and gradient ($3 n V$ per sequence). This is within a
    factor 1.5 of what XLA plans up to scores of a few GiB; beyond, XLA's GPU compiler
    recomputes attention in the backward pass and plans far less (benchmarks/
    train_memory.py), which `check_compiled_memory` reads from the compiled step."""
    item = 8 if cfg.dtype == "float64" else 4
    total, trained = parameter_count(cfg)
    B, n, d, h, H, V = cfg.batch, cfg.context, cfg.dim, cfg.hidden, cfg.heads, cfg.vocab
    layer_map = cfg.model == "gpt" or cfg.lora_rank > 0
    stages = cfg.steps * (1 if layer_map else len(tableau(cfg.solver).b))
    matrices = 4 * d * d + 2 * d * h
    scores = stages * B * 2 * H * n * n
    weights = cfg.steps * matrices if cfg.lora_rank else 0 if layer_map else stages * 2 * matrices
    activations = scores + stages * B * n * (10 * d + 2 * h) + weights + 3 * B * n * V
    least = total + trained + stages * B * n * d + B * H * n * n + B * n * V
    return MemoryNeed(item * total, item * 6 * trained, item * activations, item * scores, item * least)


def _too_large(cfg: TrainConfig, need: int, memory: int, what: str) -> ConfigError:
    return ConfigError(
        f"training would take {what} {_gib(need)}, more than the {_gib(memory)} available; lower batch or context "
        f"(the {cfg.batch} x {cfg.heads} x {cfg.context} x {cfg.context} attention scores of a stage), steps, or "
        "vocab, dim, hidden, d_emb or frequencies (parameters)."
    )


def check_memory(cfg: TrainConfig, memory: int | None = None) -> bool:
    """Before anything is built: refuse a run that cannot fit in `memory` bytes (by
    default what is available: the first device's free memory on an accelerator, else
    the host's), in one sentence with the numbers, when even `memory_need(cfg).least`
    exceeds it. True when the full estimate fits too; False when only the compiled
    step can tell (`check_compiled_memory`)."""
    need = memory_need(cfg)
    memory = available_memory() if memory is None else memory
    if need.least > memory:
        raise _too_large(cfg, need.least, memory, "at least")
    return need.total <= memory


def check_compiled_memory(cfg: TrainConfig, step, args, memory: int | None = None) -> None:
    """Refuse a run whose compiled training step (`step`, an `equinox.filter_jit`
    function, lowered for `args`) plans more than `memory` bytes (arguments, outputs
    and temporaries, XLA's count), before its first step runs. Where the compiler gives
    no count the estimate `memory_need(cfg).total` stands in for it."""
    memory = available_memory() if memory is None else memory
    stats = step.lower(*args).compile().compiled.memory_analysis()
    if stats is None:
        planned, what = memory_need(cfg).total, "about"
    else:
        planned = stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
        what = "(as compiled)"
    if planned > memory:
        raise _too_large(cfg, planned, memory, what)


# --- what trains ----------------------------------------------------------------------


class Setup(NamedTuple):
    """Everything a run needs before its first step."""

    module: Any  # DiffEqFormer, Checkpoint (GPT, unembedding tied) or LoRA
    trainable: Any  # filter spec for equinox.partition
    model_config: Any  # DiffEqFormerConfig
    corpus: Any
    tokenizer_json: str
    corpus_info: dict


def _init_folder(cfg: TrainConfig) -> Path:
    assert cfg.init is not None  # called only when init is given
    folder = Path(cfg.init).expanduser()
    if (folder / "model").is_dir() and not (folder / "config.json").exists():
        folder = folder / "model"  # a run folder: its final model
    if not folder.is_dir():
        raise ConfigError(f"init={cfg.init} is not a model folder (give a folder written by attnflow train).")
    return folder


def _adopt(cfg: TrainConfig, found: Mapping[str, int], defaults: TrainConfig, folder: Path) -> TrainConfig:
    """`cfg` with the architecture of the model in `folder`; a setting given other than
    the default that disagrees with it is an error."""
    for name, value in found.items():
        mine = getattr(cfg, name)
        if mine != value and mine != getattr(defaults, name):
            raise ConfigError(
                f"{name}={mine} disagrees with the model in {folder} ({name}={value}); leave it out "
                "when starting from init."
            )
    return dataclasses.replace(cfg, **found)


def setup(cfg: TrainConfig) -> tuple[TrainConfig, Setup]:
    """The model to train, what of it trains, the corpus and its tokenizer; `cfg` with
    the architecture read from `init` when there is one."""
    cfg = dataclasses.replace(cfg, corpus=corpus_name(cfg.corpus))
    key = jax.random.key(cfg.seed)
    init_key, lora_key = jax.random.fold_in(key, 0), jax.random.fold_in(key, 3)
    tokenizer_json, base = None, None
    if cfg.init is not None:
        folder = _init_folder(cfg)
        defaults = train_config()
        tokenizer_json = tokenizer_text(folder)
        if cfg.model == "diffeqformer":
            if not (folder / CONFIG_FILE).is_file():
                raise ConfigError(
                    f"init={cfg.init} holds no DiffEqFormer ({CONFIG_FILE} is missing); "
                    "with model=gpt it may be a GPT baseline."
                )
            found = diffeqformer_config(folder)
            cfg = _adopt(cfg, {name: getattr(found, name) for name in ARCHITECTURE}, defaults, folder)
            base = load_diffeqformer(folder).with_steps(cfg.steps)
        else:
            checkpoint = load_checkpoint(folder, dtype=cfg.dtype)
            if checkpoint.family != "gpt2" or checkpoint.positions is None:
                raise ConfigError(f"init={cfg.init} is not a GPT baseline written by attnflow train.")
            if cfg.steps != checkpoint.depth:
                raise ConfigError(
                    f"the GPT baseline in {folder} has {checkpoint.depth} layers; give steps="
                    f"{checkpoint.depth} (only the DiffEqFormer changes its number of steps)."
                )
            found = {
                "vocab": int(checkpoint.embed.shape[0]),
                "dim": checkpoint.dim,
                "heads": checkpoint.heads,
                "hidden": int(checkpoint.blocks.mlp.w1.shape[1]),
                "context": int(checkpoint.positions.shape[0]),
            }
            cfg = _adopt(cfg, found, defaults, folder)
            base = checkpoint
        check_memory(cfg)  # with the architecture of init
    corpus, tokenizer_json, info = load_corpus(
        cfg.corpus, vocab=cfg.vocab, context=cfg.context, tokenizer_json=tokenizer_json
    )
    if cfg.init is None:
        cfg = dataclasses.replace(cfg, vocab=corpus.vocab)
    elif corpus.vocab != cfg.vocab:
        raise ConfigError(f"the tokenizer of init={cfg.init} has {corpus.vocab} tokens but its model {cfg.vocab}.")
    model_config = DiffEqFormerConfig(
        vocab=cfg.vocab,
        dim=cfg.dim,
        heads=cfg.heads,
        hidden=cfg.hidden,
        context=cfg.context,
        d_emb=cfg.d_emb,
        frequencies=cfg.frequencies,
        time_scale=cfg.time_scale,
        steps=cfg.steps,
        horizon=cfg.horizon,
        dtype=cfg.dtype,
    )
    if base is None:
        base = DiffEqFormer(model_config, key=init_key) if cfg.model == "diffeqformer" else gpt(init_key, model_config)
    if cfg.lora_rank:
        # base is a DiffEqFormer for model=diffeqformer, a Checkpoint (GPT) otherwise
        checkpoint = populate(cast(DiffEqFormer, base), cfg.steps) if cfg.model == "diffeqformer" else base
        module = lora(cast("Checkpoint", checkpoint), cfg.lora_rank, key=lora_key)
        trainable = module.trainable()
    else:
        module = base
        if cfg.model == "gpt":
            # The unembedding is the embedding (tied): not a parameter of its own.
            module = dataclasses.replace(module, unembed=None)
        trainable = jax.tree.map(eqx.is_inexact_array, module)
    return cfg, Setup(module, trainable, model_config, corpus, tokenizer_json, info)


def _logits(module, ids, solver: str):
    if isinstance(module, DiffEqFormer):
        return module(ids, solver=solver)
    if isinstance(module, LoRA):
        return checkpoint_logits(module.merged(), ids)
    return checkpoint_logits(module, ids)


def loss(module, inputs, targets, solver: str = "euler"):
    """Mean next-token cross-entropy (nats) of a batch `(inputs, targets)`."""
    logits = jax.vmap(lambda ids: _logits(module, ids, solver))(inputs)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def decay_mask(params):
    """Where AdamW's weight decay applies: matrices and embeddings. For the DiffEqFormer
    every array of two or more axes (the hypernetworks of matrices, their MLPs, the
    embeddings; not the vectors: biases, gains, shifts); for GPT its attention and MLP
    matrices and embeddings; never the LoRA adapters."""
    if isinstance(params, DiffEqFormer):
        return jax.tree.map(lambda a: a.ndim >= 2, params)
    if isinstance(params, LoRA):
        return jax.tree.map(lambda a: False, params)
    return _gpt_mask(params)


def _gpt_mask(params):
    mask = jax.tree.map(lambda a: False, params)
    paths = [
        lambda m: m.blocks.attention.query,
        lambda m: m.blocks.attention.key,
        lambda m: m.blocks.attention.value,
        lambda m: m.blocks.attention.output,
        lambda m: m.blocks.mlp.w1,
        lambda m: m.blocks.mlp.w2,
        lambda m: m.embed,
        lambda m: m.positions,
    ]
    for where in paths:
        if where(params) is not None:
            mask = eqx.tree_at(where, mask, True)
    return mask


def optimizer(cfg: TrainConfig) -> Optimizer:
    """AdamW with the schedule: linear warmup over `warmup * train_steps` steps to `lr`,
    cosine decay to `min_lr * lr` at `train_steps`; gradients clipped first. The same
    object for the same settings."""
    return _optimizer(cfg.lr, cfg.warmup, cfg.train_steps, cfg.min_lr, cfg.clip, cfg.b1, cfg.adam_b2, cfg.weight_decay)


class Optimizer(NamedTuple):
    """AdamW after clipping gradients by their global norm: `program` = (clip, b1, b2,
    weight decay), what the compiled training step depends on; and the learning-rate
    `schedule` (an optax schedule of the step count), evaluated by a program of its own
    and passed to the step as data, so that runs differing only in lr, warmup or length
    (a pretraining and a fine-tuning run) share one compiled step."""

    program: tuple
    schedule: Callable

    def init(self, params):
        return _transformation(self.program, self.schedule).init(params)

    @property
    def rate(self) -> Callable:
        """The jitted schedule `count -> learning rate`, computed as optax computes it
        inside a step (the count an int32, JAX's default promotion)."""
        return _rate_program(self.schedule)


@functools.lru_cache(maxsize=16)
def _optimizer(lr, warmup, train_steps, min_lr, clip, b1, b2, weight_decay) -> Optimizer:
    warmup = max(1, round(warmup * train_steps)) if warmup > 0 else 0
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(train_steps, warmup + 1), end_value=min_lr * lr)
    return Optimizer((clip, b1, b2, weight_decay), schedule)


@functools.lru_cache(maxsize=16)
def _rate_program(schedule: Callable) -> Callable:
    def rate(count):
        with jax.numpy_dtype_promotion("standard"):  # optax's schedules mix their int32 count with floats
            value = schedule(count)
        # One type for every schedule (with a warmup optax's is float32, without it the
        # default float), so that they share the step; exact, as the step casts the rate
        # to the parameters' type.
        return jax.lax.convert_element_type(value, jax.numpy.result_type(float))

    return jax.jit(rate)


def _transformation(program: tuple, rate: Callable):
    """The optax transformation of `Optimizer.program` with the learning rate `rate`
    (a function of the step count)."""
    clip, b1, b2, weight_decay = program
    return optax.chain(
        optax.clip_by_global_norm(clip), optax.adamw(rate, b1=b1, b2=b2, weight_decay=weight_decay, mask=decay_mask)
    )


def _schedule_count(opt_state):
    """The step count of the learning-rate schedule in `opt_state` (optax's
    `ScaleByScheduleState`): the number of updates done. Searched through the tuples
    of optax's states only, not through the moments' trees (it runs every step)."""
    if isinstance(opt_state, optax.ScaleByScheduleState):
        return opt_state.count
    for part in opt_state if isinstance(opt_state, tuple) else ():
        count = _schedule_count(part)
        if count is not None:
            return count
    return None


def snapshot_steps(train_steps: int) -> list[int]:
    """0, 1, 2, 4, 8, ... up to `train_steps`, and `train_steps`."""
    steps = {0, train_steps}
    k = 1
    while k < train_steps:
        steps.add(k)
        k *= 2
    return sorted(steps)


class TrainingStep(NamedTuple):
    """`step(params, static, opt_state, corpus, key) -> (params, opt_state, loss)`: the
    compiled `program` of `training_step`, given the learning rate that `rate` (the
    optimizer's schedule) gives at the count in `opt_state`."""

    program: Callable
    rate: Callable

    def __call__(self, params, static, opt_state, corpus, key):
        return self.program(params, static, opt_state, corpus, key, self.rate(_schedule_count(opt_state)))

    def lower(self, params, static, opt_state, corpus, key):
        return self.program.lower(params, static, opt_state, corpus, key, self.rate(_schedule_count(opt_state)))


def training_step(tx: Optimizer, batch: int, context: int, solver: str) -> TrainingStep:
    """The jitted step `(params, static, opt_state, corpus, key) -> (params, opt_state,
    loss)`: a batch drawn from `key`, the loss and its gradient with respect to the
    trainable `params` (`static` the frozen rest), one optimizer update. Steps of the
    same `tx.program`, batch, context and solver share one function whatever their
    schedules, so that its compiled programs are reused within a process: by a resumed
    run, and by a fine-tuning run of a trained model's shape."""
    return TrainingStep(_step_program(tx.program, batch, context, solver), tx.rate)


@functools.lru_cache(maxsize=16)
def _step_program(program: tuple, batch: int, context: int, solver: str):
    """The step of `training_step` for the optimizer `program`, the learning rate an
    argument."""

    @eqx.filter_jit
    def step(params, static, opt_state, corpus, key, rate):
        inputs, targets = corpus.batch(key, batch, context)
        value, grads = eqx.filter_value_and_grad(lambda p: loss(eqx.combine(p, static), inputs, targets, solver))(
            params
        )
        with jax.numpy_dtype_promotion("standard"):  # optax's count is int32
            updates, opt_state = _transformation(program, lambda count: rate).update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, value

    return step


@functools.lru_cache(maxsize=16)
def validation_loss(batch: int, context: int, solver: str, batches: int):
    """The jitted mean loss `(params, static, corpus, key) -> loss` over `batches`
    held-out batches, the same ones for the same `key` (one function per set of
    arguments, compiled once per model structure within a process)."""

    @eqx.filter_jit
    def evaluate(params, static, corpus, key):
        module = eqx.combine(params, static)

        def one(i):
            inputs, targets = corpus.batch(jax.random.fold_in(key, i), batch, context, "validation")
            return loss(module, inputs, targets, solver)

        return jnp.mean(jax.lax.map(one, jnp.arange(batches)))

    return evaluate


# --- the run folder ---------------------------------------------------------------------


class RunFolder:
    """The files of one training run (see the module docstring)."""

    def __init__(self, path: Path):
        self.path = path

    state = property(lambda self: self.path / "state")
    metrics = property(lambda self: self.path / "metrics.jsonl")
    model = property(lambda self: self.path / "model")

    def snapshot(self, step: int) -> Path:
        return self.path / "snapshots" / f"step-{step:06d}"

    def claim(self, cfg: TrainConfig) -> dict | None:
        """The stored state's record (`read_state`) when the folder holds this run (None
        when it is new, or when this run started there but saved no state yet); an
        error when it holds another run or anything else."""
        stored = read_state(self.state)
        if stored is None:
            begun = self.path / "train.json"
            if begun.is_file():
                old = read_json(begun).get("config")
                if not isinstance(old, dict):
                    raise CheckpointError(f"{begun} holds no settings (its config is not a mapping); start a new out=.")
                self._same(old, cfg)
            elif self.path.exists() and any(self.path.iterdir()):
                raise ConfigError(f"out={self.path} exists and holds no training run; choose another out=.")
            return None
        self._same(stored["config"], cfg)
        return stored

    def _same(self, old: dict, cfg: TrainConfig) -> None:
        old, new = dict(ADDED, **old), cfg.record()
        differ = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        if differ:
            k = differ[0]
            raise ConfigError(
                f"out={self.path} holds a run with {k}={old.get(k)!r}, not {new.get(k)!r}; give the same "
                "settings (or out= alone) to resume it, or another out= for a new run."
            )

    def keep_metrics_until(self, step: int) -> list[dict]:
        """The metric lines up to `step` (those of a later, unsaved stretch dropped)."""
        kept = []
        if self.metrics.is_file():
            for line in self.metrics.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by an interruption
                if entry.get("step", math.inf) <= step:
                    kept.append(entry)

        write_atomically(
            self.metrics,
            lambda tmp: tmp.write_text("".join(json.dumps(e) + "\n" for e in kept)),  # pyright: ignore[reportArgumentType]  # write_text's count is unused (annotated None)
        )
        return kept

    def log(self, entry: dict) -> None:
        with self.metrics.open("a") as file:
            file.write(json.dumps(entry) + "\n")


def save_state(folder: Path, module, opt_state, step: int, elapsed: float, record: dict) -> None:
    """The latest training state, atomically: every array of the model and the
    optimizer (`state.safetensors`) and `state.json`."""
    arrays = {f"model/{k}": v for k, v in arrays_by_name(module).items()}
    arrays |= {f"optimizer/{k}": v for k, v in arrays_by_name(opt_state).items()}
    with replacing(folder, folder=True) as partial:
        write_arrays(arrays, partial / "state.safetensors")
        (partial / "state.json").write_text(
            json.dumps(dict(record, step=step, elapsed=elapsed, format_version=STATE_VERSION), indent=2) + "\n"
        )


def load_state(folder: Path, module, opt_state):
    """`(module, opt_state)` filled with the arrays of the saved state."""
    arrays = read_arrays(folder / "state.safetensors")
    where = str(folder / "state.safetensors")
    part = lambda prefix: {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
    unknown = sorted(k for k in arrays if not k.startswith(("model/", "optimizer/")))
    if unknown:
        raise CheckpointError(f"{where} holds an array {unknown[0]} of no model or optimizer.")
    return fill(module, part("model/"), where), fill(opt_state, part("optimizer/"), where)


# --- the loop ----------------------------------------------------------------------------


class TrainResult(NamedTuple):
    """What `train` returns: the run folder, the trained model (a `DiffEqFormer`, the GPT
    baseline's `Checkpoint` or a `LoRA` of a checkpoint), the step reached and the
    metric lines (as in `metrics.jsonl`)."""

    out: Path
    model: Any
    step: int
    metrics: list[dict]


def _tied(model):
    """A trained GPT baseline with its unembedding (the embedding) filled in."""
    if isinstance(model, Checkpoint) and model.unembed is None:
        return dataclasses.replace(model, unembed=model.embed)
    return model


def _say(message: str) -> None:
    print(f"attnflow: {message}", flush=True)


def _prepare_jax(cfg: TrainConfig) -> None:
    if cfg.dtype == "float64" and not jax.config.jax_enable_x64:  # pyright: ignore[reportAttributeAccessIssue]  # jax's Config stub lacks the flag attributes
        raise ConfigError(
            "dtype=float64 needs JAX's 64-bit mode; the attnflow command switches it on, a library "
            "caller sets jax.config.update('jax_enable_x64', True) first."
        )
    if cfg.compilation_cache:
        use_compilation_cache()


def train(
    cfg: TrainConfig, *, on_step: Callable[[int, dict], None] | None = None, show: bool | None = None
) -> TrainResult:
    """Train as `cfg` says, into the run folder `cfg.folder`, resuming from its latest
    state when it holds this run. `on_step(step, info)` is called after every step
    (`info`: the step's loss, and the validation loss on validation steps); `show`
    draws a progress bar (default: when stderr is a terminal, or under another drawn
    bar, as an experiment's).

    Before anything is built, a run that would not fit in memory is refused
    (`check_memory`), and the folder is locked: a second training into it is refused
    while this one runs. Ctrl-C (KeyboardInterrupt) stops the run with its latest state
    intact and re-raises. A loss that turns NaN or infinite stops it with
    `NonFiniteStateError`, its latest finite state kept; a folder that cannot be
    written (a full disk) with ConfigError, its latest state kept."""
    check(cfg)
    _prepare_jax(cfg)
    check_memory(cfg)
    new = not cfg.folder.exists()
    with RunDirectory(cfg.folder, setting="out=") as directory:
        try:
            return _train_locked(cfg, directory, on_step, show)
        except BaseException:
            if new and not any(directory.path.iterdir()):
                directory.path.rmdir()  # a run refused before writing anything leaves no folder
            raise


def train_command(cfg: TrainConfig) -> TrainResult:
    """`train` as the attnflow command runs it: JAX's 64-bit mode switched on first for
    `dtype=float64`."""
    if cfg.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    return train(cfg)


def _stop_unless_finite(losses: list, first: int, params, run: RunFolder, saved: int | None) -> None:
    """Raise NonFiniteStateError when one of `losses` (those of steps `first`, `first`
    + 1, ...) or an array of `params` (those after the last of them) holds a NaN or an
    infinity: nothing of a diverged run is written."""
    # On the host, and the arrays in one compiled program: eager operations on lists of
    # every length and on leaves of every shape would each compile one of their own.
    finite = np.isfinite(np.asarray([np.asarray(value) for value in losses]))
    arrays = _all_finite(jax.tree.leaves(params))
    if finite.all() and arrays:
        return
    step = first + (int(np.argmin(finite)) if not finite.all() else len(losses) - 1)
    kept = f"the state of step {saved} in {run.state} is kept" if saved is not None else "no state was saved"
    raise NonFiniteStateError(
        f"training diverged at step {step} (its loss or weights became NaN or infinite); "
        f"{kept}; lower lr, raise warmup or lower clip, and start a new out=."
    )


def _all_finite(leaves) -> bool:
    """Whether every array of `leaves` is finite, in one program per tree of shapes."""
    return bool(_all_finite_program()(leaves)) if leaves else True


@functools.cache
def _all_finite_program():
    return jax.jit(lambda leaves: jnp.all(jnp.stack([jnp.isfinite(leaf).all() for leaf in leaves])))


def _train_locked(cfg: TrainConfig, directory, on_step, show) -> TrainResult:
    """`train` in its locked run folder `directory`."""
    run = RunFolder(directory.path)
    cfg, s = setup(cfg)
    stored = run.claim(cfg)
    tx = optimizer(cfg)
    params, static = eqx.partition(s.module, s.trainable)
    opt_state = tx.init(params)
    record = {"config": cfg.record(), "model_config": s.model_config.to_json(), "corpus": s.corpus_info}
    extra = lambda step: {"training": {"step": step, "config": cfg.record(), "corpus": s.corpus_info}}
    start, elapsed, metrics, saved = 0, 0.0, [], None
    if stored is not None:
        module, opt_state = load_state(run.state, s.module, opt_state)
        params, static = eqx.partition(module, s.trainable)
        start, elapsed, saved = stored["step"], float(stored.get("elapsed", 0.0)), stored["step"]
        metrics = run.keep_metrics_until(start)
        if start >= cfg.train_steps and run.model.is_dir():
            _say(f"{run.path} holds this run, finished at step {start}; nothing to do.")
            return TrainResult(run.path, _tied(module), start, metrics)
        _say(f"resuming {run.path} from step {start} of {cfg.train_steps}.")

    key = jax.random.key(cfg.seed)
    data_key, validation_key = jax.random.fold_in(key, 1), jax.random.fold_in(key, 2)
    corpus, solver, batch, context = s.corpus, cfg.solver, cfg.batch, cfg.context

    step_fn = training_step(tx, batch, context, solver)
    if not check_memory(cfg):  # the estimate is over the memory: the compiled step decides
        check_compiled_memory(cfg, step_fn, (params, static, opt_state, corpus, jax.random.key(0)))
    evaluate = validation_loss(batch, context, solver, cfg.eval_batches)

    snapshots = set(snapshot_steps(cfg.train_steps))

    def snapshot(step, params):
        save_model(eqx.combine(params, static), run.snapshot(step), tokenizer_json=s.tokenizer_json, extra=extra(step))

    step, recent, unsaved = start, [], []  # unsaved: the losses since the latest saved state
    try:
        if stored is None:
            directory.write_text("train.json", json.dumps(record, indent=2) + "\n")
            directory.write_text("metrics.jsonl", "")
            validation = float(evaluate(params, static, corpus, validation_key))
            _stop_unless_finite([jnp.asarray(validation)], 0, params, run, saved)
            entry = {"step": 0, "train_loss": None, "val_loss": validation, "time": 0.0}
            run.log(entry)
            metrics.append(entry)
            snapshot(0, params)
            save_state(run.state, s.module, opt_state, 0, 0.0, record)
            saved = 0
        clock, mark, tokens = time.perf_counter(), time.perf_counter(), 0
        with Progress(f"train {cfg.model}", cfg.train_steps, unit="steps", show=show) as bar:
            bar.advance(start)
            while step < cfg.train_steps:
                params, opt_state, value = step_fn(
                    params, static, opt_state, corpus, jax.random.fold_in(data_key, step)
                )
                step += 1
                recent.append(value)
                unsaved.append(value)
                tokens += batch * context
                info = {"loss": value}
                writes = step in snapshots or step % cfg.save_every == 0 or step == cfg.train_steps
                if writes or step % cfg.eval_every == 0:
                    _stop_unless_finite(unsaved, step - len(unsaved) + 1, params, run, saved)
                if step % cfg.eval_every == 0 or step == cfg.train_steps:
                    validation = float(evaluate(params, static, corpus, validation_key))
                    _stop_unless_finite([jnp.asarray(validation)], step, [], run, saved)
                    train_loss = float(jnp.mean(jnp.stack(recent)))
                    now = time.perf_counter()
                    rate = tokens / max(now - mark, 1e-9)
                    entry = {
                        "step": step,
                        "train_loss": train_loss,
                        "val_loss": validation,
                        "time": round(elapsed + now - clock, 3),
                        "tokens_per_second": round(rate, 1),
                    }
                    run.log(entry)
                    metrics.append(entry)
                    info["val_loss"] = validation
                    recent, mark, tokens = [], now, 0
                    bar.describe(
                        f"train {cfg.model}: loss {train_loss:.3f}, validation {validation:.3f}, {rate:,.0f} tokens/s"
                    )
                    if not bar.show:
                        _say(
                            f"step {step}/{cfg.train_steps}: train loss {train_loss:.4f}, validation "
                            f"{validation:.4f}, {rate:,.0f} tokens/s"
                        )
                if step in snapshots:
                    snapshot(step, params)
                if step % cfg.save_every == 0 or step == cfg.train_steps:
                    save_state(
                        run.state,
                        eqx.combine(params, static),
                        opt_state,
                        step,
                        elapsed + time.perf_counter() - clock,
                        record,
                    )
                    saved, unsaved = step, []
                bar.advance()
                if on_step is not None:
                    on_step(step, info)
        model = _tied(eqx.combine(params, static))
        save_model(model, run.model, tokenizer_json=s.tokenizer_json, extra=extra(step))
    except KeyboardInterrupt:
        kept = (
            f"the state of step {saved} in {run.state} is intact, and `attnflow train out={run.path}` resumes from it"
            if saved is not None
            else "no state was saved yet"
        )
        print(f"attnflow: interrupted at step {step}; {kept}.", file=sys.stderr, flush=True)
        raise
    except OSError as error:
        kept = (
            f"the state of step {saved} is kept, and `attnflow train out={run.path}` resumes from it once it "
            "can be written"
            if saved is not None
            else "no state was saved yet"
        )
        raise ConfigError(f"cannot write in {run.path} ({error.strerror or error}); {kept}.") from None
    _say(f"wrote {run.model} (step {step}, validation loss {metrics[-1]['val_loss']:.4f}).")
    return TrainResult(run.path, model, step, metrics)
