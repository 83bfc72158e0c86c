"""attnflow.numerics._numerics: what every component's `build` assembles from, handed to it by
the builder, so that the component files import no JAX."""

from __future__ import annotations

import re
from pathlib import Path

import attnflow.numerics._numerics as lib

COMPONENTS = Path(lib.__file__).parent.parent


def test_every_name_a_component_builds_from_is_handed_to_it():
    """Each `lib.NAME` a file of initial/, system/ or weights/ reads is in `_numerics`
    (a missing one would fail only when a run builds that component)."""
    files = [p for folder in ("schema/initial", "schema/system", "schema/weights") for p in (COMPONENTS / folder).glob("*.py")]
    read = {name for path in files for name in re.findall(r"\blib\.(\w+)", path.read_text())}
    assert {"jnp", "SelfAttention", "MLP", "SphericalCaps", "Constant"} <= read
    assert sorted(read - set(lib.__all__)) == []
    assert all(hasattr(lib, name) for name in lib.__all__)


def test_the_components_import_no_jax_and_no_numerics():
    """The component files hold settings, checks and construction; the dynamics they
    build come through `lib`, never an import."""
    for folder in ("schema/initial", "schema/system", "schema/weights"):
        for path in (COMPONENTS / folder).glob("*.py"):
            text = path.read_text()
            assert not re.search(r"^\s*(import jax|from jax|from \.+(numerics\b|_terms|_schedules|_initial|_tiled))", text, re.M), path
