"""The keys renamed in attnflow 0.2.0 (issue 35; tests/README.md, section 18): the
scheme, the kind of attention and the clustering threshold (`attnflow.schema._config.RENAMED`,
the one table of the renames).

An old key is refused in one sentence that names the new one and gives the user's own
setting with it, wherever a user gives it: on the command line (set, added, forced,
deleted, swept; the study config of an experiment option), in an experiment YAML of a
config folder, from Python. A results file written before the renames is read as
today's: a rerun of its settings is skipped, `attnflow plot` draws the same figure,
`load_results` gives the config with the new names, `attnflow report` sees one key, the
pieces of an unfinished run resume. Such a file is one written now whose stored configs
and setting attributes get the old names back (`written_before`): a file that attnflow
0.1.0 wrote holds the same config text (checked when the renames were made).

No old name is spelt out here: each comes from `RENAMED`, so that the codemod that made
the renames (and is run again on branches merged after them) leaves this file alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml
from commands import command, load, one_sentence  # noqa: F401 (command: a fixture)

import attnflow as af
from attnflow import cli
from attnflow.running._build import resolve_study
from attnflow.schema._config import RENAMED, RENAMED_IN, current_config, defaults, to_container
from attnflow.schema._errors import ConfigError
from attnflow.presentation._plots import plot_summary, summary_title
from attnflow.presentation._report import report
from attnflow.storage._store import RunDirectory
from attnflow.running._study import plan_study, solve_study
from attnflow.experiments import compose_experiment, draw_experiment, run_experiment
from attnflow.experiments._common import config_of

OLD = {new: old for old, new in RENAMED.items()}
# A value of each key, a second one for a sweep, and the same as Python gives it.
VALUES = {"scheme": ("pre", "peri", "pre"), "attention_kind": ("usa", "sa", "usa"),
          "cluster_eps": ("0.05", "0.1", 0.05)}
TINY = ["n=4", "d=3", "members=2", "beta=1", "t1=0.2", "dt=0.1", "saves=2", "plot=false", "compilation_cache=false"]
SMALL = {"n": 4, "d": 3, "members": 6, "chunk_size": 2, "beta": [1.0, 2.0], "t1": 0.4, "dt": 0.1, "saves": 3,
         "plot": False, "compilation_cache": False}


def renamed(old: str, new: str, setting: str) -> str:
    return f"the key {old} was renamed {new} in attnflow {RENAMED_IN}; write {setting}."


def refused(result: tuple[int, list[str]], sentence: str) -> None:
    code, lines = result
    assert (code, lines) == (2, [f"attnflow: error: {sentence}"])


def written_before(config: dict) -> dict:
    """A config as an attnflow before the renames stored it: the old names at the top
    and in metastability's staircase, every other key as it is."""
    before = {OLD.get(key, key): value for key, value in config.items()}
    options = (before.get("experiment") or {}).get("options") or {}
    if isinstance(options.get("staircase"), dict):
        staircase = {OLD.get(key, key): value for key, value in options["staircase"].items()}
        before["experiment"] = {**before["experiment"], "options": {**options, "staircase": staircase}}
    return before


def write_before(path: Path) -> None:
    """Rewrite the results file `path` as an attnflow before the renames wrote it: its
    config, its panels' configs and the attributes of its top-level settings under the
    old names."""
    ds = load(path)
    ds.attrs["config"] = yaml.safe_dump(written_before(yaml.safe_load(ds.attrs["config"])), sort_keys=True)
    if "panel_configs" in ds.attrs:
        panels = yaml.safe_load(ds.attrs["panel_configs"])
        ds.attrs["panel_configs"] = yaml.safe_dump({k: written_before(v) for k, v in panels.items()}, sort_keys=True)
    for new, old in OLD.items():
        if new in ds.attrs:
            ds.attrs[old] = ds.attrs.pop(new)
    af.write_results(ds, path)
    assert f"\n{OLD['cluster_eps']}: " in load(path).attrs["config"]


# --- refused where a user gives them -------------------------------------------------


@pytest.mark.parametrize("new", list(VALUES))
@pytest.mark.parametrize("form", ["set", "add", "force", "delete", "sweep"])
def test_an_old_key_on_the_command_line_is_refused_naming_the_new_one(command, tmp_path, new, form):
    old, (value, other, _) = OLD[new], VALUES[new]
    given, setting = {
        "set": ([f"{old}={value}"], f"{new}={value}"),
        "add": ([f"+{old}={value}"], f"{new}={value}"),  # the key is there: + would be refused
        "force": ([f"++{old}={value}"], f"++{new}={value}"),
        "delete": ([f"~{old}"], f"~{new}"),
        "sweep": (["-m", f"{old}={value},{other}"], f"{new}={value},{other}"),
    }[form]
    multirun = given[:1] == ["-m"]
    refused(command(*given[:multirun], *TINY, *given[multirun:], f"hydra.run.dir={tmp_path / 'run'}",
                    f"hydra.sweep.dir={tmp_path / 'sweep'}"), renamed(old, new, setting))
    assert not (tmp_path / "run").exists() and not (tmp_path / "sweep").exists()


