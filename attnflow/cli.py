"""The `attnflow` command: Hydra composes the config, `run` does the work.

Errors a person can fix (a bad value, a typo, an unwritable output folder, a run that
turned NaN) are printed as one sentence on stderr and the command exits with code 2,
with no traceback and nothing half-written. In a sweep (`-m`) every job runs; each
failure is reported with its job, and the sweep exits with code 2 if any job failed.
Ctrl-C (or SIGTERM) stops a run at once with one line and exit code 130; the finished
pieces of the run are kept, and the line names the `hydra.run.dir=...` (a sweep's
`hydra.sweep.dir=...`) that resumes from them. A run refused before computing leaves
no folder behind: the run directory Hydra created for it is removed while it holds
nothing but what Hydra wrote.

On a terminal a status line says what the command is doing until the bar of pieces
starts (composing the config, importing JAX, checking and planning, loading a
checkpoint), and while figures are drawn; each job of a sweep starts with a line
naming its overrides. Off a terminal, a line of the count of pieces comes every so
often instead of each bar (`Progress.lines`), and what a run prints is kept in its
folder's `attnflow.log` from the moment it is accepted (`_log`).

A run, a study's or an experiment's, goes one way (a study is the experiment of one
panel, `attnflow.experiments.PlainStudy`): `_run` checks, plans, solves, writes and
draws it with the functions of `attnflow.experiments`, and `attnflow plot` redraws any
results file with the same `draw_experiment`.

Lazy imports (start-up): the run (`_study`, `attnflow.experiments`: JAX) and the reports
(xarray, matplotlib) are imported inside the function that runs them, so that a command
loads only what it uses (`attnflow plot` of a study never loads JAX). `attnflow train` is
`diffeqformer._command.main`, which checks its settings before it loads JAX.

A sweep's jobs run wherever Hydra's launcher puts them: in this process (the basic
launcher), in parallel local processes (`hydra/launcher=joblib`) or as submitit jobs
(`hydra/launcher=submitit_local`, `submitit_slurm`). Each job leaves its outcome in the
sweep folder (`_SweepRecord`), so that the process that launched the sweep can name the
failed jobs, whichever process or machine ran them.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import shlex
import shutil
import signal
import sys
import warnings
from pathlib import Path
from typing import cast

import hydra
import yaml
from hydra._internal.utils import get_args_parser
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, Glob, RangeSweep, ValueType
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from . import _help
from .diffeqformer._command import main as train_main
from .running._progress import Progress, end_all, status
from .schema._config import (
    Config,
    config_source,
    refuse_renamed,
    register_schema,
    renamed_error,
    renamed_key,
    typed_job_config,
)
from .schema._errors import ConfigError, NonFiniteStateError, RunNote, SolverFailure, StorageError, did_you_mean
from .schema._schema import explain
from .storage._store import (
    RunDirectory,
    discard_partial_files,
    finished_pieces,
    load_results,
    read_config,
    stored_config,
    write_results,
)

_FAILED: list[tuple[str, str]] = []  # (job, message) of every failed job (of the sweep, once it ends)
_JOBS: list[str] = []
# The run (or sweep) directory being worked in (for the interrupt message), the sweep's
# lock, the folders Hydra is about to create for a run (removed if it is refused), the
# start-up status line.
_CURRENT: dict = {}
_OUTCOMES = ".attnflow-jobs"  # in a sweep's folder: one file per job, `{num}.json`
# What the joblib and submitit launchers raise when a job's process dies.
_LOST_JOB = ("TerminatedWorkerError", "UncompletedJobError")
_BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
# In a run's folder: what the run printed (Hydra's own log is switched off, conf/config.yaml).
_LOG = "attnflow.log"


def _say(message: str) -> None:
    """`attnflow: message` on stderr (an error, a note), kept in the run's log."""
    print(f"attnflow: {message}", file=sys.stderr, flush=True)
    _log(message)


def _print(message: str) -> None:
    """`attnflow: message` on stdout (what was written, what a run resumes), kept in the run's log."""
    print(f"attnflow: {message}", flush=True)
    _log(message)


def _log(message: str) -> None:
    """Keep a line the run printed: held until the run is accepted (`_start_log`), then
    appended to its `attnflow.log`, one whole line a write (a log that cannot be written
    loses a line, never the run)."""
    log = _CURRENT.get("log")
    if isinstance(log, list):
        log.append(message)
    elif log is not None:
        _append(log, f"attnflow: {message}\n")


def _start_log(folder: Path, hydra_cfg) -> None:
    """The run is accepted in `folder`: its log (`_LOG`, appended to by a run resumed
    there) starts with when and what command, then what it printed so far."""
    held = _CURRENT.get("log")
    _CURRENT["log"] = folder / _LOG
    _append(folder / _LOG, "".join([f"# {_history(hydra_cfg)}\n", *(f"attnflow: {line}\n" for line in held or [])]))


