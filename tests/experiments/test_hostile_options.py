"""A hostile user's experiment options (issue 33): every field of every experiment's
`Options` is given NaN, plus and minus infinity, a repeated entry (a field typed as a
list) and a value that leaves a setting unused; each is refused before anything is
computed, in one sentence naming the option, or is allow-listed here with its reason.

The probes call `check_experiment` in this process: the options typed, the experiment's
`check`, every panel's study resolved (pure checks: no program is traced, but by the
Lyapunov experiments' own check), so that the few hundred probes take seconds. The
issue's three cases also run through the command. tests/README.md, section 17.5, lists
the cases."""

from __future__ import annotations

import copy
import dataclasses
import math
import typing
from dataclasses import field

import pytest
from commands import assert_one_error_line, attnflow

from attnflow.schema._schema import is_optional, typed
from attnflow.schema._errors import ConfigError
from attnflow.experiments import EXPERIMENTS, compose_experiment, experiment_module
from attnflow.experiments._runner import check_experiment, option_schema

NUMBERS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}

# The experiments that read a trained model in their check: a tiny one (2 layers, a word
# tokenizer `w0 w1 ...`) and a three-token text.
TINY_MODEL = ("checkpoint", "sensitivity")

# An option that holds the settings of another part of attnflow (a mapping: a training's,
# a study's) is probed at one of its numbers: the whole option given NaN is only refused
# as not a mapping.
INSIDE = {("metastability", "staircase"): "t1", ("diffeqformer", "train"): "lr",
          ("adaptive_depth", "train"): "lr", ("adaptive_depth", "pretrain"): "lr"}

# Where a refusal names the option otherwise than experiment.options.KEY: the staircase
# is the study of a panel of that name, checked (and named) as every panel is.
NAMED = {("metastability", "staircase"): "panel staircase"}

# For each option, a value that leaves a setting unused (the options given on top of the
# experiment's, and config keys): each is refused, unless allow-listed below.
UNUSED = {
    ("metastability", "staircase"): ({"staircase": {"rtol": 1e-3}}, {}),  # adaptive=false: rtol unused
    **{("metastability", f"staircase_detector.{key}"): ({"staircase": None, "staircase_detector": {key: 0.1}}, {})
       for key in ("tol", "min_length", "hold_length")},  # no staircase panel to detect on
    ("circle", "snapshots"): ({"snapshots": [0.0, 3.0, 3.01, 10.0, 100.0]}, {}),  # 3 and 3.01: one saved time
    ("causal", "fit_from"): ({"fit_from": 0.999}, {}),  # one saved time to fit the rates on
    ("flow_matching", "test_fraction"): ({"test_fraction": 0.001}, {}),  # no member held out
    ("flow_matching", "distance_times"): ({"distance_times": 1000}, {}),  # more than the saved times
    ("checkpoint", "interpolation"): ({"steps": [1], "adaptive": False, "interpolation": "linear"}, {}),
    ("checkpoint", "adaptive"): ({"adaptive": True}, {"checkpoint": "bert"}),  # a post-LN model has no such solve
    ("lyapunov", "k"): ({"k": 10**6}, {}),  # exponents the tangent space does not have
    ("lyapunov", "reorthonormalize_every"): ({"reorthonormalize_every": 1000}, {}),  # one QR interval of 1000 steps
    ("lyapunov_polynomial", "k"): ({"k": 10**6}, {}),
    ("lyapunov_polynomial", "reorthonormalize_every"): ({"reorthonormalize_every": 200}, {}),  # of 200 steps
    ("lyapunov_polynomial", "compare_every"): ({"compare_every": 10**6}, {}),
    ("sensitivity", "outputs"): ({"outputs": [-1, 2]}, {}),  # the last of three tokens twice
    ("diffeqformer", "train"): ({"train": {"out": "elsewhere"}}, {}),  # set by the experiment itself
    ("adaptive_depth", "lora_rank"): ({"methods": ["full"], "lora_rank": 8}, {}),
    ("adaptive_depth", "out"): ({"methods": [], "out": "elsewhere"}, {}),  # no fine-tuning run to keep
    ("adaptive_depth", "finetune_steps"): ({"methods": [], "finetune_steps": 20}, {}),
    ("adaptive_depth", "train"): ({"methods": [], "train": {"lr": 1e-3}}, {}),  # lr: of fine-tuning runs only
    ("long_context", "n_max"): ({"n_count": 1, "n_max": 1000}, {}),  # one n, n_min
    ("long_context", "n_count"): ({"n_min": 100, "n_max": 103, "n_count": 7}, {}),  # 4 different n
    ("noise_transition", "ratios"): ({"ratios": [0.8, 0.8000001, 1.2, 1.5]}, {}),  # one panel, ratio=0.8
    ("noise_transition", "disordered_from"): ({"disordered_from": 2.0}, {}),  # nothing to fit the threshold on
    ("hardmax_sinkhorn", "polygons"): ({"polygons": 0}, {}),  # the k-gon settings all unused
    ("hardmax_sinkhorn", "kgon_t1"): ({"kgon_t1": 0.01}, {}),  # round(0.01 / 0.05) = 0 steps
    ("meanfield_circle", "times"): ({"times": [0.0]}, {}),  # nothing compared, dt unused
}

