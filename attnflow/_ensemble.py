"""Monte Carlo ensembles: many members and many betas, in pieces of one compiled program.

The (beta, member) pairs are cut into pieces of equal size; one compiled function
solves a piece (a `jax.vmap` over it, shared out over the local devices), so a piece is
the unit of work that an interruption can lose and a resumed run can skip. The piece
size is the member chunk: sized by the working set that ran fastest on a CPU, or to an
accelerator's memory, and never beyond what the memory holds. A piece may also be
evaluated with the member axis last (`members_last`), on request.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, PartitionSpec
from jaxtyping import Array, Bool, Float, Int, Key, PRNGKeyArray

from ._errors import ConfigError, NonFiniteStateError, SolverFailure
from ._grid import every_steps, grid_times, step_count
from ._metric_registry import reading
from ._metrics import Recorder
from ._schedules import identity_multiple
from ._simulate import simulate
from ._solvers import SOLVERS, tableau, tableau_of
from ._terms import MLP, SelfAttention
from ._tiled import resolve_block

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


# Where the member axis sits in the arrays of a piece: "members_first" is `jax.vmap`'s
# (member, n, d) and the default; "members_last" keeps the state that the time loop
# carries as (n, d, member) (see `members_last`). On the 2-core benchmark machine
# (benchmarks/layout.py, the phase-diagram workload at d = 2 and 8) members last was
# 0.8-1.1x the speed of members first at the same chunk, and slower than members first
# at the fastest chunk, so it is not chosen by itself.
LAYOUTS = ("members_first", "members_last")


@eqx.filter_jit
def _solve_pairs(system, keys, betas, members, beta_index, t0, t1, dt, options, mesh, layout="members_first"):
    """Solve the pairs (keys[members[p]], betas[beta_index[p]]) of one piece, a vmap
    over them (per device) in the given layout (see `LAYOUTS`). The gathers happen
    here, inside the one compiled program."""

    def member(m, b):
        field, y0, record = system(keys[m], betas[b])
        sol = simulate(field, y0, t0=t0, t1=t1, dt=dt, record=record, **options)
        return sol.stats, sol.result, sol.num_steps, sol.reached

    solve = jax.vmap(member) if layout == "members_first" else functools.partial(members_last, member)
    if mesh is None:
        return solve(members, beta_index)
    spec = PartitionSpec(mesh.axis_names[0])
    return jax.shard_map(solve, mesh=mesh, in_specs=(spec, spec), out_specs=spec,
                         check_vma=False)(members, beta_index)


def available_memory(device: jax.Device | None = None) -> int:
    """Bytes a run may use: free device memory on an accelerator, else the host's
    available memory (`MemAvailable` of /proc/meminfo)."""
    device = device or jax.local_devices()[0]
    stats = device.memory_stats() if device.platform != "cpu" else None
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
    statistics, `output` the recorded statistics."""

    state: int = eqx.field(static=True)
    attention: int = eqx.field(static=True)
    pairwise: int = eqx.field(static=True)
    output: int = eqx.field(static=True)

    @property
    def working(self) -> int:
        """What one step and one record touch: the member's share of a chunk's cache."""
        return self.state + self.attention + self.pairwise

    @property
    def total(self) -> int:
        return self.working + self.output


def member_footprint(member, stages: int, saves: int) -> MemberFootprint:
    """The footprint of `member`, `(field, y0, record)` of one member (shapes suffice),
    solved with `stages` Runge-Kutta stages and `saves` outputs.

    Counted per step: the state, the stage input, the new state and one slope per stage
    ($n d$ each); per attention term the queries, keys and values that are not the
    tokens themselves (identity weights skip their products), the mixed values and the
    term's output, and the logits with their exponentials ($n \\times n$ per head, one
    for all heads with identity Q and K; $n \\times$ tile on the tiled path); the MLP's
    hidden layer. Per record: the Gram matrix and the threshold graph, and the attention
    maps when they are a metric."""
    field, y0, record = member
    n, d = y0.shape
    item = y0.dtype.itemsize
    state = item * n * d * (stages + 3)
    attention = pairwise = 0
    for term in field.terms:
        if isinstance(term, SelfAttention):
            heads, dk, dv = term.heads, term.query.shape[1], term.value.shape[1]
            identity = [identity_multiple(w) for w in (term.query, term.key, term.value)]
            shared = identity[0] and identity[1]
            rows = heads * n * (dk * (2 - identity[0] - identity[1]) + dv * (1 - identity[2]))
            mixed = n * d if shared and identity[2] else heads * n * dv
            attention += item * (rows + mixed + n * d)
            width = term.tile(n) or n
            pairwise += 2 * item * n * width * (1 if shared else heads)
        if isinstance(term, MLP):
            attention += item * n * (2 * term.w1.shape[0] + d)
    if isinstance(record, Recorder):
        width = resolve_block(n, record.block) or n
        pairwise += 2 * item * n * width
        if reading("attention", record.metrics):
            heads = max([t.heads for t in field.terms if isinstance(t, SelfAttention)], default=1)
            pairwise += item * heads * n * width
        saved = jax.eval_shape(lambda r, x, f: r(0.0, x, f), record, y0, field)
        per_save = sum(int(np.prod(leaf.shape)) * leaf.dtype.itemsize for leaf in jax.tree.leaves(saved))
    else:
        per_save = n * d * item
    return MemberFootprint(state=state, attention=attention, pairwise=pairwise, output=per_save * saves)