def _append(path: Path, text: str) -> None:
    """Add `text` at the end of the file `path` in one write (never through a link)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)


def _overrides(hydra_cfg) -> list[str]:
    """The command-line overrides of the job, as typed (`${...}` left unresolved)."""
    return list(cast("list[str]", OmegaConf.to_container(hydra_cfg.overrides.task, resolve=False)))  # a list of str


def _job_label(hydra_cfg) -> str:
    overrides = ", ".join(_overrides(hydra_cfg))
    number = "" if OmegaConf.is_missing(hydra_cfg.job, "num") else f" {hydra_cfg.job.num}"
    return f"job{number}" + (f" ({overrides})" if overrides else "")


def _record_failure(message: str, hydra_cfg, out: Path) -> None:
    sweep = hydra_cfg.mode == RunMode.MULTIRUN
    label = _job_label(hydra_cfg) if sweep else "run"
    _FAILED.append((label, message))
    _say(f"error: {label}: {message}" if sweep else f"error: {message}")
    if sweep and out.is_dir() and not (out / "results.nc").exists():
        # The job's own record of why it has no results (its folder holds nothing else
        # of value; a folder with results is never touched by a refused job).
        with contextlib.suppress(OSError):
            RunDirectory(out).write_text("error.txt", message + "\n")


class _SweepRecord(Callback):
    """Hydra callback (named in conf/config.yaml) that collects the outcome of every job
    of a sweep in the process that launched it.

    The joblib and submitit launchers run jobs in other processes, on other machines
    for SLURM, so each job writes its outcome (`_record_outcome`) into the sweep
    folder, which a cluster shares; this reads them once the launcher has returned.

    For a single run it notes which folders Hydra is about to create for it (the run
    directory and its parents that do not exist yet), so that a refused run can remove
    them (`_discard_refused`).
    """

    def on_run_start(self, config, **kwargs) -> None:
        run = Path(os.path.abspath(str(config.hydra.run.dir)))  # as Hydra's run_job makes it
        _CURRENT["created"] = [folder for folder in (run, *run.parents) if not folder.exists()]

    def on_multirun_start(self, config, **kwargs) -> None:
        sweep = Path(str(config.hydra.sweep.dir))
        # The sweep folder is locked while the sweep runs (its jobs lock their own
        # folders): a second sweep into it would clear this one's job records.
        lock = RunDirectory(sweep, setting="hydra.sweep.dir")
        try:
            lock.__enter__()
        except ConfigError as error:
            # Hydra turns a callback's exception into a warning and goes on: stop here.
            _say(f"error: {error}")
            raise SystemExit(2) from None
        _CURRENT["sweep_lock"] = lock
        shutil.rmtree(sweep / _OUTCOMES, ignore_errors=True)  # a previous sweep's
        _CURRENT["sweep"] = sweep

    def on_multirun_end(self, config, **kwargs) -> None:
        folder = Path(str(config.hydra.sweep.dir)) / _OUTCOMES
        outcomes, limit = [], 2**20
        for path in folder.glob("*.json"):
            # A job writes a few hundred bytes (`_record_outcome`): a record over 1 MiB (not
            # read further), or one of another shape, is not a job's and is skipped.
            with contextlib.suppress(OSError, ValueError, RecursionError), open(path, "rb") as file:
                record = file.read(limit + 1)
                outcome = json.loads(record) if len(record) <= limit else None
                if (
                    isinstance(outcome, dict)
                    and type(outcome.get("num")) is int
                    and isinstance(outcome.get("job"), str)
                    and isinstance(outcome.get("error"), (str, type(None)))
                ):
                    outcomes.append(outcome)
        outcomes.sort(key=lambda outcome: outcome["num"])
        _JOBS[:] = [outcome["job"] for outcome in outcomes]
        _FAILED[:] = [(outcome["job"], outcome["error"]) for outcome in outcomes if outcome["error"]]
        here = _stderr_identity()
        for outcome in outcomes:
            if outcome["error"] and outcome.get("stderr") != here:
                # The job's own line went to its log (submitit): say it here too.
                _say(f"error: {outcome['job']}: {outcome['error']}")
        shutil.rmtree(folder, ignore_errors=True)
        _CURRENT.pop("sweep", None)
        lock = _CURRENT.pop("sweep_lock", None)
        if lock is not None:
            lock.__exit__(None, None, None)


def _record_outcome(hydra_cfg, error: str | None) -> None:
    """A sweep job's outcome (None: finished or already there), for `_SweepRecord`."""
    outcome = {
        "num": int(hydra_cfg.job.num),
        "job": _job_label(hydra_cfg),
        "error": error,
        "stderr": _stderr_identity(),
    }
    with contextlib.suppress(OSError):
        RunDirectory(Path(str(hydra_cfg.sweep.dir))).write_text(
            f"{_OUTCOMES}/{outcome['num']}.json", json.dumps(outcome)
        )


def _stderr_identity() -> list[int] | None:
    """Which file stderr is (a job's lines reached the sweep's terminal when its
    stderr is the launching process's own)."""
    try:
        status = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        return None
    return [status.st_dev, status.st_ino]


