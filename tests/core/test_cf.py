"""Results files that describe themselves (the CF conventions, version 1.11): every
variable and coordinate has a long name and, when it holds numbers, units; the global
attributes say the conventions, what wrote the file and when (the command line, or the
Python call), attnflow's version, and every scalar setting beside the full config.

Every experiment's Dataset goes through the same `describe` before it is returned or
written, and `describe` refuses a variable that says nothing of what it is: the tests
that run each experiment (tests/experiments, tests/analysis, ...) fail on one."""

from __future__ import annotations

import re
from importlib.metadata import version

import numpy as np
import pytest
import xarray as xr
import yaml

import attnflow as af
from attnflow.storage._cf import UndescribedError, describe, dimension_name, scalar_settings, undescribed
from commands import command, load  # noqa: F401 (the fixture)

TINY = ["n=4", "members=2", "t1=1", "dt=0.1", "saves=3", "beta=[1,2]", "save_states=true", "plot=false",
        "compilation_cache=false"]
ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00"


def assert_described(ds: xr.Dataset) -> None:
    """Every variable and coordinate: a long name, and units when it holds numbers."""
    assert undescribed(ds) == []
    for name, da in [*ds.coords.items(), *ds.data_vars.items()]:
        assert da.attrs["long_name"], name
        if da.dtype.kind not in "OSU":
            assert isinstance(da.attrs["units"], str) and da.attrs["units"], name


def test_a_run_from_the_command_line_writes_a_cf_file_that_plot_reads_old_or_new(command, tmp_path):
    run = tmp_path / "run"
    code, err = command(*TINY, f"hydra.run.dir={run}")
    assert code == 0, err
    ds = load(run / "results.nc")
    assert_described(ds)
    for coordinate in ("beta", "member", "time"):
        assert ds[coordinate].attrs["units"] == "1"
    assert "depth-time" in ds["time"].attrs["long_name"]
    assert ds["energy"].attrs["units"] == "1" and "interaction energy" in ds["energy"].attrs["long_name"]
    assert ds.attrs["Conventions"] == "CF-1.11"
    assert ds.attrs["attnflow_version"] == version("attnflow")
    assert re.fullmatch(f"{ISO} attnflow n=4 members=2 .* hydra.run.dir={run}", ds.attrs["history"])
    assert ds.attrs["title"] and ds.attrs["source"].startswith("attnflow ")
    # Every scalar setting of the config, beside the full config (null ones left to it).
    config = yaml.safe_load(ds.attrs["config"])
    assert (ds.attrs["n"], ds.attrs["d"], ds.attrs["cluster_eps"], ds.attrs["dt"]) == (4, 3, 0.01, 0.1)
    assert (ds.attrs["solver"], ds.attrs["attention_kind"], ds.attrs["weights_v_kind"]) == ("euler_renorm", "sa", "identity")
    assert ds.attrs["save_states"] == 1 and "save_states" in ds.attrs["boolean_settings"].split()
    assert "alibi" not in ds.attrs
    assert set(scalar_settings(config)) <= set(ds.attrs)

    # A file written before the CF attributes (and its `attnflow plot`): still drawn.
    old = tmp_path / "old"
    bare = ds.copy()
    bare.attrs = {"config": ds.attrs["config"]}
    for name in [*bare.coords, *bare.data_vars]:
        bare[name].attrs = {}
    af.write_results(bare, old / "results.nc")
    code, err = command("plot", str(old))
    assert code == 0, err
    assert (old / "summary.png").stat().st_size > 0


def test_the_python_api_names_its_call_in_history():
    ds = af.run({"n": 4, "members": 2, "t1": 1.0, "dt": 0.1, "saves": 3, "beta": 1.0, "compilation_cache": False})
    assert_described(ds)
    assert re.fullmatch(f"{ISO} attnflow.run\\(\\{{'n': 4, .*\\}}\\)", ds.attrs["history"])


