"""What makes a results file describe itself: the attributes of the CF conventions
(https://cfconventions.org, version 1.11) that every `results.nc` carries.

`describe(ds, ...)` is the one function applied to a study's and to every experiment's
Dataset before it is written:

- every data variable and every coordinate gets a `long_name` and, when it holds
  numbers, `units` (the metrics' from their registry; "1" for a pure number, which
  nearly everything here is: the flow's time is depth, not seconds). A text label
  (a token's string, a schedule's name) gets a `long_name` only, as CF allows;
- the `long_name` is short, at most `LONG_NAME_LIMIT` characters, so that the labels
  xarray draws from it fit a figure; the prose that says more goes in `description`
  (`short_name` cuts it);
- the global attributes `Conventions`, `title`, `source`, `history`,
  `attnflow_version`, and every scalar setting of the resolved config (`n`, `d`,
  `cluster_eps`, `solver`, ...; a nested key with its dots replaced by underscores,
  `weights.v.kind` -> `weights_v_kind`; null ones left out) beside the full config
  (YAML, `config`). NetCDF has no boolean: a boolean setting is a byte, 1 for true and
  0 for false, and `boolean_settings` names them (`boolean_meanings` says so), so that
  `bool(ds.attrs["causal"])` is the setting (earlier files hold the strings
  "true"/"false" instead: `setting_value` reads both).

A variable that says what it is with a `description` gets its `long_name` from it. One
with neither is a bug of attnflow: `describe` refuses it, naming it, so that the tests,
which run every experiment, catch it.

`netcdf_layout` gives a Dataset the encoding the CF checkers read (`write_results`
applies it to every file attnflow writes): text as arrays of characters (NetCDF-4's
variable-length strings are not CF-1.8), a text coordinate along its own dimension named
in its variables' `coordinates`, and `flag_values` of the type of their variable.

Dimension names, one per concept across experiments: `time` (the flow's depth-time),
`member`, `beta`, `token` (a position in the sequence), `dim` (a coordinate of a
token's state), `head`, `layer` (a transformer block; the states between blocks are
indexed by `depth`, 0 = the embeddings), `query` and `key` (a row and a column of an
attention map), `cluster`.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from importlib.metadata import version
from typing import Any

import numpy as np

from ..schema._metric_registry import METRICS

CONVENTIONS = "CF-1.11"
# The longest `long_name` (characters): xarray labels an axis or a colour bar with it and
# its units, wrapped at 30 characters a line; a longer one was clipped off the figure.
LONG_NAME_LIMIT = 40
BOOLEAN_MEANINGS = "1 true, 0 false"

# The coordinates (and dimensions) every experiment may share: their long name and units.
COORDINATES: dict[str, tuple[str, str | None]] = {
    "time": ("depth-time t of the flow (the continuous layer index; dimensionless)", "1"),
    "beta": ("inverse temperature beta (of the attention)", "1"),
    "member": ("ensemble member index", "1"),
    "token": ("token position in the sequence", "1"),
    "dim": ("coordinate of a token's state", "1"),
    "source_token": ("source token index (cross-attention)", "1"),
    "head": ("attention head index", "1"),
    "layer": ("transformer layer (block) index", "1"),
    "depth": ("transformer layers applied (0: the embeddings; the hidden state after this many layers)", "1"),
    "query": ("attention row: the querying token", "1"),
    "key": ("attention column: the attended token", "1"),
    "cluster": ("cluster rank, largest first", "1"),
    "exponent": ("Lyapunov exponent rank, largest first", "1"),
    "schedule": ("weight schedule of the panel", None),
    "panel": ("panel of the experiment (one study each)", None),
    "d": ("dimension d (of the space the tokens live in)", "1"),
    "n": ("number of tokens n", "1"),
    "token_string": ("the token as text", None),
    "token_id": ("token id in the model's vocabulary", "1"),
}

# Variables of a study's results besides the metrics.
VARIABLES: dict[str, tuple[str, str]] = {
    "x": ("token states", "1"),
    "source_x": ("source tokens (held fixed while the target attends to them and flows)", "1"),
    "num_steps": ("solver steps taken", "1"),
    "status": ("solve status: 0 reached t1; 1 the state became non-finite; 2 the solver stopped early", "1"),
    "failure_time": (
        "failure time: the first output time whose statistics are missing (NaN when the solve succeeded)",
        "1",
    ),
}


def dimension_name(key: str) -> str:
    """The name a dotted config key takes as an attribute or a dimension: its dots
    replaced by underscores (`weights.v.kind` -> `weights_v_kind`,
    `experiment.options.eps` -> `experiment_options_eps`)."""
    return key.replace(".", "_")


def _leaves(config: Mapping, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """The scalar leaves of a config, named as attributes (`dimension_name`)."""
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _leaves(value, f"{name}.")
        elif isinstance(value, (bool, int, float, str)):
            yield dimension_name(name), value


def scalar_settings(config: Mapping) -> dict[str, Any]:
    """Every scalar leaf of a config as a NetCDF attribute: numbers and text as they
    are, booleans as a byte, 1 for true and 0 for false (NetCDF has no boolean; the
    names of those are `boolean_settings`); null settings, lists and empty mappings are
    left to the full config."""
    return {name: np.int8(value) if isinstance(value, bool) else value for name, value in _leaves(config)}


def boolean_settings(config: Mapping) -> list[str]:
    """The attribute names of the boolean settings of a config (stored as 1 or 0)."""
    return [name for name, value in _leaves(config) if isinstance(value, bool)]


def setting_value(value: Any) -> Any:
    """A setting as a results file's attribute holds it, as its value: a boolean setting
    read back as True or False from today's byte and from the "true"/"false" text of
    files written before it; any other value as it is."""
    if isinstance(value, str) and value in ("true", "false"):
        return value == "true"
    if isinstance(value, np.generic) and value.dtype == np.int8:
        return bool(value)
    return value


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


def short_name(text: str, name: str) -> str:
    """A `long_name` of at most `LONG_NAME_LIMIT` characters for a variable `name`
    whose prose is `text`: the text itself when it fits, else its first clause (up to
    ': ', ' (', '; ' or ' = ') when that fits, else the name with spaces for its
    underscores."""
    if len(text) <= LONG_NAME_LIMIT:
        return text
    head = re.split(r": | \(|; | = ", text, maxsplit=1)[0].strip()
    if 0 < len(head) <= LONG_NAME_LIMIT:
        return head
    return name.replace("_", " ")[:LONG_NAME_LIMIT]


def variable_attributes(
    name: str,
    attrs: Mapping,
    values,
    *,
    coordinate: bool = False,
    known: Mapping[str, tuple[str, str | None]] | None = None,
) -> dict:
    """A variable's attributes with its `long_name` and `units` filled in. What it is
    comes from its `description` (over a `long_name` it inherited), else its own
    `long_name`, else the names known here (the shared coordinates, the metrics, a
    study's bookkeeping); the `long_name` is that text cut short (`short_name`), the
    `description` the whole of it when it is longer. Numbers without units are pure
    numbers ("1"); text takes none."""
    attrs = dict(attrs)
    given = known
    entry: tuple[str, str | None] | None = (COORDINATES.get(name) if coordinate else None) or VARIABLES.get(name)
    if name in METRICS and not coordinate:
        entry = (METRICS[name].description, METRICS[name].units)
    if given is not None and name in given:
        entry = given[name]
    if "description" in attrs:  # what an experiment says of a variable, over what it inherited
        prose = str(attrs["description"])
    elif "long_name" in attrs:
        prose = str(attrs["long_name"])
    else:
        prose = entry[0] if entry is not None else None
    if prose is not None:
        attrs["long_name"] = short_name(prose, name)
        if attrs["long_name"] != prose:
            attrs["description"] = prose
        else:
            attrs.pop("description", None)
    if "units" not in attrs and not _is_text(np.asarray(values)):
        attrs["units"] = entry[1] if entry is not None and entry[1] is not None else "1"
    return attrs


def global_attributes(*, title: str, config: Mapping, history: str, references: str | None = None) -> dict:
    """The global attributes of a results file: every scalar setting of `config`, then
    `Conventions`, `title`, `source`, `attnflow_version`, `history` (`history_line`)
    and, when given, `references` (the paper a figure reproduces)."""
    attrs = scalar_settings(config)
    booleans = boolean_settings(config)
    if booleans:
        attrs.update(boolean_settings=" ".join(booleans), boolean_meanings=BOOLEAN_MEANINGS)
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


def netcdf_layout(ds):
    """`ds` (an xarray Dataset) with the encoding that makes its file CF-1.8 for a
    checker, its values unchanged (a shallow copy; `ds` is left as it is): text is
    written as arrays of characters (UTF-8; xarray reads it back as text), a text
    coordinate along its own dimension is named in the `coordinates` of every variable
    along that dimension (an auxiliary coordinate: CF's coordinate variables hold
    numbers), and `flag_values` take the type their variable is written with."""
    ds = ds.copy(deep=False)
    labels = {str(name) for name in ds.coords if name in ds.dims and _is_text(ds[name].values)}
    for name, variable in ds.variables.items():
        encoding = dict(variable.encoding)
        if _is_text(variable.values) and "dtype" not in encoding:
            encoding["dtype"] = "S1"
        if "flag_values" in variable.attrs:
            stored = np.dtype(encoding.get("dtype", variable.dtype))
            variable.attrs["flag_values"] = np.asarray(variable.attrs["flag_values"], stored)
        along = [str(label) for label in labels if label in variable.dims and label != name]
        if along and name not in ds.coords and "coordinates" not in encoding:
            others = [
                str(c) for c in ds.coords if c not in ds.dims and set(ds[c].dims) <= set(variable.dims) and c != name
            ]
            encoding["coordinates"] = " ".join(sorted({*along, *others}))
        variable.encoding = encoding
    return ds