def _job(cfg) -> None:
    """One run (one job of a sweep): check, lock, compute in pieces, write, plot."""
    hydra_cfg = HydraConfig.get()
    out = Path(hydra_cfg.runtime.output_dir)
    sweep = hydra_cfg.mode == RunMode.MULTIRUN
    _JOBS.append(_job_label(hydra_cfg))
    # The jobs of a parallel launcher share one terminal: none draws a line.
    Progress.muted = sweep and OmegaConf.select(hydra_cfg, "launcher._target_") != _BASIC_LAUNCHER  # pyright: ignore[reportArgumentType] HydraConfig.get() gives a DictConfig
    _CURRENT["log"] = []  # what the job prints, kept for its log once it is accepted
    Progress.lines = _progress_line  # off a terminal, every count of the run says a line every so often
    if sweep:
        _tell(None)
        _print(_job_label(hydra_cfg))
    error = None
    try:
        _run(cfg, hydra_cfg, out)
    except ConfigError as failure:
        error = str(failure)
        _tell(None)
        _record_failure(error, hydra_cfg, out)
        if not sweep:
            _discard_refused(out)
    except StorageError as failure:
        # A full disk: nothing finished is lost, and the same command resumes.
        pieces = out / RunDirectory.PIECES
        kept = finished_pieces(pieces)
        kept = (
            f"the {kept} finished piece{'s are' if kept > 1 else ' is'} kept in {pieces}, and the same command resumes"
            if kept
            else "nothing was finished yet, and the same command starts again"
        )
        error = f"{failure}; {kept} once {out} can be written again."
        _tell(None)
        _record_failure(error, hydra_cfg, out)
    finally:
        Progress.lines = None
    if sweep:
        _record_outcome(hydra_cfg, error)
    # Cleared on the way out of a finished or refused job only: an interrupt keeps it,
    # so that its message can say where the finished pieces are.
    _CURRENT.pop("dir", None)
    _CURRENT.pop("log", None)


def _run(cfg, hydra_cfg, out: Path) -> None:
    """The work of `_job`; a `ConfigError` says why there are no results."""
    # Hydra has composed the keys; their values are typed here, so that a bad one fails
    # this job alone.
    typed = typed_job_config(cfg)
    if "jax" not in sys.modules:
        _tell("importing JAX")
    # A study is the experiment of one panel (`experiments.PlainStudy`): one path for both.
    from .experiments import check_experiment, draw_experiment, plan_checked, solve_experiment  # lazy: start-up
    from .running._study import run_identity  # lazy: start-up (JAX), as the imports of the run below

    _tell("checking and planning the run")
    checked = check_experiment(typed)  # the study, or every panel of the experiment, checked
    resolved = checked.cfg
    with RunDirectory(out) as folder:
        _CURRENT["dir"] = folder.path
        stored = folder.finished_config(resolved.overwrite)
        if stored is not None and stored == run_identity(resolved):
            _print(f"{folder.results_path} already holds this run; skipping it.")
            return
        if stored is not None and not resolved.overwrite:
            raise ConfigError(
                f"{folder.results_path} holds a different run; choose another hydra.run.dir or set overwrite=true."
            )
        plan = plan_checked(checked)  # refuses what does not fit
        # Another run's unfinished pieces are refused like its results (or discarded with overwrite=true).
        discarded = folder.claim_pieces(plan.piece_configs(), resolved.overwrite)
        if discarded:
            _print(discarded)
        _write_record(folder, cfg, hydra_cfg)
        _start_log(folder.path, hydra_cfg)
        pieces = folder.path / folder.PIECES
        _tell(None)  # the bar follows
        try:
            with Progress(plan.name, plan.pieces) as progress:
                results = solve_experiment(
                    plan,
                    pieces=pieces,
                    on_piece=progress.advance,
                    on_resume=lambda label, found, total: _resuming(found, total, pieces / label),
                    on_damaged=_damaged,
                )
        except (NonFiniteStateError, SolverFailure) as error:
            if getattr(error, "results", None) is None:
                # An experiment's own computation failed (its mean-field PDE): no study's
                # statistics to keep, but its finished pieces stay for the next run.
                kept = finished_pieces(pieces)
                kept = f"; the {kept} finished piece{'s are' if kept > 1 else ' is'} kept in {pieces}" if kept else ""
                raise ConfigError(f"{str(error).rstrip('.')}{kept}.") from None
            # Nothing computed is lost: the statistics, missing from each failed
            # solve's first bad output on, go to a file that cannot be mistaken for
            # a finished run (a study's pieces go with it, an experiment's stay for
            # its other panels: `keeps_pieces_on_failure`).
            error.results.attrs["history"] = _history(hydra_cfg)
            kept = write_results(error.results, folder.path / "incomplete.nc")
            if not plan.keeps_pieces_on_failure:
                _remove_tree(pieces)
            raise ConfigError(f"{str(error).rstrip('.')}; what was computed is in {kept}.") from None
        results.attrs["history"] = _history(hydra_cfg)
        path = write_results(results, folder.results_path)
        _remove_tree(pieces)
        for stale in ("incomplete.nc", "error.txt"):
            (folder.path / stale).unlink(missing_ok=True)
        _print(f"wrote {path}")
        for note in filter(None, str(results.attrs.get("notes", "")).splitlines()):
            # Not errors (the run is whole), but what its settings did not do: said once,
            # after the results are safe, and kept in their `notes` attribute.
            _say(f"note: {note}")
        if resolved.plot:
            try:
                with status("drawing the figures"):
                    figures = draw_experiment(
                        results, folder.path, plotly_js=resolved.plotly_js.value, experiment=type(plan.experiment)
                    )
            except StorageError as error:
                raise ConfigError(
                    f"{error}; the results are safe in {path}, and `attnflow plot {folder.path}` "
                    "draws the figures once the folder can be written again."
                ) from None
            for figure in figures:
                _print(f"wrote {figure}")


def _history(hydra_cfg) -> str:
    """The `history` of a results file: when, and the command (a sweep job's own overrides)."""
    from .storage._cf import command_line, history_line  # lazy: start-up, as the study's imports

    if hydra_cfg.mode != RunMode.MULTIRUN:
        return history_line(command_line())
    return history_line(
        " ".join(["attnflow", *_overrides(hydra_cfg)]) + f" ({_job_label(hydra_cfg).split(' (')[0]} "
        f"of {_submitit_job() or command_line()})"
    )


