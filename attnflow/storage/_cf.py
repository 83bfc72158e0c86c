"""What makes a results file describe itself: the attributes of the CF conventions
(https://cfconventions.org, version 1.11) that every `results.nc` carries.

`describe(ds, ...)` is the one function applied to a study's and to every experiment's
Dataset before it is written:

- every data variable and every coordinate gets a `long_name` and, when it holds
  numbers, `units` (the metrics' from their registry; "1" for a pure number, which
  nearly everything here is: the flow's time is depth, not seconds). A text label
  (a token's string, a schedule's name) gets a `long_name` only, as CF allows;
- the global attributes `Conventions`, `title`, `source`, `history`,
  `attnflow_version`, and every scalar setting of the resolved config (`n`, `d`,
  `cluster_eps`, `solver`, ...; a nested key with its dots replaced by underscores,
  `weights.v.kind` -> `weights_v_kind`; null ones left out) beside the full config
  (YAML, `config`).

A variable that says what it is with a `description` gets it as its `long_name`. One
with neither is a bug of attnflow: `describe` refuses it, naming it, so that the tests,
which run every experiment, catch it.

Dimension names, one per concept across experiments: `time` (the flow's depth-time),
`member`, `beta`, `token` (a position in the sequence), `dim` (a coordinate of a
token's state), `head`, `layer` (a transformer block; the states between blocks are
indexed by `depth`, 0 = the embeddings), `query` and `key` (a row and a column of an
attention map), `cluster`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from datetime import datetime, timezone
from importlib.metadata import version
from typing import Any

import numpy as np

from ..schema._metric_registry import METRICS

CONVENTIONS = "CF-1.11"

# The coordinates (and dimensions) every experiment may share: their long name and units.
COORDINATES: dict[str, tuple[str, str | None]] = {
    "time": ("depth-time t of the flow (the continuous layer index; dimensionless)", "1"),
    "beta": ("inverse temperature beta of the attention", "1"),
    "member": ("ensemble member index", "1"),
    "token": ("token position in the sequence", "1"),
    "dim": ("coordinate of a token's state", "1"),
    "source_token": ("source token (cross-attention) index", "1"),
    "head": ("attention head index", "1"),
    "layer": ("transformer layer (block) index", "1"),
    "depth": ("hidden state after this many transformer layers (0: the embeddings)", "1"),
    "query": ("attention row: the querying token", "1"),
    "key": ("attention column: the attended token", "1"),
    "cluster": ("cluster rank, largest first", "1"),
    "exponent": ("rank of a Lyapunov exponent, largest first", "1"),
    "schedule": ("weight schedule of the panel", None),
    "panel": ("panel of the experiment (one study each)", None),
    "d": ("dimension d of the space the tokens live in", "1"),
    "n": ("number of tokens n", "1"),
    "token_string": ("the token as text", None),
    "token_id": ("token id in the model's vocabulary", "1"),
}

# Variables of a study's results besides the metrics.
VARIABLES: dict[str, tuple[str, str]] = {
    "x": ("token states", "1"),
    "source_x": ("source tokens the target attends to (held fixed while it flows)", "1"),
    "num_steps": ("solver steps taken", "1"),
    "status": ("solve status: 0 reached t1; 1 the state became non-finite; 2 the solver stopped early", "1"),
    "failure_time": ("first output time whose statistics are missing (NaN when the solve succeeded)", "1"),
}


def dimension_name(key: str) -> str:
    """The name a dotted config key takes as an attribute or a dimension: its dots
    replaced by underscores (`weights.v.kind` -> `weights_v_kind`,
    `experiment.options.eps` -> `experiment_options_eps`)."""
    return key.replace(".", "_")


def scalar_settings(config: Mapping, prefix: str = "") -> dict[str, Any]:
    """Every scalar leaf of a config as a NetCDF attribute: numbers and text as they
    are, booleans as `true`/`false` (NetCDF has no boolean); null settings, lists and
    empty mappings are left to the full config."""
    settings = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            settings.update(scalar_settings(value, f"{name}."))
        elif isinstance(value, bool):
            settings[dimension_name(name)] = str(value).lower()
        elif isinstance(value, (int, float, str)):
            settings[dimension_name(name)] = value
    return settings


def history_line(command: str) -> str:
    """A `history` entry: the UTC time (ISO 8601) and the command that wrote the file."""
    return f"{datetime.now(timezone.utc).isoformat(timespec='seconds')} {command}"


def command_line() -> str:
    """The `attnflow ...` command of this process, as typed."""
    import shlex

    return " ".join(["attnflow", *(shlex.quote(arg) for arg in sys.argv[1:])])


def python_call(function: str, given: Any = None) -> str:
    """`attnflow.run({...})`: a Python call as a `history` command (the mapping it was
    given, when short enough to read)."""
    if isinstance(given, Mapping):
        text = repr(dict(given))
        return f"{function}({text})" if len(text) <= 400 else f"{function}(...)"
    return f"{function}()" if given is None else f"{function}(...)"


def attnflow_version() -> str:
    try:
        return version("attnflow")
    except Exception:
        return "unknown"


class UndescribedError(ValueError):
    """A variable of a results Dataset says neither what it is nor in which units: a
    bug of attnflow (every variable it writes is described)."""


def _is_text(values: np.ndarray) -> bool:
    return values.dtype.kind in "OSU"


def variable_attributes(
    name: str,
    attrs: Mapping,
    values,
    *,
    coordinate: bool = False,
    known: Mapping[str, tuple[str, str | None]] | None = None,
) -> dict:
    """A variable's attributes with its `long_name` and `units` filled in: a
    `description` becomes the `long_name` (replacing one it had); otherwise the names
    known here (the shared coordinates, the metrics, a study's bookkeeping) give both. Numbers without units
    are pure numbers ("1"); text takes none."""
    attrs = dict(attrs)
    given = known
    entry: tuple[str, str | None] | None = (COORDINATES.get(name) if coordinate else None) or VARIABLES.get(name)
    if name in METRICS and not coordinate:
        entry = (METRICS[name].description, METRICS[name].units)
    if given is not None and name in given:
        entry = given[name]
    if "description" in attrs:  # what an experiment says of a variable, over what it inherited
        attrs["long_name"] = attrs.pop("description")
    elif "long_name" not in attrs and entry is not None:
        attrs["long_name"] = entry[0]
    if "units" not in attrs and not _is_text(np.asarray(values)):
        attrs["units"] = entry[1] if entry is not None and entry[1] is not None else "1"
    return attrs


def global_attributes(*, title: str, config: Mapping, history: str, references: str | None = None) -> dict:
    """The global attributes of a results file: every scalar setting of `config`, then
    `Conventions`, `title`, `source`, `attnflow_version`, `history` (`history_line`)
    and, when given, `references` (the paper a figure reproduces)."""
    attrs = scalar_settings(config)
    attrs.update(
        Conventions=CONVENTIONS,
        title=title,
        source=f"attnflow {attnflow_version()}",
        attnflow_version=attnflow_version(),
        history=history,
    )
    if references:
        attrs["references"] = references
    return attrs


def undescribed(ds) -> list[str]:
    """The variables and coordinates of `ds` without a `long_name`, or holding numbers
    without `units`."""
    missing = []
    for name, da in [*ds.coords.items(), *ds.data_vars.items()]:
        if "long_name" not in da.attrs or ("units" not in da.attrs and not _is_text(da.values)):
            missing.append(str(name))
    return missing


def describe(
    ds,
    *,
    title: str,
    config: Mapping,
    history: str,
    references: str | None = None,
    coordinates: Mapping[str, tuple[str, str | None]] | None = None,
):
    """Give `ds` (an xarray Dataset, changed in place and returned) the CF attributes:
    `long_name` and `units` on every variable and coordinate, and the global attributes
    (`global_attributes`; the Dataset's own attributes are kept, the scalar settings
    added beside them). `coordinates` gives the long name and units (None: text) of
    coordinates of the Dataset's own, by name.

    Raises `UndescribedError` naming the variables that say nothing of what they are.
    """
    for name in [*ds.coords, *ds.data_vars]:
        attrs = ds[name].attrs
        filled = variable_attributes(
            str(name),
            attrs,
            ds[name].values,
            coordinate=name in ds.coords,
            known=coordinates if name in ds.coords else None,
        )
        attrs.clear()
        attrs.update(filled)
    missing = undescribed(ds)
    if missing:
        raise UndescribedError(
            f"the results variables {', '.join(missing)} have no long_name or description; "
            "every variable attnflow writes says what it is."
        )
    own = dict(ds.attrs)
    ds.attrs = {**global_attributes(title=title, config=config, history=history, references=references), **own}
    ds.attrs.update(Conventions=CONVENTIONS, history=history)
    return ds
