"""`attnflow.schema._plugins`: code named by its import path, refused in one sentence when it
is not one, and the digest of a user's source that identifies a run."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

from attnflow.schema._errors import ConfigError
from attnflow.schema._plugins import BUILTIN_TERMS, import_target, source_digest, target_path


def test_an_import_path_or_a_short_name_of_attnflow_names_its_object():
    field = import_target("external_field", "terms.pull._target_")
    assert target_path(field) == BUILTIN_TERMS["external_field"]
    assert import_target("math.sqrt", "metrics")(4.0) == 2.0


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("not a path", "is not an import path"),
        ("nosuchmodule_af.thing", "no module named 'nosuchmodule_af' can be imported"),
        ("math.sqrtt", r"module math has no sqrtt \(did you mean math.sqrt\?\)"),
        (3, "must be the import path of a class or function"),
    ],
)
def test_a_name_that_is_not_an_importable_object_is_one_sentence(path, says):
    with pytest.raises(ConfigError, match=says):
        import_target(path, "metrics")


def test_the_digest_follows_the_source_of_a_users_module_and_leaves_attnflow_out(tmp_path, monkeypatch):
    module = tmp_path / "digeststudy.py"
    module.write_text("def f(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    try:
        user = importlib.import_module("digeststudy")
        first = source_digest([user.f])
        assert first is not None and source_digest([import_target("external_field", "t")]) is None
        module.write_text(textwrap.dedent("def f(x):\n    return 2 * x\n"))
        assert source_digest([user.f]) != first  # an edited module is another run
    finally:
        sys.modules.pop("digeststudy", None)