def _submitit_job() -> str | None:
    """`submitit job ID in FOLDER` in a job the submitit launcher started (its process
    runs `python -m submitit.core._submit SWEEP/.submitit/%j`, not the sweep's command,
    and `%j` is the job's ID only once it runs); None in any other process."""
    if not os.environ.get("SUBMITIT_EXECUTOR"):  # set by submitit in the jobs it runs
        return None
    try:
        import submitit  # lazy: an optional dependency, in a submitit job only

        job = submitit.JobEnvironment()
        return f"submitit job {job.job_id} in {job.paths.folder}"
    except (ImportError, RuntimeError, KeyError):  # not a job submitit can describe
        return None


def _progress_line(line: str) -> None:
    """A count of the run off a terminal, every so often (a study's count of pieces is
    named attnflow, which every printed line starts with)."""
    _print(line.removeprefix("attnflow: "))


def _resuming(found: int, total: int, pieces: Path) -> None:
    _print(f"resuming from {found} of {total} finished pieces in {pieces}")


def _damaged(piece: Path) -> None:
    _print(f"{piece} could not be read (cut short by a kill?); computing that piece again")


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _tell(what: str | None) -> None:
    """The start-up status line says `what` now (None: it ends, before a bar or a message)."""
    line = _CURRENT.get("status")
    if what is None:
        if line is not None:
            line.__exit__(None, None, None)
            del _CURRENT["status"]
    elif line is None:
        _CURRENT["status"] = status(what).__enter__()
    else:
        line.describe(what)


# What Hydra writes into a run directory: its record (hydra.output_subdir) and its log.
_HYDRA_FILES = (".hydra",)


def _discard_refused(out: Path) -> None:
    """Remove the run directory of a refused run, and the parents Hydra created with it,
    when this run created them (`_SweepRecord.on_run_start`) and they hold nothing but
    what Hydra wrote: a folder that held anything before (a resumed run's) is never
    touched, nor one that holds a result."""
    created = _CURRENT.pop("created", [])
    out = Path(os.path.abspath(out))
    if out not in created:
        return
    with contextlib.suppress(OSError):
        if any(p.name not in _HYDRA_FILES and p.suffix != ".log" for p in out.iterdir()):
            return
        shutil.rmtree(out)
        for parent in created[created.index(out) + 1 :]:
            parent.rmdir()  # only while empty (OSError otherwise: the rest is kept)


def _write_record(folder, cfg, hydra_cfg) -> None:
    """What Hydra would write to `.hydra/`, written only once the run is accepted."""
    folder.write_text(".hydra/config.yaml", OmegaConf.to_yaml(cfg))
    folder.write_text(".hydra/overrides.yaml", OmegaConf.to_yaml(_overrides(hydra_cfg)))
    folder.write_text(".hydra/hydra.yaml", OmegaConf.to_yaml({"hydra": hydra_cfg}))


# The config groups whose options are attnflow's own files (conf/NAME/OPTION.yaml).
_GROUPS = ("init", "experiment")
# At most this many jobs in one sweep: Hydra lists every job's overrides and composes
# each job's config (a fraction of a second each) before the first job starts.
_MOST_JOBS = 10_000


def _shipped(group: str, config_dir: str | None = None) -> list[str]:
    """The options of one of `_GROUPS`: the names of its YAML files, attnflow's and those
    of the user's own config folder (`--config-dir DIR`: `DIR/GROUP/NAME.yaml`)."""
    folders = [config_source()[1].joinpath(group)]
    if config_dir:
        folders.append(Path(config_dir) / group)
    return sorted(
        {
            p.name[: -len(".yaml")]
            for folder in folders
            if folder.is_dir()
            for p in folder.iterdir()
            if p.name.endswith(".yaml")
        }
    )


def _check_command_line(arguments: list[str]) -> None:
    """Refuse, before Hydra composes anything, what composing would get wrong: a config
    group option that is not a name (a path loads any YAML file on the machine, and Hydra
    runs the callbacks that file names), a key given twice (Hydra would keep the last),
    a key renamed (`RENAMED`: set, added, deleted or swept, or in the experiment YAML of
    the user's config folder) and a sweep too large to list. Raises `ConfigError` (or
    Hydra's parse error)."""
    parsed = get_args_parser().parse_args(arguments)
    given, config_dir = parsed.overrides, parsed.config_dir
    bare = next((arg for arg in given if "=" not in arg and not arg.startswith("~")), None)
    if bare is not None:
        # Hydra would say only "Error parsing override": a word alone is not a setting.
        raise ConfigError(
            f"attnflow takes settings as key=value (e.g. n=32 beta=4), experiment=NAME or a command "
            f"({', '.join(_USAGE)}, help), got {bare!r}; `attnflow --help` lists them."
        )
    overrides = OverridesParser.create().parse_overrides(given)
    if not parsed.multirun and not any(o.key_or_group == "hydra.mode" for o in overrides):
        _check_no_sweep(overrides)
    experiment = next((o.value() for o in overrides if o.key_or_group == "experiment"), None)
    seen: dict[tuple, str | None] = {}
    sizes = []
    for override in overrides:
        new = renamed_key(override.key_or_group, experiment if isinstance(experiment, str) else None)
        if new is not None:
            # Hydra would say only that the key is not in the config.
            line = override.input_line or ""
            _, equals, value = line.partition("=")
            prefix = "~" if override.is_delete() else "++" if line.startswith("++") else ""
            raise renamed_error(override.key_or_group, new, f"{prefix}{new}{equals}{value}")
        key = (override.key_or_group, override.package)
        if key in seen:
            raise ConfigError(
                f"{override.get_key_element().lstrip('~+')} is given twice ({seen[key]}, "
                f"{override.input_line}); give it once."
            )
        seen[key] = override.input_line
        if override.is_delete():
            continue  # a key left without its value is refused when the job starts
        if override.key_or_group in _GROUPS or "/" in override.key_or_group:
            _check_group_options(override.key_or_group, override.value(), config_dir)
        sizes.append(_sweep_size(override, config_dir))
    if config_dir is not None and isinstance(experiment, str):  # a name, checked above
        _check_own_experiment(Path(config_dir) / "experiment" / f"{experiment}.yaml")
    jobs = math.prod(sizes)
    if jobs > _MOST_JOBS:
        swept = " x ".join(str(size) for size in sizes if size != 1)
        raise ConfigError(
            f"this sweep has {jobs} jobs ({swept}); one command runs at most {_MOST_JOBS}, as Hydra "
            "lists and composes every job before the first one starts: split it, or give beta as a "
            "list (one run computes every beta)."
        )


