"""Code of a researcher's own, named from the command line: it runs in a real process from
a folder outside the package (PYTHONPATH), it is imported only from names the user gives
(never because a results file names it), and an edit of it is never mixed with results or
compiled programs of the code before (its source digest)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from commands import ATTNFLOW, command, load  # noqa: F401 (command: a fixture)

import attnflow as af
from attnflow.schema._errors import ConfigError

TERM = '''
import jax.numpy as jnp
from jaxtyping import Array, Float
import attnflow


class Spin(attnflow.AbstractInteraction):
    """dx/dt = speed * (-x2, x1, 0): a rotation about the third axis."""

    speed: Float[Array, ""] = 1.0

    def __call__(self, t, x):
        return self.speed * jnp.stack([-x[:, 1], x[:, 0], jnp.zeros_like(x[:, 0])], axis=-1) * FACTOR


FACTOR = 1.0
'''

# A module whose import leaves a mark: were attnflow to import it because a file names it.
EVIL = '''
from pathlib import Path
Path(__file__).with_name("IMPORTED").write_text("imported")

import attnflow


class Evil(attnflow.AbstractInteraction):
    def __call__(self, t, x):
        return x
'''

RUN = ["n=6", "d=3", "members=2", "t1=1", "dt=0.1", "saves=3", "beta=1", "plot=false", "attention=false"]


def env_with(folder: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(folder), "JAX_PLATFORMS": "cpu"}


def test_a_user_term_runs_from_its_own_folder_in_a_real_process(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "spinning.py").write_text(textwrap.dedent(TERM))
    out = tmp_path / "run"
    proc = subprocess.run([str(ATTNFLOW), *RUN, "save_states=true", "+terms.spin._target_=spinning.Spin",
                           "+terms.spin.speed=2.0", f"hydra.run.dir={out}"], env=env_with(code), cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    ds = load(out / "results.nc")
    x = ds["x"].values
    angle = np.arctan2(x[..., 1], x[..., 0])
    turned = np.angle(np.exp(1j * (angle[:, -1] - angle[:, 0])))
    # euler_renorm: each step turns the x1-x2 plane by exactly arctan(speed dt).
    np.testing.assert_allclose(turned, 10 * np.arctan(0.2), atol=1e-5)
    # Without the folder on the import path: one sentence, nothing run.
    proc = subprocess.run([str(ATTNFLOW), *RUN, "+terms.spin._target_=spinning.Spin", f"hydra.run.dir={out}-2"],
                          env={**os.environ, "JAX_PLATFORMS": "cpu"}, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "PYTHONPATH" in lines[0], proc.stderr
    assert not (tmp_path / "run-2").exists()


def test_plot_and_report_never_import_code_a_results_file_names(tmp_path, command):
    code = tmp_path / "code"
    code.mkdir()
    (code / "evil.py").write_text(textwrap.dedent(EVIL))
    run = tmp_path / "run"
    ds = af.run({"n": 4, "d": 3, "members": 2, "t1": 0.5, "dt": 0.1, "saves": 3})
    # A results file whose config names the module as a term, and as an experiment's class.
    ds.attrs["config"] = ds.attrs["config"].replace("terms: {}", "terms:\n  x:\n    _target_: evil.Evil")
    ds.attrs.update(experiment="crossing", experiment_target="evil.Evil")
    run.mkdir()
    ds.to_netcdf(run / "results.nc")
    sys.path.insert(0, str(code))  # importable, were anything to import it
    try:
        code_, lines = command("plot", str(run))
        assert code_ == 2 and "--config-dir" in lines[-1], lines
        assert command("report", str(run))[0] == 0
        # A config folder whose YAML names another class is refused too.
        folder = tmp_path / "cfg" / "experiment"
        folder.mkdir(parents=True)
        (folder / "crossing.yaml").write_text("experiment:\n  name: crossing\n  _target_: other.Class\n")
        code_, lines = command("plot", str(run), "--config-dir", str(tmp_path / "cfg"))
        assert code_ == 2 and "names the class 'other.Class'" in lines[-1], lines
    finally:
        sys.path.remove(str(code))
    assert not (code / "IMPORTED").exists()
    assert "evil" not in sys.modules


def test_an_experiment_of_ones_own_needs_its_config_folder(command, tmp_path):
    code_, lines = command("experiment=crossing")
    assert code_ == 2 and "unknown experiment 'crossing'" in lines[-1], lines


@pytest.fixture
def spinning(tmp_path):
    """The user's module, importable, and a way to edit it."""
    (tmp_path / "spinning_edit.py").write_text(textwrap.dedent(TERM))
    sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()

    def edit(factor: float):
        path = tmp_path / "spinning_edit.py"
        path.write_text(path.read_text().replace("FACTOR = ", f"FACTOR = {factor}  # ", 1))
        importlib.reload(sys.modules["spinning_edit"])

    yield edit
    sys.path.remove(str(tmp_path))
    sys.modules.pop("spinning_edit", None)


def test_an_edited_term_is_compiled_again_and_never_resumes_the_code_before(spinning, tmp_path):
    config = {"n": 6, "d": 3, "members": 4, "chunk_size": 2, "t1": 1.0, "dt": 0.1, "saves": 3, "beta": 1.0,
              "attention": False, "save_states": True, "terms": {"s": {"_target_": "spinning_edit.Spin"}}}
    pieces = tmp_path / "pieces"
    before = af.run(config, pieces=pieces)
    assert len(list(pieces.glob("piece-*.npz"))) == 2
    spinning(-1.0)  # the same config, other code: it spins the other way
    with pytest.raises(ConfigError, match="code_digest"):
        af.run(config, pieces=pieces)  # the pieces of the code before are refused
    after = af.run(config)  # and the program is compiled anew, not the one kept before
    assert before.attrs["code_digest"] != after.attrs["code_digest"]
    turned = [np.angle(np.exp(1j * np.diff(np.arctan2(ds["x"].values[..., 1], ds["x"].values[..., 0])[:, [0, -1]],
                                             axis=1))) for ds in (before, after)]
    np.testing.assert_allclose(turned[0], 10 * np.arctan(0.1), atol=1e-5)  # euler_renorm's exact turn
    np.testing.assert_allclose(turned[1], -10 * np.arctan(0.1), atol=1e-5)  # the edit turns it the other way
    discarded = af.run({**config, "overwrite": True}, pieces=pieces)  # overwrite=true discards them
    xr.testing.assert_allclose(discarded["x"], after["x"])
