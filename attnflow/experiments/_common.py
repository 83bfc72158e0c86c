"""What several experiments share: putting panels side by side in one Dataset, the
ensemble summary that keeps a file small, and reading configs back. The figure style is
`attnflow.presentation._figures` (re-exported here for the experiments)."""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..presentation._figures import caption, colormap, figure, subplots, token_ticks  # noqa: F401 (the experiments' figure tools)
from ..running._progress import Progress
from ..schema._config import _default_config, current_config
from ..schema._errors import ConfigError
from ..storage._store import read_config
from ._lazy import lazy

if TYPE_CHECKING:
    import xarray as xr
else:
    xr = lazy("xarray")


def config_of(ds: xr.Dataset, panel: str | None = None) -> dict:
    """The stored config of an experiment (or of one of its panels) as a mapping, read
    with bounded work (`read_config`: one that is not attnflow's raises `ConfigError`),
    with the keys renamed since under their new names (`current_config`)."""
    source = ds.encoding.get("source", "this Dataset")
    if panel is None:
        return current_config(read_config(source, ds.attrs["config"]))
    return current_config(read_config(source, ds.attrs["panel_configs"])[panel])


def stack_panels(
    results: Mapping[str, xr.Dataset], dim: str = "panel", coordinate: Sequence | None = None
) -> xr.Dataset:
    """The panels' Datasets along a new dimension `dim` (labelled by the panel names or
    by `coordinate`); each panel's own config attribute is dropped (the experiment
    stores them all in `panel_configs`)."""
    labels = list(results)
    parts = [ds.copy() for ds in results.values()]
    for part in parts:
        part.attrs = {}  # the Dataset's own: its variables keep theirs (long names, units)
    stacked = xr.concat(parts, dim=dim, coords="minimal", compat="override", join="outer")
    return stacked.assign_coords({dim: list(coordinate) if coordinate is not None else labels})


def member_summary(da: xr.DataArray, dim: str = "member") -> xr.Dataset:
    """Mean and the 10th/50th/90th percentiles over `dim`, NaN (failed members) left
    out; what a figure of a large ensemble needs, at a fraction of its size."""
    values = da.values
    axis = da.dims.index(dim)
    dims = tuple(d for d in da.dims if d != dim)
    coords = {k: v for k, v in da.coords.items() if dim not in v.dims}
    with np.errstate(all="ignore"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            mean = np.nanmean(values, axis=axis)
            q = np.nanpercentile(values, [10, 50, 90], axis=axis)
    name = da.name or "value"
    return xr.Dataset(
        {
            f"{name}_mean": (dims, mean, {"description": f"mean over {dim}s of {name}"}),
            f"{name}_q10": (dims, q[0], {"description": f"10th percentile over {dim}s of {name}"}),
            f"{name}_median": (dims, q[1], {"description": f"median over {dim}s of {name}"}),
            f"{name}_q90": (dims, q[2], {"description": f"90th percentile over {dim}s of {name}"}),
        },
        coords=coords,
    )


def wireframe_sphere(ax, color: str = "0.85", zoom: float = 1.0, unit_limits: bool = False) -> None:
    """The unit sphere as a light wireframe on 3-D axes, with equal aspect and no axes
    (`unit_limits`: the axes span exactly [-1, 1])."""
    u, v = np.mgrid[0 : 2 * np.pi : 40j, 0 : np.pi : 20j]
    ax.plot_wireframe(np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v), color=color, linewidth=0.3)
    ax.set_box_aspect((1, 1, 1), zoom=zoom)
    if unit_limits:
        for axis in "xyz":
            getattr(ax, f"set_{axis}lim")(-1, 1)
    ax.set_axis_off()


def check_member_option(options, members: int, *, optional: bool = False, what: str = "a member index") -> None:
    """`experiment.options.member` must index one of `members` (a whole number, never a
    boolean), or be null where `optional` (the experiment then picks one). `options`:
    an experiment's typed options."""
    member = options.member
    if member is None and optional:
        return
    if isinstance(member, bool) or not isinstance(member, int) or not 0 <= member < members:
        allowed = f"{what} from 0 to {members - 1}" + (" or null" if optional else "")
        raise ConfigError(f"experiment.options.member must be {allowed}, got {member!r}.")


def check_drawn_member(name: str, cfg, options, why: str, *, optional: bool = False) -> None:
    """`experiment.options.member` must index a member (or be None where `optional`: the
    experiment picks one), and the states must be saved: `why` says what the experiment
    does with them."""
    check_member_option(options, cfg.members, optional=optional)
    if not cfg.save_states:
        raise ConfigError(f"experiment {name} {why}: keep save_states=true.")


def whole_number(value, minimum: int = 1) -> bool:
    """Whether an option is a whole number (never a boolean) of at least `minimum`."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= minimum  # pyright: ignore[reportOperatorIssue]  # numbers.Integral's stub lacks >=


def finite_number(value) -> bool:
    """Whether an option is a finite number (never a boolean)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def refuse_given(cfg, keys, experiment: str, why: str) -> None:
    """Refuse the config keys among `keys` that `cfg` gives other values than the defaults
    of `conf/`: settings the experiment does not read. `why` says, in parentheses in the
    sentence, what it reads instead."""
    default = _default_config()
    given = [key for key in keys if getattr(cfg, key) != getattr(default, key)]
    if given:
        raise ConfigError(
            f"{' and '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to experiment "
            f"{experiment} ({why}); remove {'it' if len(given) == 1 else 'them'}."
        )


def failed_members(ds: xr.Dataset, description: str = "members whose solve failed") -> xr.DataArray:
    """How many members of a panel's Dataset failed (`status` not 0), as a described scalar."""
    return xr.DataArray(int((ds["status"] != 0).sum())).assign_attrs(description=description)


def counted(name: str, total: int, work, on_piece=None):
    """`work(advance)`, where `advance` is the runner's `on_piece` when given (its bar
    counts the pieces) or else that of a bar of `total` pieces of this experiment's own."""
    if on_piece is not None:
        return work(on_piece)
    with Progress(name, total) as bar:
        return work(bar.advance)
