"""Every kind of file attnflow writes passes the CF checker: `cfchecks -v 1.8` (cfchecker
4.1.0, pinned in the test extra; it needs the udunits2 library, which .ci/run installs)
finds 0 errors and 0 warnings in a study, an experiment (a phase diagram; the checkpoint
experiment with its probes, whose files held attribute names with ':', text variables
and a text coordinate), and a report of a sweep over a list-valued key (its column of
lists crashed the checker). The files declare the CF version they follow (CF-1.11),
which no checker knows yet: each is checked as a copy that declares CF-1.8
(`commands.assert_cf`, which also checks the names and the length of the long names).
Every other experiment's file is checked in the test that already runs that experiment
(tests/experiments, tests/analysis/test_metastability.py,
tests/diffeqformer/test_diffeqformer_studies.py, tests/checkpoints), on the file it writes.

Beside the checker: every `long_name` is at most `LONG_NAME_LIMIT` characters (the
prose in `description`), and a boolean setting reads back as its truth."""

from __future__ import annotations

import netCDF4
import numpy as np
from checkpoint_models import write_tiny, write_word_tokenizer
from commands import assert_cf, command, load  # noqa: F401 (the fixture)

from attnflow.presentation._report import report
from attnflow.storage._cf import setting_value, short_name

TINY = ["n=4", "members=2", "t1=1", "dt=0.1", "saves=3", "beta=[1,2]", "plot=false", "compilation_cache=false"]


def test_a_study_passes_the_checker_with_short_long_names_and_booleans_that_read_true(command, tmp_path):
    run = tmp_path / "study"
    code, err = command(*TINY, "save_states=true", "causal=false", "time_change.speed=2", f"hydra.run.dir={run}")
    assert code == 0, err
    (ds,) = assert_cf(tmp_path, run / "results.nc")
    # xarray's label for the time axis: short, the rest of the prose in `description`
    assert ds["time"].attrs["long_name"] == "rescaled time s, not t"
    assert "c = 2" in ds["time"].attrs["description"]
    assert ds["status"].attrs["long_name"] == "solve status" and "non-finite" in ds["status"].attrs["description"]
    # booleans: a byte each, 1 true and 0 false, named in `boolean_settings`
    assert bool(ds.attrs["save_states"]) is True and bool(ds.attrs["causal"]) is False
    with netCDF4.Dataset(run / "results.nc") as f:
        assert f.getncattr("causal").dtype == np.int8
    assert {"save_states", "causal", "adaptive"} <= set(ds.attrs["boolean_settings"].split())
    assert ds.attrs["boolean_meanings"] == "1 true, 0 false"
    assert "n" not in ds.attrs["boolean_settings"].split() and ds.attrs["n"] == 4
    assert [setting_value(v) for v in ("true", "false", np.int8(1), np.int8(0), 4, "rk4")] == [
        True, False, True, False, 4, "rk4"]


def test_an_experiment_passes_the_checker(command, tmp_path):
    run = tmp_path / "phase"
    code, err = command("experiment=phase_diagram", "d=[2,3]", "members=2", "beta=[1,4]", "t1=1", "n=4",
                        "plot=false", "compilation_cache=false", f"hydra.run.dir={run}")
    assert code == 0, err
    (ds,) = assert_cf(tmp_path, run / "results.nc")
    assert "flag_values" not in ds["failed_members"].attrs  # a count, not the flags of `status`


def test_the_checkpoint_experiment_with_its_probes_passes_the_checker(command, tmp_path):
    """On a tiny post-LN (BERT) checkpoint with a word tokenizer: the layout of every
    checkpoint's file (minilm's is the same; the tiny one costs a fraction of its run)."""
    folder = write_tiny("bert", tmp_path / "bert")
    write_word_tokenizer(folder, "bart")
    run = tmp_path / "checkpoint"
    code, err = command("experiment=checkpoint", f"checkpoint={folder}", "text=w5 w6 w7",
                        "experiment.options.steps=[1,2]", "plot=false", "compilation_cache=false",
                        f"hydra.run.dir={run}")
    assert code == 0, err
    (ds,) = assert_cf(tmp_path, run / "results.nc")
    # text variables and the text coordinate `run`, stored as characters, read back as text
    assert list(ds["run"].values) == ["dt=1", "dt=1/2", "theory"]
    assert ds["token_string"].dtype == object and all(isinstance(t, str) for t in ds["token_string"].values)
    assert ds.attrs["spectra__model"] and not any(":" in name for name in ds.attrs)


def test_a_report_of_a_sweep_over_a_list_passes_the_checker(command, tmp_path):
    sweep = tmp_path / "sweep"
    code, err = command("-m", "weights.v.factors=[1,-1],[2,-1]", "weights.v.switch_times=[0.5]", *TINY,
                        f"hydra.sweep.dir={sweep}")
    assert code == 0, err
    paths, _ = report(sweep)
    ds, _ = assert_cf(tmp_path, sweep / "report.nc", sweep / "0" / "results.nc")
    assert sorted(set(ds["weights_v_factors"].values)) == ["[1.0, -1.0]", "[2.0, -1.0]"]


def test_a_file_of_before_with_text_booleans_and_variable_length_strings_is_still_reported(command, tmp_path):
    """`attnflow report` and `plot` of a results file written before: booleans as the
    text "true"/"false", text as NetCDF-4 strings."""
    run = tmp_path / "runs" / "old"
    code, err = command(*TINY, f"hydra.run.dir={run}")
    assert code == 0, err
    ds = load(run / "results.nc")
    ds.attrs.update({name: "true" if ds.attrs[name] else "false" for name in ds.attrs["boolean_settings"].split()})
    del ds.attrs["boolean_settings"], ds.attrs["boolean_meanings"]
    for variable in ds.variables.values():
        variable.encoding = {}
    ds.to_netcdf(run / "results.nc", engine="netcdf4")  # the old layout: xarray's own defaults
    with netCDF4.Dataset(run / "results.nc") as f:
        assert f.getncattr("causal") == "false"
    assert setting_value(load(run / "results.nc").attrs["causal"]) is False
    paths, line = report(tmp_path / "runs")
    assert "reported 1 run" in line
    code, err = command("plot", str(run))
    assert code == 0, err


def test_a_long_name_is_the_prose_cut_at_its_first_clause_or_the_name():
    assert short_name("solve status: 0 reached t1; 1 the state became non-finite", "status") == "solve status"
    assert short_name("interaction energy E_beta = sum_ij exp(beta <x_i,x_j>) / (2 beta n^2)", "energy") == (
        "interaction energy E_beta")
    assert short_name("histogram of the pair cosines cos(x_i, x_j), i < j (fractions)", "pair_cosines") == (
        "pair cosines")
    assert short_name("token states", "x") == "token states"
