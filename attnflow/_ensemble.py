"""Monte Carlo ensembles: many members and many betas in one compiled call."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, PartitionSpec
from jaxtyping import Array, Float, Key, PRNGKeyArray

from ._errors import ConfigError, NonFiniteStateError, SolverFailure
from ._simulate import fixed_steps, simulate
from ._terms import SelfAttention


class EnsembleResult(eqx.Module):
    """Statistics of an ensemble: every array has leading axes `(beta, member, time)`."""

    ts: Float[Array, " times"]
    stats: dict[str, Array]
    result: Array
    num_steps: Array


@eqx.filter_jit
def _solve(system, keys, betas, ts, t0, t1, dt, options, chunk_size, mesh):
    n_beta, n_member = betas.shape[0], keys.shape[0]
    flat_keys = jnp.tile(keys, n_beta)
    flat_betas = jnp.repeat(betas, n_member)
    batch = n_beta * n_member

    def member(args):
        key, beta = args
        field, y0, record = system(key, beta)
        sol = simulate(field, y0, t0=t0, t1=t1, dt=dt, ts=ts, record=record, **options)
        return sol.stats, sol.result._value, sol.num_steps, sol.ts

    def members(flat_keys, flat_betas):
        size = flat_betas.shape[0]
        if chunk_size is None or chunk_size >= size:
            return jax.vmap(member)((flat_keys, flat_betas))
        return lax.map(member, (flat_keys, flat_betas), batch_size=chunk_size)

    if mesh is None:
        out = members(flat_keys, flat_betas)
    else:
        # Each device solves its own slice of the (beta, member) pairs; the batch is
        # padded to a multiple of the device count and the padding dropped afterwards.
        pad = (-batch) % mesh.size
        if pad:
            flat_keys = jnp.concatenate([flat_keys, flat_keys[:pad]])
            flat_betas = jnp.concatenate([flat_betas, flat_betas[:pad]])
        spec = PartitionSpec(mesh.axis_names[0])
        solve_local = jax.shard_map(members, mesh=mesh, in_specs=(spec, spec), out_specs=spec, check_vma=False)
        out = solve_local(flat_keys, flat_betas)
        out = jax.tree.map(lambda a: a[:batch], out)
    stats, result, steps, times = out
    unflatten = lambda a: a.reshape((n_beta, n_member) + a.shape[1:])
    return jax.tree.map(unflatten, stats), unflatten(result), unflatten(steps), times[0]


def solve_ensemble(
    system: Callable[[PRNGKeyArray, Array], tuple],
    keys: Key[Array, " member"],
    betas: Float[Array, " beta"],
    *,
    t1: float,
    ts: Float[Array, " times"] | None = None,
    save_every: int | None = None,
    t0: float = 0.0,
    dt: float | None = None,
    solver: str = "tsit5",
    adaptive: bool = False,
    rtol: float = 1e-6,
    atol: float = 1e-8,
    max_steps: int = 100_000,
    chunk_size: int | None = None,
    devices: Sequence[jax.Device] | None = None,
    check: bool = True,
) -> EnsembleResult:
    """Solve one system per (beta, member) pair in one compiled call.

    `system(key, beta) -> (field, y0, record)` builds a member from its key and its beta
    (it is traced, not run in Python). Output times are either every `save_every`
    fixed steps (`dt` must divide `t1 - t0`) or the given `ts` (diffrax dense output,
    and the only choice with `adaptive=True`). `keys` holds one key per member; member m uses
    the same key for every beta, so a beta sweep compares like with like. Members are
    processed `chunk_size` at a time (`lax.map` over vmapped chunks) to bound memory;
    by default the chunk is sized to the CPU cache.
    The pairs are shared out over `devices` (default: every local device) with
    `jax.shard_map`; with one device this is a plain vmap.

    beta, the times and the step are data: calling again with other values of them
    reuses the compiled program. With `check=True` a failed solve raises
    `SolverFailure` and a non-finite state raises `NonFiniteStateError`.
    """
    dtype = jnp.asarray(betas).dtype
    options = dict(solver=solver, adaptive=adaptive, rtol=rtol, atol=atol, max_steps=max_steps)
    if ts is None:
        if adaptive:
            raise ConfigError("adaptive solves need output times ts.")
        num_steps = fixed_steps(float(t0), float(t1), float(dt))
        if num_steps is None:
            raise ConfigError(f"dt={dt} does not divide t1 - t0 = {t1 - t0}; pass output times ts instead.")
        options.update(save_every=save_every or num_steps, num_steps=num_steps)
    else:
        ts = jnp.asarray(ts, dtype)
    if chunk_size is None:
        chunk_size = _cache_sized_chunk(system, keys[0], jnp.asarray(betas, dtype).reshape(-1)[0])
    devices = jax.local_devices() if devices is None else list(devices)
    mesh = Mesh(np.array(devices), ("batch",)) if len(devices) > 1 else None
    stats, result, steps, times = _solve(
        system,
        keys,
        jnp.asarray(betas, dtype).reshape(-1),
        ts,
        jnp.asarray(t0, dtype),
        jnp.asarray(t1, dtype),
        None if dt is None else jnp.asarray(dt, dtype),
        options,
        chunk_size,
        mesh,
    )
    out = EnsembleResult(ts=times, stats=stats, result=result, num_steps=steps)
    if check:
        check_ensemble(out, betas)
    return out


def _cache_sized_chunk(system, key, beta) -> int:
    # Keep each chunk's working set (a state and its n x n attention per head) near the
    # size of the last-level cache: measured on a 2-core CPU (benchmarks/phase_diagram.py)
    # this is 2-3x faster at d=128 than one vmap over 2048 members, and never slower at
    # small d. Shapes come from tracing one member, not from running it.
    field, y0, _ = jax.eval_shape(system, key, beta)
    n, d = y0.shape
    heads = max([term.heads for term in field.terms if isinstance(term, SelfAttention)], default=1)
    per_member = n * max(n, d) * y0.dtype.itemsize * heads
    return max(1, (4 * 2**20) // per_member)


def check_ensemble(out: EnsembleResult, betas) -> None:
    """Raise one clear error if a member failed or its state left the finite numbers."""
    betas = np.asarray(betas).reshape(-1)
    finite = np.asarray(out.stats["finite"])
    if not finite.all():
        b, m, i = np.argwhere(~finite)[0]
        ts = np.asarray(out.ts)
        since = f"after t={ts[i - 1]:g}" if i > 0 else "from the start"
        raise NonFiniteStateError(
            f"the state became non-finite (NaN or inf) {since} (first bad output t={ts[i]:g}) in member {m} "
            f"at beta={betas[b]:g}; use a smaller dt, an adaptive solver, float64 or a smaller beta."
        )
    failed = np.asarray(out.result) != dfx.RESULTS.successful._value
    if failed.any():
        b, m = np.argwhere(failed)[0]
        raise SolverFailure(
            f"the solver stopped before t1 in member {m} at beta={betas[b]:g} "
            f"(after {int(np.asarray(out.num_steps)[b, m])} steps); raise max_steps or loosen rtol/atol."
        )
