"""Monte Carlo ensembles: many members and many betas, in pieces of one compiled program.

The (beta, member) pairs are cut into pieces of equal size; one compiled function
solves a piece (a `jax.vmap` over it, shared out over the local devices), so a piece is
the unit of work that an interruption can lose and a resumed run can skip. The piece
size is the member chunk: sized by the working set that ran fastest on a CPU, or to an
accelerator's memory, and never beyond what the memory holds.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import math
import os
import time
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import export
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxtyping import Array, Bool, Float, Int, Key, PRNGKeyArray

from ..numerics._grid import TimeGrid, time_grid
from ..numerics._metrics import Recorder
from ..numerics._simulate import simulate
from ..numerics._solvers import SOLVERS, tableau, tableau_of
from ..numerics._tiled import resolve_block
from ..schema._errors import ConfigError, NonFiniteStateError, SolverFailure
from ..schema._metric_registry import reading
from ..storage._store import write_atomically
from ._progress import status

# Integer statistics have no NaN: after a member's first bad state they hold this.
INTEGER_FILL = -1


@dataclasses.dataclass(frozen=True)
class EnsembleResult:
    """Statistics of an ensemble (NumPy arrays): every array has leading axes `(beta, member, time)`.

    `valid[b, m, i]` is False from the first output time at which member m at beta b
    had a non-finite state or had not been reached by its solver; from there on the
    floating-point statistics are NaN and the integer ones `INTEGER_FILL` (-1).
    `result` is 0 for a solve that reached `t1`, diffrax's failure code otherwise.
    """

    ts: Float[np.ndarray, " times"]
    stats: dict[str, np.ndarray]
    result: Int[np.ndarray, "beta member"]
    num_steps: Int[np.ndarray, "beta member"]
    valid: Bool[np.ndarray, "beta member times"]


@eqx.filter_jit
def _solve_pairs(system, keys, betas, members, beta_index, t0, t1, dt, options, mesh):
    """Solve the pairs (keys[members[p]], betas[beta_index[p]]) of one piece, a vmap
    over them (per device). The gathers happen here, inside the one compiled program."""

    def member(m, b):
        field, y0, record = system(keys[m], betas[b])
        sol = simulate(field, y0, t0=t0, t1=t1, dt=dt, record=record, **options)
        return sol.stats, sol.result, sol.num_steps, sol.reached

    solve = jax.vmap(member)
    if mesh is None:
        return solve(members, beta_index)
    spec = PartitionSpec(mesh.axis_names[0])
    return jax.shard_map(solve, mesh=mesh, in_specs=(spec, spec), out_specs=spec, check_vma=False)(members, beta_index)


def available_memory(device: jax.Device | None = None) -> int:  # pyright: ignore[reportInvalidTypeForm]  (jax.Device: an untyped alias of jaxlib's class)
    """Bytes a run may use: free device memory on an accelerator, else the host's
    available memory (`MemAvailable` of /proc/meminfo)."""
    device = device or jax.local_devices()[0]
    stats = device.memory_stats() if device.platform != "cpu" else None  # pyright: ignore[reportOptionalMemberAccess]  (a device: the first local one by default)
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _gib(size) -> str:
    return f"{size / 2**30:.1f} GiB"


class MemberFootprint(eqx.Module):
    """The memory one member's solve works in, estimated from its shapes (not measured):
    `state` the states and Runge-Kutta stages of a step, `attention` the queries, keys,
    values and mixed values of the attention heads and the MLP's hidden layer,
    `pairwise` the logits and exponentials of each head and the Gram matrix of the
    statistics, `output` the recorded statistics, `weights` the member's own arrays
    (its weight matrices and their schedules, its noise)."""

    state: int = eqx.field(static=True)
    attention: int = eqx.field(static=True)
    pairwise: int = eqx.field(static=True)
    output: int = eqx.field(static=True)
    weights: int = eqx.field(static=True, default=0)

    @property
    def working(self) -> int:
        """What one step and one record touch: the member's share of a chunk's cache
        (its weights aside: the chunk sizes were measured without them)."""
        return self.state + self.attention + self.pairwise

    def largest(self, heads: int = 1) -> tuple[str, str]:
        """What takes most of it, in words, and what lowers that (`heads`: the most heads
        of an attention term): for a refusal that names the setting responsible."""
        many = heads > 1
        parts = [
            (
                self.pairwise,
                f"the n x n attention logits{f' of each of its {heads} heads' if many else ''} and the "
                "Gram matrix of the statistics (n x attention_block in tiles)",
                f"lower {'heads or n' if many else 'n'}, drop the attention metric, or let the attention go through "
                "tiles (attention_block=null or a smaller tile size)",
            ),
            (
                self.attention,
                "the terms' arrays per token (the heads' queries, keys and values, the MLP's hidden "
                "layer, a term's own)",
                "lower heads, d_k, d_v or mlp.hidden, or the memory of a term of your own",
            ),
            (
                self.weights,
                "the weight matrices of the heads and the MLP (heads x d_k x d each)",
                "lower heads, d_k, d_v or mlp.hidden",
            ),
            (
                self.state,
                "the states and Runge-Kutta stages (n x d each)",
                "lower n or d, or take a solver of fewer stages",
            ),
            (
                self.output,
                "the statistics recorded at each saved time",
                "lower saves, or drop save_states and the attention metric",
            ),
        ]
        _, what, remedy = max(parts, key=lambda part: part[0])
        return what, remedy

    @property
    def total(self) -> int:
        return self.working + self.output + self.weights


def member_footprint(member, stages: int, saves: int) -> MemberFootprint:
    """The footprint of `member`, `(field, y0, record)` of one member (shapes suffice),
    solved with `stages` Runge-Kutta stages and `saves` outputs.

    Counted per step: the state, the stage input, the new state and one slope per stage
    ($n d$ each); per term what it says it works in (`working_bytes`: attention's
    queries, keys, values and logits, the MLP's hidden layer), or for a term that does
    not say, what XLA's memory analysis of one compiled call of it finds (never less
    than its output). Per record: the Gram matrix and the threshold graph, and the
    attention maps when they are a metric."""
    field, y0, record = member
    n, d = y0.shape
    item = y0.dtype.itemsize
    state = item * n * d * (stages + 3)
    attention = pairwise = 0
    for term in field.terms:
        known = term.working_bytes(n, item)
        tokens, pairs = known if known is not None else (measured_bytes(term, y0), 0)
        attention += tokens
        pairwise += pairs
    if isinstance(record, Recorder):
        width = resolve_block(n, record.block) or n
        pairwise += 2 * item * n * width
        if reading("attention", record.metrics):
            heads = max([getattr(t, "heads", 1) for t in field.terms], default=1)
            pairwise += item * heads * n * width
        saved = jax.eval_shape(lambda r, x, f: r(0.0, x, f), record, y0, field)
        per_save = sum(int(np.prod(leaf.shape)) * leaf.dtype.itemsize for leaf in jax.tree.leaves(saved))
    else:
        per_save = n * d * item
    # The member's own arrays: its weights (drawn per member unless shared) and schedules.
    weights = sum(
        int(np.prod(leaf.shape)) * leaf.dtype.itemsize
        for leaf in jax.tree.leaves(field)
        if hasattr(leaf, "shape")
        and hasattr(leaf, "dtype")
        and not jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)  # pyright: ignore[reportPrivateImportUsage]  (public in jax.dtypes, not re-exported in its stub)
    )
    return MemberFootprint(
        state=state, attention=attention, pairwise=pairwise, output=per_save * saves, weights=weights
    )


# What a term's call measured (by the term's structure): one compilation per kind of term.
_MEASURED: dict = {}


def measured_bytes(term, y0) -> int:
    """The memory one call of `term` at the tokens `y0` (shapes suffice) works in, from
    XLA's memory analysis of the compiled call: its temporaries and its output, never
    less than the output's $n d$ numbers (a backend without the analysis gives that)."""
    floor = int(np.prod(y0.shape)) * y0.dtype.itemsize
    arrays, static = eqx.partition(term, eqx.is_array_like)
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), jnp.result_type(a)), arrays)
    key = (static, jax.tree.structure(shapes), tuple(jax.tree.leaves(shapes)), y0.shape, str(y0.dtype))
    try:
        hash(key)
    except TypeError:  # a term with unhashable settings: measured, not remembered
        key = None
    if key is not None and key in _MEASURED:
        return _MEASURED[key]

    def call(arrays, x):
        return eqx.combine(arrays, static)(jnp.zeros((), x.dtype), x)

    x = jax.ShapeDtypeStruct(y0.shape, y0.dtype)
    try:
        analysis = jax.jit(call).lower(shapes, x).compile().memory_analysis()
        measured = int(analysis.temp_size_in_bytes + analysis.output_size_in_bytes)  # pyright: ignore[reportOptionalMemberAccess]  (no analysis: the error is caught below)
    except Exception:  # no memory analysis on this backend (or a term that cannot be lowered alone)
        measured = 0
    measured = max(measured, floor)
    if key is not None:
        _MEASURED[key] = measured
    return measured


