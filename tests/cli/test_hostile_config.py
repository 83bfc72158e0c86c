"""A hostile user's command lines (issue 18): keys the schema lacks, booleans that are
numbers, a bad value in one job of a sweep, experiment options that index, group
options that are paths, deleted and repeated keys, absurd sweeps, non-ASCII values.

Refusals come before anything is computed, so most cases run `attnflow.cli.main` in
this process (`command`, from tests/cli/test_cli.py); the sweeps run as subprocesses, the way their
launchers run them. tests/README.md, section 17.4, lists the cases.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf
from commands import attnflow, command, load  # noqa: F401 (command: a fixture)

from attnflow.schema._config import Config, compose, config_source
from attnflow.schema._errors import ConfigError
from attnflow.experiments import EXPERIMENTS, compose_experiment, experiment_module, plan_experiment
from attnflow.experiments._runner import default_options

TINY = ["n=4", "d=3", "members=2", "beta=1", "t1=0.2", "dt=0.1", "saves=2", "plot=false"]


def refused(result: tuple[int, list[str]], *says: str) -> str:
    """Exit 2 with one `attnflow: error:` line saying each of `says`."""
    code, lines = result
    assert code == 2 and len(lines) == 1 and lines[0].startswith("attnflow: error: "), (code, lines)
    for part in says:
        assert part in lines[0], lines[0]
    return lines[0]


# --- 2. a key the schema lacks, added with + -------------------------------------------


@pytest.mark.parametrize("args, says", [
    (["+mlp.enabld=true"], ["unknown config key mlp.enabld", "did you mean mlp.enabled?"]),
    (["++mlp.enabld=true"], ["unknown config key mlp.enabld", "did you mean mlp.enabled?"]),
    (["mlp.enabld=true"], ["unknown config key mlp.enabld", "did you mean mlp.enabled?"]),
    (["+bta=2"], ["unknown config key bta", "did you mean beta?"]),
    (["experiment=single_cluster", "+weights.q.scal=2"], ["unknown config key weights.q.scal",
                                                          "did you mean weights.q.scale?"]),
    (["experiment=single_cluster", "+experiment.options.membr=1"], ["experiment.options.membr",
                                                                   "did you mean member?"]),
    (["experiment=single_cluster", "+experiment.nme=x"], ["unknown config key experiment.nme",
                                                          "did you mean experiment.name?"]),
])
def test_a_key_the_schema_lacks_is_refused_with_the_nearest_name(command, tmp_path, args, says):
    refused(command(*TINY, *args, f"hydra.run.dir={tmp_path / 'run'}"), *says)
    assert not (tmp_path / "run" / "results.nc").exists()


# --- 3. booleans are true or false ------------------------------------------------------


def boolean_keys(schema: type = Config, prefix: str = "") -> list[str]:
    """Every boolean of the schema, as a dotted key."""
    keys = []
    for name, kind in typing.get_type_hints(schema).items():
        if kind is bool:
            keys.append(prefix + name)
        elif dataclasses.is_dataclass(kind):
            keys.extend(boolean_keys(kind, f"{prefix}{name}."))
    return keys


def nested(key: str, value) -> dict:
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


def test_the_schema_has_the_booleans_this_file_checks():
    assert len(boolean_keys()) >= 17 and "weights.v.transpose" in boolean_keys()


@pytest.mark.parametrize("key", boolean_keys())
def test_a_boolean_is_true_or_false_and_nothing_else(key):
    for value in (2, 0, 1, 1.0, "1", "y", "n", "maybe", [True]):
        with pytest.raises(ConfigError, match=rf"^{key} must be true or false, got {value!r}\.$".replace("[", r"\[")):
            compose(nested(key, value))
    for value, read in ((True, True), ("yes", True), ("On", True), ("off", False), ("FALSE", False)):
        cfg = compose(nested(key, value))
        for part in key.split("."):
            cfg = getattr(cfg, part)
        assert cfg is read, (key, value)


def test_a_boolean_on_the_command_line_and_in_experiment_options(command, tmp_path):
    refused(command(*TINY, "causal=2", f"hydra.run.dir={tmp_path / 'run'}"), "causal must be true or false, got 2.")
    cfg = compose_experiment("checkpoint", {"experiment": {"options": {"probes": 2}}})
    with pytest.raises(ConfigError, match=r"^experiment.options.probes must be true or false, got 2\.$"):
        plan_experiment(cfg)


# --- 10. a bad value in one job of a sweep ----------------------------------------------


@pytest.mark.parametrize("launcher", [[], ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]],
                         ids=["basic", "joblib"])
def test_a_type_error_in_a_sweep_fails_its_own_job_only(tmp_path, launcher):
    if launcher:
        pytest.importorskip("hydra_plugins.hydra_joblib_launcher", reason="pip install 'attnflow[joblib]'")
    sweep = tmp_path / "sweep"
    proc = attnflow("-m", *TINY, "causal=maybe,false", *launcher, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("attnflow: error: job 0 (") and "causal=maybe" in lines[0], proc.stderr
    assert lines[0].endswith("causal must be true or false, got 'maybe'."), proc.stderr
    assert lines[-1].startswith("attnflow: error: 1 of 2 jobs failed: job 0 ("), proc.stderr
    assert len(lines) == 2, proc.stderr
    assert load(sweep / "1" / "results.nc").attrs["config"].count("causal: false") == 1
    assert not (sweep / "0" / "results.nc").exists()
    assert "causal must be true or false" in (sweep / "0" / "error.txt").read_text()


# --- 11. experiment options ---------------------------------------------------------------


MEMBER = [name for name in EXPERIMENTS if "member" in default_options(experiment_module(name))]


@pytest.mark.parametrize("name", MEMBER)
def test_an_option_that_indexes_is_checked_before_computing(name):
    cfg = compose_experiment(name, {"members": 8})
    optional = default_options(experiment_module(name))["member"] is None
    # Typed by the experiment's Options schema ("1" reads as 1, as the study's integers do),
    # then range-checked by the experiment.
    for member in [8, -1, True, 1.5, "one"] + ([] if optional else [None]):
        options = {**cfg.experiment.options, "member": member} if cfg.experiment.options else {"member": member}
        bad = dataclasses.replace(cfg, experiment=dataclasses.replace(cfg.experiment, options=options))
        with pytest.raises(ConfigError, match=r"experiment\.options\.member must be") as info:
            plan_experiment(bad)
        assert repr(member) in str(info.value), str(info.value)


def test_every_experiment_config_declares_its_options():
    # What `experiment.options.KEY=...` (without +) overrides: the experiment's config
    # holds every option with the module's default.
    folder = config_source()[1].joinpath("experiment")
    for name in EXPERIMENTS:
        declared = yaml.safe_load(folder.joinpath(f"{name}.yaml").read_text())["experiment"].get("options") or {}
        assert declared == default_options(experiment_module(name)), name


def test_the_documented_option_form_works_and_a_misspelt_option_is_refused(command, tmp_path):
    small = ["members=2", "t1=0.02", "dt=0.01", "saves=2", "plot=false", "dtype=float32"]
    code, lines = command("experiment=single_cluster", "experiment.options.member=1", *small,
                          f"hydra.run.dir={tmp_path / 'run'}")
    assert code == 0, lines
    stored = yaml.safe_load(load(tmp_path / "run" / "results.nc").attrs["config"])
    assert stored["experiment"]["options"] == {"member": 1}
    refused(command("experiment=single_cluster", "experiment.options.membr=1", *small,
                    f"hydra.run.dir={tmp_path / 'other'}"),
            "unknown config key experiment.options.membr", "did you mean experiment.options.member?")
    # An option that is an open mapping (settings of attnflow train) takes keys with +.
    refused(command("experiment=diffeqformer", "experiment.options.train.lr=0.001", f"hydra.run.dir={tmp_path / 'x'}"),
            "experiment.options.train holds no keys by default; add one with +experiment.options.train.lr=VALUE.")


# --- 12. group options are names, never paths -------------------------------------------


@pytest.fixture
def foreign(tmp_path) -> tuple[Path, Path]:
    """A YAML file outside the package whose Hydra callback would create `marker`."""
    marker = tmp_path / "marker"
    evil = tmp_path / "elsewhere" / "evil.yaml"
    evil.parent.mkdir()
    evil.write_text("# @package _global_\n" + yaml.safe_dump({
        "experiment": {"name": "single_cluster"}, "n": 3, "members": 2, "t1": 0.02, "dt": 0.01, "saves": 2,
        "plot": False, "dtype": "float32",
        "hydra": {"callbacks": {"evil": {"_target_": "os.makedirs", "name": str(marker)}}}}))
    return evil.with_suffix(""), marker


@pytest.mark.parametrize("group", ["experiment", "init", "hydra/launcher"])
def test_a_group_option_is_a_shipped_name_never_a_path(command, tmp_path, foreign, group):
    evil, marker = foreign
    conf = Path(str(config_source()[1]))
    relative = os.path.relpath(evil, conf / group)
    for value in (relative, str(evil)):
        line = refused(command(*TINY, f"{group}={value}", f"hydra.run.dir={tmp_path / 'run'}"), repr(value))
        if group != "hydra/launcher":
            shipped = sorted(p.name[:-5] for p in (conf / group).iterdir() if p.name.endswith(".yaml"))
            assert line.endswith(f"unknown {group} {value!r}; choose one of {', '.join(shipped)}."), line
        assert not marker.exists()
    # In a sweep too, before any job runs.
    line = refused(command("-m", *TINY, f"init=caps,{relative}", f"hydra.sweep.dir={tmp_path / 'sweep'}"),
                   f"unknown init {relative!r}")
    assert not marker.exists() and not (tmp_path / "sweep").exists() and not (tmp_path / "run").exists()


def test_a_name_that_climbs_out_of_its_group_is_refused(command, tmp_path):
    line = refused(command(*TINY, "experiment=../config", f"hydra.run.dir={tmp_path / 'run'}"),
                   "unknown experiment '../config'; choose one of adaptive_depth, bouncing,")
    assert "choose one of ." not in line


# --- beyond the listed cases ------------------------------------------------------------


@pytest.mark.parametrize("args, says", [
    (["~t1"], ["t1 has no value; give it one."]),
    (["~init"], ["init has no value; give it one."]),
    (["~mlp.bias"], ["mlp.bias has no value; give it one."]),
    (["n=3", "n=4"], ["n is given twice (n=3, n=4); give it once."]),
    (["init=caps", "init=mixture"], ["init is given twice (init=caps, init=mixture)"]),
    (["text=日本語"], ["text=日本語", "quotes", "\"text='日本語'\""]),
    (["beta={a:1}"], ["beta cannot be a mapping"]),
    (["alibi={a:1}"], ["alibi cannot be a mapping, got {'a': 1}."]),
    (["experiment="], ["unknown experiment ''; choose one of adaptive_depth,"]),
])
def test_deleted_repeated_unquoted_and_mistyped_keys_are_refused(command, tmp_path, args, says):
    keys = {arg.lstrip("~+").split("=")[0] for arg in args}
    tiny = [arg for arg in TINY if arg.split("=")[0] not in keys]
    refused(command(*tiny, *args, f"hydra.run.dir={tmp_path / 'run'}"), *says)
    assert not (tmp_path / "run" / "results.nc").exists()


def test_values_of_every_kind_are_checked_and_quoted_non_ascii_text_is_kept():
    for key, value, says in [
        ("n", 1.5, "n must be an integer, got 1.5."), ("n", "", "n must be an integer, got ''."),
        ("t1", "abc", "t1 must be a number, got 'abc'."), ("dt", "", "dt must be a number or null, got ''."),
        ("metrics", "energy", "metrics must be a list of names among energy,"),
        ("solver", "RK4", "solver must be one of euler,"), ("weights", 3, "weights must be a mapping of shared,"),
    ]:
        with pytest.raises(ConfigError) as info:
            compose({key: value})
        assert str(info.value).startswith(says), str(info.value)
    assert compose({"text": "日本語 ✓"}).text == "日本語 ✓"
    # An interpolation is the user's own (their command line): it is resolved once, and
    # the resolved value is what a run stores.
    os.environ["ATTNFLOW_TEST_SENTENCE"] = "from the environment"
    assert compose({"text": "${oc.env:ATTNFLOW_TEST_SENTENCE}"}).text == "from the environment"


def test_a_sweep_too_large_to_list_is_refused_at_once(tmp_path):
    # Hydra would list the 200000 jobs and compose each one's config (a fraction of a
    # second each) before the first starts: hours without a word.
    proc = subprocess.run([sys.executable, "-m", "attnflow.cli", "-m", *TINY, "seed=range(0,100000)", "cluster_eps=0.1,0.2",
                           f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "200000 jobs" in lines[0], proc.stderr
    assert not (tmp_path / "sweep").exists()


def test_a_range_with_step_zero_is_refused(command, tmp_path):
    # Hydra raises a ValueError for whole numbers and counts floats for ever.
    for sweep in ("seed=range(0,10,0)", "cluster_eps=range(0.1,0.5,0)"):
        refused(command("-m", *TINY, sweep, f"hydra.sweep.dir={tmp_path / 'sweep'}"),
                f"{sweep} never ends: a range takes a step other than 0.")


def test_the_hydra_schema_names_the_same_keys_as_the_typed_one():
    from hydra.core.config_store import ConfigStore

    from attnflow.schema._config import INITS, register_schema

    register_schema()
    store = ConfigStore.instance()
    node = store.load("attnflow_schema/config.yaml").node
    assert list(node) == [f.name for f in dataclasses.fields(Config)]
    for name, cls in INITS.items():
        init = store.load(f"attnflow_schema/init_{name}.yaml").node
        assert list(init) == [f.name for f in dataclasses.fields(cls)] and init.kind == name
    assert OmegaConf.is_missing(node, "n")
