"""`attnflow.schema._methods`: the table of solvers is what the steppers and the schema use."""

from __future__ import annotations

import pytest

from attnflow.schema._config import Config
from attnflow.schema._errors import ConfigError
from attnflow.schema._methods import ADAPTIVE, SOLVERS
from attnflow.numerics._solvers import tableau


def test_every_solver_of_the_table_has_a_tableau_of_its_order_and_the_schema_offers_it():
    import typing

    solver_choice = typing.get_type_hints(Config)["solver"]
    assert [c.value for c in solver_choice] == list(SOLVERS)
    for name, method in SOLVERS.items():
        table = tableau(name)
        assert abs(sum(table.b) - 1) < 1e-12, name  # consistent: order >= 1
        assert len(table.b) >= min(method.order, 4), name  # an explicit RK method of order p has >= p stages
    assert ADAPTIVE == tuple(name for name, method in SOLVERS.items() if method.adaptive)
    assert not SOLVERS["euler_renorm"].projected and SOLVERS["rk4"].projected


def test_adaptive_stepping_is_refused_for_a_method_without_an_error_estimate():
    import attnflow as af

    with pytest.raises(ConfigError, match="has no error estimate"):
        af.validate_config({"solver": "euler", "adaptive": True})