# The working set a chunk of members may have on a CPU (`default_chunk`), measured: on
# the 2-core benchmark machine the fastest chunks of the phase-diagram workload held
# 21-46 MB (benchmarks/layout.py: 2048 members at d = 2 and 8, 512 at d = 32, 256 at
# d = 128), and a quarter of that ran up to 2x slower at d = 128.
CPU_CHUNK_BYTES = 48 * 2**20


def default_chunk(platform: str, memory: int, footprint: MemberFootprint) -> int:
    """Members solved at once per device, by default.

    On a CPU, whatever the memory, the largest power of two whose working set
    (`footprint.working` per member) stays within `CPU_CHUNK_BYTES`: each chunk runs its
    whole time loop on its own states, and its members split evenly over vector lanes
    and threads. On the 2-core benchmark machine (benchmarks/layout.py, n = 32) this is
    2048 members at d = 2 and 8, 1024 at d = 32 and 256 at d = 128, each the fastest
    fixed chunk or within 6% of it. On an accelerator (GPU, TPU), whose throughput grows with the batch,
    as many as fill a quarter of its free `memory`: XLA's buffers for a step and the
    recorded output share the rest.
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

    def __init__(self, system, keys, betas, *, t1, ts=None, save_every=None, save_steps=None, t0=0.0, dt=None,
                 solver="tsit5", adaptive=False, rtol=1e-6, atol=1e-8, max_steps=100_000, chunk_size=None,
                 devices=None, memory: int | None = None, layout: str | None = None):
        self.system = system
        self.keys = keys
        self.dtype = np.dtype(betas.dtype if hasattr(betas, "dtype") else jnp.asarray(betas).dtype)
        self.betas = jnp.asarray(np.asarray(betas, self.dtype).reshape(-1))
        options = dict(solver=solver, adaptive=adaptive, rtol=rtol, atol=atol, max_steps=max_steps)
        if adaptive:
            if ts is None:
                raise ConfigError("adaptive solves need output times ts.")
            count = len(ts)
        else:
            num_steps = step_count(t0, t1, dt)
            options["num_steps"] = num_steps
            if ts is None:
                if save_steps is None:
                    save_steps = every_steps(num_steps, num_steps if save_every is None else int(save_every))
                options["save_steps"] = tuple(int(k) for k in save_steps)
                count = len(options["save_steps"])
            else:
                count = len(ts)
        if ts is not None:
            options["ts"] = tuple(float(t) for t in np.asarray(ts))
        self.options = options
        self.times = (t0, t1, dt)

        devices = jax.local_devices() if devices is None else list(devices)
        self.mesh = Mesh(np.array(devices), ("batch",)) if len(devices) > 1 else None
        self.pairs = int(self.betas.shape[0]) * int(keys.shape[0])
        stages = _stage_count(solver)
        # shapes only: nothing is computed
        member = jax.eval_shape(lambda k, b: system(k[0], b[0]), keys, self.betas)
        footprint = member_footprint(member, stages, count)
        self.member = member  # `(field, y0, record)` of one member, as shapes
        memory = available_memory(devices[0]) if memory is None else memory
        self.footprint = footprint
        platform = devices[0].platform
        self.piece_size, self.pieces = _pieces(member, footprint, self.pairs, len(devices), chunk_size, memory,
                                               platform)
        self.layout = "members_first" if layout is None else layout
        if self.layout not in LAYOUTS:
            raise ConfigError(f"unknown ensemble layout {self.layout!r}; choose one of {', '.join(LAYOUTS)}.")
        self._program = None  # the exported piece program, once looked up
        self._export_tried = False

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
        members, beta_index = self._inputs(i)
        t0, t1, dt = self.times
        # Times are data (new values reuse the program), except with output times off
        # the grid of a fixed-step run, which are placed between grid steps in Python.
        static = "ts" in self.options and not self.options["adaptive"]
        as_data = lambda v: None if v is None else (float(v) if static else np.asarray(v, self.dtype))
        times = (as_data(t0), as_data(t1), as_data(dt))
        if not self._export_tried:
            self._export_tried = True
            if not static and self.mesh is None:
                self._program = self._exported(members, beta_index, times)
        exported = self._program
        if exported is not None:
            program, leaves, key_data = exported
            outputs = program.call(leaves, key_data, self.betas, members, beta_index, *times)
        else:
            outputs = _solve_pairs(self.system, self.keys, self.betas, members, beta_index, *times, self.options,
                                   self.mesh, self.layout)
        stats, result, steps, reached = outputs
        size = self.size_of(i)
        out = {f"stats/{name}": np.asarray(value)[:size] for name, value in stats.items()}
        out.update(result=np.asarray(result)[:size], num_steps=np.asarray(steps)[:size],
                   reached=np.asarray(reached)[:size])
        return out

    def _exported(self, members, beta_index, times):
        """The piece program as a `jax.export` artifact kept in the persistent cache:
        a rerun with the same structure loads it instead of tracing and lowering it
        again (its compiled form comes from JAX's own cache). None when JAX's cache is
        not in use, or the program cannot be exported (adaptive solves)."""
        folder = jax.config.jax_compilation_cache_dir
        if not folder:
            return None
        dynamic, static = eqx.partition(self.system, eqx.is_array)
        leaves, treedef = jax.tree.flatten(dynamic)
        key_data = jax.random.key_data(self.keys)
        args = (leaves, key_data, self.betas, members, beta_index, *times)
        shapes = jax.tree.map(lambda a: (np.shape(a), str(jnp.result_type(a))), args)
        key = _program_key(static, treedef, {**self.options, "layout": self.layout}, shapes)
        if key in _LOADED:  # one object per program: its compiled call is reused in-process
            _LOADED.move_to_end(key)
            return _LOADED[key], leaves, key_data
        path = Path(folder) / "attnflow-exported" / f"{key}.bin"
        from jax import export

        if path.exists():
            try:
                return _remember(key, export.deserialize(bytearray(path.read_bytes()))), leaves, key_data
            except Exception:  # a damaged or foreign file: trace again and replace it
                path.unlink(missing_ok=True)
        options, layout = self.options, self.layout

        def piece(leaves, key_data, betas, members, beta_index, t0, t1, dt):
            system = eqx.combine(jax.tree.unflatten(treedef, leaves), static)
            keys = jax.random.wrap_key_data(key_data)
            return _solve_pairs(system, keys, betas, members, beta_index, t0, t1, dt, options, None, layout)

        try:
            program = export.export(jax.jit(piece))(*args)
            serialized = program.serialize()
        except (NotImplementedError, ImportError, ValueError):
            # The host callbacks of diffrax's adaptive solves cannot be exported, nor can
            # LAPACK calls without a stability guarantee (the pivoted QR of
            # attention_rank: a ValueError), nor anything without the flatbuffers
            # package: those are solved directly.
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(serialized)
        os.replace(tmp, path)
        return _remember(key, program), leaves, key_data

    def output_times(self) -> np.ndarray:
        """The output times in float64 (the grid times actually recorded)."""
        t0, t1, dt = self.times
        if "ts" in self.options:
            return np.asarray(self.options["ts"])
        return grid_times(t0, t1, self.options["num_steps"], at=self.options["save_steps"])

    def assemble(self, outputs: Sequence[dict[str, np.ndarray]]) -> EnsembleResult:
        """The pieces' outputs (in order) as one result, with every statistic after a
        member's first bad state masked (NaN, or `INTEGER_FILL` for integers)."""
        joined = {name: np.concatenate([o[name] for o in outputs]) for name in outputs[0]}
        n_beta = self.betas.shape[0]
        shape = lambda a: a.reshape((n_beta, -1) + a.shape[1:])
        stats = {name[len("stats/"):]: shape(v) for name, v in joined.items() if name.startswith("stats/")}
        finite = stats.pop("finite")
        valid = np.logical_and.accumulate(finite & shape(joined["reached"]), axis=-1)
        for name, value in stats.items():
            mask = valid.reshape(valid.shape + (1,) * (value.ndim - 3))
            fill = np.nan if np.issubdtype(value.dtype, np.floating) else INTEGER_FILL
            if not mask.all():
                stats[name] = np.where(mask, value, np.asarray(fill).astype(value.dtype))
        return EnsembleResult(ts=self.output_times(), stats=stats, result=shape(joined["result"]),
                              num_steps=shape(joined["num_steps"]), valid=valid)


# The exported piece programs of this process, by key, the most recently used last: a
# notebook that runs many studies keeps the last `_LOADED_MOST` (each holds its compiled
# program; the files stay in the cache folder).
_LOADED: collections.OrderedDict = collections.OrderedDict()
_LOADED_MOST = 16


def _remember(key: str, program):
    _LOADED[key] = program
    while len(_LOADED) > _LOADED_MOST:
        _LOADED.popitem(last=False)
    return program


def _stage_count(solver) -> int:
    """Stages held at once by one step: the tableau's, or (a diffrax instance that is not
    an explicit Runge-Kutta method, adaptive runs only) the most of any solver here."""
    if isinstance(solver, str):
        return len(tableau(solver).b)
    try:
        return len(tableau_of(solver).b)
    except ConfigError:
        return max(len(tableau(name).b) for name in SOLVERS)


@functools.lru_cache(maxsize=1)
def _source_hash() -> str:
    """A hash of attnflow's own code: an edit invalidates every exported program."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def _program_key(static, treedef, options, shapes) -> str:
    """What an exported piece program depends on: the system's structure, the solve
    options, the shapes and dtypes of its arguments, and the versions of the code."""
    from importlib.metadata import version

    parts = [repr(static), repr(treedef), repr(sorted(options.items())), repr(shapes), _source_hash(),
             jax.__version__, version("jaxlib"), eqx.__version__, version("diffrax"),  # diffrax: its tableaus
             str(jax.config.jax_default_prng_impl), str(jax.config.jax_enable_x64),
             str(jax.config.jax_default_matmul_precision)]  # in the traced products
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _pieces(member, footprint: MemberFootprint, pairs: int, devices: int, chunk_size, memory: int,
            platform: str = "cpu"):
    """(piece size, number of pieces): the chunk (members solved at once per device) is
    `default_chunk`'s or the user's, shrunk to half the memory; pieces are balanced."""
    n = member[1].shape[0]
    budget = memory // 2
    if footprint.total > budget:
        raise ConfigError(
            f"one member needs about {_gib(footprint.total)} of working memory (n={n} tokens: the attention "
            f"logits and the Gram matrix of the statistics, n x n each, or n x attention_block in tiles), more "
            f"than half of the {_gib(memory)} available (the other half is left for the compiler's buffers); "
            "lower n, drop the attention metric, let the attention go through tiles (attention_block=null or a "
            "smaller tile size), or use a machine with more memory."
        )
    if footprint.output * pairs > 0.8 * memory:
        raise ConfigError(
            f"the results of {pairs} solves would take {_gib(footprint.output * pairs)} of memory but "
            f"{_gib(memory)} is available; lower members or saves, or drop save_states and the attention metric."
        )
    if chunk_size is None:
        chunk_size = default_chunk(platform, memory, footprint)
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
    devices: Sequence[jax.Device] | None = None,
    layout: str | None = None,
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
    out over `devices` (default: every local device) with `jax.shard_map`. `layout`
    (see `LAYOUTS`; default `members_first`) says where the member axis sits in the
    arrays of a piece; both give the same numbers.

    beta and the times are data: calling again with other values of them reuses the
    compiled program. With `check=True` a failed solve raises `SolverFailure` and a
    non-finite state raises `NonFiniteStateError`; either way the statistics after a
    member's first bad state are masked (see `EnsembleResult`).
    """
    plan = EnsemblePlan(system, keys, betas, t1=t1, ts=ts, save_every=save_every, save_steps=save_steps, t0=t0,
                        dt=dt, solver=solver, adaptive=adaptive, rtol=rtol, atol=atol, max_steps=max_steps,
                        chunk_size=chunk_size, devices=devices, layout=layout)
    out = plan.assemble([plan.solve(i) for i in range(plan.pieces)])
    if check:
        check_ensemble(out, np.asarray(plan.betas))
    return out


def check_ensemble(out: EnsembleResult, betas) -> None:
    """Raise one clear error if a member failed or its state left the finite numbers."""
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
            f"at beta={betas[b]:g}{others}; use a smaller dt, an adaptive solver, float64 or a smaller beta."
        )
    b, m = np.argwhere(failed)[0]
    raise SolverFailure(
        f"the solver stopped before t1 in member {m} at beta={betas[b]:g}{others} "
        f"(after {int(np.asarray(out.num_steps)[b, m])} steps); raise max_steps or loosen rtol/atol."
    )