def _check_no_sweep(overrides) -> None:
    """Refuse a sweep in a single run (no `-m`), with Hydra's hint in attnflow's words:
    Hydra would say it on four lines, and the first alone loses what to write instead."""
    for override in overrides:
        if not override.is_sweep_override():
            continue
        line = override.input_line or ""
        refusal = f"{line} is a sweep (one job per value), which takes -m (--multirun)."
        if override.value_type == ValueType.SIMPLE_CHOICE_SWEEP:  # `key=a,b`: perhaps a list or a text
            key, _, value = line.partition("=")
            refusal += (
                f" For one run, write a list, {key}=[{value}], or a string in quotes that reach attnflow, "
                f"\"{key}='{value}'\"."
            )
        raise ConfigError(refusal)


def _check_own_experiment(path: Path) -> None:
    """Refuse a renamed key (`RENAMED`) in the YAML file of an experiment of the user's
    own, naming the file (Hydra would say only that a key is not in the config). A file
    that cannot be read is left to Hydra."""
    try:
        given = read_config(path) if path.is_file() else None
    except (OSError, ValueError, yaml.YAMLError):
        return
    if isinstance(given, dict):
        refuse_renamed(given, str(path))


def _check_group_options(group: str, value, config_dir: str | None = None) -> None:
    """Each option a group override names (one, or a sweep's) is one of attnflow's own
    (`_GROUPS`) or of the user's config folder, or a plain name for Hydra's groups
    (hydra/launcher, ...)."""
    names = _shipped(group, config_dir) if group in _GROUPS else None
    if isinstance(value, Glob):
        return  # matched against the group's own options by Hydra
    for option in value.list if isinstance(value, ChoiceSweep) else [value]:
        option = None if option is None else str(option)
        if names is None:
            if option is not None and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", option):
                raise ConfigError(
                    f"unknown {group} {option!r}: a config group takes the name of one of its options, never a path."
                )
        elif option not in names and not (option is None and group == "experiment"):
            shown = "null" if option is None else repr(option)
            guess = did_you_mean(option, names)
            raise ConfigError(f"unknown {group} {shown}{guess}; choose one of {', '.join(names)}.")


def _sweep_size(override, config_dir: str | None = None) -> int:
    """How many values an override sweeps over (1 for a plain value)."""
    value = override.value()
    if isinstance(value, ChoiceSweep):
        return len(value.list)
    if isinstance(value, Glob) and override.key_or_group in _GROUPS:
        return len(value.filter(_shipped(override.key_or_group, config_dir)))
    if isinstance(value, RangeSweep) and value.start is not None and value.stop is not None:
        if not value.step:
            raise ConfigError(f"{override.input_line} never ends: a range takes a step other than 0.")
        return max(0, math.ceil((value.stop - value.start) / value.step))
    return 1


def _sentence(error: BaseException) -> str:
    """One sentence for an error raised by Hydra while composing the config."""
    if isinstance(error, MissingConfigException) and error.missing_cfg_file:
        group, _, option = error.missing_cfg_file.rpartition("/")
        names = [o for o in (error.options or []) if not o.startswith("attnflow_schema")]
        options, guess = ", ".join(names), did_you_mean(option, names)
        if group == "hydra/launcher":
            return (
                f"unknown hydra/launcher {option!r}{guess}; choose one of {options} (joblib comes with "
                'pip install "attnflow[joblib]", submitit_local and submitit_slurm with "attnflow[slurm]").'
            )
        if group:
            return f"unknown {group} {option!r}{guess}; choose one of {options}."
        return f"cannot find the config {error.missing_cfg_file!r}."
    if isinstance(error, OverrideParseException):
        first = str(error).strip().splitlines()[0].rstrip(".")
        key, _, value = first.rpartition(": ")[2].partition("=")
        if key.isascii() and not value.isascii():
            # Hydra reads unquoted values in ASCII only.
            return (
                f"cannot parse the command line ({first}); a value with other characters goes in quotes that "
                f"reach attnflow, e.g. \"{key}='{value}'\"."
            )
        return f"cannot parse the command line ({first})."
    cause = error if isinstance(error, OmegaConfBaseException) else error.__cause__
    if isinstance(cause, OmegaConfBaseException):
        return explain(cause, Config)
    if isinstance(error, OSError) and error.filename:
        return f"cannot use {error.filename} ({error.strerror})."
    first = str(error).strip().splitlines()[0].rstrip(".") if str(error).strip() else type(error).__name__
    return f"{first}."


