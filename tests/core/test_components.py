"""A researcher's own term and metric, named from outside the package, and the terms
attnflow ships beyond attention and the MLP (tests/README.md, "Components").

The user's module is written into the test's own folder and put on the import path, as a
user's own folder on PYTHONPATH would be: nothing of it is in the package.

- A rotation of the sphere, dx/dt = A x with A skew-symmetric, is tangent (<x, A x> = 0),
  so the sphere scheme's flow is x(t) = exp(t A) x(0) exactly: the user term is held to
  that closed form.
- The external field F_i = s u pulls each token along the great circle toward u:
  tan(theta(t)/2) = tan(theta(0)/2) exp(-s |u| t) for the angle theta between x and u.
- A user metric is held against NumPy on the saved states.
"""

from __future__ import annotations

import importlib

import sys
import textwrap


import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

import attnflow as af
from attnflow.running._ensemble import member_footprint
from attnflow.schema._errors import ConfigError

USER_MODULE = '''
"""A researcher's own term and metric (written by tests/core/test_components.py)."""
import jax.numpy as jnp
from jaxtyping import Array, Float

import attnflow


class Rotation(attnflow.AbstractInteraction):
    """dx/dt = speed * A x, with A the skew-symmetric part of `generator`."""

    generator: Float[Array, "d d"]
    speed: Float[Array, ""] = 1.0

    def __call__(self, t, x):
        a = 0.5 * (self.generator - self.generator.T)
        return self.speed * x @ a.T


class Pairwise(attnflow.AbstractInteraction):
    """A term that works in n x n x d memory and does not say so: the median of the
    differences to every other token (a sort of all of them), measured by the planner."""

    def __call__(self, t, x):
        differences = jnp.sort(x[None, :, :] - x[:, None, :], axis=1)
        return differences[:, x.shape[0] // 2, :]


class NeedsBeta(attnflow.AbstractInteraction):
    """A pull toward the mean, of strength beta: beta is the run's."""

    beta: Float[Array, ""]
    d: int

    def __call__(self, t, x):
        return self.beta * (jnp.mean(x, axis=0, keepdims=True) - x)


@attnflow.metric(long_name="mean distance of the tokens to their centroid", units="1")
def spread(x):
    return jnp.mean(jnp.linalg.norm(x - jnp.mean(x, axis=0, keepdims=True), axis=-1))


@attnflow.metric(long_name="first coordinate of every token", dims=("token",))
def first_coordinate(x, context):
    return x[:, 0] * context.beta / context.beta


def energy(x):  # not registered
    return jnp.sum(x)
'''

GENERATOR = [[0.0, -1.0, 0.3], [1.0, 0.0, -0.5], [-0.3, 0.5, 0.0]]
S = {"n": 6, "d": 3, "members": 3, "t1": 1.0, "dt": 0.01, "saves": 5, "beta": 1.0, "dtype": "float64",
     "solver": "rk4", "attention": False, "save_states": True}


@pytest.fixture(scope="module")
def user_module(tmp_path_factory):
    folder = tmp_path_factory.mktemp("user")
    (folder / "componentstudy.py").write_text(textwrap.dedent(USER_MODULE))
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    yield folder
    sys.path.remove(str(folder))
    sys.modules.pop("componentstudy", None)


def test_a_user_term_follows_its_closed_form_rotation_of_the_sphere(user_module):
    ds = af.run({**S, "terms": {"rot": {"_target_": "componentstudy.Rotation", "generator": GENERATOR, "speed": 0.7}}})
    a = 0.5 * (np.array(GENERATOR) - np.array(GENERATOR).T)
    x = ds["x"].values  # (member, time, token, dim)
    for k, t in enumerate(ds["time"].values):
        expected = x[:, 0] @ scipy.linalg.expm(0.7 * t * a).T
        np.testing.assert_allclose(x[:, k], expected, atol=1e-9)  # RK4 at dt = 0.01: 1e-11 here
    # Sabotage check: the rotation at another speed is far from it.
    assert np.abs(x[:, -1] - x[:, 0] @ scipy.linalg.expm(0.5 * a).T).max() > 1e-2


def test_the_external_field_pulls_along_great_circles_at_its_closed_form_rate():
    u = np.array([0.0, 0.0, 2.0])
    ds = af.run({**S, "terms": {"pull": {"_target_": "external_field", "direction": u.tolist(), "strength": 0.5}}})
    x, t = ds["x"].values, ds["time"].values
    theta = np.arccos(np.clip(x @ (u / np.linalg.norm(u)), -1, 1))  # (member, time, token)
    expected = 2 * np.arctan(np.tan(theta[:, :1] / 2) * np.exp(-0.5 * np.linalg.norm(u) * t)[None, :, None])
    np.testing.assert_allclose(theta, expected, atol=1e-9)
    # The same by its full import path; a short name that is not one is refused.
    path = {"_target_": "attnflow.terms.external_field.ExternalField", "direction": u.tolist(), "strength": 0.5}
    np.testing.assert_array_equal(af.run({**S, "terms": {"pull": path}})["x"].values, x)


