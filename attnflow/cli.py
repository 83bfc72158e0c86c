"""The `attnflow` command: Hydra composes the config, `run` does the work.

Errors a person can fix (a bad value, a typo, an unwritable output folder, a run that
turned NaN) are printed as one sentence on stderr and the command exits with code 2,
with no traceback and nothing half-written. In a sweep (`-m`) every job runs; each
failure is reported with its job, and the sweep exits with code 2 if any job failed.
Ctrl-C (or SIGTERM) stops a run at once with one line and exit code 130; the finished
pieces of the run are kept, and the same command resumes from them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

from ._config import config_source

_FAILED: list[tuple[str, str]] = []  # (job, message) of every failed job of this process
_JOBS: list[str] = []
_CURRENT: dict[str, Path] = {}  # the run directory being worked in (for the interrupt message)


def _say(message: str) -> None:
    print(f"attnflow: {message}", file=sys.stderr, flush=True)


def _overrides(hydra_cfg) -> list[str]:
    """The command-line overrides of the job, as typed (`${...}` left unresolved)."""
    from omegaconf import OmegaConf

    return list(OmegaConf.to_container(hydra_cfg.overrides.task, resolve=False))


def _job_label(hydra_cfg) -> str:
    from omegaconf import OmegaConf

    overrides = ", ".join(_overrides(hydra_cfg))
    number = "" if OmegaConf.is_missing(hydra_cfg.job, "num") else f" {hydra_cfg.job.num}"
    return f"job{number}" + (f" ({overrides})" if overrides else "")


def _record_failure(message: str, hydra_cfg, out: Path) -> None:
    from hydra.types import RunMode

    sweep = hydra_cfg.mode == RunMode.MULTIRUN
    label = _job_label(hydra_cfg) if sweep else "run"
    _FAILED.append((label, message))
    _say(f"error: {label}: {message}" if sweep else f"error: {message}")
    if sweep and out.is_dir() and not (out / "results.nc").exists():
        # The job's own record of why it has no results (its folder holds nothing else
        # of value; a folder with results is never touched by a refused job).
        from ._store import RunDirectory

        with contextlib.suppress(OSError):
            RunDirectory(out).write_text("error.txt", message + "\n")


def _job(cfg) -> None:
    """One run (one job of a sweep): check, lock, compute in pieces, write, plot."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from ._config import explain
    from ._errors import ConfigError, NonFiniteStateError, SolverFailure

    hydra_cfg = HydraConfig.get()
    out = Path(hydra_cfg.runtime.output_dir)
    _JOBS.append(_job_label(hydra_cfg))
    try:
        try:
            # Hydra has composed it against the typed schema: it is a Config already.
            typed = OmegaConf.to_object(cfg)
        except OmegaConfBaseException as error:
            raise ConfigError(explain(error)) from None
        from ._build import validate_config
        from ._progress import Progress
        from ._store import RunDirectory, write_results
        from ._study import config_yaml, plan_study, solve_study

        experiment = None
        if typed.experiment is not None:
            from .experiments import plan_experiment

            experiment = plan_experiment(typed)  # every panel checked and planned
            resolved = experiment.cfg
        else:
            resolved = validate_config(typed)
        with RunDirectory(out) as folder:
            _CURRENT["dir"] = folder.path
            stored = folder.finished_config(resolved.overwrite)
            if stored is not None and stored == config_yaml(resolved):
                print(f"attnflow: {folder.results_path} already holds this run; skipping it.", flush=True)
                _CURRENT.pop("dir", None)
                return
            if stored is not None and not resolved.overwrite:
                raise ConfigError(f"{folder.results_path} holds a different run; choose another hydra.run.dir "
                                  "or set overwrite=true.")
            plan = plan_study(resolved) if experiment is None else None  # refuses what does not fit
            _write_record(folder, cfg, hydra_cfg)
            pieces = folder.path / folder.PIECES
            name = "attnflow" if experiment is None else experiment.name
            total = plan.pieces if experiment is None else experiment.pieces
            try:
                with Progress(name, total) as progress:
                    if experiment is None:
                        results = solve_study(resolved, plan, pieces=pieces, on_piece=progress.advance,
                                              on_resume=lambda found, total: _resuming(found, total, pieces))
                    else:
                        from .experiments import solve_experiment

                        results = solve_experiment(experiment, pieces=pieces, on_piece=progress.advance,
                                                   on_resume=lambda label, found, total: _resuming(
                                                       found, total, pieces / label))
            except (NonFiniteStateError, SolverFailure) as error:
                # Nothing computed is lost: the statistics, missing from each failed
                # solve's first bad output on, go to a file that cannot be mistaken for
                # a finished run (an experiment's other panels keep their pieces).
                kept = write_results(error.results, folder.path / "incomplete.nc")
                if experiment is None:
                    _remove_tree(pieces)
                raise ConfigError(f"{str(error).rstrip('.')}; what was computed is in {kept}.") from None
            path = write_results(results, folder.results_path)
            _remove_tree(pieces)
            for stale in ("incomplete.nc", "error.txt"):
                (folder.path / stale).unlink(missing_ok=True)
            print(f"attnflow: wrote {path}", flush=True)
            if resolved.plot:
                if experiment is None:
                    from ._plots import plot_summary

                    figures = [plot_summary(results.to_xarray(), folder.path / "summary.png", title=_title(resolved))]
                else:
                    from .experiments import draw_experiment

                    figures = draw_experiment(results, folder.path)
                for figure in figures:
                    print(f"attnflow: wrote {figure}", flush=True)
    except ConfigError as error:
        _record_failure(str(error), hydra_cfg, out)
    # Cleared on the way out of a finished or refused job only: an interrupt keeps it,
    # so that its message can say where the finished pieces are.
    _CURRENT.pop("dir", None)


