"""One configured study: its JAX settings (`prepare_jax`), its plan (`plan_study`), its
pieces solved and kept (`solve_study`) and its results (`to_results`), with the config
and identity they store (`config_yaml`, `run_identity`). A run, a study's or an
experiment's, goes through `attnflow.experiments` (`attnflow.run`, the command line),
which solves each panel here."""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from pathlib import Path
from typing import cast

import jax
import jax.numpy as jnp
import numpy as np
import yaml

from ..schema._config import NOT_RESULT_KEYS, Config, to_container
from ..schema._errors import NonFiniteStateError, RunNote, SolverFailure
from ..schema._metric_registry import METRICS, UserMetric
from ..schema._plugins import target_path
from ..schema.system import PARTS
from ..storage._cf import global_attributes, history_line, variable_attributes
from ..storage._store import PieceStore, Results, in_background
from ._build import Study, build_system, non_finite_advice
from ._components import code_digest, user_metrics
from ._ensemble import INTEGER_FILL, EnsemblePlan, EnsembleResult, check_ensemble

# The dimensions each saved value adds after (beta, member, time): the metrics' from
# their registry, and the states'.
_DIMS = {
    "x": ("token", "dim"),
    "source_x": ("source_token", "dim"),
    **{name: metric.dims for name, metric in METRICS.items()},
}
# Saved values that do not change in time, stored once without a `time` dimension: their
# value at the first output time (the source tokens of cross-attention, held fixed).
_ONCE = ("source_x",)
STATUS_MEANINGS = "ok non_finite solver_stopped"


def config_yaml(cfg: Config) -> str:
    """The resolved config as YAML (what is stored in `results.nc`), without the keys
    that do not change the results (`NOT_RESULT_KEYS`: `overwrite`, `plot`, `plotly_js`,
    `compilation_cache`)."""
    return yaml.safe_dump({k: v for k, v in to_container(cfg).items() if k not in NOT_RESULT_KEYS}, sort_keys=True)


def run_identity(cfg: Config) -> str:
    """What identifies a run's results and pieces: its config (`config_yaml`) and, when it
    names code of the researcher's own (terms, metrics, an experiment), the digest of
    that code's source, so that an edited term never resumes from, or skips to, the
    results of the code before."""
    digest = code_digest(cfg)
    return config_yaml(cfg) + (f"code_digest: {digest}\n" if digest else "")


def cache_directory() -> Path:
    """Where compiled programs are kept: `$ATTNFLOW_CACHE_DIR`, else
    `$XDG_CACHE_HOME/attnflow/jax`, else `~/.cache/attnflow/jax`."""
    if os.environ.get("ATTNFLOW_CACHE_DIR"):
        return Path(os.environ["ATTNFLOW_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attnflow" / "jax"


def prepare_jax(cfg: Config) -> None:
    """Process-wide JAX settings a config asks for: the CPU devices (`use_cpu_devices`),
    float64, the precision of float32 matrix products on an accelerator
    (`use_matmul_precision`), and JAX's persistent compilation cache (so that a repeated
    structure is not compiled again). The devices take effect before JAX's first
    computation in the process, the cache before its first compilation: the command line
    sets both first."""
    use_cpu_devices(cfg.cpu_devices)
    if cfg.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    use_matmul_precision(cfg.matmul_precision.value)
    if cfg.compilation_cache:
        use_compilation_cache()


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity: a SLURM job's or `taskset`'s
    share of the machine), else every core."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def use_cpu_devices(count: int | None = None) -> None:
    """Split the CPU into `count` JAX devices (None: one per usable core), over which
    `solve_ensemble` shares out an ensemble's members, each device's chunk its own
    program on its own thread. One device per core is faster than one device on all of
    them, whose small per-member operations keep only part of the cores busy (the
    phase-diagram workload on 2 cores, docs/performance.md: 1.05-1.45x from d = 2 to 128).

    JAX fixes its devices when it starts computing: once it has (a script that ran JAX
    before calling attnflow), the process keeps the devices it has, and so it does when
    `count` is None and the device count was chosen already (`jax_num_cpu_devices`, or
    XLA's `--xla_force_host_platform_device_count`)."""
    forced = "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")
    chosen = forced or jax.config.jax_num_cpu_devices != -1  # pyright: ignore[reportAttributeAccessIssue]  (jax's Config stub lacks the flag attributes)
    if count is None and chosen:
        return
    with contextlib.suppress(RuntimeError):  # JAX's backends have started: their devices stay
        jax.config.update("jax_num_cpu_devices", usable_cores() if count is None else int(count))