def test_a_user_metric_is_recorded_as_its_function_computes_it(user_module):
    ds = af.run({**S, "terms": {"rot": {"_target_": "componentstudy.Rotation", "generator": GENERATOR}},
                 "metrics": ["energy", "componentstudy.spread", "componentstudy.first_coordinate"]})
    x = ds["x"].values
    np.testing.assert_allclose(ds["spread"].values,
                               np.linalg.norm(x - x.mean(axis=-2, keepdims=True), axis=-1).mean(axis=-1), rtol=1e-12)
    assert ds["first_coordinate"].dims == ("member", "time", "token")
    np.testing.assert_allclose(ds["first_coordinate"].values, x[..., 0], rtol=1e-12)
    assert ds["spread"].attrs["description"] == "mean distance of the tokens to their centroid"  # too long a label
    assert ds["spread"].attrs["long_name"] == "spread"
    assert ds["spread"].attrs["metric"] == "componentstudy.spread"
    assert ds.attrs["code_digest"]


def test_supplied_fields_and_bad_terms_are_one_sentence(user_module):
    # beta and d supplied: a pull toward the mean at rate beta (the mean of unit tokens'
    # deviations decays like e^{-beta t} in flat space).
    ds = af.run({**S, "scheme": "none", "beta": 2.0, "terms": {"mean": {"_target_": "componentstudy.NeedsBeta"}}})
    x = ds["x"].values
    deviation = x - x.mean(axis=-2, keepdims=True)
    np.testing.assert_allclose(deviation[:, -1], deviation[:, 0] * np.exp(-2.0), rtol=1e-8)
    for terms, says in [
        ({"r": {"_target_": "componentstudy.Rotaton", "generator": GENERATOR}}, "did you mean componentstudy.Rotation"),
        ({"r": {"_target_": "nosuchmodule.Rotation"}}, "PYTHONPATH"),
        ({"r": {"_target_": "componentstudy.spread"}}, "not a subclass of attnflow.AbstractInteraction"),
        ({"r": {"_target_": "componentstudy.Rotation", "generatr": GENERATOR}}, "did you mean terms.r.generator"),
        ({"r": {"_target_": "componentstudy.Rotation"}}, "needs generator"),
        ({"r": {"_target_": "componentstudy.Rotation", "generator": [[1.0, 2.0]]}}, "raised"),
        ({"r": {"generator": GENERATOR}}, "names no class"),
        ({"r": {"_target_": "componentstudy.Rotation", "generator": GENERATOR, "speed": float("nan")}}, "finite"),
    ]:
        with pytest.raises(ConfigError, match=says):
            af.validate_config({**S, "terms": terms})
    for metrics, says in [(["componentstudy.energy"], "not registered"), (["spred"], "unknown metric 'spred'"),
                          (["componentstudy.nothing"], "has no nothing")]:
        with pytest.raises(ConfigError, match=says):
            af.validate_config({**S, "terms": {"r": {"_target_": "componentstudy.Rotation", "generator": GENERATOR}},
                                "metrics": metrics})


def test_the_planner_measures_a_term_that_does_not_say_its_memory(user_module):
    # Pairwise sorts n x n x d differences: at n = 64 in float32 that is 48 KiB, where the
    # term's output is 768 bytes.
    cfg = af.validate_config({**S, "n": 64, "dtype": "float32", "terms": {"p": {"_target_": "componentstudy.Pairwise"}},
                              "metrics": ["energy"], "save_states": False})
    member = jax.eval_shape(lambda: af.build_system(cfg)(jax.random.key(0), jnp.float32(1.0)))
    footprint = member_footprint(member, 4, saves=5)
    assert footprint.attention >= 64 * 64 * 3 * 4  # never zero, never its output alone
    small = af.validate_config({**S, "n": 64, "dtype": "float32", "metrics": ["energy"], "save_states": False,
                                "terms": {"pull": {"_target_": "external_field", "direction": [0.0, 0.0, 1.0]}}})
    member = jax.eval_shape(lambda: af.build_system(small)(jax.random.key(0), jnp.float32(1.0)))
    assert member_footprint(member, 4, saves=5).attention == 64 * 3 * 4  # it says so: its output
    # A memory it does not fit in refuses the run, naming what needs it.
    from attnflow.running._ensemble import _pieces

    member = jax.eval_shape(lambda: af.build_system(cfg)(jax.random.key(0), jnp.float32(1.0)))
    with pytest.raises(ConfigError, match="a term of your own"):
        _pieces(member, footprint, 1, 1, None, memory=footprint.total)