def _resuming(found: int, total: int, pieces: Path) -> None:
    print(f"attnflow: resuming from {found} of {total} finished pieces in {pieces}", flush=True)


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _write_record(folder, cfg, hydra_cfg) -> None:
    """What Hydra would write to `.hydra/`, written only once the run is accepted."""
    from omegaconf import OmegaConf

    folder.write_text(".hydra/config.yaml", OmegaConf.to_yaml(cfg))
    folder.write_text(".hydra/overrides.yaml", OmegaConf.to_yaml(_overrides(hydra_cfg)))
    folder.write_text(".hydra/hydra.yaml", OmegaConf.to_yaml({"hydra": hydra_cfg}))


def _title(cfg) -> str:
    return (
        f"{cfg.dynamics.value.upper()} on norm={cfg.norm}, n={cfg.n}, d={cfg.d}, "
        f"{cfg.members} members, {cfg.solver} dt={cfg.dt}"
    )


def _sentence(error: BaseException) -> str:
    """One sentence for an error raised by Hydra while composing the config."""
    from hydra.errors import MissingConfigException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    from ._config import explain

    if isinstance(error, MissingConfigException) and error.missing_cfg_file:
        group, _, option = error.missing_cfg_file.rpartition("/")
        options = ", ".join(o for o in (error.options or []) if not o.startswith("attnflow_schema"))
        if group:
            return f"unknown {group} {option!r}; choose one of {options}."
        return f"cannot find the config {error.missing_cfg_file!r}."
    if isinstance(error, OverrideParseException):
        first = str(error).strip().splitlines()[0].rstrip(".")
        return f"cannot parse the command line ({first})."
    cause = error if isinstance(error, OmegaConfBaseException) else error.__cause__
    if isinstance(cause, OmegaConfBaseException):
        return explain(cause)
    if isinstance(error, OSError) and error.filename:
        return f"cannot use {error.filename} ({error.strerror})."
    first = str(error).strip().splitlines()[0].rstrip(".") if str(error).strip() else type(error).__name__
    return f"{first}."