def use_matmul_precision(precision: str, platform: str | None = None) -> None:
    """float32 matrix products at `precision` on a GPU or TPU (`platform`, default JAX's
    backend): "highest" (full float32, a run's default), "high" or "default" (XLA's
    faster passes: TensorFloat-32 on NVIDIA GPUs, bfloat16 on TPUs, with relative errors
    near 1e-3 instead of 1e-7). A CPU multiplies float32 in full whatever the setting
    and is left alone."""
    if (platform or jax.default_backend()) != "cpu":
        jax.config.update("jax_default_matmul_precision", precision)


def use_compilation_cache() -> None:
    """Keep every compiled program in JAX's persistent cache, in `cache_directory()`,
    unless the process has chosen a cache folder already.

    The cache is an optimisation: where its folder cannot be created or written (a
    read-only home on a cluster node, `ATTNFLOW_CACHE_DIR` naming a file) the run goes on
    without it, and says so once (a `RunNote`). A damaged entry (a process killed while
    JAX wrote it) is dropped when it is read, and its program compiled again and written
    anew (`_repair_damaged_entries`)."""
    if not jax.config.jax_compilation_cache_dir:  # pyright: ignore[reportAttributeAccessIssue] jax's options are set at run time
        folder = cache_directory()
        problem = _unwritable(folder)
        if problem is not None:
            if folder not in _REFUSED_FOLDERS:
                _REFUSED_FOLDERS.add(folder)
                warnings.warn(
                    f"the compilation cache cannot be kept in {folder} ({problem}), so this run compiles "
                    "without it; set ATTNFLOW_CACHE_DIR to a folder that can be written to keep compiled "
                    "programs.",
                    RunNote,
                    stacklevel=2,
                )
            return
        jax.config.update("jax_compilation_cache_dir", str(folder))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    _repair_damaged_entries()


# The cache folders already found unusable in this process (said once each).
_REFUSED_FOLDERS: set[Path] = set()


