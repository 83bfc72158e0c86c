"""Every metric a run can record, one entry each: the one place a metric is declared.

An entry says what the config accepts (`metrics: [name, ...]`), what the metric reads
(the clustering threshold `cluster_eps`, the attention maps), the dimensions it adds to a
saved time, its description and units in `results.nc`, its label and reduction in the
summary figure and in `attnflow report`, whether it can go through tiles, where it can
be computed in less than $n^2$ time (`subquadratic`), and how many bytes one saved value
takes. Its function is the method of the same name of
`attnflow.numerics._metrics.Pairs` (what the metrics of one state share: the Gram matrix, the
cosines, the close pairs, the cluster labels), dense or tiled as the state says.

This module imports neither JAX nor xarray: reading a config, checking it and sizing
a run need only these entries. Adding a metric: one entry here, one method of
`Pairs`, and its test.

A researcher's own metric is a function of one member's tokens in their own module,
registered with the decorator `metric` and named in `metrics` by its import path
(`metrics=[energy,mymodule.spread]`): see `metric`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ._errors import ConfigError, did_you_mean
from ._plugins import import_target


class Sizes(NamedTuple):
    """What the size of one saved value depends on: tokens, heads, bytes of a float,
    attention rows kept (None: all of them), source tokens of cross-attention."""

    n: int
    heads: int
    itemsize: int
    rows: int | None
    sources: int = 0


def _identity(da: Any) -> Any:
    return da


def _largest_cluster(da: Any) -> Any:
    return da.isel(cluster=0) / da.sizes["cluster"]


def _mean_rank(da: Any) -> Any:
    return da.mean("head", skipna=False)


def _count_distinct(values: Any, axis: int) -> Any:
    """How many distinct labels lie along `axis` (NaN where one is missing)."""
    a = np.sort(np.moveaxis(np.asarray(values, np.float64), axis, -1), axis=-1)
    valid = np.isfinite(a) & (a >= 0)
    count = 1 + ((np.diff(a, axis=-1) != 0) & valid[..., 1:]).sum(-1)
    return np.where(valid.all(-1), count, np.nan)


def _distinct(da: Any) -> Any:
    """The number of distinct values along `token` (each member and time apart)."""
    return da.reduce(_count_distinct, dim="token")


def _concentration(da: Any) -> Any:
    return da.max("key", skipna=False).mean(("query", "head"), skipna=False)


@dataclass(frozen=True)
class Metric:
    """One metric.

    Arguments:
        name: the config's name and the variable of `results.nc`.
        description: its `description` attribute in `results.nc` (what it is).
        units: its CF `units` attribute ("1": a pure number).
        label: the y label of its panel in the summary figure.
        dims: the dimensions one saved value adds after (beta, member, time).
        size: bytes of one saved value, from `Sizes`.
        reads_eps: whether it reads the clustering threshold `cluster_eps`.
        reads_attention: whether it reads the attention maps (needs `attention=true`).
        reads_source: whether it reads the source tokens of cross-attention (needs
            `cross.enabled=true`).
        reads_beta: whether it reads beta itself (not only through the states).
        tiled: whether it can go through tiles (else it needs whole n x n maps).
        subquadratic: where it can be computed in less than n^2 time: "any" (every
            configuration: O(n)), "circle" (tokens on the circle, d = 2: from the sorted
            angles, `Recorder(on_circle=True)`), "moments" (tokens on the sphere with
            d <= 3: from the harmonic moments of the summation), "" (nowhere: it reads
            every pair, or whole attention maps). See `subquadratic_metrics`.
        cosines: whether it reads cosines of the states (tokens must not be zero).
        reduce: its reduction to (beta?, member, time) for the figure and the report.
        limits: the y range of its panel, or None.
        reduced_name: the name of the reduced series in `attnflow report`, when not `name`.
        panel: its place among the summary figure's panels (lower first).
    """

    name: str
    description: str
    units: str
    label: str
    dims: tuple[str, ...]
    size: Callable[[Sizes], int]
    reads_eps: bool = False
    reads_attention: bool = False
    reads_source: bool = False
    reads_beta: bool = False
    tiled: bool = True
    subquadratic: str = ""
    cosines: bool = False
    reduce: Callable[[Any], Any] = _identity
    limits: tuple[float, float] | None = None
    reduced_name: str | None = None
    panel: int = 0


_EPS = r"\varepsilon"
_ENERGY = r"$E_\beta = \sum_{ij} e^{\beta\langle x_i, x_j\rangle} / (2\beta n^2)$"

# In the config's order (its list of choices); `panel` orders the summary figure.
METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric(
            "energy",
            "interaction energy E_beta = sum_ij exp(beta <x_i,x_j>) / (2 beta n^2)",
            "1",
            "interaction energy\n" + _ENERGY,
            (),
            lambda s: s.itemsize,
            reads_beta=True,
            panel=3,
            subquadratic="moments",
        ),
        Metric(
            "log_energy",
            "log of the interaction energy (finite for any beta)",
            "1",
            "log interaction energy " r"$\log E_\beta$" "\n" + _ENERGY,
            (),
            lambda s: s.itemsize,
            reads_beta=True,
            panel=2,
            subquadratic="moments",
        ),
        Metric(
            "normalized_energy",
            "mean_ij exp(cos(x_i, x_j))",
            "1",
            "normalized energy\n" r"$\sum_{ij} e^{\cos(x_i, x_j)} / n^2$",
            (),
            lambda s: s.itemsize,
            cosines=True,
            panel=4,
        ),
        Metric(
            "pair_density",
            "fraction of pairs i != j with cos(x_i, x_j) > 1 - eps",
            "1",
            "pair density\n" rf"$P(\cos(x_i, x_j) > 1 - {_EPS})$",
            (),
            lambda s: s.itemsize,
            reads_eps=True,
            cosines=True,
            limits=(0.0, 1.0),
            panel=0,
            subquadratic="circle",
        ),
        Metric(
            "clusters",
            "connected components of the graph cos(x_i, x_j) > 1 - eps",
            "1",
            "clusters\n" rf"components of $\cos > 1 - {_EPS}$",
            (),
            lambda s: 4,
            reads_eps=True,
            cosines=True,
            panel=1,
            subquadratic="circle",
        ),
        Metric(
            "cluster_sizes",
            "cluster sizes, largest first, zero-padded",
            "1",
            "largest cluster\n" r"$|C_{\max}| / n$",
            ("cluster",),
            lambda s: 4 * s.n,
            reads_eps=True,
            cosines=True,
            reduce=_largest_cluster,
            limits=(0.0, 1.0),
            reduced_name="largest_cluster",
            panel=6,
            subquadratic="circle",
        ),
        Metric(
            "order_parameter",
            "|mean_i x_i / |x_i||",
            "1",
            "order parameter\n" r"$\|\frac{1}{n}\sum_i \hat x_i\|$,  $\hat x = x / \|x\|$",
            (),
            lambda s: s.itemsize,
            cosines=True,
            limits=(0.0, 1.0),
            panel=5,
            subquadratic="any",
        ),
        Metric(
            "attention",
            "attention matrices a_ij of each head",
            "1",
            "attention concentration\n" r"$\sum_i \max_j a_{ij} / n$, mean over heads",
            ("head", "query", "key"),
            lambda s: s.heads * (s.n if s.rows is None else s.rows) * s.n * s.itemsize,
            reads_attention=True,
            reduce=_concentration,
            limits=(0.0, 1.0),
            reduced_name="attention_concentration",
            panel=8,
        ),
        Metric(
            "source_capture",
            "fraction of target tokens within eps of a source token: cos(y_i, x_j) > 1 - eps for some j",
            "1",
            "captured by the source\n" rf"$\frac{{1}}{{n}}\#\{{i: \max_j \cos(y_i, x_j) > 1 - {_EPS}\}}$",
            (),
            lambda s: s.itemsize,
            reads_eps=True,
            reads_source=True,
            cosines=True,
            limits=(0.0, 1.0),
            panel=10,
        ),
        Metric(
            "nearest_source",
            "source cluster nearest each target token: the lowest index of the source tokens within "
            "eps of the source token nearest it (largest cosine)",
            "1",
            "source clusters chosen\ndistinct nearest source clusters",
            ("token",),
            lambda s: 4 * s.n,
            reads_eps=True,
            reads_source=True,
            cosines=True,
            reduce=_distinct,
            reduced_name="source_clusters_chosen",
            panel=11,
        ),
        Metric(
            "marginal_error",
            "max over heads and keys j of |sum_i a_ij - 1|: the column-sum error of the "
            "attention matrices (0: doubly stochastic)",
            "1",
            "column marginal error\n" r"$\max_j |\sum_i a_{ij} - 1|$",
            (),
            lambda s: s.itemsize,
            reads_attention=True,
            tiled=False,
            panel=9,
        ),
        Metric(
            "attention_rank",
            "numerical rank of each head's attention matrix",
            "1",
            "attention rank\n" r"numerical rank of $(a_{ij})$, mean over heads",
            ("head",),
            lambda s: 4 * s.heads,
            reads_attention=True,
            tiled=False,
            reduce=_mean_rank,
            panel=7,
        ),
    )
}
METRIC_NAMES = tuple(METRICS)
DEFAULT_METRICS = ("energy", "log_energy", "pair_density", "clusters", "order_parameter")
# The summary figure's panels, in their order.
PANELS = tuple(sorted(METRICS.values(), key=lambda m: m.panel))


def subquadratic_metrics(d: int) -> tuple[str, ...]:
    """The built-in metrics that can be computed in less than $n^2$ time for tokens on the
    sphere in dimension `d`, in the registry's order: those of any dimension, the circle's
    at d = 2, those from the harmonic moments at d <= 3 (see `Metric.subquadratic`)."""
    where = {"any"} | ({"circle"} if d == 2 else set()) | ({"moments"} if d <= 3 else set())
    return tuple(name for name, m in METRICS.items() if m.subquadratic in where)


def reading(what: str, names) -> set[str]:
    """The built-in metrics among `names` that read `what` ("eps", "attention", "source",
    "beta" or "cosines"; a researcher's metric, named by its import path, is not among them)."""
    key = {
        "eps": "reads_eps",
        "attention": "reads_attention",
        "source": "reads_source",
        "beta": "reads_beta",
        "cosines": "cosines",
    }[what]
    return {str(name) for name in names if str(name) in METRICS and getattr(METRICS[str(name)], key)}


def names_reading(what: str) -> str:
    """`a, b or c`: the metrics that read `what`, for a message."""
    names = sorted(reading(what, METRIC_NAMES), key=METRIC_NAMES.index)
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]