def _interrupted() -> None:
    """Ctrl-C: remove what is half-written, say what is kept and the override that
    resumes from it, exit at once."""
    end_all()
    _CURRENT.pop("status", None)
    discard_partial_files()
    folder = _CURRENT.get("dir")
    kept = finished_pieces(folder / RunDirectory.PIECES) if folder else 0
    sweep = _CURRENT.get("sweep")
    # Without its folder, the same command would start over in a new timestamped one.
    resume = (
        f"hydra.sweep.dir={shlex.quote(str(Path(sweep).absolute()))}"
        if sweep is not None
        else f"hydra.run.dir={shlex.quote(str(Path(folder).absolute()))}"
        if folder
        else None
    )
    if kept:
        assert folder is not None  # pieces are kept only in a folder
        _say(
            f"interrupted; {kept} finished piece{'s are' if kept > 1 else ' is'} kept in "
            f"{folder / RunDirectory.PIECES}; the same command with {resume} resumes from there."
        )
    elif sweep is not None:
        # Between jobs, or the jobs ran in other processes (a parallel launcher, whose
        # workers stop with this one): their finished pieces are where they were.
        _say(
            f"interrupted; the finished jobs and pieces are kept in {sweep}; the same command with {resume} "
            "resumes from there, skipping the finished jobs."
        )
    else:
        _say("interrupted; no results were written.")
        if _CURRENT.get("created"):
            _discard_refused(_CURRENT["created"][0])  # nothing of this run's in it: no empty folder
    sys.stdout.flush()
    if folder is None and sweep is not None:
        # Nothing computes in this process (the launcher's workers are stopped): a normal
        # exit, which lets joblib release what its workers shared.
        sys.exit(130)
    # os._exit: a compiled computation may still be running in a worker thread, and a
    # normal exit would wait for it.
    os._exit(130)


def _terminate(signum, frame) -> None:
    raise KeyboardInterrupt


_USAGE = _help.SUBCOMMANDS


def _command(name: str, args: list[str]) -> int:
    """`attnflow plot DIR...` and `attnflow report DIR`: read results, draw, summarize;
    `attnflow train ...`: the DiffEqFormer's training (its own settings and messages)."""
    if name == "train":
        return train_main(args)
    config_dir = None
    if name == "plot":
        try:
            args, config_dir = _config_dir_of(args)
        except ConfigError as error:
            _say(f"error: {error}")
            return 2
    if name == "report" and any(a in ("-h", "--help") for a in args):
        print(_help.report_help(), flush=True)
        return 0
    options = {}
    if name == "report":
        try:
            args, options = _report_options_of(args)
        except ConfigError as error:
            _say(f"error: {error}")
            return 2
    if not args or any(a in ("-h", "--help") for a in args) or (name == "report" and len(args) != 1):
        _say(f"usage: {_USAGE[name]}.")
        return 0 if any(a in ("-h", "--help") for a in args) else 2
    try:
        with status("reading the results"):
            from .presentation._report import results_files  # lazy: start-up (xarray)

            found = [results_files(Path(arg), name) for arg in args]
        if name == "plot":
            for results in (path for paths in found for path in paths):
                with status(f"drawing the figures of {results}"):
                    drawn = _redraw(results, config_dir)
                for path in drawn:
                    _print(f"wrote {path}")
        else:
            from .presentation._report import report  # lazy: start-up

            folder = Path(args[0])
            with status(f"writing the report of {len(found[0])} run{'s' if len(found[0]) > 1 else ''}"):
                written, reported = report(folder.parent if folder.is_file() else folder, **options)
            for path in written:
                _print(f"wrote {path}")
            _print(f"{reported}")
    except (ConfigError, StorageError) as error:
        end_all()
        _say(f"error: {error}")
        return 2
    except KeyboardInterrupt:
        _interrupted()
    return 0


