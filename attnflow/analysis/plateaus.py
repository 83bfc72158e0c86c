"""Metastability, found automatically: plateaus of a time series while the cluster
partition holds, and the merges of clusters with their times.

Tokens under self-attention often gather quickly into a few clusters that then stay
apart for a time exponentially long in beta before they merge ("A Survey of Continuous
Time Dynamics of Transformers", section 4.1 and theorem 4.7; "Dynamic metastability in
the self-attention model", Geshkovski, Koubbi, Polyanskiy, Rigollet). The interaction
energy then climbs a staircase whose levels are those of the cluster partitions: for
point clusters of sizes $m_1, \\dots, m_k$ far apart at large beta,

$$\\frac{1}{n^2} \\sum_{ij} e^{\\beta(\\langle x_i, x_j\\rangle - 1)} \\to \\sum_q \\frac{m_q^2}{n^2}$$

(7/25, 11/25, 13/25 and 1 for the partitions (2, 1, 1, 1), (3, 1, 1), (3, 2) and (5) of
five tokens). This module reads such series, whatever run produced them.

**The time axis.** `axis="log"` puts a sample at time $t$ at $\\log_{10}(t - t_0)$, with
$t_0$ the `origin` (the start of the run), and measures durations in decades of
$t - t_0$; samples at or before the origin are left out. `axis="linear"` puts it at $t$
and measures durations in units of time (a run at constant speed records the rescaled
time, whose staircase is read on a linear axis). Samples whose value is not finite (the
tail of a failed member) are left out.

**Plateaus.** A plateau is a level that holds while the cluster partition holds. The
samples are cut into *partition runs*: stretches of consecutive samples with one
partition (the sorted cluster sizes, e.g. the `cluster_sizes` metric; without a
partition the whole series is one run). With $R = \\max s - \\min s$ the range of the
series $s$, a window of consecutive samples is *flat* when its values span at most
$\\mathrm{tol} \\cdot R$. Inside each run, the longest flat window (the earliest among
equals) becomes a plateau if it lasts, from its first to its last sample, at least
`min_length` on the axis; the parts of the run to its left and right are searched the
same way, until no flat window that is left lasts long enough. Plateaus are therefore
maximal within their run and never overlap, and each is reported with its partition,
the partition's level $\\sum_q m_q^2 / n^2$, and its measured level (the median of the
series over the plateau). A series that never changes ($R = 0$) is one plateau per run.

**Drifts are not plateaus.** A series that changes while no partition holds (the
partition changes faster than `min_length`) has no run long enough to hold one. A series
that changes at a constant rate along the axis spans $\\mathrm{tol} \\cdot R$ in a window
of $\\mathrm{tol}$ times the axis' span: `min_length` must exceed that (it is checked), so
such a drift is never flat for long enough. The tolerance is relative to the range so
that the energy $E_\\beta$ (of order $e^\\beta$), its logarithm, the energy relative to
one cluster and the cluster count are all read with one number.

**Merges.** The cluster count is split into runs of one value. A run *holds* when it
lasts, from its first to its last sample, at least `hold_length` on the axis; runs that
do not hold (a one-sample flicker never does) are ignored, and neighbouring runs that
hold with the same value join. A merge is a step down between two successive runs that
hold: its time is the first sample of the lower run (the time from which the new count
holds), and it records the count before and after. Several tokens or clusters that merge
within less than `hold_length` of each other make one merge (8 -> 2, say), as the record
cannot tell them apart. Steps up (a cluster splitting, possible with other weights) are
not merges, but the count after them is the one the next merge starts from.

`plateaus` and `merges` read one series (NumPy arrays); `detect_metastability` reads a
whole results Dataset (any dimensions besides `time`, such as beta and member) and
returns its plateaus (with their partitions when the Dataset holds the cluster sizes) and
merges padded to a fixed size (NaN and -1), ready for NetCDF.
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

from ..storage._store import read_config

__all__ = ["Merges", "Plateaus", "detect_metastability", "merges", "partition_level", "plateaus"]

# A plateau spans at most 2% of the range and lasts at least half a decade (a factor of
# about 3 in time: shorter is a slow drift chopped into pieces, not a metastable state);
# a cluster count holds when it lasts a fifth of a decade (a factor of about 1.6).
DEFAULT_TOL = 0.02
DEFAULT_MIN_LENGTH = 0.5
DEFAULT_HOLD_LENGTH = 0.2
AXES = ("log", "linear")


class Plateaus(NamedTuple):
    """The plateaus of one series, in time order: sample indices `first` and `last`
    (inclusive, into the arrays given), their times `start` and `end`, `level`, the
    median of the series over each plateau, and, when a partition was given, the
    `partition` of each (its cluster sizes, largest first, zero-padded: shape
    `(plateaus, n)`) and that partition's level $\\sum_q m_q^2 / n^2$ (NaN without one)."""

    first: np.ndarray
    last: np.ndarray
    start: np.ndarray
    end: np.ndarray
    level: np.ndarray
    partition: np.ndarray
    partition_level: np.ndarray


