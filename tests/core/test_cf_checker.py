"""Every kind of file attnflow writes passes the CF checker: `cfchecks -v 1.8` (cfchecker
4.1.0, pinned in the test extra; it needs the udunits2 library, which .ci/run installs)
finds 0 errors and 0 warnings in a study, an experiment (a phase diagram; the checkpoint
experiment with its probes, whose files held attribute names with ':', text variables
and a text coordinate), and a report of a sweep over a list-valued key (its column of
lists crashed the checker). The files declare the CF version they follow (CF-1.11),
which no checker knows yet: each is checked as a copy that declares CF-1.8. The
checker's tables (standard names, area types, regions) would be downloaded: small
offline ones ship in tests/cf_tables (attnflow uses no standard name, area type or
region).

Beside the checker: every `long_name` is at most `LONG_NAME_LIMIT` characters (the
prose in `description`), and a boolean setting reads back as its truth."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import netCDF4
import numpy as np
import pytest
import xarray as xr

from attnflow.presentation._report import report
from attnflow.storage._cf import CONVENTIONS, LONG_NAME_LIMIT, setting_value, short_name
from commands import command, load  # noqa: F401 (the fixture)

TABLES = Path(__file__).parents[1] / "cf_tables"
CFCHECKS = Path(sys.executable).with_name("cfchecks")
TINY = ["n=4", "members=2", "t1=1", "dt=0.1", "saves=3", "beta=[1,2]", "plot=false", "compilation_cache=false"]
CF_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def cf_counts(path: Path, tmp_path: Path) -> tuple[int, int, str]:
    """`cfchecks -v 1.8` on a copy of `path` that declares CF-1.8, with the offline
    tables: its errors, its warnings and what it printed. A crash of the checker fails."""
    assert CFCHECKS.exists(), "cfchecks is not installed: pip install '.[test]' (cfchecker==4.1.0)"
    copy = tmp_path / f"cf18-{path.parent.name}-{path.name}"
    shutil.copyfile(path, copy)
    with netCDF4.Dataset(copy, "a") as f:
        assert f.getncattr("Conventions") == CONVENTIONS  # what the file follows, declared as written
        f.setncattr("Conventions", "CF-1.8")
    tables = ["-s", TABLES / "standard-name-table.xml", "-a", TABLES / "area-type-table.xml",
              "-r", TABLES / "region-list.xml"]
    proc = subprocess.run([str(CFCHECKS), "-v", "1.8", *map(str, tables), str(copy)], capture_output=True, text=True,
                          timeout=120)
    out = proc.stdout + proc.stderr
    if "udunits" in out.lower() and "Traceback" in out:
        pytest.fail("cfchecker needs the udunits2 library: apt-get install libudunits2-0 (.ci/run installs it)")
    assert "Traceback" not in out, out
    errors = re.search(r"ERRORS detected: (\d+)", out)
    warnings = re.search(r"WARNINGS given: (\d+)", out)
    assert errors and warnings, out
    return int(errors.group(1)), int(warnings.group(1)), out


def assert_cf(path: Path, tmp_path: Path) -> xr.Dataset:
    """The file passes the checker, its names are CF names, its long names short."""
    errors, warnings, out = cf_counts(path, tmp_path)
    assert (errors, warnings) == (0, 0), out
    ds = load(path)
    assert all(CF_NAME.fullmatch(str(name)) for name in [*ds.attrs, *ds.variables]), list(ds.attrs)
    for name, da in ds.variables.items():
        assert len(da.attrs["long_name"]) <= LONG_NAME_LIMIT, (name, da.attrs["long_name"])
        if "description" in da.attrs:
            assert len(da.attrs["description"]) > len(da.attrs["long_name"]), name
    return ds


def test_a_study_passes_the_checker_with_short_long_names_and_booleans_that_read_true(command, tmp_path):
    run = tmp_path / "study"
    code, err = command(*TINY, "save_states=true", "causal=false", "time_change.speed=2", f"hydra.run.dir={run}")
    assert code == 0, err
    ds = assert_cf(run / "results.nc", tmp_path)
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
    ds = assert_cf(run / "results.nc", tmp_path)
    assert "flag_values" not in ds["failed_members"].attrs  # a count, not the flags of `status`


def test_the_checkpoint_experiment_with_its_probes_passes_the_checker(command, tmp_path):
    run = tmp_path / "checkpoint"
    code, err = command("experiment=checkpoint", "checkpoint=minilm", "text=The cat sat.",
                        "experiment.options.steps=[1,2]", "plot=false", "compilation_cache=false",
                        f"hydra.run.dir={run}")
    assert code == 0, err
    ds = assert_cf(run / "results.nc", tmp_path)
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
    ds = assert_cf(sweep / "report.nc", tmp_path)
    assert sorted(set(ds["weights_v_factors"].values)) == ["[1.0, -1.0]", "[2.0, -1.0]"]
    assert_cf(sweep / "0" / "results.nc", tmp_path)


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
