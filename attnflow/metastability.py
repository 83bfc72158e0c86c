"""Metastability, found automatically: plateaus of a time series over log time, and the
merges of clusters with their times.

Tokens under self-attention often gather quickly into a few clusters that then stay
apart for a time exponentially long in beta before they merge ("A Survey of Continuous
Time Dynamics of Transformers", section 4.1 and theorem 4.7; "Dynamic metastability in
the self-attention model", Geshkovski, Koubbi, Polyanskiy, Rigollet). On a logarithmic
time axis the interaction energy then climbs a staircase and the cluster count steps
down. This module reads such series, whatever run produced them.

**The log-time axis.** A sample at time $t$ sits at $\\log_{10}(t - t_0)$, where $t_0$
is the `origin` (the start of the run); durations are in decades of $t - t_0$. Samples
at or before the origin, and samples whose value is not finite (the tail of a failed
member), are left out.

**Plateaus.** With $R = \\max s - \\min s$ the range of the series $s$ over the samples
kept, a window of consecutive samples is *flat* when its values span at most
$\\mathrm{tol} \\cdot R$: $\\max - \\min \\le \\mathrm{tol} \\cdot R$. A plateau is a flat
window that lasts, from its first to its last sample, at least `min_decades`. Plateaus
are taken longest first: the longest flat window of the series (the earliest among
equals) becomes a plateau if it lasts long enough, and the parts of the series to its
left and to its right are searched the same way, until no flat window that is left
lasts long enough. Each plateau is therefore maximal (one more sample on either side
would break the tolerance or belongs to a neighbouring plateau) and plateaus never
overlap. A series that never changes ($R = 0$) is one plateau. The tolerance is relative
to the range so that the energy $E_\\beta$ (of order $e^\\beta$), its logarithm and the
cluster count are all read with one number; a tolerance below $1/R$ on an integer series
such as the cluster count makes plateaus the runs of one value.

**Merges.** The cluster count is split into runs of one value. A run *holds* when it
lasts, from its first to its last sample, at least `hold_decades`; runs that do not hold
(a one-sample flicker never does) are ignored, and neighbouring runs that hold with the
same value join. A merge is a step down between two successive runs that hold: its time
is the first sample of the lower run (the time from which the new count holds), and it
records the count before and after. Several tokens or clusters that merge within less
than `hold_decades` of each other make one merge (8 -> 2, say), as the record cannot
tell them apart. Steps up (a cluster splitting, possible with other weights) are not
merges, but the count after them is the one the next merge starts from.

`plateaus` and `merges` read one series (NumPy arrays); `detect_metastability` reads a
whole results Dataset (any dimensions besides `time`, such as beta and member) and
returns its plateaus and merges padded to a fixed size (NaN and -1), ready for NetCDF.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import pairwise
from typing import NamedTuple

import numpy as np
import xarray as xr
from jaxtyping import ScalarLike
from numpy.typing import ArrayLike

__all__ = ["Merges", "Plateaus", "detect_metastability", "merges", "plateaus"]

# A plateau spans at most 2% of the range and lasts at least half a decade (a factor of
# about 3 in time: shorter is a slow drift chopped into pieces, not a metastable state);
# a cluster count holds when it lasts a fifth of a decade (a factor of about 1.6).
DEFAULT_TOL = 0.02
DEFAULT_MIN_DECADES = 0.5
DEFAULT_HOLD_DECADES = 0.2


class Plateaus(NamedTuple):
    """The plateaus of one series, in time order: sample indices `first` and `last`
    (inclusive, into the arrays given), their times `start` and `end`, and `level`,
    the median of the series over each plateau."""

    first: np.ndarray
    last: np.ndarray
    start: np.ndarray
    end: np.ndarray
    level: np.ndarray


class Merges(NamedTuple):
    """The merges of one cluster-count series, in time order: the sample `index` (into
    the arrays given) and `time` from which the lower count holds, and the counts
    `before` and `after`."""

    index: np.ndarray
    time: np.ndarray
    before: np.ndarray
    after: np.ndarray


def _check(t: ArrayLike, series: ArrayLike, tol: ScalarLike | None, decades: ScalarLike,
           name: str) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(t, dtype=np.float64)
    values = np.asarray(series, dtype=np.float64)
    if t.ndim != 1 or values.shape != t.shape:
        raise ValueError(f"times and series must be 1-D arrays of one length, got shapes {t.shape} and {values.shape}.")
    if np.any(np.diff(t) <= 0):
        raise ValueError("times must increase strictly.")
    if tol is not None and not (np.isfinite(tol) and 0 <= tol < 1):
        raise ValueError(f"tol is a fraction of the series' range in [0, 1), got tol={tol!r}.")
    if not (np.isfinite(decades) and decades >= 0):
        raise ValueError(f"{name} must be a number of decades >= 0, got {decades!r}.")
    return t, values


def _kept(t: np.ndarray, values: np.ndarray, origin: float) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the samples on the log axis and their $\\log_{10}(t - t_0)$."""
    index = np.flatnonzero((t > origin) & np.isfinite(values))
    return index, np.log10(t[index] - origin)


