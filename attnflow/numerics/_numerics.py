"""What a component builds from: JAX and the numerics of the field, handed to every
component's `build` by the builder (`attnflow.running._build`), so that the component files
(`initial/`, `system/`, `weights/`) hold their settings, checks and construction without
importing JAX: the schema, `--help` and `attnflow plot` read them, and the dynamics sit
below the construction that assembles them.

A researcher's own `Part` reads what it needs from the same object
(`lib.jnp.asarray(...)`, `lib.SelfAttention(...)`)."""

import jax
import jax.numpy as jnp

from ._cross import CrossAttention
from ._initial import GaussianMixture, Given, Orthonormal, SphericalCaps, UniformCube, UniformSphere
from ._random_matrices import draw_matrix
from ._schedules import Constant, Identity, PiecewiseConstant, QtK, Scaled, Transposed, factored, identity_multiple
from ._terms import MLP, SelfAttention
from ._tiled import resolve_block

__all__ = [
    "MLP",
    "Constant",
    "CrossAttention",
    "GaussianMixture",
    "Given",
    "Identity",
    "Orthonormal",
    "PiecewiseConstant",
    "QtK",
    "Scaled",
    "SelfAttention",
    "SphericalCaps",
    "Transposed",
    "UniformCube",
    "UniformSphere",
    "draw_matrix",
    "factored",
    "identity_multiple",
    "jax",
    "jnp",
    "resolve_block",
]