# The working set a chunk of members may have on a CPU (`default_chunk`): the size the
# fastest chunks of the phase-diagram workload had, and a smaller one costs most at
# large d (benchmarks/layout.py; the numbers are in benchmarks/README.md).
CPU_CHUNK_BYTES = 48 * 2**20


def default_chunk(platform: str, memory: int, footprint: MemberFootprint) -> int:
    """Members solved at once per device, by default.

    On a CPU, whatever the memory, the largest power of two whose working set
    (`footprint.working` per member) stays within `CPU_CHUNK_BYTES`: each chunk runs its
    whole time loop on its own states, and its members split evenly over vector lanes
    and threads (at n = 32: 2048 members at d = 2 and 8, 1024 at d = 32 and 256 at
    d = 128; benchmarks/layout.py compares it with fixed chunks). On an accelerator
    (GPU, TPU), whose throughput grows with the batch, as many as fill a quarter of its
    free `memory`: XLA's buffers for a step and the recorded output share the rest.
    """
    per_member = max(footprint.working, 1)
    if platform == "cpu":
        return 1 << max(0, (CPU_CHUNK_BYTES // per_member).bit_length() - 1)
    return max(1, memory // (4 * per_member))


class EnsemblePlan:
    """How an ensemble is solved: its pairs, cut into `pieces` of `piece_size` each.

    `solve(i)` runs piece i and returns its output as NumPy arrays; `assemble` puts
    the pieces' outputs together into an `EnsembleResult`. A plan refuses (with a
    `ConfigError`) an ensemble whose one member, or whose output, exceeds the memory.
    """

    def __init__(
        self,
        system,
        keys,
        betas,
        grid: TimeGrid,
        *,
        solver="tsit5",
        rtol=1e-6,
        atol=1e-8,
        max_steps=100_000,
        chunk_size=None,
        devices=None,
        memory: int | None = None,
    ):
        self.system = system
        self.keys = keys
        self.dtype = np.dtype(betas.dtype if hasattr(betas, "dtype") else jnp.asarray(betas).dtype)
        self.betas = jnp.asarray(np.asarray(betas, self.dtype).reshape(-1))
        self.grid = grid
        options: dict[str, Any] = dict(solver=solver, adaptive=grid.adaptive, rtol=rtol, atol=atol, max_steps=max_steps)
        if not grid.adaptive:
            options["num_steps"] = grid.num_steps
        if grid.marks is not None:
            options["save_steps"] = grid.marks
        if grid.ts is not None:
            options["ts"] = grid.ts
        self.options = options
        count = grid.count

        self.pairs = int(self.betas.shape[0]) * int(keys.shape[0])
        devices = jax.local_devices() if devices is None else list(devices)
        stages = _stage_count(solver)
        # shapes only: nothing is computed
        member = jax.eval_shape(lambda k, b: system(k[0], b[0]), keys, self.betas)
        footprint = member_footprint(member, stages, count)
        self.member = member  # `(field, y0, record)` of one member, as shapes
        memory = available_memory(devices[0]) if memory is None else memory
        self.footprint = footprint
        platform = devices[0].platform
        # No more devices than pairs (a device with only padding to solve would take a
        # core from the others), nor, on a CPU, than members fit in half the host's
        # memory, which its devices share (`_pieces` refuses a member too large for one).
        most = self.pairs if platform != "cpu" else min(self.pairs, memory // 2 // max(footprint.total, 1))
        devices = devices[: max(1, most)]
        self.mesh = Mesh(np.array(devices), ("batch",)) if len(devices) > 1 else None
        self.piece_size, self.pieces = _pieces(
            member, footprint, self.pairs, len(devices), chunk_size, memory, platform
        )
        self._program = None  # the exported piece program, once looked up
        self._export_tried = False
        self._timing = None  # the file of its measured solve time, beside it in the cache
        self._line = None  # the status line of the first piece, while it is solved

    def _inputs(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """The member and beta index of each pair of piece i (the last piece wraps around)."""
        start = i * self.piece_size
        index = np.arange(start, start + self.piece_size) % self.pairs
        n_member = self.keys.shape[0]
        return (index % n_member).astype(np.int32), (index // n_member).astype(np.int32)

    def size_of(self, i: int) -> int:
        """The number of real (not padding) pairs in piece i."""
        return min(self.piece_size, self.pairs - i * self.piece_size)

    def solve(self, i: int) -> dict[str, np.ndarray]:
        """Piece i: `stats/NAME`, `result`, `num_steps` and `reached`, one row per pair."""
        if self._export_tried:
            return self._solve(i)
        # The first piece solved compiles the program (or loads it from the cache); where
        # an earlier run measured how long a piece of this program takes to solve, the
        # line says so once the program is compiled: the time left of a one-piece run.
        with status("first piece: compiling, then solving") as line:
            self._line = line
            try:
                return self._solve(i)
            finally:
                self._line = None

    @property
    def measured_seconds(self) -> float | None:
        """How long one piece of this plan's program took to solve (compiling aside) in
        the last run that solved one on this machine; None where no run has, where the
        program is not kept in the cache, or before the first piece looks it up."""
        if self._timing is None:
            return None
        try:
            # `_measured` writes a dozen bytes: a larger file is not its (and is not read).
            with open(self._timing, "rb") as file:
                text = file.read(65)
            seconds = float(text) if len(text) <= 64 else math.nan
        except (OSError, ValueError):
            return None
        return seconds if math.isfinite(seconds) and seconds >= 0 else None

    def _measured(self, seconds: float) -> None:
        """Keep the solve time of a piece beside the exported program, for the next run."""
        if self._timing is None:
            return
        try:
            write_atomically(self._timing, lambda tmp: tmp.write_text(f"{seconds:.6g}\n"))
        except OSError:  # a read-only cache: no estimate next time, nothing else lost
            pass

    def _solve(self, i: int) -> dict[str, np.ndarray]:
        members, beta_index = self._inputs(i)
        t0, t1, dt = self.grid.t0, self.grid.t1, self.grid.dt
        # Times are data (new values reuse the program), except with output times off
        # the grid of a fixed-step run, which are placed between grid steps in Python.
        static = "ts" in self.options and not self.options["adaptive"]
        as_data = lambda v: None if v is None else (float(v) if static else np.asarray(v, self.dtype))
        times = (as_data(t0), as_data(t1), as_data(dt))
        if not self._export_tried:
            self._export_tried = True
            if not static:
                self._program = self._exported(members, beta_index, times)
        exported = self._program
        if exported is not None:
            entry, leaves, key_data = exported
            args = (leaves, key_data, self.betas, members, beta_index, *times)
            if entry.compiled is None:
                call = jax.jit(entry.program.call)
                if self.mesh is not None:  # the pairs split over the devices, the rest on each
                    whole = NamedSharding(self.mesh, PartitionSpec())
                    split = NamedSharding(self.mesh, PartitionSpec(self.mesh.axis_names[0]))
                    inputs = (whole, whole, whole, split, split, whole, whole, whole)
                    call = jax.jit(entry.program.call, in_shardings=inputs, out_shardings=split)
                entry.compiled = call.lower(*args).compile()
            seconds = self.measured_seconds
            if self._line is not None and seconds is not None:
                self._line.describe(f"first piece: solving, about {_duration(seconds)} (as long as last time)")
            start = time.perf_counter()
            out = self._outputs(entry.compiled(*args), i)
            self._measured(time.perf_counter() - start)
            return out
        return self._outputs(
            _solve_pairs(self.system, self.keys, self.betas, members, beta_index, *times, self.options, self.mesh), i
        )

    def _outputs(self, outputs, i: int) -> dict[str, np.ndarray]:
        """A piece's outputs as NumPy arrays (waiting for them), without its padding."""
        stats, result, steps, reached = outputs
        size = self.size_of(i)
        out = {f"stats/{name}": np.asarray(value)[:size] for name, value in stats.items()}
        out.update(
            result=np.asarray(result)[:size], num_steps=np.asarray(steps)[:size], reached=np.asarray(reached)[:size]
        )
        return out

    def _exported(self, members, beta_index, times):
        """The piece program as a `jax.export` artifact kept in the persistent cache:
        a rerun with the same structure loads it instead of tracing and lowering it
        again (its compiled form comes from JAX's own cache). None when JAX's cache is
        not in use, or the program cannot be exported (adaptive solves)."""
        folder = jax.config.jax_compilation_cache_dir  # pyright: ignore[reportAttributeAccessIssue]  (jax's Config stub lacks the flag attributes)
        if not folder:
            return None
        dynamic, static = eqx.partition(self.system, eqx.is_array)
        leaves, treedef = jax.tree.flatten(dynamic)
        key_data = jax.random.key_data(self.keys)
        args = (leaves, key_data, self.betas, members, beta_index, *times)
        shapes = jax.tree.map(lambda a: (np.shape(a), str(jnp.result_type(a))), args)
        devices = None if self.mesh is None else [device.id for device in self.mesh.devices.flat]
        key = _program_key(static, treedef, self.options, (shapes, devices))
        path = Path(folder) / "attnflow-exported" / f"{key}.bin"
        self._timing = path.with_suffix(".seconds")
        if key in _LOADED:  # one object per program: its compiled call is reused in-process
            _LOADED.move_to_end(key)
            return _LOADED[key], leaves, key_data
        if path.exists():
            try:
                return _remember(key, export.deserialize(bytearray(path.read_bytes()))), leaves, key_data
            except Exception:  # a damaged or foreign file: trace again and replace it
                path.unlink(missing_ok=True)
        options, mesh = self.options, self.mesh

        def piece(leaves, key_data, betas, members, beta_index, t0, t1, dt):
            system = eqx.combine(jax.tree.unflatten(treedef, leaves), static)
            keys = jax.random.wrap_key_data(key_data)
            return _solve_pairs(system, keys, betas, members, beta_index, t0, t1, dt, options, mesh)

        try:
            program = export.export(jax.jit(piece))(*args)
            serialized = program.serialize()
        except (NotImplementedError, ImportError, ValueError):
            # The host callbacks of diffrax's adaptive solves cannot be exported, nor can
            # LAPACK calls without a stability guarantee (the pivoted QR of
            # attention_rank: a ValueError), nor anything without the flatbuffers
            # package: those are solved directly.
            return None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(path, lambda tmp: tmp.write_bytes(serialized))
        except OSError:  # a cache that cannot be written now (a full disk): the program is used, not kept
            self._timing = None
        return _remember(key, program), leaves, key_data

    def assemble(self, outputs: Sequence[dict[str, np.ndarray]]) -> EnsembleResult:
        """The pieces' outputs (in order) as one result, with every statistic after a
        member's first bad state masked (NaN, or `INTEGER_FILL` for integers)."""
        joined = {name: np.concatenate([o[name] for o in outputs]) for name in outputs[0]}
        n_beta = self.betas.shape[0]
        shape = lambda a: a.reshape((n_beta, -1) + a.shape[1:])
        stats = {name[len("stats/") :]: shape(v) for name, v in joined.items() if name.startswith("stats/")}
        finite = stats.pop("finite")
        valid = np.logical_and.accumulate(finite & shape(joined["reached"]), axis=-1)
        for name, value in stats.items():
            mask = valid.reshape(valid.shape + (1,) * (value.ndim - 3))
            fill = np.nan if np.issubdtype(value.dtype, np.floating) else INTEGER_FILL
            if not mask.all():
                stats[name] = np.where(mask, value, np.asarray(fill).astype(value.dtype))
        return EnsembleResult(
            ts=self.grid.times,
            stats=stats,
            result=shape(joined["result"]),
            num_steps=shape(joined["num_steps"]),
            valid=valid,
        )


# The exported piece programs of this process, by key, the most recently used last: a
# notebook that runs many studies keeps the last `_LOADED_MOST` (each holds its compiled
# program; the files stay in the cache folder).
_LOADED: collections.OrderedDict = collections.OrderedDict()
_LOADED_MOST = 16


@dataclasses.dataclass
class _Loaded:
    """An exported piece program and, once compiled in this process, its executable."""

    program: Any  # a jax.export.Exported (anything with `.call`)
    compiled: Callable | None = None


def _remember(key: str, program) -> _Loaded:
    _LOADED[key] = entry = _Loaded(program)
    while len(_LOADED) > _LOADED_MOST:
        _LOADED.popitem(last=False)
    return entry


def _duration(seconds: float) -> str:
    """`42 s`, `3 min`, `1.5 h`: a time to wait, to two figures at most."""
    if seconds < 90:
        return f"{max(seconds, 1):.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.2g} h"


def _stage_count(solver) -> int:
    """Stages held at once by one step: the tableau's, or (a diffrax instance that is not
    an explicit Runge-Kutta method, adaptive runs only) the most of any solver here."""
    if isinstance(solver, str):
        return len(tableau(solver).b)
    try:
        return len(tableau_of(solver).b)
    except ConfigError:
        return max(len(tableau(name).b) for name in SOLVERS)


_PACKAGE = Path(__file__).parent.parent


@functools.lru_cache(maxsize=4)
def _source_hash(root: Path = _PACKAGE) -> str:
    """A hash of the package at `root` (attnflow's by default): its version and every
    `.py` and `.yaml` file in it and its subpackages, by relative path. Any edit
    invalidates every exported program; it is computed once per process."""
    try:
        release = version("attnflow")
    except PackageNotFoundError:  # run from a source tree that is not installed
        release = "unknown"
    digest = hashlib.sha256(release.encode())
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".yaml") and p.is_file()):
        digest.update(b"\0" + path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _program_key(static, treedef, options, shapes) -> str:
    """What an exported piece program depends on: the system's structure, the solve
    options, the shapes and dtypes of its arguments, and the versions of the code."""
    parts = [
        repr(static),
        repr(treedef),
        repr(sorted(options.items())),
        repr(shapes),
        _source_hash(),
        jax.__version__,
        version("jaxlib"),
        eqx.__version__,
        version("diffrax"),  # diffrax: its tableaus
        str(jax.config.jax_default_prng_impl),  # pyright: ignore[reportAttributeAccessIssue]  (jax's Config stub lacks the flag attributes)
        str(jax.config.jax_enable_x64),  # pyright: ignore[reportAttributeAccessIssue]  (as above)
        str(jax.config.jax_default_matmul_precision),  # pyright: ignore[reportAttributeAccessIssue]  (as above)
    ]  # in the traced products
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _pieces(
    member, footprint: MemberFootprint, pairs: int, devices: int, chunk_size, memory: int, platform: str = "cpu"
):
    """(piece size, number of pieces): the chunk (members solved at once per device) is
    `default_chunk`'s or the user's, shrunk to half the memory; pieces are balanced."""
    field, y0, _ = member
    n, d = y0.shape
    budget = memory // 2
    if footprint.total > budget:
        heads = max([getattr(term, "heads", 1) for term in field.terms], default=1)
        what, remedy = footprint.largest(heads)
        raise ConfigError(
            f"one member needs about {_gib(footprint.total)} of working memory (n={n}, d={d}"
            f"{f', heads={heads}' if heads > 1 else ''}), most of it for {what}: more than half of the "
            f"{_gib(memory)} available (the other half is left for the compiler's buffers); {remedy}, or use a "
            "machine with more memory."
        )
    if footprint.output * pairs > 0.8 * memory:
        raise ConfigError(
            f"the results of {pairs} solves would take {_gib(footprint.output * pairs)} of memory but "
            f"{_gib(memory)} is available; lower members or saves, or drop save_states and the attention metric."
        )
    if chunk_size is None:
        chunk_size = default_chunk(platform, memory, footprint)
    if platform == "cpu":  # the CPU devices share the host's memory (an accelerator has its own)
        budget //= devices
    chunk = max(1, min(int(chunk_size), budget // footprint.total, math.ceil(pairs / devices)))
    pieces = math.ceil(pairs / (chunk * devices))
    size = math.ceil(pairs / pieces)
    size = devices * math.ceil(size / devices)
    return size, pieces


def solve_ensemble(
    system: Callable[[PRNGKeyArray, Array], tuple],
    keys: Key[Array, " member"],
    betas: Float[Array, " beta"],
    *,
    t1: float,
    ts=None,
    save_every: int | None = None,
    save_steps=None,
    t0: float = 0.0,
    dt: float | None = None,
    solver: str = "tsit5",
    adaptive: bool = False,
    rtol: float = 1e-6,
    atol: float = 1e-8,
    max_steps: int = 100_000,
    chunk_size: int | None = None,
    devices: Sequence[jax.Device] | None = None,  # pyright: ignore[reportInvalidTypeForm]  (jax.Device: an untyped alias of jaxlib's class)
    check: bool = True,
) -> EnsembleResult:
    """Solve one system per (beta, member) pair.

    `system(key, beta) -> (field, y0, record)` builds a member from its key and its beta
    (it is traced, not run in Python). Output, as for `simulate`: the grid steps
    `save_steps`, or every `save_every` fixed steps and at `t1`, or the times `ts`
    (interpolated between grid steps off the grid; the only choice with `adaptive`).
    `keys` holds one key per member; member m uses the same key for every beta, so a
    beta sweep compares like with like. The pairs are solved in equal pieces of at
    most `chunk_size` members per device (by default `default_chunk`: a measured working
    set on a CPU, or an accelerator's memory), always small enough for the memory, shared
    out over `devices` (default: every local device) with `jax.shard_map`.

    beta and the times are data: calling again with other values of them reuses the
    compiled program. With `check=True` a failed solve raises `SolverFailure` and a
    non-finite state raises `NonFiniteStateError`; either way the statistics after a
    member's first bad state are masked (see `EnsembleResult`).
    """
    grid = time_grid(t1=t1, t0=t0, dt=dt, adaptive=adaptive, ts=ts, save_every=save_every, save_steps=save_steps)
    plan = EnsemblePlan(
        system,
        keys,
        betas,
        grid,
        solver=solver,
        rtol=rtol,
        atol=atol,
        max_steps=max_steps,
        chunk_size=chunk_size,
        devices=devices,
    )
    out = plan.assemble([plan.solve(i) for i in range(plan.pieces)])
    if check:
        check_ensemble(out, np.asarray(plan.betas))
    return out


NON_FINITE_ADVICE = "use a smaller dt, an adaptive solver, float64 or a smaller beta"


def check_ensemble(out: EnsembleResult, betas, advice: str = NON_FINITE_ADVICE) -> None:
    """Raise one clear error if a member failed or its state left the finite numbers;
    `advice` says what to change when a state did (only what the run may change)."""
    betas = np.asarray(betas).reshape(-1)
    failed = np.asarray(out.result) != 0
    valid = np.asarray(out.valid)
    bad = ~valid[..., -1]
    if not bad.any():
        return
    ts = np.asarray(out.ts)
    count = int(bad.sum())
    others = f" (and {count - 1} other solve{'s' if count > 2 else ''})" if count > 1 else ""
    if (bad & ~failed).any():
        b, m = np.argwhere(bad & ~failed)[0]
        i = int(np.argmin(valid[b, m]))
        since = f"after t={ts[i - 1]:g}" if i > 0 else "from the start"
        raise NonFiniteStateError(
            f"the state became non-finite (NaN or inf) {since} (first bad output t={ts[i]:g}) in member {m} "
            f"at beta={betas[b]:g}{others}; {advice}."
        )
    b, m = np.argwhere(failed)[0]
    raise SolverFailure(
        f"the solver stopped before t1 in member {m} at beta={betas[b]:g}{others} "
        f"(after {int(np.asarray(out.num_steps)[b, m])} steps); raise max_steps or loosen rtol/atol."
    )