def _report_options_of(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """`attnflow report`'s arguments without its options (`--x KEY` or `--x=KEY`, ...:
    `_help.REPORT_OPTIONS`; `--color` is `--colour`), and those options by name."""
    rest, options = [], {}
    words = iter(args)
    for word in words:
        if not word.startswith("--"):
            rest.append(word)
            continue
        flag, given, value = word.partition("=")
        name = "colour" if flag == "--color" else flag[2:]
        if name not in _help.REPORT_OPTIONS:
            raise ConfigError(
                f"attnflow report has no option {flag}{did_you_mean(name, _help.REPORT_OPTIONS, '--')}; its options "
                f"are {', '.join(f'--{n}' for n in _help.REPORT_OPTIONS)} (attnflow help report)."
            )
        if name in options:
            raise ConfigError(f"--{name} is given twice; give it once.")
        value = value if given else next(words, None)
        if value is None or value.startswith("--"):
            raise ConfigError(
                f"{flag} takes {_help.REPORT_OPTIONS[name][0]} (attnflow help report says what each means)."
            )
        options[name] = value
    return rest, options


def _config_dir_of(args: list[str]) -> tuple[list[str], str | None]:
    """`attnflow plot`'s arguments without `--config-dir DIR` (or `-cd DIR`,
    `--config-dir=DIR`), and that folder."""
    rest, folder = [], None
    words = iter(args)
    for word in words:
        if word in ("--config-dir", "-cd"):
            folder = next(words, None)
            if folder is None:
                raise ConfigError(f"{word} takes a folder: the config folder of your own experiment.")
        elif word.startswith("--config-dir="):
            folder = word.partition("=")[2]
        else:
            rest.append(word)
    return rest, folder


def _user_experiment(ds, config_dir: str | None):
    """The class of a researcher's own experiment that drew `ds`, imported only from the
    config folder the user gave (`--config-dir`): its `experiment/NAME.yaml` must name the
    class the results name. None for a shipped experiment."""
    target, name = ds.attrs.get("experiment_target"), ds.attrs.get("experiment")
    if target is None:
        return None
    if config_dir is None:
        return None  # the runner refuses it in one sentence, naming --config-dir
    from .experiments import experiment_class  # lazy: start-up

    path = Path(config_dir) / "experiment" / f"{name}.yaml"
    try:
        given = read_config(path)
    except (OSError, ValueError) as error:
        raise ConfigError(
            f"{path} cannot be read ({type(error).__name__}); give the config folder of the experiment {name}."
        ) from None
    named = (given.get("experiment") or {}).get("_target_") if isinstance(given, dict) else None
    if named != target:
        raise ConfigError(
            f"{path} names the class {named!r}, but the results were drawn by {target}; give the "
            "config folder of the experiment that wrote them."
        )
    return experiment_class(name, named)


def _redraw(results: Path, config_dir: str | None = None) -> list[Path]:
    """Redraw the figures of one results file beside it (a researcher's own experiment
    with the class its config folder names, `--config-dir`)."""
    stored_config(results, "give the results.nc of a finished run")  # one sentence for a file not attnflow's
    ds = load_results(results)
    # A study's summary.png or an experiment's figures, as the run drew them (no JAX
    # for a study's).
    from .experiments import draw_experiment  # lazy: start-up

    try:
        return draw_experiment(ds, results.parent, experiment=_user_experiment(ds, config_dir))
    except KeyError as missing:  # a file that lacks what its figures draw
        name = ds.attrs.get("experiment")
        drawn = f"experiment {name}" if name else "a study"
        raise ConfigError(
            f"{results} lacks {missing}, which the figures of {drawn} need; was it written by attnflow?"
        ) from None


_HELP_FLAGS = ("-h", "--help")
_COMPLETION_FLAGS = ("-sc", "--shell-completion")


def _without_hydra(args: list[str]) -> int | None:
    """What the command answers before Hydra composes anything: `--version`, `--help`
    (alone or with experiment=NAME: other overrides go through Hydra's `--help`, which
    composes them first), `attnflow help [TOPIC]`, `attnflow train --help`,
    `--shell-completion` without a subcommand, and the completion of a choice key's value.
    Returns the exit code, or None for Hydra to go on."""
    if "--version" in args:
        print(f"attnflow {_help.version()}", flush=True)
        return 0
    if args[:1] == ["help"]:
        topic = args[1:]
        if not topic:
            return _without_hydra(["--help"])
        if len(topic) == 1 and topic[0] in _USAGE:
            return _without_hydra([topic[0], "--help"]) if topic[0] == "train" else _command(topic[0], ["--help"])
        if len(topic) == 1 and topic[0].removeprefix("experiment=") in _help.experiments():
            return _without_hydra([f"experiment={topic[0].removeprefix('experiment=')}", "--help"])
        _say(
            f"error: attnflow help takes plot, report, train or an experiment ({', '.join(_help.experiments())}), "
            f"got {' '.join(topic)!r}."
        )
        return 2
    if args[:1] == ["train"] and any(a in _HELP_FLAGS for a in args[1:]):
        print(_help.train_help(), flush=True)
        return 0
    overrides = [a for a in args if a not in _HELP_FLAGS]
    if (
        len(overrides) < len(args)
        and args[:1] not in ([name] for name in _USAGE)
        and (overrides == [] or (len(overrides) == 1 and overrides[0].startswith("experiment=")))
    ):
        try:
            _check_command_line(overrides)  # an experiment that is not one
        except (ConfigError, HydraException) as error:
            _say(f"error: {error if isinstance(error, ConfigError) else _sentence(error)}")
            return 2
        name = overrides[0].partition("=")[2] if overrides else "null"
        print(_help.hydra_help(None if name == "null" else name), flush=True)
        return 0
    if any(a in _COMPLETION_FLAGS for a in args):
        return _completion([a for a in args if a not in _COMPLETION_FLAGS])
    return None


def _completion(overrides: list[str]) -> int | None:
    """`-sc` without install=, uninstall= or query= is one sentence; a query for the
    value of a choice key (`solver=r`) is answered with its names; the first word is
    also a subcommand (plot, report, train, help), given before Hydra's completion of it,
    and the words after a subcommand are its own (`_help.complete_command`: its options,
    folders, topics); any other query goes to Hydra's completion (keys, groups, a group's
    options)."""
    commands = {key: value for key, _, value in (o.partition("=") for o in overrides)}
    if not any(key in commands for key in ("install", "uninstall", "query")):
        _say(f"usage: {_help.COMPLETION_USAGE}")
        return 2
    shell = commands.get("query")
    line = os.environ.get("COMP_LINE", "")
    if shell is None or not line:
        return None
    from hydra.plugins.completion_plugin import CompletionPlugin  # lazy: completion only

    words = CompletionPlugin.strip_python_or_app_name(line).split()
    if line[-1].isspace():
        words.append("")  # the word to complete: none typed yet
    typed = words[-1] if words else ""
    if len(words) == 1 and not typed.startswith(("-", "+", "~")) and "=" not in typed:
        hydras = io.StringIO()
        with contextlib.redirect_stdout(hydras):
            _hydra_entry()()  # Hydra's completion of the first word (keys and groups)
        matches = [name for name in (*_USAGE, "help") if name.startswith(typed)] + hydras.getvalue().split()
    elif words[0] in (*_USAGE, "help"):
        matches = _help.complete_command(words[0], typed, words[1:-1])
    else:
        matches = _help.complete(typed, words[:-1]) if typed else None
    if matches is None:
        return None
    print(("\n" if shell == "fish" else " ").join(matches), flush=True)
    return 0


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """attnflow's notes (`RunNote`) as one line each; other warnings as Python shows them."""
    if isinstance(category, type) and issubclass(category, RunNote):
        _tell(None)
        _say(f"note: {message}")
    else:
        _PYTHON_SHOWWARNING(message, category, filename, lineno, file, line)


_PYTHON_SHOWWARNING = warnings.showwarning


# Groups of kinds inside another group (the source's `cross.init`): a kind's keys are not
# in the defaults' `cross.init` (only `kind` is), so Hydra would refuse them; they are
# added as given (`++cross.init.k=3`) and typed by the chosen kind's schema.
_OPEN_GROUPS = ("cross.init.",)


def _opened(arguments: list[str]) -> list[str]:
    """The command line with the keys of `_OPEN_GROUPS` added as given (`++`)."""
    return ["++" + a if a.startswith(_OPEN_GROUPS) and "=" in a else a for a in arguments]


def _mode_from_the_flags() -> None:
    """Hydra composes the whole config once only to read `hydra.mode` before composing it
    again for the run (`Hydra.get_mode`; a tenth of a trivial run's start-up on a 2-core
    CPU). attnflow's configs never set the mode, so unless the command line names it, or
    brings configs of its own (`--config-dir`, `--config-name`), the mode is what Hydra
    takes when the config is silent: a sweep with `-m`, else one run."""
    from hydra._internal.hydra import Hydra  # lazy: start-up

    compose_for_mode = getattr(Hydra, "get_mode", None)
    if compose_for_mode is None or getattr(compose_for_mode, "attnflow", False):
        return
    own_configs = any(
        a.startswith(("--config-dir", "-cd", "--config-name", "-cn", "--config-path", "-cp")) for a in sys.argv
    )

    def get_mode(self, config_name, overrides):
        if own_configs or any("hydra.mode" in override for override in overrides):
            return compose_for_mode(self, config_name, overrides)
        return None

    get_mode.attnflow = True  # pyright: ignore[reportFunctionMemberAccess]  (a marker: patched once)
    Hydra.get_mode = get_mode


def _hydra_entry():
    """Hydra's entry point of a run (`_job`), over attnflow's configs and schema: it reads `sys.argv`."""
    register_schema()
    _mode_from_the_flags()
    return hydra.main(version_base=None, config_path=config_source()[0], config_name="config")(_job)


def main() -> None:
    """The console entry point."""
    warnings.showwarning = _show_warning
    answered = _without_hydra(sys.argv[1:])
    if answered is not None:
        sys.exit(answered)
    if len(sys.argv) > 1 and sys.argv[1] in _USAGE:
        signal.signal(signal.SIGTERM, _terminate)
        sys.exit(_command(sys.argv[1], sys.argv[2:]))
    # Let Hydra's own errors reach this function (instead of its multi-line printer).
    os.environ["HYDRA_FULL_ERROR"] = "1"
    signal.signal(signal.SIGTERM, _terminate)
    entry = _hydra_entry()
    sys.argv[1:] = _opened(sys.argv[1:])
    try:
        _check_command_line(sys.argv[1:])
        _tell("composing the config")
        entry()
    except KeyboardInterrupt:
        _interrupted()
    except ConfigError as error:
        _tell(None)
        _say(f"error: {error}")
        sys.exit(2)
    except (HydraException, OmegaConfBaseException, OSError) as error:
        _tell(None)
        _say(f"error: {_sentence(error)}")
        if _CURRENT.get("created"):
            _discard_refused(_CURRENT["created"][0])  # the run directory
        sys.exit(2)
    except Exception as error:
        if type(error).__name__ not in _LOST_JOB:
            raise  # a bug: its traceback
        # A job's process died (killed for memory, or by the scheduler's time limit):
        # the launcher gives up on the jobs it had not run yet.
        first = str(error).strip().splitlines()[0].rstrip(".") if str(error).strip() else type(error).__name__
        _say(
            f"error: a job's process ended before its job did ({first}); the finished jobs are kept in "
            f"{_CURRENT.get('sweep', 'the sweep folder')} and the same command runs the others."
        )
        sys.exit(2)
    finally:
        _tell(None)
    if _FAILED:
        if len(_JOBS) > 1:
            names = "; ".join(label for label, _ in _FAILED)
            _say(f"error: {len(_FAILED)} of {len(_JOBS)} jobs failed: {names}.")
        sys.exit(2)


if __name__ == "__main__":
    main()