def test_describe_fills_from_descriptions_and_refuses_a_variable_that_says_nothing():
    ds = xr.Dataset({"energy": (("member",), np.ones(2)),
                     "gap": (("member",), np.ones(2), {"description": "spectral gap"}),
                     "angle": (("member",), np.ones(2), {"description": "an angle", "units": "radian"}),
                     "label": (("member",), np.array(["a", "b"], dtype=object), {"description": "a label"})},
                    coords={"member": [0, 1]})
    describe(ds, title="t", config={"n": 4, "weights": {"v": {"kind": "tied"}}, "alibi": None}, history="h")
    assert_described(ds)
    assert ds["gap"].attrs == {"long_name": "spectral gap", "units": "1"}  # short: no description beside it
    assert ds["angle"].attrs["units"] == "radian"
    assert "units" not in ds["label"].attrs  # text takes no units
    assert ds["energy"].attrs["long_name"].startswith("interaction energy")  # from the metric registry
    assert ds.attrs["weights_v_kind"] == "tied" and "alibi" not in ds.attrs
    # a long description: a short long_name (its first clause), the prose kept
    long = xr.Dataset({"gap": (("member",), np.ones(2), {"description": "spectral gap: the distance of the two "
                                                         "largest eigenvalues of the averaged attention"})})
    describe(long, title="t", config={}, history="h")
    assert long["gap"].attrs["long_name"] == "spectral gap" and "eigenvalues" in long["gap"].attrs["description"]
    mystery = xr.Dataset({"mystery": (("member",), np.ones(2))}, coords={"token_rank": [0, 1]})
    with pytest.raises(UndescribedError, match="mystery, token_rank|token_rank, mystery"):
        describe(mystery, title="t", config={}, history="h")


def test_a_dotted_key_is_named_with_underscores():
    assert dimension_name("weights.v.kind") == "weights_v_kind"
    assert dimension_name("experiment.options.eps") == "experiment_options_eps"
    assert dimension_name("d") == "d"


def test_files_with_the_dimension_names_of_before_are_read_in_todays():
    """`attnflow plot` of a file written before the names were unified: each experiment
    whose names changed reads the old ones into today's (`current_layout`)."""
    from attnflow.experiments import checkpoint, diffeqformer_vs_gpt

    models = ["diffeqformer", "gpt"]
    old = xr.Dataset({"val_loss": (("model", "eval_step"), np.arange(6.0).reshape(2, 3)),
                      "exponent": (("sens_model", "token"), np.ones((2, 4))),
                      "token_string": (("token",), np.array(list("abcd"), dtype=object)),
                      "spectral_variation": (("spectra_model", "head"), np.zeros((2, 2))),
                      "weight_norm": (("theory_model", "tau"), np.full((2, 5), 2.0))},
                     coords={"model": models, "sens_model": models, "spectra_model": models, "theory_model": models})
    new = diffeqformer_vs_gpt.current_layout(old)
    assert set(new.dims) == {"model", "eval_step", "token", "head", "tau"} and "token_string" in new.coords
    for name in ("val_loss", "exponent", "spectral_variation", "weight_norm"):
        np.testing.assert_array_equal(new[name].values, old[name].values)

    depth = 3
    before = xr.Dataset({"hidden": (("layer", "token", "dim"), np.zeros((depth + 1, 2, 4))),
                         "attention": (("block", "head", "query", "key"), np.ones((depth, 1, 2, 2))),
                         "token_string": (("token",), np.array(["a", "b"], dtype=object)),
                         "spectra_qk": (("spectra_layer", "spectra_head"), np.ones((depth, 1)))},
                        coords={"layer": np.arange(depth + 1), "block": np.arange(1, depth + 1),
                                "spectra_layer": np.arange(depth)})
    now = checkpoint.current_layout(before)
    assert now["hidden"].dims == ("depth", "token", "dim") and now["attention"].dims[0] == "layer"
    assert list(now["layer"].values) == [0, 1, 2] and "token_string" in now.coords
    assert checkpoint._unprefixed(now, "spectra")["qk"].dims == ("layer", "head")
