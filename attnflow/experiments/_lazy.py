"""Heavy imports of the experiments' modules, made on first use: importing a module of
`attnflow.experiments` loads no JAX, xarray, matplotlib or scipy, so that the help, the
shell completion and the reference page import the modules and read their classes
(`title`, `paper`, `Options`) at once.

A module names what it uses at its top, as a proxy (`jnp = lazy("jax.numpy")`,
`_metrics = lazy("attnflow.numerics._metrics")`, whose functions it then calls as
`_metrics.cluster_labels(...)`), and the real imports under `if TYPE_CHECKING:`, so
that the type checker reads the modules themselves:

    if TYPE_CHECKING:
        import jax.numpy as jnp
    else:
        jnp = lazy("jax.numpy")

The first attribute read from a proxy imports its module (by its full name: `jax.numpy`
without running the parent's import first, which `lazy_loader.load` would). A function
compiled at the module's top (`@jax.jit`) is compiled on its first call instead
(`@on_first_call(lambda f: jax.jit(f))`)."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class _LazyModule(ModuleType):
    """A stand-in for the module `name`, imported when an attribute is first read."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._imported: ModuleType | None = None

    def __getattr__(self, attribute: str) -> Any:
        if self._imported is None:
            self._imported = importlib.import_module(self.__name__)
        return getattr(self._imported, attribute)

    def __repr__(self) -> str:
        return f"<lazy module {self.__name__!r}>"


def lazy(name: str) -> Any:
    """The module `name` (a full dotted name), imported on first attribute access."""
    return _LazyModule(name)


def on_first_call(decorate: Callable[[F], Callable[..., Any]]) -> Callable[[F], F]:
    """A decorator that applies `decorate` (such as `lambda f: jax.jit(f)`) when the
    function is first called, not when its module is imported."""

    def wrap(function: F) -> F:
        made: list[Callable[..., Any]] = []

        @functools.wraps(function)
        def call(*args, **kwargs):
            if not made:
                made.append(decorate(function))
            return made[0](*args, **kwargs)

        return call  # pyright: ignore[reportReturnType] the same signature as `function`

    return wrap