class Merges(NamedTuple):
    """The merges of one cluster-count series, in time order: the sample `index` (into
    the arrays given) and `time` from which the lower count holds, and the counts
    `before` and `after`."""

    index: np.ndarray
    time: np.ndarray
    before: np.ndarray
    after: np.ndarray


def partition_level(sizes: ArrayLike) -> np.ndarray:
    """$\\sum_q m_q^2 / n^2$ of cluster sizes $m_q$ along the last axis ($n = \\sum_q m_q$):
    the energy $\\frac{1}{n^2}\\sum_{ij} e^{\\beta(\\langle x_i, x_j\\rangle - 1)}$ of point
    clusters of those sizes infinitely far apart in the scale of beta."""
    sizes = np.asarray(sizes, dtype=np.float64)
    return np.sum(sizes**2, axis=-1) / np.sum(sizes, axis=-1) ** 2


def _axis(axis: str) -> None:
    if axis not in AXES:
        raise ValueError(f"axis must be one of {', '.join(AXES)}, got {axis!r}.")


def _check(
    t: ArrayLike, series: ArrayLike, tol: ScalarLike | None, length: ScalarLike, name: str, axis: str
) -> tuple[np.ndarray, np.ndarray]:
    _axis(axis)
    t = np.asarray(t, dtype=np.float64)
    values = np.asarray(series, dtype=np.float64)
    if t.ndim != 1 or values.shape != t.shape:
        raise ValueError(f"times and series must be 1-D arrays of one length, got shapes {t.shape} and {values.shape}.")
    if np.any(np.diff(t) <= 0):
        raise ValueError("times must increase strictly.")
    if tol is not None and not (np.isfinite(tol) and 0 <= tol < 1):  # pyright: ignore[reportOperatorIssue]  # a ScalarLike is a real number here; the stub's ArrayLike admits complex
        raise ValueError(f"tol is a fraction of the series' range in [0, 1), got tol={tol!r}.")
    unit = "decades" if axis == "log" else "units of time"
    if not (np.isfinite(length) and length >= 0):  # pyright: ignore[reportOperatorIssue]  # a ScalarLike is a real number here; the stub's ArrayLike admits complex
        raise ValueError(f"{name} must be a number of {unit} >= 0, got {length!r}.")
    return t, values


