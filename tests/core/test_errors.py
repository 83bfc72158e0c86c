"""`attnflow.schema._errors`: the errors attnflow raises for people, and the one suggestion of
a nearest known name that every refusal of an unknown name gives."""

from __future__ import annotations

import pytest

import attnflow as af
from attnflow.schema._errors import CheckpointError, ConfigError, StorageError, did_you_mean


def test_the_nearest_name_is_suggested_with_its_prefix_and_none_when_nothing_is_near():
    assert did_you_mean("clsuters", ["clusters", "energy"]) == " (did you mean clusters?)"
    assert did_you_mean("radus", ["radius", "k"], "init.") == " (did you mean init.radius?)"
    assert did_you_mean("q", ["clusters"]) == ""
    assert did_you_mean(3, [1, 2]) == ""  # names of any kind are compared as text


def test_every_refusal_of_an_unknown_name_uses_it():
    with pytest.raises(ConfigError, match=r"unknown metric 'clsuters' \(did you mean clusters\?\)"):
        af.validate_config({"metrics": ["clsuters"]})
    with pytest.raises(ConfigError, match=r"did you mean init.radius\?"):
        af.validate_config({"init": {"kind": "caps", "radus": 0.2}})


def test_the_families_of_errors():
    assert issubclass(CheckpointError, ConfigError) and issubclass(ConfigError, ValueError)
    assert issubclass(StorageError, OSError)