def _unwritable(folder: Path) -> str | None:
    """Why files cannot be written in `folder` (created if need be), or None."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-"):
            pass
    except FileExistsError:
        return "it is a file, not a folder"
    except OSError as error:
        return error.strerror or type(error).__name__
    return None


def _repair_damaged_entries() -> None:
    """Read JAX's cache entries through a guard: an entry that cannot be read back (cut
    short, or corrupt) is removed and counts as a miss, so that its program is compiled
    again and its entry written whole, instead of JAX warning about it on every run.
    (JAX's own reader, `jax._src.compilation_cache.get_executable_and_time`, is private:
    where it is not there, the guard is not installed and JAX's warnings stay.)"""
    try:
        from jax._src import compilation_cache
    except ImportError:
        return
    read = getattr(compilation_cache, "get_executable_and_time", None)
    if read is None or getattr(read, "repairs_damaged_entries", False):
        return

    def guarded(cache_key, *args, **kwargs):
        try:
            return read(cache_key, *args, **kwargs)
        except Exception as error:  # anything JAX could not read back: a miss
            folder = jax.config.jax_compilation_cache_dir  # pyright: ignore[reportAttributeAccessIssue] jax's options are set at run time
            for suffix in ("-cache", "-atime"):
                with contextlib.suppress(OSError, TypeError):
                    (Path(folder) / f"{cache_key}{suffix}").unlink(missing_ok=True)
            if folder not in _REPAIRED_FOLDERS:
                _REPAIRED_FOLDERS.add(folder)
                reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                warnings.warn(
                    f"a damaged entry of the compilation cache in {folder} ({reason}) was removed; its "
                    "program is compiled again and kept anew.",
                    RunNote,
                    stacklevel=2,
                )
            return None, None

    guarded.repairs_damaged_entries = True
    compilation_cache.get_executable_and_time = guarded


_REPAIRED_FOLDERS: set = set()


def plan_study(study: Study) -> EnsemblePlan:
    """The ensemble plan of a resolved study (its pieces, before any is solved)."""
    cfg = study.config
    prepare_jax(cfg)
    keys = jax.random.split(jax.random.key(cfg.seed), cfg.members)
    return EnsemblePlan(
        build_system(cfg),
        keys,
        jnp.asarray(study.betas, jnp.dtype(cfg.dtype.value)),
        study.grid,
        solver=cfg.solver.value,
        rtol=cfg.rtol,
        atol=cfg.atol,
        max_steps=cfg.max_steps,
        chunk_size=cfg.chunk_size,
    )


def solve_study(
    study: Study,
    plan: EnsemblePlan,
    *,
    pieces: str | os.PathLike | None = None,
    on_resume=None,
    on_piece=None,
    on_damaged=None,
):
    """Solve a planned study (see `attnflow.run`, whose runner plans, calls this and
    returns the `Results` as an xarray Dataset). `on_resume(found, total)` is told how many
    finished pieces were found, `on_piece()` of each piece finished (found or solved),
    `on_damaged(path)` of each piece that could not be read (and is solved again).
    A failed solve's error carries `error.results`."""
    cfg = study.config
    store = None
    if pieces is not None:
        identity = f"{run_identity(cfg)}\npieces: {plan.pieces} of {plan.piece_size}\n"
        store = PieceStore(Path(pieces), identity, discard=cfg.overwrite)
    outputs = [store.load(i, rows=plan.size_of(i)) if store is not None else None for i in range(plan.pieces)]
    for path in store.damaged if store is not None and on_damaged is not None else ():
        assert on_damaged is not None  # the loop runs only when it is given
        on_damaged(path)
    found = sum(out is not None for out in outputs)
    if found and on_resume is not None:
        on_resume(found, plan.pieces)
    for i in range(plan.pieces):
        out = outputs[i]
        if out is None:
            out = in_background(lambda i=i: plan.solve(i))
            if store is not None:
                store.save(i, out)
            outputs[i] = out
        if on_piece is not None:
            on_piece()
    result = plan.assemble(cast("list[dict[str, np.ndarray]]", outputs))  # every piece is there now
    results = to_results(study, result)
    try:
        check_ensemble(result, study.betas, non_finite_advice(cfg))
    except (NonFiniteStateError, SolverFailure) as error:
        results.attrs["error"] = str(error)
        error.results = results
        raise
    return results


def to_results(study: Study, result: EnsembleResult) -> Results:
    """The ensemble's statistics as `Results` (an xarray Dataset's layout) with the
    config in its attributes.

    Entries after a solve's first bad state are missing: NaN; the integer statistics
    with missing entries are stored as int32 with `_FillValue` -1 and read back as
    floats with NaN.
    """
    cfg, beta_is_list = study.config, study.beta_is_list
    valid = np.asarray(result.valid)
    failed = ~valid[..., -1]
    stopped = np.asarray(result.result) != 0
    first_bad = np.argmin(valid, axis=-1)
    data_vars, encoding = {}, {}
    kept = {str(m) for m in cfg.metrics}
    custom = {metric.name: metric for metric in user_metrics(cfg)}
    for name, value in result.stats.items():
        if name in METRICS and name not in kept:
            continue  # recorded for a check of the run's own (the Sinkhorn tolerance), not asked for
        value = np.asarray(value)
        if np.issubdtype(value.dtype, np.integer) and not valid.all():
            mask = valid.reshape(valid.shape + (1,) * (value.ndim - 3))
            value = np.where(mask, value.astype(np.float64), np.nan)
            encoding[name] = {"dtype": "int32", "_FillValue": INTEGER_FILL}
        dims = custom[name].dims if name in custom else _DIMS.get(name, ())
        if name in _ONCE:
            data_vars[name] = (("beta", "member") + dims, value[:, :, 0])
            continue
        data_vars[name] = (("beta", "member", "time") + dims, value)
    data_vars["num_steps"] = (("beta", "member"), np.asarray(result.num_steps))
    data_vars["status"] = (("beta", "member"), np.where(failed, np.where(stopped, 2, 1), 0).astype(np.int8))
    data_vars["failure_time"] = (("beta", "member"), np.where(failed, np.asarray(result.ts)[first_bad], np.nan))
    beta = study.betas
    if not beta_is_list:  # a single beta: a scalar coordinate, no `beta` dimension
        data_vars = {name: (dims[1:], value[0]) for name, (dims, value) in data_vars.items()}
        beta = beta[0]
    rescaled = {"description": time_axis(cfg.time_change.speed)} if cfg.time_change.speed is not None else {}
    time = variable_attributes("time", rescaled, 0.0, coordinate=True)
    coords = {
        "beta": (("beta",) if beta_is_list else (), beta, variable_attributes("beta", {}, beta, coordinate=True)),
        "member": (("member",), np.arange(cfg.members), variable_attributes("member", {}, 0, coordinate=True)),
        "time": (("time",), np.asarray(result.ts, dtype=np.float64), time),
    }
    described = {
        name: (dims, value, variable_attributes(name, _attributes(name, custom.get(name)), value))
        for name, (dims, value) in data_vars.items()
    }
    config = config_yaml(cfg)
    digest = code_digest(cfg)
    attrs = {
        "config": config,
        **({"code_digest": digest} if digest else {}),
        **global_attributes(
            title=_title(cfg), config=yaml.safe_load(config), history=history_line("attnflow.run(...)")
        ),
    }
    if cfg.time_change.speed is not None:
        attrs["time_axis"] = time_axis(cfg.time_change.speed)
    for part in PARTS.values():  # how each term computed what it did (the summation of attention)
        if part.enabled(cfg):
            attrs.update(part.attributes(cfg))
    notes = list(study.notes)
    if cfg.attention_kind == "sinkhorn" and "marginal_error" in result.stats:
        # The fixed iteration count's achieved column error, against the tolerance asked
        # for, in every Sinkhorn run (recorded whether or not the config keeps it).
        errors = np.asarray(result.stats["marginal_error"], np.float64)
        worst = float(np.nanmax(errors)) if np.isfinite(errors).any() else float("nan")
        attrs["sinkhorn_marginal_error"] = worst
        attrs["sinkhorn_within_tol"] = int(worst <= cfg.sinkhorn.tol)
        if not worst <= cfg.sinkhorn.tol:
            notes.append(
                f"Sinkhorn attention missed sinkhorn.tol={cfg.sinkhorn.tol:g}: its largest column error "
                f"is {worst:.3g} after sinkhorn.iterations={cfg.sinkhorn.iterations}; raise the "
                "iterations or the tolerance."
            )
    if notes:
        attrs["notes"] = "\n".join(notes)
    return Results(coords=coords, data_vars=described, attrs=attrs, encoding=encoding)


def _title(cfg: Config) -> str:
    """What a study is, in one line (the `title` of its results file)."""
    return (
        f"attnflow study: {cfg.attention_kind.value.upper()} dynamics, scheme={cfg.scheme.value}, "
        f"n={cfg.n}, d={cfg.d}, "
        f"{cfg.members} members, {cfg.solver.value} dt={cfg.dt:g}"
    )


def time_axis(speed) -> str:
    """What `time` is in the results of a run at constant speed `speed` (a number or
    `log_beta`)."""
    c = "log(beta)" if speed == "log_beta" else f"{float(speed):g}"
    return f"rescaled time s, not t: dX/ds = c F(X)/|F(X)| with c = {c} (time_change.speed)"


def _attributes(name: str, custom: UserMetric | None = None) -> dict:
    """A variable's attributes beyond its long name and units: the flags of `status`; a
    researcher's metric's long name and units, and where it comes from."""
    if custom is not None:
        return {"long_name": custom.long_name, "units": custom.units, "metric": target_path(custom.function)}
    attrs = {}
    if name == "status":
        attrs.update(flag_values=np.array([0, 1, 2], np.int8), flag_meanings=STATUS_MEANINGS)
    return attrs
