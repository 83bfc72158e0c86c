"""`attnflow train` against a hostile user (issue 18): a second training in the same
folder, sizes that cannot fit, run files that hold interpolations or the wrong types,
`+key=` and typos, booleans that are numbers, an `out=` that is a file, a full disk, a
loss that turns NaN, a corpus that is missing. Each refusal is one sentence, before
anything is built where it can be, and keeps what was computed.

Most cases call the command's entry (`attnflow.diffeqformer.main`) in this process with
the expensive parts (`setup`, the compiled steps) replaced by stubs that fail loudly, so
a refusal that comes too late fails the test at once instead of training."""

import dataclasses
import errno
import json
import math
import os
import re
import sys
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from commands import command  # noqa: F401 (a fixture)

from attnflow import CheckpointError, ConfigError
from attnflow.storage._store import RunDirectory
from attnflow.diffeqformer import DiffEqFormer, DiffEqFormerConfig, gpt, lora, main, populate, train_config
from attnflow.diffeqformer import _data, _train

# The smallest run: the copying task (no tokenizer to train), one solver step.
TINY = dict(model="diffeqformer", corpus="induction", vocab=8, dim=4, heads=1, hidden=4, context=4, d_emb=2,
            frequencies=1, steps=1, batch=2, train_steps=2, eval_every=2, eval_batches=1, save_every=1,
            compilation_cache=False)
TINY_ARGS = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in TINY.items()]


def tiny(*settings: str) -> list[str]:
    """TINY's command line with `settings` (KEY=VALUE) in place of its own: a setting is
    given once (attnflow train refuses one given twice)."""
    given = dict(s.split("=", 1) for s in settings)
    return [a for a in TINY_ARGS if a.split("=", 1)[0] not in given] + list(settings)


@pytest.fixture
def nothing_built(monkeypatch):
    """`setup` (the tokenizer, the model, the corpus) raises: a refusal must come first."""

    def built(cfg):
        raise AssertionError("the run got as far as building its model")

    monkeypatch.setattr(_train, "setup", built)