# --- the members-last layout ---------------------------------------------------------
#
# `jax.vmap` puts the member axis first in every array of a piece. At small d a
# member's state is a few numbers per token, so the work on it (the retraction, the
# update, the norms) runs along axes of length d and fills little of a CPU's vector
# units. `members_last(f, *args)` evaluates `jax.vmap(f)(*args)` with the member axis
# kept *last* in the state that the time loop carries, `(n, d, members)`, so that this
# work runs along the members. It traces f for one member into a jaxpr and evaluates
# each equation on batched arrays whose member axis may sit anywhere (the rules below):
# a product leaves it first, where XLA's batched matrix products want it; an
# elementwise operation takes the place its largest operand has (the state's, on a
# tie); loops carry it last. Equations no rule covers go through `jax.vmap`, so any
# program is evaluated, the common ones in this layout.

_ELEMENTWISE = frozenset("""
    abs acos acosh add and asin asinh atan atan2 atanh cbrt ceil clamp conj convert_element_type copy cos cosh
    div eq eq_to erf erf_inv erfc exp exp2 expm1 floor ge gt imag integer_pow is_finite le le_to lgamma log log1p
    logistic lt lt_to max min mul ne neg nextafter not or population_count pow real reduce_precision rem round
    rsqrt select_n shift_left shift_right_arithmetic shift_right_logical sign sin sinh sqrt square stop_gradient
    sub tan tanh xor
""".split())
_REDUCTIONS = frozenset("reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or reduce_xor argmax "
                        "argmin".split())