def _flat_ends(values: np.ndarray, width: float) -> np.ndarray:
    """For each start i, the last j such that values[i..j] spans at most `width`
    (two pointers with monotone queues of the window's maximum and minimum)."""
    size = len(values)
    ends = np.empty(size, dtype=np.int64)
    high: deque[int] = deque()
    low: deque[int] = deque()
    j = -1
    for i in range(size):
        while high and high[0] < i:
            high.popleft()
        while low and low[0] < i:
            low.popleft()
        while j + 1 < size:
            v = values[j + 1]
            top = max(v, values[high[0]]) if high else v
            bottom = min(v, values[low[0]]) if low else v
            if top - bottom > width:
                break
            j += 1
            while high and values[high[-1]] <= v:
                high.pop()
            high.append(j)
            while low and values[low[-1]] >= v:
                low.pop()
            low.append(j)
        ends[i] = j
    return ends


def plateaus(t: ArrayLike, series: ArrayLike, *, tol: ScalarLike = DEFAULT_TOL,
             min_decades: ScalarLike = DEFAULT_MIN_DECADES, origin: ScalarLike = 0.0) -> Plateaus:
    """The plateaus of `series` over log time: maximal windows whose values span at
    most `tol` times the range of the series and that last at least `min_decades`
    decades of $t -$ `origin`, found longest first (see the module docstring)."""
    t, values = _check(t, series, tol, min_decades, "min_decades")
    tol, min_decades = float(tol), float(min_decades)
    index, log_t = _kept(t, values, float(origin))
    found: list[tuple[int, int]] = []
    kept = values[index]
    if index.size:
        ends = _flat_ends(kept, tol * (kept.max() - kept.min()))
        pending = [(0, index.size - 1)]
        while pending:
            lo, hi = pending.pop()
            if lo > hi:
                continue
            starts = np.arange(lo, hi + 1)
            stops = np.minimum(ends[lo : hi + 1], hi)
            lasting = log_t[stops] - log_t[starts]
            best = int(np.argmax(lasting))
            if lasting[best] < min_decades:
                continue
            i, j = lo + best, int(stops[best])
            found.append((i, j))
            pending += [(lo, i - 1), (j + 1, hi)]
        found.sort()
    first = np.array([index[i] for i, _ in found], dtype=np.int64)
    last = np.array([index[j] for _, j in found], dtype=np.int64)
    level = np.array([np.median(kept[i : j + 1]) for i, j in found], dtype=np.float64)
    return Plateaus(first, last, t[first], t[last], level)


def _holding_runs(t: np.ndarray, values: np.ndarray, hold_decades: float, origin: float) -> list[tuple[int, float]]:
    """The runs of one value that hold at least `hold_decades`, neighbours of one value
    joined: (index of the run's first sample, value)."""
    index, log_t = _kept(t, values, origin)
    if not index.size:
        return []
    kept = values[index]
    starts = np.flatnonzero(np.r_[True, kept[1:] != kept[:-1]])
    stops = np.r_[starts[1:], kept.size] - 1
    runs: list[tuple[int, float]] = []
    for a, b in zip(starts, stops):
        if log_t[b] - log_t[a] >= hold_decades and not (runs and runs[-1][1] == kept[a]):
            runs.append((int(index[a]), float(kept[a])))
    return runs


def merges(t: ArrayLike, clusters: ArrayLike, *, hold_decades: ScalarLike = DEFAULT_HOLD_DECADES,
           origin: ScalarLike = 0.0) -> Merges:
    """The merges of a cluster-count series: the steps down between runs of one count
    that each hold at least `hold_decades` decades of $t -$ `origin`, timed at the first
    sample of the lower count (see the module docstring)."""
    t, values = _check(t, clusters, None, hold_decades, "hold_decades")
    runs = _holding_runs(t, values, float(hold_decades), float(origin))
    steps = [(start, high, low) for (_, high), (start, low) in pairwise(runs) if low < high]
    index = np.array([start for start, _, _ in steps], dtype=np.int64)
    return Merges(index, t[index], np.array([high for _, high, _ in steps], dtype=np.int64),
                  np.array([low for _, _, low in steps], dtype=np.int64))


def _origin(ds: xr.Dataset) -> float:
    """$t_0$ of the run that wrote `ds` (from its stored config), else 0."""
    import yaml

    config = ds.attrs.get("config")
    if isinstance(config, str):
        t0 = (yaml.safe_load(config) or {}).get("t0")
        if t0 is not None:
            return float(t0)
    return 0.0


def _padded(rows: list[np.ndarray], size: int, fill, dtype) -> np.ndarray:
    out = np.full((len(rows), size), fill, dtype=dtype)
    for k, row in enumerate(rows):
        out[k, : len(row)] = row
    return out