def _one_sentence(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("attnflow: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_second_training_into_the_same_folder_is_refused(tmp_path, capsys, nothing_built):
    out = tmp_path / "run"
    with RunDirectory(out):  # the lock a first training holds
        assert main(TINY_ARGS + [f"out={out}"]) == 2
    err = _one_sentence(capsys)
    assert str(out) in err and "another attnflow run" in err and "out=" in err and "hydra" not in err
    assert list(out.iterdir()) == []


def test_a_run_refused_after_taking_its_folder_leaves_no_folder(tmp_path, capsys, monkeypatch):
    def refused(cfg):
        raise ConfigError("the corpus is too small.")

    monkeypatch.setattr(_train, "setup", refused)
    out = tmp_path / "run"
    assert main(TINY_ARGS + [f"out={out}"]) == 2
    assert "the corpus is too small" in _one_sentence(capsys) and not out.exists()


@pytest.mark.parametrize("sizes", [["vocab=2000000000"], ["context=200000"], ["steps=10000000000"],
                                   ["frequencies=1000000000"], ["model=gpt", "hidden=100000000000"]])
def test_a_run_that_cannot_fit_is_refused_at_once_with_gib(sizes, tmp_path, capsys, nothing_built):
    out = tmp_path / "run"
    start = time.perf_counter()
    assert main(tiny(*sizes, f"out={out}")) == 2
    assert time.perf_counter() - start < 2.0
    err = _one_sentence(capsys)
    assert "GiB" in err and "available" in err
    assert not out.exists()


def test_the_memory_estimate_accepts_small_and_default_runs():
    from attnflow.running._ensemble import available_memory

    for cfg in (train_config(TINY), train_config(), train_config(dict(model="gpt"))):
        need = _train.memory_need(cfg)
        assert 0 < need.least < need.total < available_memory()
        assert _train.check_memory(cfg) is True
    with pytest.raises(ConfigError, match=r"at least .*GiB, more than the 0.0 GiB available"):
        _train.check_memory(train_config(), memory=1000)
    need = _train.memory_need(train_config())
    assert _train.check_memory(train_config(), memory=(need.least + need.total) // 2) is False


def test_between_the_least_and_the_full_estimate_the_compiled_step_decides(tmp_path, capsys, monkeypatch):
    """XLA's GPU compiler recomputes attention in the backward pass once the scores are
    large, and plans down to 1/7 of the estimate (benchmarks/train_memory.py): a run
    whose full estimate is over the memory but whose least need is not is refused only
    if its compiled step plans more than there is."""
    cfg = train_config(dict(TINY, model="gpt"))
    cfg, s = _train.setup(cfg)
    tx = _train.optimizer(cfg)
    params, static = eqx.partition(s.module, s.trainable)
    step = _train.training_step(tx, cfg.batch, cfg.context, cfg.solver)
    args = (params, static, tx.init(params), s.corpus, jax.random.key(0))
    stats = step.lower(*args).compile().compiled.memory_analysis()
    planned = stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
    _train.check_compiled_memory(cfg, step, args, memory=planned)
    with pytest.raises(ConfigError, match=r"\(as compiled\)"):
        _train.check_compiled_memory(cfg, step, args, memory=planned - 1)
    # Wired into the run: a memory between the least need and the plan stops it before its first step.
    need = _train.memory_need(cfg)
    assert need.least < planned
    monkeypatch.setattr(_train, "available_memory", lambda device=None: (need.least + planned) // 2)
    out = tmp_path / "run"
    assert main(tiny("model=gpt", f"out={out}")) == 2
    assert "(as compiled)" in _one_sentence(capsys) and not (out / "metrics.jsonl").exists()


def _count(tree) -> int:
    """The parameters of a model built by `eqx.filter_eval_shape` (shapes, no numbers)."""
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(tree) if jnp.issubdtype(leaf.dtype, jnp.inexact))


def test_the_parameter_count_is_that_of_the_built_models():
    cfg = train_config(dict(TINY, vocab=11, dim=6, heads=2, hidden=5, context=7, d_emb=3, frequencies=2, steps=3))
    config = DiffEqFormerConfig(vocab=11, dim=6, heads=2, hidden=5, context=7, d_emb=3, frequencies=2, steps=3)
    key = jax.random.key(0)
    model = eqx.filter_eval_shape(DiffEqFormer, config, key=key)
    assert _train.parameter_count(cfg) == (_count(model), _count(model))
    baseline = eqx.filter_eval_shape(lambda: dataclasses.replace(gpt(key, config), unembed=None))  # tied, as it trains
    assert _train.parameter_count(dataclasses.replace(cfg, model="gpt")) == (_count(baseline), _count(baseline))
    adapted = eqx.filter_eval_shape(lambda: lora(populate(DiffEqFormer(config, key=key)), 2, key=key))
    total, trained = _train.parameter_count(dataclasses.replace(cfg, lora_rank=2, init="somewhere"))
    assert trained == _count(adapted.adapters)
    assert _count(adapted) <= total <= 1.1 * _count(adapted)


@pytest.mark.slow  # 60 s and 100 s of compiling here; the parameter count above is the fast check
@pytest.mark.parametrize("sizes", [dict(model="gpt", context=64, steps=2),
                                   dict(model="diffeqformer", solver="heun", context=64, steps=3)])
def test_the_memory_estimate_is_within_a_factor_two_of_xla_s_buffers(sizes):
    """The training step as XLA plans it (arguments, outputs and temporary buffers), at
    a context where the attention scores are most of it. Measured: the estimate is 0.82
    (GPT) and 1.08 (DiffEqFormer, Heun) of XLA's plan."""
    cfg = train_config(dict(TINY, vocab=64, dim=16, heads=4, hidden=32, d_emb=4, frequencies=2, batch=4, **sizes))
    cfg, s = _train.setup(cfg)
    tx = _train.optimizer(cfg)
    params, static = eqx.partition(s.module, s.trainable)
    step = _train.training_step(tx, cfg.batch, cfg.context, cfg.solver)
    lowered = step.lower(params, static, tx.init(params), s.corpus, jax.random.key(0))
    stats = lowered.compile().compiled.memory_analysis()
    planned = stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
    need = _train.memory_need(cfg).total
    assert planned / 2 < need < 2 * planned, (need, planned)


def _state_folder(out, config: dict, **state) -> None:
    (out / "state").mkdir(parents=True)
    record = dict({"config": config, "step": 1, "elapsed": 0.0, "format_version": _train.STATE_VERSION}, **state)
    (out / "state" / "state.json").write_text(json.dumps(record))


def test_a_run_s_own_files_are_data_never_resolved(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNFLOW_HOSTILE_SOLVER", "euler")
    record = train_config(TINY).record()
    out = tmp_path / "interpolated"
    _state_folder(out, dict(record, solver="${oc.env:ATTNFLOW_HOSTILE_SOLVER}"))
    with pytest.raises(CheckpointError, match="state.json") as caught:
        train_config([f"out={out}"])
    assert "${oc.env:ATTNFLOW_HOSTILE_SOLVER}" in str(caught.value)
    cases = {"typed": dict(config=dict(record, lr="fast")), "unknown": dict(config=dict(record, depth=3)),
             "step": dict(config=record, step="abc"), "negative": dict(config=record, step=-4),
             "config": dict(config=[1, 2])}
    for name, state in cases.items():
        out = tmp_path / name
        _state_folder(out, **state)
        with pytest.raises(CheckpointError, match=f"{out / 'state' / 'state.json'}"):
            train_config([f"out={out}"])
    with pytest.raises(CheckpointError, match=r"holds lr='fast', which is not a number\.$"):
        train_config([f"out={tmp_path / 'typed'}"])
    # A string setting holding `${...}` stays that string.
    out = tmp_path / "literal"
    _state_folder(out, dict(record, init="${oc.env:HOME}", lora_rank=0))
    assert train_config([f"out={out}"]).init == "${oc.env:HOME}"


def test_plus_keys_and_typos_are_refused_with_the_nearest_name():
    assert train_config(["+lr=0.1"]).lr == 0.1 and train_config(["++batch=3"]).batch == 3
    for args, nearest in ((["+mlp.enabld=true"], None), (["dimm=3"], "dim"), (["+lrr=0.1"], "lr"),
                          (["train_step=3"], "train_steps")):
        with pytest.raises(ConfigError, match="^unknown setting ") as caught:
            train_config(args)
        message = str(caught.value)
        name = args[0].split("=")[0].lstrip("+")
        assert message.startswith(f"unknown setting {name} of attnflow train"), message
        assert message.endswith(f"; it takes {', '.join(f.name for f in dataclasses.fields(_train.TrainConfig))}.")
        if nearest:
            assert f"did you mean {nearest}?" in message
    with pytest.raises(ConfigError, match=r"^unknown setting mlp\.enabld of attnflow train; it takes model, "):
        train_config(["+mlp.enabld=true"])
    with pytest.raises(ConfigError, match=r"^unknown setting batchh of attnflow train \(did you mean batch\?\); it takes "):
        train_config(dict(batchh=3))


def test_booleans_are_true_or_false_only():
    for word, value in (("true", True), ("False", False), ("yes", True), ("no", False), ("on", True), ("off", False)):
        assert train_config([f"compilation_cache={word}"]).compilation_cache is value
    for bad in ("2", "1", "0", "maybe", "1.0"):
        with pytest.raises(ConfigError, match="compilation_cache must be true or false"):
            train_config([f"compilation_cache={bad}"])
    for bad in (2, 1, 0):
        with pytest.raises(ConfigError, match="compilation_cache must be true or false"):
            train_config(dict(compilation_cache=bad))


def test_a_value_of_the_wrong_type_is_one_sentence_of_the_schema():
    """The settings are typed by the one schema mechanism (`_schema.typed`), on the command
    line and through the Python API alike: its sentence names the setting, the value and
    the type (a choice's names)."""
    for setting, says in (("vocab=2.5", "vocab must be an integer, got 2.5."),
                          ("lr=fast", "lr must be a number, got 'fast'."),
                          ("b2=abc", "b2 must be a number or null, got 'abc'."),
                          ("out=[1]", "out must be a string or null, got [1]."),
                          ("model=[1]", "model must be one of diffeqformer, gpt, got [1].")):
        with pytest.raises(ConfigError, match=f"^{re.escape(says)}$"):
            train_config([setting])
    with pytest.raises(ConfigError, match=r"^vocab must be an integer, got 'many'\.$"):
        train_config(dict(vocab="many"))
    assert train_config(dict(vocab="12", lr="1e-3")).vocab == 12  # OmegaConf's reading of a number, as a study's


def test_numbers_that_break_a_run_later_are_refused():
    for setting in ("weight_decay=inf", "clip=inf", "seed=9223372036854775808"):
        with pytest.raises(ConfigError, match=setting.split("=")[0]):
            train_config([setting])


def test_an_out_that_is_not_a_folder_is_one_sentence(tmp_path, capsys, nothing_built):
    (tmp_path / "afile").write_text("mine")
    for out in (tmp_path / "afile", tmp_path / "afile" / "below"):
        assert main(TINY_ARGS + [f"out={out}"]) == 2
        err = _one_sentence(capsys)
        assert str(out) in err and "out=" in err
    assert (tmp_path / "afile").read_text() == "mine"


def _stub_setup(cfg):
    """A setup without a model worth compiling: one array, trained by plain Adam."""
    config = DiffEqFormerConfig(vocab=cfg.vocab, dim=cfg.dim, heads=cfg.heads, hidden=cfg.hidden, context=cfg.context)
    return cfg, _train.Setup({"w": jnp.ones(3)}, {"w": True}, config, None, "", {"corpus": cfg.corpus})


@pytest.fixture
def stubbed(monkeypatch):
    """`setup`, the optimizer, the compiled steps and the model folders replaced by stubs;
    the step's loss is NaN from the call numbers in `nan_from` on (never by default)."""
    nan_from = [math.inf]
    calls = []

    def step(params, static, opt_state, corpus, key):
        calls.append(key)
        return params, opt_state, np.float32(np.nan if len(calls) >= nan_from[0] else 1.0)

    monkeypatch.setattr(_train, "setup", _stub_setup)
    monkeypatch.setattr(_train, "optimizer", lambda cfg: optax.adam(0.1))
    monkeypatch.setattr(_train, "training_step", lambda *a: step)
    monkeypatch.setattr(_train, "validation_loss", lambda *a: lambda *b: np.float32(1.0))
    monkeypatch.setattr(_train, "save_model", lambda *a, **k: None)
    return nan_from


def test_a_full_disk_is_one_sentence_naming_the_folder_and_the_rerun_resumes(tmp_path, capsys, monkeypatch,
                                                                             stubbed):
    save_state = _train.save_state

    def full_at_step_2(folder, module, opt_state, step, *args):
        if step == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        save_state(folder, module, opt_state, step, *args)

    monkeypatch.setattr(_train, "save_state", full_at_step_2)
    out = tmp_path / "run"
    assert main(TINY_ARGS + [f"out={out}"]) == 2
    err = _one_sentence(capsys)
    assert str(out) in err and "No space left on device" in err and "state of step 1 is kept" in err
    assert json.loads((out / "state" / "state.json").read_text())["step"] == 1
    monkeypatch.setattr(_train, "save_state", save_state)  # room again
    assert main([f"out={out}"]) == 0
    assert "resuming" in capsys.readouterr().out
    assert json.loads((out / "state" / "state.json").read_text())["step"] == 2


def test_a_loss_that_turns_nan_stops_the_run_and_keeps_the_last_finite_state(tmp_path, capsys, stubbed):
    stubbed[0] = 2  # the update to step 2 has a NaN loss
    out = tmp_path / "run"
    assert main(tiny("train_steps=4", "eval_every=4", f"out={out}")) == 2
    err = _one_sentence(capsys)
    assert "step 2" in err and "state of step 1" in err and "lr" in err
    assert json.loads((out / "state" / "state.json").read_text())["step"] == 1
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [0]


def test_a_missing_or_empty_corpus_is_one_sentence(monkeypatch):
    monkeypatch.setattr(_data, "reference_topics", lambda: {})
    with pytest.raises(ConfigError, match="too few tokens"):
        _data.load_corpus("reference", vocab=300, context=16, tokenizer_json=_data.induction_tokenizer(300))
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "pydoc_data.topics", None)  # a Python without it
    with pytest.raises(ConfigError, match="pydoc_data.*corpus=induction"):
        _data.reference_topics()


def test_a_corrupt_state_is_one_sentence_naming_the_file(tmp_path, capsys, stubbed):
    out = tmp_path / "run"
    assert main(tiny("train_steps=1", f"out={out}")) == 0
    (out / "state" / "state.safetensors").write_bytes(b"\x00" * 10)  # a truncated file
    assert main([f"out={out}"]) == 1
    assert "state.safetensors is not a readable safetensors file" in _one_sentence(capsys)


def test_run_files_get_the_mode_the_umask_gives(tmp_path):
    previous = os.umask(0o027)
    try:
        _train.save_state(tmp_path / "state", {"w": jnp.ones(3)}, {"m": jnp.zeros(3)}, 0, 0.0, {})
    finally:
        os.umask(previous)
    assert {oct(p.stat().st_mode & 0o777) for p in (tmp_path / "state").iterdir()} == {oct(0o640)}


def test_the_diffeqformer_refuses_ids_its_embedding_has_no_row_for():
    """JAX reads an id past the embedding as its last row: the DiffEqFormer's forward
    pass (a tampered tokenizer.json next to a trained model) named no error. Concrete
    ids are refused with the id and the size, traced ones stop the jitted call."""
    model = DiffEqFormer(DiffEqFormerConfig(vocab=8, dim=4, heads=1, hidden=4, context=4, d_emb=2, frequencies=1,
                                            steps=1), key=jax.random.key(0))
    assert np.isfinite(np.asarray(model(jnp.asarray([1, 7])))).all()
    for ids in ([1, 8], [-1, 2]):
        with pytest.raises(ConfigError, match=r"token id -?\d at position \d is outside the DiffEqFormer's embedding, "
                                              r"which has 8 rows"):
            model(jnp.asarray(ids))
    with pytest.raises(Exception, match="outside the DiffEqFormer's embedding, which has 8 rows"):
        jax.block_until_ready(eqx.filter_jit(lambda m, ids: m(ids))(model, jnp.asarray([1, 8])))


def test_the_command_line_is_composed_by_hydra_as_a_study_is(tmp_path):
    """Hydra reads `attnflow train`'s arguments (its grammar: quotes, null) and composes
    them over conf/train.yaml with the schema's keys from its ConfigStore; what it would
    let through silently (a setting twice, a deletion, a sweep) is one sentence."""
    import re

    folder = tmp_path / "a b"
    cfg = train_config([f"out='{folder}'", "lr=1e-3", "b2=null", "corpus=reference-b"])
    assert (cfg.out, cfg.lr, cfg.b2, cfg.corpus) == (str(folder), 1e-3, None, "reference-b")
    for args, says in ((["lr=1", "lr=2"], "lr is given twice (lr=1, lr=2); give it once."),
                       (["~lr"], "attnflow train cannot delete a setting (~lr); give lr a value."),
                       (["lr=1e-3,3e-3"], "attnflow train runs one training, not a sweep (lr=1e-3,3e-3)"),
                       (["lr=[1"], "cannot parse the settings of attnflow train")):
        with pytest.raises(ConfigError, match=re.escape(says)) as caught:
            train_config(args)
        assert "\n" not in str(caught.value)


def test_init_on_the_command_line_is_a_setting_not_the_config_group():
    # `init` is also a config group of the study's config (conf/init/, beside train.yaml):
    # Hydra read `attnflow train init=DIR` as a choice of it and refused the README's command.
    cfg = train_config(["init=runs/train/some-run", "steps=12", "corpus=reference-b"])
    assert (cfg.init, cfg.steps, cfg.corpus) == ("runs/train/some-run", 12, "reference-b")


def test_cfg_job_prints_the_composed_settings_and_runs_nothing(tmp_path, capsys, nothing_built):
    """`attnflow train --cfg job`, as every Hydra app answers it: the settings composed
    over conf/train.yaml, as YAML, and nothing built or written (issue 35)."""
    out = tmp_path / "run"
    assert main(["--cfg", "job", "steps=7", "model=gpt", f"out={out}"]) == 0
    printed = capsys.readouterr().out
    assert "steps: 7\n" in printed and "model: gpt\n" in printed and f"out: {out}\n" in printed
    assert not out.exists()
    assert main(["-c", "all", "--resolve", "steps=9"]) == 0 and "steps: 9\n" in capsys.readouterr().out
    assert main(["--cfg", "hydra"]) == 2 and "--cfg job" in _one_sentence(capsys)
    assert main(["--cfg", "jobs"]) == 2 and "--cfg takes job, hydra or all" in _one_sentence(capsys)


def test_multirun_trains_each_job_in_its_folder_and_a_failed_job_stops_none(tmp_path, command):
    """`attnflow train -m` sweeps as a Hydra app does (and as `attnflow -m` does a
    study): one training per combination, job N in out/N, each announced with its swept
    settings and its folder; a failed job is one line naming it, the others run, and the
    sweep ends with the failed jobs named and exit code 2. The same command leaves the
    finished jobs as they are; `--cfg job` prints every job's settings and runs none."""
    sweep = tmp_path / "lr"
    args = ("train", "-m", *tiny("model=gpt", "lr=1e-3,-1,3e-3"), f"out={sweep}")  # GPT: the quicker to compile
    code, err = command(*args)
    assert code == 2
    assert err == ["attnflow: error: job 1 (lr=-1): lr must be a positive number, got -1.0.",
                   "attnflow: error: 1 of 3 jobs failed: job 1 (lr=-1)."]
    for number, lr in ((0, 0.001), (2, 0.003)):
        folder = sweep / str(number)
        assert f"attnflow: job {number} (lr={lr}): training in {folder}\n" in command.out
        assert f"attnflow: wrote {folder / 'model'} (step 2," in command.out
        assert json.loads((folder / "train.json").read_text())["config"]["lr"] == lr
    assert sorted(p.name for p in sweep.iterdir()) == ["0", "2"]  # the refused job left no folder
    losses = [json.loads((sweep / n / "metrics.jsonl").read_text().splitlines()[-1])["val_loss"] for n in "02"]
    assert losses[0] != losses[1]  # each job trained with its own lr
    code, err = command(*args)
    assert code == 2 and len(err) == 2 and command.out.count("nothing to do") == 2
    code, err = command("train", "-m", "--cfg", "job", "seed=0,1", "lr=1e-3,3e-3")
    assert code == 0 and err == []
    jobs = command.out.split("# job ")[1:]
    assert [job.splitlines()[0] for job in jobs] == ["0 (seed=0, lr=0.001)", "1 (seed=0, lr=0.003)",
                                                     "2 (seed=1, lr=0.001)", "3 (seed=1, lr=0.003)"]
    assert all(re.search(rf"^out: runs/train/multirun/[\d-]+/[\d-]+/{n}$", job, re.M) for n, job in enumerate(jobs))
    assert not (tmp_path / "runs").exists()
    for bad, says in ((["out=a,b"], "out names the sweep's folder"), (["lr=interval(0,1)"], "sweeps lists, ranges"),
                      (["seed=range(0,200)", "lr=range(1,101)"], "more than 10000 jobs")):
        code, err = command("train", "-m", *bad)
        assert code == 2 and len(err) == 1 and says in err[0], err


def test_the_settings_are_read_checked_and_swept_without_jax():
    """`attnflow train` refuses a bad setting, and lists a sweep's jobs, before it loads
    JAX: its settings and command (`_settings`, `_command`) import none of it."""
    import subprocess

    code = ("import sys; from attnflow.diffeqformer._command import main; "
            "codes = [main(['dtype=float16']), main(['solver=rk5']), main(['-m', '--cfg', 'job', 'lr=1e-3,3e-3'])]; "
            "print(codes, 'jax' in sys.modules, 'equinox' in sys.modules, 'optax' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == "[2, 2, 0] False False False", done.stdout + done.stderr
    assert "dtype must be one of float32, float64" in done.stderr and "unknown solver 'rk5'" in done.stderr