def _kept(t: np.ndarray, values: np.ndarray, origin: float, axis: str) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the samples on the axis and their positions there."""
    if axis == "log":
        index = np.flatnonzero((t > origin) & np.isfinite(values))
        return index, np.log10(t[index] - origin)
    index = np.flatnonzero(np.isfinite(values))
    return index, t[index]


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


def _runs(sizes: np.ndarray | None, count: int) -> list[tuple[int, int]]:
    """The partition runs `(first, last)` over `count` kept samples whose partitions are
    the rows of `sizes` (one run without them); a row with a missing entry is no
    partition and belongs to no run."""
    if sizes is None:
        return [(0, count - 1)] if count else []
    valid = np.all(np.isfinite(sizes) & (sizes >= 0), axis=1)
    change = np.r_[True, np.any(sizes[1:] != sizes[:-1], axis=1) | (valid[1:] != valid[:-1])]
    starts = np.flatnonzero(change)
    stops = np.r_[starts[1:], count] - 1
    return [(int(a), int(b)) for a, b in zip(starts, stops) if valid[a]]


def plateaus(
    t: ArrayLike,
    series: ArrayLike,
    *,
    sizes: ArrayLike | None = None,
    tol: ScalarLike = DEFAULT_TOL,
    min_length: ScalarLike = DEFAULT_MIN_LENGTH,
    axis: str = "log",
    origin: ScalarLike = 0.0,
) -> Plateaus:
    """The plateaus of `series`: within each stretch where the partition `sizes` (shape
    `(times, clusters)`, each row the cluster sizes at one time, largest first; None: no
    partition) holds, the maximal windows whose values span at most `tol` times the range
    of the series and that last at least `min_length` on the `axis` (`"log"`: decades of
    $t -$ `origin`; `"linear"`: units of $t$), found longest first (see the module
    docstring). Raises `ValueError` when `min_length` does not exceed `tol` times the span
    of the axis, where a series drifting at a constant rate would have plateaus."""
    t, values = _check(t, series, tol, min_length, "min_length", axis)
    tol, min_length = float(tol), float(min_length)  # pyright: ignore[reportArgumentType]  # a ScalarLike is a real number here; the stub's ArrayLike admits complex
    if sizes is not None:
        sizes = np.asarray(sizes, dtype=np.float64)
        if sizes.ndim != 2 or sizes.shape[0] != t.size:
            raise ValueError(
                f"sizes must have one row of cluster sizes per time, shape ({t.size}, clusters), got {sizes.shape}."
            )
    index, position = _kept(t, values, float(origin), axis)  # pyright: ignore[reportArgumentType]  # a ScalarLike is a real number here; the stub's ArrayLike admits complex
    if index.size > 1 and tol > 0 and min_length <= tol * (position[-1] - position[0]):
        unit = "decades" if axis == "log" else "units of time"
        raise ValueError(
            f"min_length={min_length:g} must exceed tol times the span of the {axis} axis "
            f"({tol:g} x {position[-1] - position[0]:.4g} {unit}), or a series drifting at a constant "
            "rate would be cut into plateaus."
        )
    kept = values[index]
    found: list[tuple[int, int]] = []
    if index.size:
        ends = _flat_ends(kept, tol * (kept.max() - kept.min()))
        pending = _runs(None if sizes is None else sizes[index], index.size)
        while pending:
            lo, hi = pending.pop()
            if lo > hi:
                continue
            starts = np.arange(lo, hi + 1)
            stops = np.minimum(ends[lo : hi + 1], hi)
            lasting = position[stops] - position[starts]
            best = int(np.argmax(lasting))
            if lasting[best] < min_length:
                continue
            i, j = lo + best, int(stops[best])
            found.append((i, j))
            pending += [(lo, i - 1), (j + 1, hi)]
        found.sort()
    first = np.array([index[i] for i, _ in found], dtype=np.int64)
    last = np.array([index[j] for _, j in found], dtype=np.int64)
    level = np.array([np.median(kept[i : j + 1]) for i, j in found], dtype=np.float64)
    if sizes is None:
        partition = np.zeros((len(found), 0), dtype=np.int64)
        partition_levels = np.full(len(found), np.nan)
    else:
        partition = sizes[first].astype(np.int64).reshape(len(found), sizes.shape[1])
        partition_levels = partition_level(partition) if len(found) else np.zeros(0)
    return Plateaus(first, last, t[first], t[last], level, partition, partition_levels)


def _holding_runs(
    t: np.ndarray, values: np.ndarray, hold_length: float, origin: float, axis: str
) -> list[tuple[int, float]]:
    """The runs of one value that hold at least `hold_length`, neighbours of one value
    joined: (index of the run's first sample, value)."""
    index, position = _kept(t, values, origin, axis)
    if not index.size:
        return []
    kept = values[index]
    starts = np.flatnonzero(np.r_[True, kept[1:] != kept[:-1]])
    stops = np.r_[starts[1:], kept.size] - 1
    runs: list[tuple[int, float]] = []
    for a, b in zip(starts, stops):
        if position[b] - position[a] >= hold_length and not (runs and runs[-1][1] == kept[a]):
            runs.append((int(index[a]), float(kept[a])))
    return runs


def merges(
    t: ArrayLike,
    clusters: ArrayLike,
    *,
    hold_length: ScalarLike = DEFAULT_HOLD_LENGTH,
    axis: str = "log",
    origin: ScalarLike = 0.0,
) -> Merges:
    """The merges of a cluster-count series: the steps down between runs of one count
    that each hold at least `hold_length` on the `axis` (decades of $t -$ `origin`, or
    units of $t$), timed at the first sample of the lower count (see the module
    docstring)."""
    t, values = _check(t, clusters, None, hold_length, "hold_length", axis)
    runs = _holding_runs(t, values, float(hold_length), float(origin), axis)  # pyright: ignore[reportArgumentType]  # a ScalarLike is a real number here; the stub's ArrayLike admits complex
    steps = [(start, high, low) for (_, high), (start, low) in pairwise(runs) if low < high]
    index = np.array([start for start, _, _ in steps], dtype=np.int64)
    return Merges(
        index,
        t[index],
        np.array([high for _, high, _ in steps], dtype=np.int64),
        np.array([low for _, _, low in steps], dtype=np.int64),
    )


def _origin(ds: xr.Dataset) -> float:
    """$t_0$ of the run that wrote `ds` (from its stored config), else 0."""
    config = ds.attrs.get("config")
    if isinstance(config, str):
        t0 = (read_config(ds.encoding.get("source", "this Dataset"), config) or {}).get("t0")
        if t0 is not None:
            return float(t0)
    return 0.0


def _padded(rows: list[np.ndarray], size: int, fill, dtype) -> np.ndarray:
    out = np.full((len(rows), size) + (rows[0].shape[1:] if rows else ()), fill, dtype=dtype)
    for k, row in enumerate(rows):
        out[k, : len(row)] = row
    return out


def detect_metastability(
    ds: xr.Dataset,
    series: Sequence[str] | None = None,
    *,
    clusters: str | None = "clusters",
    sizes: str | None = "cluster_sizes",
    tol: ScalarLike = DEFAULT_TOL,
    min_length: ScalarLike = DEFAULT_MIN_LENGTH,
    hold_length: ScalarLike = DEFAULT_HOLD_LENGTH,
    axis: str = "log",
    origin: ScalarLike | None = None,
) -> xr.Dataset:
    """Plateaus of each variable in `series` and merges of the variable `clusters`, for
    every series along `time` of a results Dataset (every member, beta, ...).

    `series` defaults to the energy (or, failing it, the log-energy) and the cluster
    count, those the Dataset holds. Plateaus hold while the partition of the variable
    `sizes` (the `cluster_sizes` metric: dimensions those of the series and `cluster`)
    holds, when the Dataset has it (`sizes=None` leaves the partition out). `axis` is
    `"log"` (lengths in decades of $t - t_0$) or `"linear"` (lengths in units of $t$);
    `origin` defaults to the run's t0.

    Returns, over the Dataset's other dimensions and a `plateau` (a `merge`) dimension
    padded with NaN (-1 for counts) to the largest number found: `NAME_plateau_start`,
    `_end` and `_level` with `NAME_plateau_count` for each series, with the partition
    `NAME_plateau_partition` (over `cluster`) and its level
    `NAME_plateau_partition_level` when a partition was read; and `merge_time`,
    `merge_from`, `merge_to` with `merge_count`. `tol`, `min_length`, `hold_length`,
    `axis` and `origin` are attributes.
    """
    _axis(axis)
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
    sizes = sizes if sizes is not None and sizes in ds else None
    origin = _origin(ds) if origin is None else float(origin)  # pyright: ignore[reportArgumentType]  # a ScalarLike is a real number here; the stub's ArrayLike admits complex
    t = ds["time"].values
    first = ds[[*series, *([clusters] if clusters else [])][0]]
    rest = tuple(d for d in first.dims if d != "time")
    coords = {k: v for k, v in first.coords.items() if "time" not in v.dims}

    def rows_of(name: str, extra: tuple[str, ...] = ()) -> np.ndarray:
        da = ds[name]
        if "time" not in da.dims or set(da.dims) != {*rest, "time", *extra}:
            raise ValueError(
                f"{name} has dimensions {da.dims}; the series read together need the same ones, "
                f"{(*rest, 'time', *extra)}."
            )
        values = da.transpose(*rest, "time", *extra).values
        return values.reshape((-1, t.size) + values.shape[len(rest) + 1 :])

    partitions = [None] * int(np.prod([ds.sizes[d] for d in rest], dtype=np.int64))
    if sizes is not None:
        partitions = list(rows_of(sizes, ("cluster",)))
    sizes_found: dict[str, int] = {}
    out = {}
    for name in series:
        found = [
            plateaus(t, row, sizes=part, tol=tol, min_length=min_length, axis=axis, origin=origin)
            for row, part in zip(rows_of(name), partitions)
        ]
        sizes_found["plateau"] = max([sizes_found.get("plateau", 0)] + [len(p.first) for p in found])
        out[name] = found
    merged = None
    if clusters is not None:
        merged = [merges(t, row, hold_length=hold_length, axis=axis, origin=origin) for row in rows_of(clusters)]
        sizes_found["merge"] = max([0] + [len(m.index) for m in merged])
    shape = tuple(ds.sizes[d] for d in rest)
    variables = {}
    unit = "decades" if axis == "log" else "units of time"
    where = f"over {axis} time from t0 = {origin:g} (tol {tol:g} of the range, at least {min_length:g} {unit}" + (
        f", while the partition of {sizes} holds)" if sizes is not None else ")"
    )
    for name, found in out.items():
        size = sizes_found["plateau"]
        for field, what in (("start", "first time"), ("end", "last time"), ("level", "median value")):
            values = _padded([getattr(p, field) for p in found], size, np.nan, np.float64)
            variables[f"{name}_plateau_{field}"] = (
                rest + ("plateau",),
                values.reshape(shape + (size,)),
                {"description": f"{what} of each plateau of {name} {where}; NaN pads"},
            )
        variables[f"{name}_plateau_count"] = (
            rest,
            np.array([len(p.first) for p in found]).reshape(shape),
            {"description": f"number of plateaus of {name} {where}"},
        )
        if sizes is not None:
            clusters_dim = ds.sizes["cluster"]
            parts = _padded([p.partition for p in found], size, -1, np.int64)
            variables[f"{name}_plateau_partition"] = (
                rest + ("plateau", "cluster"),
                parts.reshape(shape + (size, clusters_dim)),
                {"description": f"cluster sizes (largest first, zero-padded) during each plateau of {name}; -1 pads"},
            )
            variables[f"{name}_plateau_partition_level"] = (
                rest + ("plateau",),
                _padded([p.partition_level for p in found], size, np.nan, np.float64).reshape(shape + (size,)),
                {
                    "description": f"sum_q m_q^2 / n^2 of the partition of each plateau of {name} (the level of point "
                    "clusters far apart); NaN pads"
                },
            )
    if merged is not None:
        size = sizes_found["merge"]
        held = f"between counts of {clusters} that hold at least {hold_length:g} {unit} of the {axis} time axis"
        variables["merge_time"] = (
            rest + ("merge",),
            _padded([m.time for m in merged], size, np.nan, np.float64).reshape(shape + (size,)),
            {"description": f"first time of the lower count of each merge {held}; NaN pads"},
        )
        for field, key, what in (("before", "merge_from", "before"), ("after", "merge_to", "after")):
            variables[key] = (
                rest + ("merge",),
                _padded([getattr(m, field) for m in merged], size, -1, np.int64).reshape(shape + (size,)),
                {"description": f"cluster count {what} each merge {held}; -1 pads"},
            )
        variables["merge_count"] = (
            rest,
            np.array([len(m.index) for m in merged]).reshape(shape),
            {"description": f"number of merges {held}"},
        )
    coords = {**coords, **{dim: np.arange(size) for dim, size in sizes_found.items()}}
    return xr.Dataset(
        variables,
        coords=coords,
        attrs={
            "tol": float(tol),  # pyright: ignore[reportArgumentType]  # a ScalarLike is a real number here; the stub's ArrayLike admits complex
            "min_length": float(min_length),  # pyright: ignore[reportArgumentType]  # a ScalarLike is a real number here; the stub's ArrayLike admits complex
            "hold_length": float(hold_length),  # pyright: ignore[reportArgumentType]  # a ScalarLike is a real number here; the stub's ArrayLike admits complex
            "axis": axis,
            "origin": float(origin),
        },
    )