def test_an_old_key_of_an_options_study_config_is_refused_and_other_eps_are_not(command, tmp_path):
    old = OLD["attention_kind"]
    refused(command("experiment=metastability", f"experiment.options.staircase.{old}=usa"),
            renamed(f"experiment.options.staircase.{old}", "experiment.options.staircase.attention_kind",
                    "experiment.options.staircase.attention_kind=usa"))
    # The keys of the same last name that were not renamed pass the check: LayerNorm's
    # eps, the phase diagram's option (the level of its equiangular curve), and a
    # staircase key of an experiment that has no staircase.
    eps = OLD["cluster_eps"]
    for given in (["token_norm.eps=0.1"], ["experiment=phase_diagram", f"experiment.options.{eps}=0.01"],
                  ["experiment=circle", f"+experiment.options.staircase.{eps}=1"]):
        cli._check_command_line(given)


def test_an_old_key_in_an_experiment_yaml_of_a_config_folder_is_refused_naming_the_file(command, tmp_path):
    folder = tmp_path / "cfg" / "experiment"
    folder.mkdir(parents=True)
    mine = folder / "mine.yaml"
    mine.write_text(f"# @package _global_\nexperiment:\n  name: mine\n  _target_: my.Mine\n{OLD['scheme']}: pre\n")
    refused(command("--config-dir", str(tmp_path / "cfg"), "experiment=mine"),
            renamed(OLD["scheme"], "scheme", f"scheme: pre in {mine}"))
    staircase = folder / "steps.yaml"
    staircase.write_text("# @package _global_\nexperiment:\n  name: metastability\n  options:\n    staircase:\n"
                         f"      {OLD['cluster_eps']}: 1.0e-6\n")
    refused(command("--config-dir", str(tmp_path / "cfg"), "experiment=steps"),
            renamed(f"experiment.options.staircase.{OLD['cluster_eps']}", "experiment.options.staircase.cluster_eps",
                    f"cluster_eps: 1e-06 in {staircase}"))


@pytest.mark.parametrize("new", list(VALUES))
def test_an_old_key_from_python_is_refused_naming_the_new_one(new):
    old, value = OLD[new], VALUES[new][2]
    for call in (af.compose, af.run, af.validate_config):
        with pytest.raises(ConfigError) as error:
            call({old: value})
        assert one_sentence(error) == renamed(old, new, f"{new}={value}")
    with pytest.raises(ConfigError) as error:
        run_experiment("metastability", {"experiment": {"options": {"staircase": {old: value}}}})
    where = "experiment.options.staircase."
    assert one_sentence(error) == renamed(f"{where}{old}", f"{where}{new}", f"{where}{new}={value}")


# --- read as today's where they were stored --------------------------------------------


def test_a_stored_config_gets_the_new_names_and_no_other_key_changes():
    for config in (to_container(compose_experiment("metastability", {})),
                   to_container(compose_experiment("phase_diagram", {})), to_container(defaults())):
        before = written_before(config)
        assert before != config and before["token_norm"] == config["token_norm"]
        assert current_config(before) == config
        assert current_config(config) == config  # today's, as it is
    # The phase diagrams' option of the same last name is not the clustering threshold.
    phase = to_container(compose_experiment("phase_diagram", {}))
    assert current_config(written_before(phase))["experiment"]["options"] == {OLD["cluster_eps"]: 1e-3}
    assert current_config("not a mapping") == "not a mapping"


def test_a_run_written_before_is_skipped_redrawn_and_loaded_as_today(command, tmp_path):
    run = tmp_path / "run"
    settings = [*TINY, "cluster_eps=0.05", "scheme=sphere", f"hydra.run.dir={run}"]
    assert command(*settings)[0] == 0
    assert command("plot", str(run))[0] == 0
    today_png = (run / "summary.png").read_bytes()
    today = yaml.safe_load(load(run / "results.nc").attrs["config"])
    write_before(run / "results.nc")
    (run / "summary.png").unlink()
    code, _ = command(*settings)
    assert code == 0 and f"{run / 'results.nc'} already holds this run; skipping it." in command.out
    refused(command(*TINY, "cluster_eps=0.1", f"hydra.run.dir={run}"),
            f"{run / 'results.nc'} holds a different run; choose another hydra.run.dir or set overwrite=true.")
    assert command("plot", str(run))[0] == 0
    assert (run / "summary.png").read_bytes() == today_png  # its caption says scheme = sphere, cluster_eps = 0.05
    # The same figure from the file as xarray opens it (its config as stored), titled as
    # `attnflow plot` titles it.
    opened = xr.load_dataset(run / "results.nc")
    plot_summary(opened, tmp_path / "summary.png", title=summary_title(opened))
    assert (tmp_path / "summary.png").read_bytes() == today_png
    loaded = af.load_results(run / "results.nc")
    assert yaml.safe_load(loaded.attrs["config"]) == today
    assert loaded.attrs[OLD["cluster_eps"]] == 0.05  # the other attributes as stored