TEXT = ("a text (a folder or a sentence): nan or inf typed for it is the text 'nan' or 'inf', "
        "as valid as any other")
EVERY = "every value is used"
# Probes accepted on purpose, with the reason.
ALLOWED = {
    **{(name, key, probe): TEXT for name, key in (("diffeqformer", "out"), ("diffeqformer", "sentence"),
                                                 ("adaptive_depth", "pretrained"), ("adaptive_depth", "baseline"),
                                                 ("adaptive_depth", "out")) for probe in NUMBERS},
    **{(name, "member", "unused"): f"{EVERY}: it indexes a member (one out of range is refused, issue 18)"
       for name in ("single_cluster", "metastability", "random_qk", "bouncing", "causal", "polytope", "polynomial",
                    "normalization", "flow_matching", "cross_attention")},
    **{("metastability", f"sphere_detector.{key}", "unused"): f"{EVERY}: the detector reads it on the computed "
       "series of panel sphere (its range is checked)" for key in ("tol", "min_length", "hold_length")},
    ("phase_diagram", "eps", "unused"): f"{EVERY}: the level of the equiangular curve",
    ("phase_diagram_random", "eps", "unused"): f"{EVERY}: the level of the equiangular curve",
    ("phase_diagram_random", "panels", "unused"): f"{EVERY}: each entry is a panel",
    ("random_qk", "contrast", "unused"): f"{EVERY}: true adds the panel of V negated, false leaves it out",
    ("token_detection", "sequences", "unused"): f"{EVERY}: each sequence is a panel (one length for all)",
    ("token_detection", "readout_beta", "unused"): f"{EVERY}: the read-out of every panel",
    ("causal", "tolerance", "unused"): f"{EVERY}: the convergence test of every member",
    ("polytope", "hyperplane_v", "unused"): f"{EVERY}: the V of panel hyperplanes",
    ("polytope", "product_v", "unused"): f"{EVERY}: the V of panel product",
    ("polytope", "tol", "unused"): f"{EVERY}: the rescaled limits of every panel are merged at it",
    ("polynomial", "normalizer", "unused"): f"{EVERY}: both choices set the attention of every panel",
    ("normalization", "pre_norm", "unused"): f"{EVERY}: both choices set the N of panel pre_ln",
    **{("normalization", key, "unused"): f"{EVERY}: the fits' window is found on the computed cosines, not "
       "known before solving (0 < floor < fit_from < 1 and settle are checked)" for key in ("fit_from", "floor",
                                                                                              "settle")},
    **{("flow_matching", key, "unused"): f"{EVERY}: a size or a rate of the surrogate's training and flow"
       for key in ("width", "depth", "train_steps", "batch_size", "learning_rate", "surrogate_steps", "epsilon")},
    ("checkpoint", "steps", "unused"): f"{EVERY}: each entry is a run",
    ("checkpoint", "bins", "unused"): f"{EVERY}: the cosine histograms",
    ("checkpoint", "probes", "unused"): f"{EVERY}: true adds the probes, false leaves them out",
    ("checkpoint", "adaptive", "unused"): ("documented (conf/experiment/checkpoint.yaml: the adaptive solve is "
                                           "of pre-LN models): true is the default, and docs/checkpoints.md runs "
                                           "checkpoint=minilm (post-LN) with it; the figure lists the runs made"),
    ("lyapunov_polynomial", "schedules", "unused"): f"{EVERY}: each entry is a schedule's study",
    ("lyapunov_polynomial", "dispersion", "unused"): f"{EVERY}: true adds the dispersion studies",
    ("sensitivity", "steps", "unused"): f"{EVERY}: the steps per layer of the solve",
    ("sensitivity", "solver", "unused"): f"{EVERY}: the solver of the solve",
    ("diffeqformer", "out", "unused"): f"{EVERY}: the folder of the two training runs",
    ("diffeqformer", "sentence", "unused"): f"{EVERY}: the sentence of the theory runs",
    **{("diffeqformer", key, "unused"): f"{EVERY}: a size of the analysis" for key in ("tokens", "spectra_steps")},
    ("diffeqformer", "cluster_horizon", "unused"): f"{EVERY}: T_c of the attention-only runs",
    ("diffeqformer", "frozen_at", "unused"): f"{EVERY}: where the frozen weights are taken",
    ("adaptive_depth", "pretrained", "unused"): f"{EVERY}: the DiffEqFormer run (trained when missing)",
    ("adaptive_depth", "baseline", "unused"): f"{EVERY}: the GPT run (trained when missing)",
    ("adaptive_depth", "steps", "unused"): f"{EVERY}: each entry is a number of steps evaluated",
    ("adaptive_depth", "methods", "unused"): f"{EVERY}: each entry is a fine-tuning method ([] for none)",
    ("adaptive_depth", "corpus", "unused"): f"{EVERY}: the corpus of the zero-shot losses and of fine-tuning",
    ("adaptive_depth", "pretrain", "unused"): ("read only when a pretrained run is missing: a fact of the folders "
                                               "when the run starts (and its settings are checked by train_config)"),
    ("adaptive_depth", "finetune_steps", "unused"): (
        "documented: docs/gallery/adaptive_depth.md's zero-shot command (methods=[]) shares its test overrides, "
        "finetune_steps=2 among them, with the fine-tuning one (stored in the results, never run)"),
    ("adaptive_depth", "train", "unused"): (
        "documented: docs/gallery/adaptive_depth.md's zero-shot command (methods=[]) gives train.eval_every in its "
        "test overrides (its seed, batch, eval_batches and solver choose the zero-shot batches)"),
    ("long_context", "rho", "unused"): f"{EVERY}: each entry is a sweep",
    ("long_context", "gamma_critical", "unused"): f"{EVERY}: each entry is a gamma of every sweep",
    ("long_context", "n_min", "unused"): f"{EVERY}: the first n",
    ("long_context", "rows", "unused"): f"{EVERY}: the query tokens sampled (checked against n_min and d)",
    ("noise_transition", "sizes", "unused"): f"{EVERY}: each entry is a row of panels",
    ("noise_transition", "members", "unused"): f"{EVERY}: each entry is the members of a row of panels (null: the "
                                               "config's members, read by every panel)",
    ("noise_transition", "late", "unused"): f"{EVERY}: every late in (0, 1] holds t1, the last saved time",
    ("hardmax_sinkhorn", "bins", "unused"): f"{EVERY}: the pair-cosine histogram",
    ("hardmax_sinkhorn", "sides", "unused"): f"{EVERY}: k of every k-gon (polygons >= 1)",
    ("hardmax_sinkhorn", "interior", "unused"): f"{EVERY}: the interior tokens of every k-gon (polygons >= 1)",
    ("many_heads", "laws", "unused"): f"{EVERY}: each entry is a row of panels",
    ("many_heads", "heads", "unused"): f"{EVERY}: each entry is a column of panels",
    ("cross_attention", "cross_betas", "unused"): f"{EVERY}: each entry is a row of the diagram (a panel)",
    ("cross_attention", "cases", "unused"): f"{EVERY}: each entry is a cell of the grid drawn (one off it is refused)",
    **{("meanfield_circle", key, "unused"): f"{EVERY}: {what}" for key, what in (
        ("kind", "both kinds set the attention"), ("beta", "of the particles and the PDE"),
        ("mode", "of the initial density and of the mode measured"), ("amplitude", "of the initial density"),
        ("n", "each entry is a token count"), ("members", "the draws of each n"), ("dt", "the particles' step"),
        ("grid", "the PDE's grid"), ("sigma", "the noise of the particles and the PDE"),
        ("gap", "the particle clusters are split at it"), ("core", "the particle clusters' cores"),
        ("min_mass", "the clusters counted"))},
}


