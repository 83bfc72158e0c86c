"""Code a researcher names: an interaction term, a metric or an experiment of their own
module, given by its import path (`module.Class`) on the command line or in their own
config folder, as Hydra's `_target_` names what it instantiates.

attnflow imports code only from names the user gives that way: a results file may name a
term, a metric or an experiment of the user's (it is stored in its config), and
`attnflow plot` and `attnflow report` never import it because of that. The source of
every module a run names is part of what identifies the run (`source_digest`): its
compiled program and its pieces are never reused once that source changes.

The terms attnflow ships beyond attention and the MLP are named by a short name too
(`BUILTIN_TERMS`: one line each). Nothing here imports JAX.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._errors import ConfigError, did_you_mean

# The terms attnflow ships beyond attention and the MLP, by the short name a config may
# give as their `_target_` (`+terms.pull._target_=external_field`): one line per term.
BUILTIN_TERMS = {
    "external_field": "attnflow.terms.external_field.ExternalField",
}


def components(package: str, paths: Mapping[str, str], base: type, required: tuple[str, ...]) -> dict[str, Any]:
    """The classes a registry of attnflow's own components names (`module.Class` inside
    `package`, one line each), by their registered name. Each must subclass `base` and
    define `required` itself (the methods the base only declares): a component that
    lacks one is a programming error, raised when the registry is imported."""
    found = {}
    for name, path in paths.items():
        module, attribute = path.split(".")
        cls = getattr(importlib.import_module(f"{package}.{module}"), attribute)
        missing = [m for m in required if not any(m in vars(k) for k in cls.__mro__ if k is not base)]
        if not issubclass(cls, base) or missing:
            raise TypeError(f"{package}.{path} must subclass {base.__name__} and define {', '.join(missing)}.")
        found[name] = cls
    return found


def import_target(path: Any, key: str) -> Any:
    """The object `path` names (`package.module.Name`, or a short name of
    `BUILTIN_TERMS`); `key` is the setting that gave it, named in the one-sentence
    `ConfigError` for a path that is not one, a module that cannot be imported (or
    fails while it is) and a name the module lacks."""
    if not isinstance(path, str) or not path:
        raise ConfigError(f"{key} must be the import path of a class or function, module.Name, got {path!r}.")
    path = BUILTIN_TERMS.get(path, path)
    module_name, _, attribute = path.rpartition(".")
    if not module_name or not all(part.isidentifier() for part in path.split(".")):
        builtin = f" or one of attnflow's own terms ({', '.join(BUILTIN_TERMS)})" if key.startswith("terms.") else ""
        raise ConfigError(f"{key}={path} is not an import path: give module.Name{builtin}.")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        missing = error.name or module_name
        raise ConfigError(
            f"{key}={path}: no module named {missing!r} can be imported; put the folder that holds it on PYTHONPATH."
        ) from None
    except Exception as error:  # the user's module failed while it was imported
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise ConfigError(
            f"{key}={path}: importing {module_name} raised {type(error).__name__}{': ' + first if first else ''}."
        ) from None
    if not hasattr(module, attribute):
        names = [name for name in vars(module) if not name.startswith("_")]
        guess = did_you_mean(attribute, names, f"{module_name}.")
        raise ConfigError(f"{key}={path}: module {module_name} has no {attribute}{guess}.")
    return getattr(module, attribute)


def target_path(obj: Any) -> str:
    """The import path of a class or function (`module.Name`)."""
    return f"{obj.__module__}.{obj.__qualname__}"


def source_digest(objects: list[Any]) -> str | None:
    """A digest of the source files of the modules that define `objects` (a user's
    terms, metrics, experiment), None when there are none. attnflow's own modules are
    left out: the installed version identifies them."""
    files = []
    for obj in objects:
        module = sys.modules.get(getattr(obj, "__module__", "") or "")
        if module is None or module.__name__.split(".")[0] == "attnflow":
            continue
        try:
            files.append(Path(inspect.getfile(module)))
        except (TypeError, OSError):  # a module without a file (defined in a notebook): its name alone
            files.append(Path(f"<{module.__name__}>"))
    if not files:
        return None
    digest = hashlib.sha256()
    for path in sorted(set(files)):
        digest.update(str(path).encode())
        try:
            digest.update(path.read_bytes())
        except OSError:
            pass
    return digest.hexdigest()[:16]