def _interrupted() -> None:
    """Ctrl-C: remove what is half-written, say what is kept, exit at once."""
    from ._store import RunDirectory, discard_partial_files

    discard_partial_files()
    folder = _CURRENT.get("dir")
    kept = len(list((folder / RunDirectory.PIECES).glob("piece-*.npz"))) if folder else 0
    if kept:
        _say(f"interrupted; {kept} finished piece{'s are' if kept > 1 else ' is'} kept in "
             f"{folder / RunDirectory.PIECES} and the same command resumes from there.")
    else:
        _say("interrupted; no results were written.")
    sys.stdout.flush()
    # os._exit: a compiled computation may still be running in a worker thread, and a
    # normal exit would wait for it.
    os._exit(130)


def _terminate(signum, frame) -> None:
    raise KeyboardInterrupt


_USAGE = {
    "plot": "attnflow plot DIR...: redraw the figures of each run directory (or results.nc) from its results.nc",
    "report": "attnflow report DIR: one table (report.csv) and one figure (report.png) across the runs of a sweep",
    "train": "attnflow train [KEY=VALUE ...]: train a DiffEqFormer or its GPT baseline (defaults in conf/train.yaml); "
             "the same command, or out=DIR alone, resumes an interrupted run",
}


def _command(name: str, args: list[str]) -> int:
    """`attnflow plot DIR...` and `attnflow report DIR`: read results, draw, summarize;
    `attnflow train ...`: the DiffEqFormer's training (its own settings and messages)."""
    from ._errors import ConfigError

    if name == "train":
        from .diffeqformer import main as train

        return train(args)
    if not args or any(a in ("-h", "--help") for a in args) or (name == "report" and len(args) != 1):
        _say(f"usage: {_USAGE[name]}.")
        return 0 if any(a in ("-h", "--help") for a in args) else 2
    try:
        if name == "plot":
            for arg in args:
                for path in _redraw(Path(arg)):
                    print(f"attnflow: wrote {path}", flush=True)
        else:
            from ._report import report

            for path in report(Path(args[0])):
                print(f"attnflow: wrote {path}", flush=True)
    except ConfigError as error:
        _say(f"error: {error}")
        return 2
    except KeyboardInterrupt:
        _interrupted()
    return 0


def _redraw(path: Path) -> list[Path]:
    from ._errors import ConfigError
    from ._store import load_results, stored_config

    results = path / "results.nc" if path.is_dir() else path
    if not results.is_file():
        raise ConfigError(f"{path} holds no results.nc; give a run directory or a results file.")
    stored_config(results)  # one sentence for a file that is not attnflow's
    ds = load_results(results)
    if ds.attrs.get("experiment"):
        from .experiments import draw_experiment

        return draw_experiment(ds, results.parent)
    from ._plots import plot_summary

    return [plot_summary(ds, results.parent / "summary.png")]


def main() -> None:
    """The console entry point."""
    if len(sys.argv) > 1 and sys.argv[1] in _USAGE:
        signal.signal(signal.SIGTERM, _terminate)
        sys.exit(_command(sys.argv[1], sys.argv[2:]))
    import hydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from ._config import register_schema

    # Let Hydra's own errors reach this function (instead of its multi-line printer).
    os.environ["HYDRA_FULL_ERROR"] = "1"
    signal.signal(signal.SIGTERM, _terminate)
    register_schema()
    entry = hydra.main(version_base=None, config_path=config_source()[0], config_name="config")(_job)
    try:
        entry()
    except KeyboardInterrupt:
        _interrupted()
    except (HydraException, OmegaConfBaseException, OSError) as error:
        _say(f"error: {_sentence(error)}")
        sys.exit(2)
    if _FAILED:
        if len(_JOBS) > 1:
            names = "; ".join(label for label, _ in _FAILED)
            _say(f"error: {len(_FAILED)} of {len(_JOBS)} jobs failed: {names}.")
        sys.exit(2)


if __name__ == "__main__":
    main()