def test_a_sweep_written_before_reports_one_key(tmp_path):
    """Runs written before and after the renames, and a failed job whose overrides name
    the old key, differ in one key: the report names it once, by its new name."""
    for name, eps in (("0", 0.05), ("1", 0.1)):
        af.write_results(af.run({**SMALL, "cluster_eps": eps}), tmp_path / name / "results.nc")
    write_before(tmp_path / "0" / "results.nc")
    failed = tmp_path / "2"
    (failed / ".hydra").mkdir(parents=True)
    (failed / ".hydra" / "overrides.yaml").write_text(f"- {OLD['cluster_eps']}=0.2\n")
    (failed / "error.txt").write_text("the state became non-finite at t = 0.5.\n")
    _, reported = report(tmp_path)
    assert reported == "reported 2 runs in 5 rows (2 runs x 2 betas, 1 failed job; swept key cluster_eps)"
    with xr.open_dataset(tmp_path / "report.nc") as table:
        assert list(table["cluster_eps"].values) == [0.05, 0.05, 0.1, 0.1, 0.2]


def test_the_pieces_of_a_run_started_before_are_resumed_bit_for_bit(tmp_path):
    pieces = tmp_path / "run" / RunDirectory.PIECES / "."
    today = af.run({**SMALL, "cluster_eps": 0.05}, pieces=pieces)
    plan = pieces / "plan.txt"
    text = plan.read_text()
    config, _, tail = text.partition("\npieces: ")
    plan.write_text(f"{yaml.safe_dump(written_before(yaml.safe_load(config)), sort_keys=True)}\npieces: {tail}")
    # The run folder's check finds them this run's, and the run resumes from every piece.
    with RunDirectory(tmp_path / "run") as folder:
        assert folder.claim_pieces({".": config}, overwrite=False) is None
    found = []
    study = resolve_study({**SMALL, "cluster_eps": 0.05})
    ensemble = plan_study(study)
    resumed = solve_study(study, ensemble, pieces=pieces, on_resume=lambda done, total: found.append((done, total)))
    assert ensemble.pieces > 1 and found == [(ensemble.pieces, ensemble.pieces)] and plan.read_text() == text
    np.testing.assert_array_equal(resumed.to_xarray()["energy"].values, today["energy"].values)


def test_an_experiment_written_before_is_redrawn_as_today(command, tmp_path):
    """The phase diagram reads the clustering threshold from its stored config and the
    level of its curve from its option, which kept its name: the figure of the file
    written before is the figure of today's."""
    ds = run_experiment("phase_diagram", {"d": [2, 3], "members": 2, "beta": [1.0, 4.0], "t1": 2.0, "saves": 21,
                                          "cluster_eps": 0.02, "compilation_cache": False})
    for name in ("today", "before"):
        af.write_results(ds, tmp_path / name / "results.nc")
    write_before(tmp_path / "before" / "results.nc")
    before = xr.load_dataset(tmp_path / "before" / "results.nc")
    assert "cluster_eps" not in before.attrs["panel_configs"]
    assert config_of(before, "d=3") == config_of(ds, "d=3") and config_of(before, "d=3")["cluster_eps"] == 0.02
    for name in ("today", "before"):
        assert command("plot", str(tmp_path / name))[0] == 0
    # and from the file as xarray opens it (its configs as stored)
    draw_experiment(before, tmp_path)
    folders = (tmp_path / "today", tmp_path / "before", tmp_path)
    png = [(folder / "phase_diagram.png").read_bytes() for folder in folders]
    assert png[0] == png[1] == png[2]


def test_the_pieces_of_a_run_started_before_cross_attention_are_resumed(tmp_path):
    """A plan written before the `cross` group was added names no `cross`: the run that
    resumes it (cross-attention off, its default) reads every piece as its own."""
    pieces = tmp_path / "run" / RunDirectory.PIECES / "."
    today = af.run(SMALL, pieces=pieces)
    plan = pieces / "plan.txt"
    config, _, tail = plan.read_text().partition("\npieces: ")
    before = yaml.safe_load(config)
    del before["cross"]
    plan.write_text(f"{yaml.safe_dump(before, sort_keys=True)}\npieces: {tail}")
    found = []
    study = resolve_study(SMALL)
    ensemble = plan_study(study)
    resumed = solve_study(study, ensemble, pieces=pieces, on_resume=lambda done, total: found.append((done, total)))
    assert ensemble.pieces > 1 and found == [(ensemble.pieces, ensemble.pieces)]
    np.testing.assert_array_equal(resumed.to_xarray()["energy"].values, today["energy"].values)