# The names a researcher's metric cannot take: the built-in metrics', the states' and the
# run's bookkeeping variables, and the results' own dimensions.
TAKEN = (
    *METRIC_NAMES,
    "x",
    "source_x",
    "finite",
    "num_steps",
    "status",
    "failure_time",
    "beta",
    "member",
    "time",
    "token",
    "dim",
)


@dataclass(frozen=True)
class UserMetric:
    """A metric of a researcher's own module (see `metric`): the function, what its
    variable in `results.nc` says it is, and the dimensions its value has beyond (beta,
    member, time). Its variable is named after the function."""

    function: Callable[..., Any]
    long_name: str
    units: str
    dims: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.function.__name__

    @property
    def takes_context(self) -> bool:
        """Whether the function takes the context of the record as its second argument."""
        parameters = [
            p
            for p in inspect.signature(self.function).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        return len(parameters) >= 2


def metric(*, long_name: str, units: str = "1", dims: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    r"""Register a function as a metric that a run can record at every saved time.

    The function takes one member's tokens, `f(x)` with `x` of shape `(n, d)`, or
    `f(x, context)`, where `context` (`attnflow.MetricContext`) carries the time, beta,
    the clustering threshold (`cluster_eps`, as `context.eps`), the member's vector field
    and the run's config; it is written for one member in `jax.numpy` (attnflow maps it
    over the ensemble) and returns a scalar, or an array whose axes `dims` names. Named
    in `metrics` by its import path, `metrics=[energy,mymodule.spread]`, it is recorded
    as the variable named after the function, with `long_name` and `units` as its
    attributes:

        @attnflow.metric(long_name="mean distance to the centroid", units="1")
        def spread(x):
            return jnp.mean(jnp.linalg.norm(x - x.mean(axis=0), axis=-1))

    A name already taken (a built-in metric, `x`, `status`, ...) is refused when the run
    is checked.
    """
    if not isinstance(long_name, str) or not long_name:
        raise TypeError("attnflow.metric needs long_name, a description of what the metric is.")
    if not (isinstance(dims, tuple) and all(isinstance(dim, str) and dim.isidentifier() for dim in dims)):
        raise TypeError(f"attnflow.metric takes dims, a tuple of dimension names, got {dims!r}.")

    def register(function: Callable) -> Callable:
        function.__attnflow_metric__ = UserMetric(function, long_name, str(units), dims)
        return function

    return register


def registered(function: Any) -> UserMetric | None:
    """The registration of a user's metric (`metric`), or None for anything else."""
    found = getattr(function, "__attnflow_metric__", None)
    return found if isinstance(found, UserMetric) and found.function is function else None


def user_metrics(cfg: Any) -> tuple[UserMetric, ...]:
    """The researcher's metrics the config names (import paths of functions registered
    with `attnflow.metric`), in its order; an unknown name, a function not registered or
    a name already taken is one sentence."""
    found = []
    for name in cfg.metrics:
        name = str(name)
        if name in METRIC_NAMES:
            continue
        if "." not in name:
            guess = did_you_mean(name, METRIC_NAMES)
            raise ConfigError(
                f"unknown metric {name!r}{guess}; metrics takes {', '.join(METRIC_NAMES)}, or the "
                "import path of a function registered with @attnflow.metric (module.function)."
            )
        function = import_target(name, "metrics")
        metric = registered(function)
        if metric is None:
            raise ConfigError(
                f"metrics names {name}, which is not registered as a metric: decorate it with "
                "@attnflow.metric(long_name=...)."
            )
        if metric.name in TAKEN or metric.name in [m.name for m in found]:
            raise ConfigError(
                f"metrics names {name}, whose variable {metric.name!r} is already taken (by a "
                f"{'metric of the run' if metric.name not in TAKEN else 'variable of every run'}); "
                "rename the function."
            )
        found.append(metric)
    return tuple(found)