def option_keys(name: str) -> list[str]:
    """The options of experiment `name`, those of a nested dataclass key by key
    (`sphere_detector.tol`)."""
    keys = []
    schema = option_schema(experiment_module(name))
    for f in dataclasses.fields(schema):
        kind = _plain_type(typing.get_type_hints(schema)[f.name])
        if dataclasses.is_dataclass(kind):
            keys += [f"{f.name}.{inner.name}" for inner in dataclasses.fields(kind)]
        else:
            keys.append(f.name)
    return keys


def _plain_type(kind):
    return next(a for a in typing.get_args(kind) if a is not type(None)) if is_optional(kind) else kind


def _is_list(name: str, key: str) -> bool:
    schema = option_schema(experiment_module(name))
    return "." not in key and typing.get_origin(_plain_type(typing.get_type_hints(schema)[key])) is list


CASES = [(name, key, probe) for name in EXPERIMENTS for key in option_keys(name)
         for probe in (*NUMBERS, "duplicate", "unused") if probe != "duplicate" or _is_list(name, key)]


def _first_replaced(value, number):
    """`value` with its first entry (nested lists: the first number or name) replaced by
    `number`; `number` itself where `value` is not a list."""
    if not isinstance(value, list):
        return number
    if not value:
        return [number]
    return [_first_replaced(value[0], number), *value[1:]]