_ALONG_AXIS = frozenset("cumsum cumprod cummax cummin cumlogsumexp".split())
_INLINE = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "custom_jvp_call": "call_jaxpr",
           "custom_vjp_call": "call_jaxpr"}
_SCATTERS = frozenset(("scatter", "scatter-add", "scatter-sub", "scatter-mul", "scatter-min", "scatter-max"))


def members_last(f: Callable, *args):
    """`jax.vmap(f)(*args)` (every argument batched along its first axis), evaluated in
    the members-last layout; the outputs come back with the member axis first."""
    size = int(args[0].shape[0])
    one = [jax.ShapeDtypeStruct(a.shape[1:], a.dtype) for a in args]
    closed, shapes = jax.make_jaxpr(f, return_shape=True)(*one)
    outs = _evaluate(closed.jaxpr, closed.consts, list(args), [0] * len(args), size)
    outs = [_moved(value, axis, 0, size) for value, axis in outs]
    return jax.tree.unflatten(jax.tree.structure(shapes), outs)


def _moved(value, axis: int | None, target: int, size: int):
    """`value` with its member axis at `target` (-1: last); one without a member axis
    (`axis` None) is broadcast along a new one."""
    value = jnp.asarray(value)
    if axis is None:
        value = lax.broadcast_in_dim(value, value.shape + (size,), tuple(range(value.ndim)))
        axis = value.ndim - 1
    target %= value.ndim
    return value if axis == target else jnp.moveaxis(value, axis, target)


