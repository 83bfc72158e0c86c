"""The parts of the field the study's own keys switch on (attention, the MLP) and the
initial conditions are components: one file each, in `attnflow/schema/system/` and
`attnflow/schema/initial/`, that the checks, the builder and the captions iterate over
(tests/README.md, "Components").

- A part registered in `PARTS` alone is checked, built into every member's field,
  refused where its keys do not apply, and described in the caption, with no other
  file touched: held here by a part that pulls every token toward a fixed direction,
  whose flow on the sphere has a closed form (tan(theta/2) shrinks as e^{-s t}).
- The builder and the captions name no part, no term class and no initial condition.
- The components are read without JAX (the schema, the help and `attnflow plot` read
  them).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import attnflow as af
from attnflow.schema._errors import ConfigError
from attnflow.presentation._plots import summary_figure
from attnflow.schema.initial import INITS
from attnflow.schema.system import PARTS, Part
from attnflow.terms.external_field import ExternalField

PACKAGE = Path(af.__file__).parent
S = {"n": 6, "d": 3, "members": 2, "t1": 1.0, "dt": 0.01, "saves": 5, "beta": 1.0, "dtype": "float64",
     "solver": "rk4", "attention": False, "save_states": True, "plot": False}


class Pull(Part):
    """A part of the test's own: every token pulled toward e_3 with strength 0.5 when
    the MLP is off and `mlp.scale` is 0.25 (keys the schema has, so that no schema file
    changes); `mlp.bias` does not apply to it."""

    name = "pull"

    @classmethod
    def enabled(cls, cfg):
        return not cfg.mlp.enabled and cfg.mlp.scale == 0.25

    @classmethod
    def check(cls, cfg, betas):
        if cls.enabled(cfg) and cfg.d < 3:
            raise ConfigError(f"the pull toward e_3 needs d >= 3, got d={cfg.d}.")

    @classmethod
    def unused(cls, cfg):
        return [("to the pull", [("mlp.bias", lambda c: c.mlp.bias)])] if cls.enabled(cfg) else []

    @classmethod
    def build(cls, cfg, get, key, beta, dtype, lib):
        return ExternalField(lib.jnp.eye(cfg.d, dtype=dtype)[2], lib.jnp.asarray(0.5, dtype))

    @classmethod
    def describe(cls, stored):
        mlp = stored.get("mlp") or {}
        return ["pull toward e_3"] if not mlp.get("enabled") and mlp.get("scale") == 0.25 else []


@pytest.fixture
def pull(monkeypatch):
    monkeypatch.setitem(PARTS, "pull", Pull)
    # mlp.scale=0.25 with the MLP off is refused by the MLP's own rule; the test's part
    # uses it, so the MLP leaves it alone here.
    monkeypatch.setattr(PARTS["mlp"], "unused", classmethod(lambda cls, cfg: []))
    return Pull


def test_a_part_registered_alone_is_checked_built_refused_and_described(pull):
    ds = af.run({**S, "mlp": {"scale": 0.25}})
    x, t = ds["x"].values, ds["time"].values
    theta = np.arccos(np.clip(x[..., 2], -1, 1))  # (member, time, token): the angle to e_3
    expected = 2 * np.arctan(np.tan(theta[:, :1] / 2) * np.exp(-0.5 * t)[None, :, None])
    np.testing.assert_allclose(theta, expected, atol=1e-9)
    assert "pull toward e_3" in " ".join(t.get_text() for t in summary_figure(ds).texts)
    with pytest.raises(ConfigError, match="needs d >= 3"):
        af.validate_config({**S, "d": 2, "mlp": {"scale": 0.25}})
    with pytest.raises(ConfigError, match="mlp.bias does not apply to the pull"):
        af.validate_config({**S, "mlp": {"scale": 0.25, "bias": False}})
    # Without it registered the same config has no dynamics at all.
    PARTS.pop("pull")
    with pytest.raises(ConfigError, match="leave no dynamics"):
        af.validate_config({**S, "mlp": {"scale": 0.25}})


def test_the_builder_and_the_captions_name_no_part_and_no_initial_condition():
    names = ["SelfAttention", "MLP", "cfg.mlp", "cfg.attention", "cfg.attention_kind", "cfg.alibi", "cfg.heads_combine",
             "cfg.sinkhorn", "cfg.hardmax", *[f"cfg.weights.{m}" for m in "qkvo"],
             *[cls.__name__ for cls in INITS.values()], "SphericalCaps", "GaussianMixture", "UniformCube",
             *[f'"{kind}"' for kind in INITS], '"tied"', '"random"', '"identity"', '"sinkhorn"', '"hardmax"']
    for module in ("running/_build.py", "presentation/_plots.py"):
        source = (PACKAGE / module).read_text()
        named = [name for name in names if re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", source)]
        assert not named, f"{module} names {named}: a component's own file says it"


def test_the_components_are_read_without_jax():
    done = subprocess.run([sys.executable, "-X", "importtime", "-c",
                           "import attnflow.schema.initial, attnflow.schema.system, attnflow.schema._config, attnflow.presentation._plots"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert "jax" not in imported and "diffrax" not in imported


def test_each_initial_condition_checks_and_describes_itself():
    cfg = af.validate_config({"init": {"kind": "caps", "k": 2, "radius": 0.2}, "n": 4, "d": 3})
    assert type(cfg.init) is INITS["caps"] and type(cfg.init).data == ("radius", "centres")
    assert INITS["caps"].describe({"kind": "caps", "k": 2, "radius": 0.2, "centres": None}) == "caps (k = 2, radius = 0.2)"
    assert INITS["given"].describe({"kind": "given", "value": [[1.0, 0.0]]}) == "given (value given)"
    with pytest.raises(ConfigError, match=r"init.k=5 caps for n=4 tokens"):
        af.validate_config({"init": {"kind": "caps", "k": 5}, "n": 4, "d": 3})
    with pytest.raises(ConfigError, match="orthonormal initial condition needs n <= d"):
        af.validate_config({"init": "orthonormal", "n": 4, "d": 3})


def test_the_constants_the_components_spell_out_are_the_numerics_own():
    """What a component restates so as to be read without JAX is what the numerics use."""
    from attnflow.numerics import _random_matrices, _tiled
    from attnflow.schema.system import attention
    from attnflow.schema.weights import random

    assert attention._INDEX_LIMIT == _tiled.INDEX_LIMIT
    assert set(random.SQUARE_LAWS) == set(_random_matrices.SQUARE_LAWS)


def test_a_registry_refuses_a_component_that_lacks_what_its_base_only_declares():
    from attnflow.schema._plugins import components
    from attnflow.schema.initial import InitialCondition

    assert components("attnflow.schema.system", {"mlp": "mlp.MLP"}, Part, required=("enabled", "build"))["mlp"] is PARTS["mlp"]
    with pytest.raises(TypeError, match="must subclass Part and define describe_all"):
        components("attnflow.schema.system", {"mlp": "mlp.MLP"}, Part, required=("build", "describe_all"))
    with pytest.raises(TypeError, match="must subclass InitialCondition"):
        components("attnflow.schema.system", {"mlp": "mlp.MLP"}, InitialCondition, required=())
