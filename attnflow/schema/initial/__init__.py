"""The initial conditions a config names with `init=KIND`, one file each: its line in
the help, its typed settings with their meanings (a dataclass the schema composes, the
defaults in `conf/init/KIND.yaml`), their check, its description and the law it builds
(`InitialCondition`). Adding one is its file, its YAML and one line in `KINDS`. Nothing
here imports JAX."""

from __future__ import annotations

from .._plugins import components
from ._kind import InitialCondition

# init=KIND -> the module.Class of its settings: one line per initial condition.
KINDS = {
    "uniform": "uniform.Uniform",
    "orthonormal": "orthonormal.Orthonormal",
    "caps": "caps.Caps",
    "mixture": "mixture.Mixture",
    "cube": "cube.Cube",
    "given": "given.Given",
}


INITS: dict[str, type[InitialCondition]] = components(__name__, KINDS, InitialCondition, required=("build",))

__all__ = ["INITS", "KINDS", "InitialCondition"]