def _shift(dims, axis: int) -> tuple[int, ...]:
    """Axes of the unbatched array as axes of the batched one, whose member axis is `axis`."""
    return tuple(int(d) if d < axis else int(d) + 1 for d in dims)


def _read(env, var):
    from jax.extend.core import Literal

    return (var.val, None) if isinstance(var, Literal) else env[var]


def _evaluate(jaxpr, consts, args, axes, size: int) -> list[tuple[object, int | None]]:
    """The outputs of `jaxpr` as (value, member axis) pairs; the axis is None for a
    value that is the same for every member."""
    from jax.extend.core import DropVar

    env = {v: (c, None) for v, c in zip(jaxpr.constvars, consts)}
    env.update({v: (a, axis) for v, a, axis in zip(jaxpr.invars, args, axes)})
    for eqn in jaxpr.eqns:
        values, where = [], []
        for var in eqn.invars:
            value, axis = _read(env, var)
            values.append(value)
            where.append(axis)
        if any(axis is not None for axis in where):
            outs, out_axes = _rule(eqn.primitive.name)(eqn, values, where, size)
        else:
            with eqn.ctx.manager:
                out = eqn.primitive.bind(*values, **eqn.primitive.get_bind_params(eqn.params))
            outs = out if eqn.primitive.multiple_results else [out]
            out_axes = [None] * len(outs)
        for var, value, axis in zip(eqn.outvars, outs, out_axes):
            if not isinstance(var, DropVar):
                env[var] = (value, None if axis is None else int(axis))
    return [_read(env, var) for var in jaxpr.outvars]


def _rule(name: str):
    if name in _RULES:
        return _RULES[name]
    if name in _ELEMENTWISE:
        return _elementwise
    if name in _REDUCTIONS:
        return _reduction
    if name in _ALONG_AXIS:
        return _along_axis
    if name in _INLINE:
        return _inline
    if name in _SCATTERS:
        return _scatter
    return _through_vmap


def _propagate(jaxpr, batched) -> list[bool]:
    """Which outputs of `jaxpr` depend on the member (never fewer than `_evaluate` gives)."""
    from jax.extend.core import Literal

    env = dict(zip(jaxpr.invars, batched))
    read = lambda var: False if isinstance(var, Literal) else env.get(var, False)
    for eqn in jaxpr.eqns:
        flags = [read(var) for var in eqn.invars]
        name = eqn.primitive.name
        if not any(flags):
            out = [False] * len(eqn.outvars)
        elif name in _INLINE:
            out = _propagate(eqn.params[_INLINE[name]].jaxpr, flags)
        elif name == "scan":
            out = _scan_flags(eqn.params, flags)
        elif name == "while":
            carry, predicate = _while_flags(eqn.params, flags)
            out = [True] * len(eqn.outvars) if predicate else carry
        elif name == "cond" and not flags[0]:
            out = _cond_flags(eqn.params, flags)
        else:
            out = [True] * len(eqn.outvars)
        env.update(zip(eqn.outvars, out))
    return [read(var) for var in jaxpr.outvars]


def _bind(eqn, *values, **changes):
    with eqn.ctx.manager:
        out = eqn.primitive.bind(*values, **{**eqn.params, **changes})
    return out if eqn.primitive.multiple_results else [out]


def _through_vmap(eqn, values, where, size):
    """Any equation, by `jax.vmap` over the member axes where they are; outputs first."""
    params = eqn.primitive.get_bind_params(eqn.params)
    out = jax.vmap(lambda *a: eqn.primitive.bind(*a, **params), in_axes=list(where), axis_size=size)(*values)
    outs = out if eqn.primitive.multiple_results else [out]
    return list(outs), [0] * len(outs)


