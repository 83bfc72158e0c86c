"""The experiment framework: every figure is a config plus a module, reachable from the
command line and from Python, checked before anything is computed, redrawn from its
`results.nc` alone. The figures' own properties are tested in their own files."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from commands import assert_ok, assert_one_error_line, attnflow, load

import attnflow as af
from attnflow.schema._config import config_source
from attnflow.schema._errors import ConfigError
from attnflow.experiments import (
    EXPERIMENTS,
    compose_experiment,
    draw_experiment,
    experiment_figures,
    experiment_module,
    plan_experiment,
    run_experiment,
)
from attnflow.experiments._experiment import panel_configs
from attnflow.experiments._runner import experiment_class

CONF = config_source()[1].joinpath("experiment")  # the shipped configs, installed or not
TINY = {"members": 2, "t1": 1.0, "dt": 0.1, "saves": 3, "compilation_cache": False}


def test_every_experiment_has_a_config_and_a_module_with_the_protocol():
    shipped = sorted(p.name[: -len(".yaml")] for p in CONF.iterdir() if p.name.endswith(".yaml"))
    assert shipped == sorted(EXPERIMENTS)
    for name in EXPERIMENTS:
        text = CONF.joinpath(f"{name}.yaml").read_text()
        assert text.startswith("# @package _global_"), name
        assert yaml.safe_load(text)["experiment"]["name"] == name
        module = experiment_module(name)
        kind = experiment_class(name)
        if kind.__module__ == module.__name__:  # the protocol as a class: its title, and the module's Options
            assert kind.title and kind.Options is module.Options, name
        else:  # a module of the earlier form, until every one is converted
            for attribute in ("TITLE", "PAPER", "Options", "analyse", "draw"):
                assert hasattr(module, attribute), (name, attribute)


def test_panel_keys_expand_lists_and_a_study_refuses_a_list():
    base = {"d": [2, 8], "n": 4}
    assert panel_configs(base, ("d",)) == {"d=2": {"d": 2, "n": 4}, "d=8": {"d": 8, "n": 4}}
    assert panel_configs({"d": 3}, ("d",)) == {"main": {"d": 3}}
    with pytest.raises(ConfigError, match=r"d=\[2, 8\] is a list: a study takes one dimension"):
        af.validate_config({"d": [2, 8]})
    with pytest.raises(ConfigError, match="d must be a whole number, got 2.5"):
        af.validate_config({"d": 2.5})


def test_beta_from_linspace_is_an_evenly_spaced_list():
    cfg = af.validate_config({"beta": "${linspace:0.1,9,90}"})
    np.testing.assert_allclose(cfg.beta, np.linspace(0.1, 9.0, 90), rtol=0, atol=0)
    assert cfg == af.validate_config({"beta": np.linspace(0.1, 9.0, 90).tolist()})
    with pytest.raises(ConfigError, match="beta holds an interpolation that cannot be resolved.*whole count"):
        af.validate_config({"beta": "${linspace:1,2,0}"})


def test_bad_experiment_input_is_one_sentence_before_any_computing():
    with pytest.raises(ConfigError, match="unknown experiment 'nope'; choose one of adaptive_depth, bouncing"):
        compose_experiment("nope")
    cfg = compose_experiment("single_cluster", {**TINY, "experiment": {"options": {"colour": 1}}})
    for run in (plan_experiment, af.run):  # attnflow.run runs an experiment's config too
        with pytest.raises(ConfigError, match="unknown option experiment.options.colour of experiment single_cluster"):
            run(cfg)
    with pytest.raises(ConfigError, match=r"experiment=single_cluster is run by attnflow.run or attnflow.run_exp"):
        af.validate_config(cfg)  # a single study's resolution
    with pytest.raises(ConfigError, match="unknown experiment 'nope'; choose one of adaptive_depth, bouncing"):
        af.run({"experiment": "nope"})


def test_experiment_options_are_the_defaults_with_the_given_ones_typed():
    from attnflow.experiments import experiment_options

    options = experiment_options("adaptive_depth", {"steps": [9, 12], "methods": ["full"]})
    assert options["steps"] == [9, 12] and options["finetune_steps"] == 200  # given, and a default
    assert [m.value if hasattr(m, "value") else m for m in options["methods"]] == ["full"]
    with pytest.raises(ConfigError, match=r"unknown option experiment.options.step of experiment adaptive_depth "
                                          r"\(did you mean steps\?\)"):
        experiment_options("adaptive_depth", {"step": [9]})
    with pytest.raises(ConfigError, match="experiment.options.methods"):
        experiment_options("adaptive_depth", {"methods": ["half"]})


def test_the_python_api_and_the_command_line_compose_the_same_config(tmp_path):
    # plotly_js says how to write the HTML view, not what the results are: not stored.
    proc = attnflow("experiment=single_cluster", "members=2", "t1=1", "dt=0.1", "saves=3", "compilation_cache=false",
                    "plotly_js=directory", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert_ok(proc)
    stored = load(tmp_path / "run" / "results.nc").attrs["config"]
    from attnflow.running._study import config_yaml

    assert stored == config_yaml(plan_experiment(compose_experiment("single_cluster", TINY)).cfg)
    assert "plotly_js" not in yaml.safe_load(stored)
    assert 'src="plotly.min.js"' in (tmp_path / "run" / "single_cluster.html").read_text()
    assert (tmp_path / "run" / "plotly.min.js").is_file()
    # Rerunning the same command finds the finished run; `attnflow plot` redraws it.
    again = attnflow("experiment=single_cluster", "members=2", "t1=1", "dt=0.1", "saves=3",
                     "compilation_cache=false", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert_ok(again)
    assert "already holds this run; skipping it" in again.stdout
    png = tmp_path / "run" / "single_cluster.png"
    png.unlink()
    redraw = attnflow("plot", str(tmp_path / "run"), cwd=tmp_path)
    assert_ok(redraw)
    assert png.exists()


def test_run_takes_an_experiments_config_as_run_experiment_does(tmp_path):
    """`attnflow.run` runs a config that names an experiment (its missing keys from the
    experiment's config, as the command line composes them) and returns what
    `run_experiment` returns; the config stored in its results runs it again."""
    expected = run_experiment("single_cluster", TINY)
    for config in ({"experiment": "single_cluster", **TINY},
                   {"experiment": {"name": "single_cluster"}, **TINY},
                   yaml.safe_load(expected.attrs["config"])):
        ds = af.run(config)
        assert ds.attrs["history"].endswith(")") and "attnflow.run(" in ds.attrs["history"]
        assert list(ds.variables) == list(expected.variables)
        for name in ds.variables:
            np.testing.assert_array_equal(ds[name].values, expected[name].values)
            assert ds[name].attrs.keys() == expected[name].attrs.keys(), name
        assert {k: v for k, v in ds.attrs.items() if k != "history"} == {
            k: v for k, v in expected.attrs.items() if k != "history"}


def test_experiment_errors_from_the_command_line_are_one_line(tmp_path):
    line = assert_one_error_line(attnflow("experiment=nope", cwd=tmp_path))
    assert "unknown experiment 'nope'" in line
    line = assert_one_error_line(attnflow("plot", str(tmp_path / "missing"), cwd=tmp_path))
    assert "does not exist" in line and line.endswith("to plot.")


def test_run_experiment_returns_what_draw_needs(tmp_path):
    import matplotlib
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    ds = run_experiment("single_cluster", TINY)
    assert ds.attrs["experiment"] == "single_cluster"
    assert set(yaml.safe_load(ds.attrs["panel_configs"])) == {"main"}
    # Drawing returns figures and leaves the user's backend (svg here, not attnflow's
    # Agg), rcParams and pyplot alone.
    plt.switch_backend("svg")
    try:
        backend, params = matplotlib.get_backend(), dict(matplotlib.rcParams)
        figures = experiment_figures(ds)
        assert list(figures) == ["single_cluster"] and isinstance(figures["single_cluster"], Figure)
        # Drawn in attnflow's style all the same (its 8 pt tick labels).
        assert figures["single_cluster"].axes[1].xaxis.get_ticklabels()[0].get_fontsize() == 8
        # The figures, the GIF (matplotlib's animation) and the HTML view, plotly.js beside it.
        paths = draw_experiment(ds, tmp_path, plotly_js="directory")
        assert matplotlib.get_backend() == backend
        assert dict(matplotlib.rcParams) == params
        assert plt.get_fignums() == []
    finally:
        plt.switch_backend("agg")
    assert {p.suffix for p in paths} >= {".png", ".pdf"}
    assert all(p.exists() and p.stat().st_size > 0 for p in paths)
    assert {p.name for p in paths} == {"single_cluster.png", "single_cluster.pdf", "single_cluster.gif",
                                       "single_cluster.html", "plotly.min.js"}
    # One shared plotly.js (several MB) and a page that loads it and stays small (the
    # default, plotly.js inside the page, is test_single_cluster's).
    script, page = tmp_path / "plotly.min.js", (tmp_path / "single_cluster.html").read_text()
    assert 'src="plotly.min.js"' in page and "Plotly.newPlot" in page
    assert len(page) < 100_000 < script.stat().st_size / 10
    with pytest.raises(ConfigError, match="plotly_js='cdn' is not a choice; give one of embed, directory"):
        draw_experiment(ds, tmp_path, plotly_js="cdn")


def test_progress_counts_pieces_and_draws_only_when_asked(capsys):
    from attnflow.running._progress import Progress

    with Progress("quiet", 3, show=False) as bar:
        for _ in range(3):
            bar.advance()
    assert bar.done == 3
    assert capsys.readouterr().err == ""
    with Progress("phase diagram", 4, show=True) as bar:
        for _ in range(4):
            bar.advance()
    err = capsys.readouterr().err
    assert "phase diagram" in err and "4/4" in err