def detect_metastability(ds: xr.Dataset, series: Sequence[str] | None = None, *, clusters: str | None = "clusters",
                         tol: ScalarLike = DEFAULT_TOL, min_decades: ScalarLike = DEFAULT_MIN_DECADES,
                         hold_decades: ScalarLike = DEFAULT_HOLD_DECADES,
                         origin: ScalarLike | None = None) -> xr.Dataset:
    """Plateaus of each variable in `series` and merges of the variable `clusters`, for
    every series along `time` of a results Dataset (every member, beta, ...).

    `series` defaults to the energy (or, failing it, the log-energy) and the cluster
    count, those the Dataset holds; `origin` defaults to the run's t0. Returns, over the
    Dataset's other dimensions and a `plateau` (a `merge`) dimension padded with NaN
    (-1 for counts) to the largest number found: `NAME_plateau_start`, `_end` and
    `_level` with `NAME_plateau_count` for each series, and `merge_time`, `merge_from`,
    `merge_to` with `merge_count`. `tol`, `min_decades`, `hold_decades` and `origin`
    are attributes.
    """
    if "time" not in ds.dims:
        raise ValueError("the Dataset has no time dimension; give one with a `time` coordinate.")
    if series is None:
        energy = [name for name in ("energy", "log_energy") if name in ds][:1]
        series = energy + ([clusters] if clusters is not None and clusters in ds else [])
    missing = [name for name in [*series, *([clusters] if clusters else [])] if name not in ds]
    if missing:
        raise ValueError(f"the Dataset has no variable {missing[0]!r}; it holds {', '.join(map(str, ds.data_vars))}.")
    if not series and clusters is None:
        raise ValueError("nothing to detect: give at least one series or the cluster-count variable.")
    origin = _origin(ds) if origin is None else float(origin)
    t = ds["time"].values
    first = ds[[*series, *([clusters] if clusters else [])][0]]
    rest = tuple(d for d in first.dims if d != "time")
    coords = {k: v for k, v in first.coords.items() if "time" not in v.dims}

    def rows_of(name: str) -> np.ndarray:
        da = ds[name]
        if "time" not in da.dims or set(da.dims) != {*rest, "time"}:
            raise ValueError(f"{name} has dimensions {da.dims}; the series read together need the same ones, "
                             f"{(*rest, 'time')}.")
        return da.transpose(*rest, "time").values.reshape(-1, t.size)

    sizes: dict[str, int] = {}
    out = {}
    for name in series:
        found = [plateaus(t, row, tol=tol, min_decades=min_decades, origin=origin) for row in rows_of(name)]
        sizes["plateau"] = max([sizes.get("plateau", 0)] + [len(p.first) for p in found])
        out[name] = found
    merged = None
    if clusters is not None:
        merged = [merges(t, row, hold_decades=hold_decades, origin=origin) for row in rows_of(clusters)]
        sizes["merge"] = max([0] + [len(m.index) for m in merged])
    shape = tuple(ds.sizes[d] for d in rest)
    variables = {}
    where = f"over log time from t0 = {origin:g} (tol {tol:g} of the range, at least {min_decades:g} decades)"
    for name, found in out.items():
        size = sizes["plateau"]
        for field, what in (("start", "first time"), ("end", "last time"), ("level", "median value")):
            values = _padded([getattr(p, field) for p in found], size, np.nan, np.float64)
            variables[f"{name}_plateau_{field}"] = (rest + ("plateau",), values.reshape(shape + (size,)),
                                                    {"description": f"{what} of each plateau of {name} {where}; "
                                                                    "NaN pads"})
        variables[f"{name}_plateau_count"] = (rest, np.array([len(p.first) for p in found]).reshape(shape),
                                              {"description": f"number of plateaus of {name} {where}"})
    if merged is not None:
        size = sizes["merge"]
        held = f"between counts of {clusters} that hold at least {hold_decades:g} decades of t - {origin:g}"
        variables["merge_time"] = (rest + ("merge",), _padded([m.time for m in merged], size, np.nan,
                                                              np.float64).reshape(shape + (size,)),
                                   {"description": f"first time of the lower count of each merge {held}; NaN pads"})
        for field, key, what in (("before", "merge_from", "before"), ("after", "merge_to", "after")):
            variables[key] = (rest + ("merge",), _padded([getattr(m, field) for m in merged], size, -1,
                                                         np.int64).reshape(shape + (size,)),
                              {"description": f"cluster count {what} each merge {held}; -1 pads"})
        variables["merge_count"] = (rest, np.array([len(m.index) for m in merged]).reshape(shape),
                                    {"description": f"number of merges {held}"})
    coords = {**coords, **{dim: np.arange(size) for dim, size in sizes.items()}}
    return xr.Dataset(variables, coords=coords,
                      attrs={"tol": float(tol), "min_decades": float(min_decades),
                             "hold_decades": float(hold_decades), "origin": float(origin)})