def _elementwise(eqn, values, where, size):
    """The member axis where the largest operand has it (last on a tie: the state's
    place); the others moved or broadcast there. A scalar operand of a non-scalar
    operation (`select_n`'s predicate, `clamp`'s bounds) is broadcast to the output's
    shape; operands of one rank may differ in axes of size one."""
    batched = [(np.size(v), a == np.ndim(v) - 1, a) for v, a in zip(values, where) if a is not None]
    target = max(batched)[2]
    shape = eqn.outvars[0].aval.shape
    operands = []
    for var, value, axis in zip(eqn.invars, values, where):
        value = jnp.asarray(value, var.aval.dtype)
        own = var.aval.shape
        if shape and not own:  # a scalar among arrays: broadcast to the output's shape
            full = shape[:target] + (size,) + shape[target:]
            operands.append(lax.broadcast_in_dim(value, full, () if axis is None else (target,)))
        elif axis is None:
            full = own[:target] + (size,) + own[target:]
            operands.append(lax.broadcast_in_dim(value, full, _shift(range(len(own)), target)))
        else:
            operands.append(_moved(value, axis, target, size))
    return _bind(eqn, *operands), [target] * len(eqn.outvars)


def _reduction(eqn, values, where, size):
    (axis,) = where
    axes = tuple(eqn.params["axes"])
    return _bind(eqn, values[0], axes=_shift(axes, axis)), [axis - sum(a < axis for a in axes)]


def _along_axis(eqn, values, where, size):
    (axis,) = where
    return _bind(eqn, values[0], axis=_shift([eqn.params["axis"]], axis)[0]), [axis]


def _rev(eqn, values, where, size):
    (axis,) = where
    return _bind(eqn, values[0], dimensions=_shift(eqn.params["dimensions"], axis)), [axis]


def _squeeze(eqn, values, where, size):
    (axis,) = where
    dims = tuple(eqn.params["dimensions"])
    return _bind(eqn, values[0], dimensions=_shift(dims, axis)), [axis - sum(d < axis for d in dims)]


def _inline(eqn, values, where, size):
    """A call (jit; custom derivative rules: the ensemble is not differentiated): its body."""
    closed = eqn.params[_INLINE[eqn.primitive.name]]
    outs = _evaluate(closed.jaxpr, closed.consts, values, where, size)
    return [v for v, _ in outs], [a for _, a in outs]


def _broadcast_in_dim(eqn, values, where, size):
    """The member axis goes before the output axis that the operand's next axis maps to."""
    (operand, *dynamic), p = values, eqn.params
    if any(a is not None for a in where[1:]):
        return _through_vmap(eqn, values, where, size)
    axis, shape, dims = where[0], tuple(p["shape"]), tuple(p["broadcast_dimensions"])
    at = dims[axis] if axis < len(dims) else len(shape)
    dims = tuple(d if d < at else d + 1 for d in dims)
    dims = dims[:axis] + (at,) + dims[axis:]
    return _bind(eqn, operand, *dynamic, shape=shape[:at] + (size,) + shape[at:], broadcast_dimensions=dims,
                 sharding=None), [at]


def _reshape(eqn, values, where, size):
    if eqn.params.get("dimensions") is not None or len(values) > 1:
        return _through_vmap(eqn, values, where, size)
    sizes = tuple(eqn.params["new_sizes"])
    if where[0] == 0:  # the leading axis stays leading
        return _bind(eqn, values[0], new_sizes=(size,) + sizes, sharding=None), [0]
    value = _moved(values[0], where[0], -1, size)
    return _bind(eqn, value, new_sizes=sizes + (size,), sharding=None), [len(sizes)]


def _transpose(eqn, values, where, size):
    """The member axis stays first where it is first, else goes last."""
    (axis,) = where
    moved = [d if d < axis else d + 1 for d in eqn.params["permutation"]]
    at = 0 if axis == 0 else len(moved)
    return _bind(eqn, values[0], permutation=tuple(moved[:at] + [axis] + moved[at:])), [at]


def _slice(eqn, values, where, size):
    (axis,) = where
    p = eqn.params
    insert = lambda seq, v: tuple(seq[:axis]) + (v,) + tuple(seq[axis:])
    strides = None if p["strides"] is None else insert(p["strides"], 1)
    return _bind(eqn, values[0], start_indices=insert(p["start_indices"], 0),
                 limit_indices=insert(p["limit_indices"], size), strides=strides), [axis]


def _concatenate(eqn, values, where, size):
    target = next(a for a in where if a is not None)
    operands = [_moved(v, a, target, size) for v, a in zip(values, where)]
    return _bind(eqn, *operands, dimension=_shift([eqn.params["dimension"]], target)[0]), [target]


def _sort(eqn, values, where, size):
    target = next(a for a in where if a is not None)
    operands = [_moved(v, a, target, size) for v, a in zip(values, where)]
    return (_bind(eqn, *operands, dimension=_shift([eqn.params["dimension"]], target)[0]),
            [target] * len(eqn.outvars))


