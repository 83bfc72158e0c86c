"""`attnflow.numerics._schedules`: weight matrices as functions of time, against their formulas."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from attnflow.schema._errors import ConfigError
from attnflow.numerics._schedules import (
    Constant,
    Identity,
    PiecewiseConstant,
    PiecewiseSchedule,
    QtK,
    Scaled,
    Transposed,
    identity_multiple,
)

A = jnp.array([[[1.0, 2.0], [3.0, 4.0]]])  # one head


def test_piecewise_schedules_are_right_continuous_and_choose_their_piece_at_at():
    values = jnp.stack([A, 2 * A, 3 * A])
    w = PiecewiseConstant(jnp.array([1.0, 2.0]), values)
    for t, k in ((0.5, 1), (1.0, 2), (1.5, 2), (2.0, 3), (9.0, 3)):
        np.testing.assert_array_equal(w(t), k * A)
    np.testing.assert_array_equal(w(0.5, at=1.5), 2 * A)  # the piece of `at`, not of t
    with pytest.raises((ConfigError, ValueError)):
        PiecewiseConstant(jnp.array([1.0, 2.0]), jnp.stack([A, A]))  # one value too few


def test_a_polynomial_factor_and_pieces_of_schedules():
    w = Scaled(jnp.array([1.0, 0.5, 2.0]), Constant(A))  # (1 + t/2 + 2 t^2) A
    np.testing.assert_allclose(w(2.0), (1 + 1 + 8) * A)
    pieces = PiecewiseSchedule(jnp.array([1.0]), (Constant(A), Scaled(jnp.array([-1.0]), Constant(A))))
    np.testing.assert_array_equal(pieces(0.0), A)
    np.testing.assert_array_equal(pieces(1.0), -A)


def test_the_identity_the_transpose_and_v_tied_to_qtk():
    eye = Identity(2, 3, "float32")
    assert eye.shape == (2, 3, 3) and (eye(0.0) == jnp.eye(3, dtype=jnp.float32)[None]).all()
    assert identity_multiple(Scaled(jnp.array([2.0]), eye)) and not identity_multiple(Constant(A))
    np.testing.assert_array_equal(Transposed(Constant(A))(0.0), jnp.swapaxes(A, -1, -2))
    q, k = Constant(A), Constant(jnp.array([[[0.0, 1.0], [1.0, 0.0]]]))
    np.testing.assert_allclose(QtK(q, k, jnp.asarray(-1.0))(0.0), -jnp.einsum("hkd,hke->hde", A, k(0.0)))