def probe_options(name: str, key: str, probe: str, options: dict) -> tuple[dict, dict] | None:
    """The options (and config keys) of one probe, over the experiment's `options`; None
    where the probe has no value (an unused probe answered by the allow-list alone)."""
    options = copy.deepcopy(options)
    head, _, rest = key.partition(".")
    if probe == "unused":
        if (name, key) not in UNUSED:
            return None
        given, config = UNUSED[(name, key)]
        for option, value in given.items():
            if isinstance(value, dict) and isinstance(options.get(option), dict):
                options[option] = {**options[option], **value}
            else:
                options[option] = value
        return options, config
    if probe == "duplicate":
        options[head] = [*options[head], options[head][0]]
    elif rest:
        options[head][rest] = NUMBERS[probe]
    elif (name, head) in INSIDE:
        options[head] = {**options[head], INSIDE[(name, head)]: NUMBERS[probe]}
    else:
        options[head] = _first_replaced(options[head], NUMBERS[probe])
    return options, {}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny pre-LN (Llama) and post-LN (BERT) model, each with a word tokenizer."""
    from checkpoint_models import VOCAB, write_tiny
    from tokenizers import Tokenizer, models as tokenizer_models, pre_tokenizers

    root = tmp_path_factory.mktemp("models")
    folders = {}
    for family in ("llama", "bert"):
        folder = write_tiny(family, root / family)
        backend = Tokenizer(tokenizer_models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
        backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        backend.save(str(folder / "tokenizer.json"))
        folders[family] = str(folder)
    return folders


@pytest.fixture(scope="module")
def composed(models):
    """The config of `attnflow experiment=NAME` (with config keys on top), composed once."""
    found = {}

    def get(name: str, config: dict):
        config = dict(config)
        if name in TINY_MODEL:
            config = {"text": "w1 w2 w3", **config, "checkpoint": models[config.get("checkpoint", "llama")]}
        key = (name, repr(sorted(config.items())))
        if key not in found:
            found[key] = compose_experiment(name, config)
        return found[key]

    return get


@pytest.mark.parametrize("name, key, probe", CASES, ids=["-".join(case) for case in CASES])
def test_every_option_refuses_a_value_it_cannot_use(name, key, probe, composed, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the run folders some experiments look for (runs/...) are not there
    allowed = ALLOWED.get((name, key, probe))
    if allowed is not None:
        assert allowed.strip(), (name, key, probe)
    base = composed(name, {})
    probed = probe_options(name, key, probe, base.experiment.options)
    if probed is None:
        assert allowed is not None, (f"{name}: experiment.options.{key} has no value that leaves a setting unused "
                                     "in UNUSED and no allow-list entry saying why every value is used")
        return
    options, config = probed
    cfg = composed(name, config)
    cfg = dataclasses.replace(cfg, experiment=dataclasses.replace(cfg.experiment, options=options))
    where = f"{name}: experiment.options.{key} probed with {probe} ({options[key.partition('.')[0]]!r})"
    try:
        check_experiment(cfg)
    except ConfigError as error:
        message = str(error)
        assert allowed is None, f"{where} is refused ({message}): remove its allow-list entry ({allowed!r})"
        assert "\n" not in message and message.endswith(".") and len(message) < 400, f"{where}: {message!r}"
        named = NAMED.get((name, key.partition(".")[0]),
                          f"experiment.options.{key if probe in NUMBERS else key.partition('.')[0]}")
        assert named in message, f"{where}: the refusal does not name {named}: {message!r}"
    else:
        assert allowed is not None, (f"{where} is accepted: refuse it before computing, in one sentence naming the "
                                     "option, the value and what is allowed, or allow-list it with its reason")


def test_the_allow_list_and_the_unused_values_name_real_probes():
    cases = set(CASES)
    assert set(ALLOWED) <= cases, sorted(set(ALLOWED) - cases)
    assert {(name, key, "unused") for name, key in UNUSED} <= cases
    # Every option has a value that leaves a setting unused, or the reason why none does.
    assert all((name, key) in UNUSED or (name, key, probe) in ALLOWED for name, key, probe in CASES
               if probe == "unused")


def test_a_field_may_declare_that_it_takes_infinity_or_repeats():
    @dataclasses.dataclass
    class Options:
        horizon: float = field(default=1.0, metadata={"infinite": True})
        times: list[float] = field(default_factory=lambda: [0.0, 1.0], metadata={"repeats": True})
        plain: list[float] = field(default_factory=lambda: [0.0, 1.0])
        matrix: typing.Any = field(default_factory=lambda: [[1.0, 0.0], [0.0, 1.0]])

    options = typed(Options, {"horizon": math.inf, "times": [1.0, 1.0]}, "experiment.options.")
    assert options.horizon == math.inf and options.times == [1.0, 1.0]
    assert typed(Options, {"horizon": -math.inf}, "experiment.options.").horizon == -math.inf
    with pytest.raises(ConfigError, match=r"^experiment\.options\.horizon must be a number, inf or -inf, got nan\.$"):
        typed(Options, {"horizon": math.nan}, "experiment.options.")
    with pytest.raises(ConfigError, match=r"^experiment\.options\.plain holds 1\.0 twice; give each value once\.$"):
        typed(Options, {"plain": [1, 1.0]}, "experiment.options.")
    with pytest.raises(ConfigError, match=r"^experiment\.options\.plain holds 2\.0 3 times; give each value once\.$"):
        typed(Options, {"plain": [2.0, 2.0, 2.0]}, "experiment.options.")
    # A matrix (an untyped field) repeats its numbers freely, and holds finite ones only.
    assert typed(Options, {"matrix": [[1.0, 1.0], [1.0, 1.0]]}, "experiment.options.").matrix[0] == [1, 1]
    with pytest.raises(ConfigError, match=r"^experiment\.options\.matrix must hold a finite number in each place, "
                                          r"got inf in \[\[1\.0, inf\], \[0\.0, 1\.0\]\]\.$"):
        typed(Options, {"matrix": [[1.0, math.inf], [0.0, 1.0]]}, "experiment.options.")


def test_a_panel_key_that_repeats_a_value_is_refused():
    """`d=[8,8]` in the phase diagram: two panels d=8, one reported twice."""
    with pytest.raises(ConfigError, match=r"^d holds 8 twice; give each value once \(each is a panel\)\.$"):
        check_experiment(compose_experiment("phase_diagram", {"d": [8, 8]}))


NT = ["experiment=noise_transition", "experiment.options.ratios=[0.8,1.2,1.5]", "experiment.options.members=null",
      "members=2", "t1=0.46875", "saves=5", "plot=false"]


@pytest.mark.parametrize("args, says", [
    ([*NT, "experiment.options.sizes=[8]", "experiment.options.disordered_from=nan"],
     "experiment.options.disordered_from must be a finite number, got nan."),
    ([*NT, "experiment.options.sizes=[8,8]"], "experiment.options.sizes holds 8 twice; give each value once."),
    (["experiment=hardmax_sinkhorn", "n=6", "members=2", "beta=[1,4]", "t1=0.5", "saves=3",
      "experiment.options.polygons=1", "experiment.options.interior=4", "experiment.options.kgon_t1=inf", "plot=false"],
     "experiment.options.kgon_t1 must be a finite number, got inf."),
], ids=["2-nan-disordered_from", "3-a-panel-twice", "15-infinite-kgon_t1"])
def test_the_issues_cases_are_refused_by_the_command_before_computing(args, says, tmp_path):
    run = tmp_path / "run"
    proc = attnflow(*args, f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert assert_one_error_line(proc) == f"attnflow: error: {says}"
    # refused while checking: nothing solved, no folder taken
    assert not run.exists(), sorted(p.name for p in run.iterdir())