def _dot_general(eqn, values, where, size):
    """A batch axis of the product where both operands have it (the product's first),
    else one more free axis of the operand that has it."""
    (lhs_c, rhs_c), (lhs_b, rhs_b) = eqn.params["dimension_numbers"]
    (lhs, rhs), (left, right) = values, where
    if left is not None:
        lhs_c, lhs_b = _shift(lhs_c, left), _shift(lhs_b, left)
    if right is not None:
        rhs_c, rhs_b = _shift(rhs_c, right), _shift(rhs_b, right)
    if left is not None and right is not None:
        numbers = ((lhs_c, rhs_c), ((left,) + lhs_b, (right,) + rhs_b))
        return _bind(eqn, lhs, rhs, dimension_numbers=numbers, out_sharding=None), [0]
    out = _bind(eqn, lhs, rhs, dimension_numbers=((lhs_c, rhs_c), (lhs_b, rhs_b)), out_sharding=None)
    if left is not None:
        free = [d for d in range(np.ndim(lhs)) if d not in lhs_c and d not in lhs_b]
        return out, [len(lhs_b) + free.index(left)]
    lhs_free = np.ndim(lhs) - len(lhs_c) - len(lhs_b)
    free = [d for d in range(np.ndim(rhs)) if d not in rhs_c and d not in rhs_b]
    return out, [len(lhs_b) + lhs_free + free.index(right)]


def _dynamic_slice(eqn, values, where, size):
    (operand, *starts), axis = values, where[0]
    if any(a is not None for a in where[1:]):
        return _through_vmap(eqn, values, where, size)
    zero = np.zeros((), eqn.invars[1].aval.dtype)
    sizes = tuple(eqn.params["slice_sizes"])
    return _bind(eqn, operand, *starts[:axis], zero, *starts[axis:],
                 slice_sizes=sizes[:axis] + (size,) + sizes[axis:]), [axis]


def _dynamic_update_slice(eqn, values, where, size):
    operand, update, *starts = values
    if any(a is not None for a in where[2:]):
        return _through_vmap(eqn, values, where, size)
    target = where[0] if where[0] is not None else where[1]
    operand, update = _moved(operand, where[0], target, size), _moved(update, where[1], target, size)
    zero = np.zeros((), eqn.invars[2].aval.dtype)
    return _bind(eqn, operand, update, *starts[:target], zero, *starts[target:]), [target]


def _gather(eqn, values, where, size):
    """Indices the same for every member into a batched operand: the member axis is one
    more slice (offset) axis, taken whole."""
    operand, indices = values
    axis = where[0]
    if where[1] is not None:
        return _through_vmap(eqn, values, where, size)
    numbers = eqn.params["dimension_numbers"]
    collapsed = _shift(numbers.collapsed_slice_dims, axis)
    batching = _shift(numbers.operand_batching_dims, axis)
    offsets = tuple(numbers.offset_dims)
    # The member axis is the k-th of the operand's offset axes, in order.
    k = sum(1 for d in range(axis) if d not in collapsed and d not in batching)
    at = offsets[k] if k < len(offsets) else (offsets[-1] + 1 if offsets else 0)
    offsets = tuple(sorted([o if o < at else o + 1 for o in offsets] + [at]))
    numbers = numbers._replace(offset_dims=offsets, collapsed_slice_dims=collapsed, operand_batching_dims=batching,
                               start_index_map=_shift(numbers.start_index_map, axis))
    sizes = tuple(eqn.params["slice_sizes"])
    return _bind(eqn, operand, indices, dimension_numbers=numbers,
                 slice_sizes=sizes[:axis] + (size,) + sizes[axis:]), [at]


def _scatter(eqn, values, where, size):
    """Indices the same for every member: the member axis is one more window axis of the
    updates (last in both, where the loops keep their buffers)."""
    if where[1] is not None:
        return _through_vmap(eqn, values, where, size)
    operand, indices, updates = values
    operand, updates = _moved(operand, where[0], -1, size), _moved(updates, where[2], -1, size)
    numbers = eqn.params["dimension_numbers"]
    numbers = numbers._replace(update_window_dims=tuple(numbers.update_window_dims) + (updates.ndim - 1,))
    return _bind(eqn, operand, indices, updates, dimension_numbers=numbers), [operand.ndim - 1]


def _last(values, where, flags, size):
    """The values that should depend on the member (`flags`) with the member axis last."""
    return [_moved(v, a, -1, size) if flag else v for v, a, flag in zip(values, where, flags)]


def _last_axes(values, flags) -> list[int | None]:
    return [np.ndim(v) - 1 if flag else None for v, flag in zip(values, flags)]


def _scan_flags(params, flags) -> list[bool]:
    """The carries and outputs of a scan that depend on the member: a fixed point."""
    consts, carry = params["num_consts"], params["num_carry"]
    batched = list(flags[consts: consts + carry])
    while True:
        out = _propagate(params["jaxpr"].jaxpr, list(flags[:consts]) + batched + list(flags[consts + carry:]))
        grown = [a or b for a, b in zip(batched, out[:carry])]
        if grown == batched:
            return batched + out[carry:]
        batched = grown


def _scan(eqn, values, where, size):
    """The loop over steps: its carries (the state) and outputs hold the member axis last."""
    p = eqn.params
    consts, carry, body = p["num_consts"], p["num_carry"], p["jaxpr"]
    flags = [a is not None for a in where]
    out_flags = _scan_flags(p, flags)
    fixed, fixed_axes = values[:consts], list(where[:consts])
    init = _last(values[consts: consts + carry], where[consts: consts + carry], out_flags[:carry], size)
    xs = _last(values[consts + carry:], where[consts + carry:], flags[consts + carry:], size)
    x_flags = flags[consts + carry:]

    def step(state, x):
        axes = fixed_axes + _last_axes(state, out_flags[:carry]) + _last_axes(x, x_flags)
        outs = _evaluate(body.jaxpr, body.consts, [*fixed, *state, *x], axes, size)
        outs = _last([v for v, _ in outs], [a for _, a in outs], out_flags, size)
        return outs[:carry], outs[carry:]

    final, ys = lax.scan(step, init, xs, length=p["length"], reverse=p["reverse"], unroll=p["unroll"])
    outs = [*final, *ys]
    return outs, _last_axes(outs, out_flags)


def _while_flags(params, flags) -> tuple[list[bool], bool]:
    """(the carries that depend on the member, whether the loop condition does)."""
    cond_n, body_n = params["cond_nconsts"], params["body_nconsts"]
    cond_consts, body_consts = list(flags[:cond_n]), list(flags[cond_n: cond_n + body_n])
    batched = list(flags[cond_n + body_n:])
    while True:
        out = _propagate(params["body_jaxpr"].jaxpr, body_consts + batched)
        grown = [a or b for a, b in zip(batched, out)]
        if grown == batched:
            break
        batched = grown
    return batched, _propagate(params["cond_jaxpr"].jaxpr, cond_consts + batched)[0]


def _while(eqn, values, where, size):
    """A loop whose condition is the same for every member, its carries member-last; one
    whose condition differs between members goes through `jax.vmap` (which runs it
    until every member is done)."""
    p = eqn.params
    flags = [a is not None for a in where]
    carry_flags, predicate = _while_flags(p, flags)
    if predicate:
        return _through_vmap(eqn, values, where, size)
    cond_n, body_n = p["cond_nconsts"], p["body_nconsts"]
    cond_consts, body_consts = values[:cond_n], values[cond_n: cond_n + body_n]
    init = _last(values[cond_n + body_n:], where[cond_n + body_n:], carry_flags, size)
    cond, body = p["cond_jaxpr"], p["body_jaxpr"]

    def proceed(state):
        return _evaluate(cond.jaxpr, cond.consts, [*cond_consts, *state], list(where[:cond_n]) + _last_axes(state, carry_flags),
                         size)[0][0]

    def step(state):
        outs = _evaluate(body.jaxpr, body.consts, [*body_consts, *state],
                         list(where[cond_n: cond_n + body_n]) + _last_axes(state, carry_flags), size)
        return _last([v for v, _ in outs], [a for _, a in outs], carry_flags, size)

    out = list(lax.while_loop(proceed, step, init))
    return out, _last_axes(out, carry_flags)


def _cond_flags(params, flags) -> list[bool]:
    branches = [_propagate(branch.jaxpr, flags[1:]) for branch in params["branches"]]
    return [any(column) for column in zip(*branches)]


def _cond(eqn, values, where, size):
    """A branch chosen alike for every member (a `lax.cond` on the step index, as the
    recording of fixed steps has); one chosen per member goes through `jax.vmap`."""
    if where[0] is not None:
        return _through_vmap(eqn, values, where, size)
    out_flags = _cond_flags(eqn.params, [False] + [a is not None for a in where[1:]])

    def branch(closed):
        def run(*operands):
            outs = _evaluate(closed.jaxpr, closed.consts, operands, where[1:], size)
            return _last([v for v, _ in outs], [a for _, a in outs], out_flags, size)

        return run

    outs = list(lax.switch(values[0], [branch(b) for b in eqn.params["branches"]], *values[1:]))
    return outs, _last_axes(outs, out_flags)


_RULES = {
    "broadcast_in_dim": _broadcast_in_dim,
    "reshape": _reshape,
    "transpose": _transpose,
    "squeeze": _squeeze,
    "rev": _rev,
    "slice": _slice,
    "concatenate": _concatenate,
    "sort": _sort,
    "dot_general": _dot_general,
    "dynamic_slice": _dynamic_slice,
    "dynamic_update_slice": _dynamic_update_slice,
    "gather": _gather,
    "scan": _scan,
    "while": _while,
    "cond": _cond,
}
