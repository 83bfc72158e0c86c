"""The command `attnflow train [KEY=VALUE ...]`, without JAX: its settings composed and
checked (`_settings`), Hydra's flags it answers (`--cfg job`, `-m`), the jobs of a sweep,
and its messages and exit codes. The training (`_train`: JAX, equinox, optax) is imported
once a run starts, so that a mistyped or unknown setting is refused before JAX loads.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from omegaconf import DictConfig, OmegaConf

from ..schema._errors import CheckpointError, ConfigError, NonFiniteStateError
from ._settings import TrainConfig, _command_line, _defaults_file, _overrides, _typed, train_config

# At most this many jobs in one sweep (`-m`): each is a training run.
MOST_JOBS = 10_000

USAGE = (
    "attnflow train [KEY=VALUE ...]: train a DiffEqFormer (model=diffeqformer) or its GPT baseline "
    "(model=gpt); defaults in conf/train.yaml; `attnflow train out=DIR` resumes an interrupted run; "
    "`attnflow train -m KEY=A,B ...` trains one run per combination, job N in out/N; "
    "`attnflow train --cfg job [KEY=VALUE ...]` prints the composed settings"
)


def _hydra_flags(args: list[str]) -> tuple[list[str], str | None, bool]:
    """The settings without Hydra's flags that attnflow train answers: `--cfg`/`-c`
    (and `--resolve`, which changes nothing here: the settings hold no interpolations
    once composed), with the part of the config it asks for (`job` and `all` print the
    settings: attnflow train has no Hydra run folder of its own, it writes to `out`;
    `hydra` is refused in one sentence), and `-m`/`--multirun` (a sweep)."""
    rest, shown, multirun = [], None, False
    position = 0
    while position < len(args):
        arg = args[position]
        if arg in ("--cfg", "-c") or arg.startswith("--cfg="):
            value = arg.split("=", 1)[1] if "=" in arg else (args[position + 1] if position + 1 < len(args) else None)
            position += 1 if "=" in arg else 2
            if value not in ("job", "all", "hydra"):
                raise ConfigError(f"--cfg takes job, hydra or all, got {value!r}.")
            if value == "hydra":
                raise ConfigError(
                    "attnflow train has no Hydra settings of its own (it writes to out=DIR); "
                    "`attnflow train --cfg job` prints its settings."
                )
            shown = value
            continue
        if arg in ("-m", "--multirun"):
            multirun = True
        elif arg != "--resolve":
            rest.append(arg)
        position += 1
    return rest, shown, multirun


def _defaults_text() -> str:
    """The settings, their defaults and meanings, as YAML with comments."""
    values = cast(DictConfig, OmegaConf.load(_defaults_file()))  # conf/train.yaml is a mapping
    return "".join(
        f"{OmegaConf.to_yaml({field.name: values[field.name]}).strip()}  # {field.metadata['help']}\n"
        for field in dataclasses.fields(TrainConfig)
    )


def main(args: Sequence[str]) -> int:
    """`attnflow train [KEY=VALUE ...]` (`--cfg job` prints the composed settings and
    runs nothing; `-m` runs the jobs of a sweep, `_sweep`): 0 when done; 2 for bad
    settings, a run that does not fit in memory, a folder in use or that cannot be
    written, or a loss that turns NaN (one sentence each), and for a sweep in which a
    job failed; 1 for an unreadable init or state; 130 on Ctrl-C (the latest state
    kept)."""
    if any(a in ("-h", "--help") for a in args):
        print(f"usage: {USAGE}.\nsettings, their defaults and meanings:\n{_defaults_text()}", end="", flush=True)
        return 0
    try:
        args, shown, multirun = _hydra_flags(list(args))
        if multirun:
            return _sweep(args, shown)
        cfg = train_config(args)
        if shown is not None:
            # As every Hydra app answers `--cfg job`: the composed settings, nothing run.
            print(OmegaConf.to_yaml(OmegaConf.structured(cfg)), end="", flush=True)
            return 0
        _run(cfg)
    except CheckpointError as error:
        print(f"attnflow: error: {error}", file=sys.stderr, flush=True)
        return 1
    except (ConfigError, NonFiniteStateError) as error:
        print(f"attnflow: error: {error}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        sys.stdout.flush()
        sys.stderr.flush()
        # A compiled step may still be running in a worker thread; do not wait for it.
        os._exit(130)
    return 0


def _run(cfg: TrainConfig) -> None:
    """One training, as the command runs it: the training module (JAX) is imported
    here, once a run starts."""
    from . import _train  # lazy: start-up (JAX, equinox, optax)

    _train.train_command(cfg)


def _jobs(args: Sequence[str]) -> tuple[str | None, list[tuple[list[str], str]]]:
    """The sweep `attnflow train -m ARGS`: its folder (`out`, None when not given; it
    cannot be swept), and its jobs in the order Hydra's basic sweeper runs them (the
    product of the swept values: `KEY=A,B`, `KEY=range(0,4)`, `KEY=choice(A,B)`), each
    with its settings and, as its label, the swept ones."""
    overrides = _overrides(args, sweep=True)
    swept = [override for override in overrides if override.is_sweep_override()]
    folder = next((override.value() for override in overrides if override.key_or_group == "out"), None)
    jobs = 1
    for override in swept:
        if override.key_or_group == "out":
            raise ConfigError(
                f"out names the sweep's folder (job N trains in out/N); give it one value, not a sweep "
                f"({override.input_line})."
            )
        if not override.is_discrete_sweep():
            raise ConfigError(
                f"attnflow train -m sweeps lists, ranges and choices, not {override.input_line}; "
                "give the values, e.g. lr=1e-3,3e-3."
            )
        jobs *= sum(1 for _ in itertools.islice(override.sweep_string_iterator(), MOST_JOBS + 1))
    if jobs > MOST_JOBS:
        raise ConfigError(f"this sweep has more than {MOST_JOBS} jobs, each a training; split it.")
    keys = {override.get_key_element() for override in swept}
    listed = BasicSweeper.split_arguments(overrides, None)[0]
    return None if folder is None else str(folder), [
        (job, ", ".join(arg for arg in job if arg.split("=", 1)[0] in keys)) for job in listed
    ]


def _job_config(job: Sequence[str], sweep: str, number: int) -> TrainConfig:
    """The settings of job `number` of a sweep in the folder `sweep`: its own settings,
    trained in `sweep/number` (resumed there, or left as it is when finished)."""
    composed, given = _command_line(job)
    out = str(Path(sweep, str(number)))
    return _typed({**composed, "out": out}, {**given, "out": out})


def _sweep(args: Sequence[str], shown: str | None) -> int:
    """`attnflow train -m ...`: one training per job (`_jobs`), one after the other in
    this process, job N in `out/N` (`out=` the sweep's folder; by default
    runs/train/multirun/DATE/TIME, as Hydra names a study's sweep folder), each
    announced by a line naming its swept settings and its folder. Every job runs
    whatever the others do; a failed one is one line naming it, and the sweep then ends
    with a line naming the failed jobs and exit code 2. The same command with the same
    `out=` resumes an interrupted sweep: each job resumes in its folder, a finished one
    is left as it is. With `--cfg job` each job's settings are printed and nothing runs."""
    given, jobs = _jobs(args)
    sweep = given or str(Path("runs", "train", "multirun", datetime.datetime.now().strftime("%Y-%m-%d/%H-%M-%S")))
    failed = []
    for number, (job, swept) in enumerate(jobs):
        name = f"job {number}" + (f" ({swept})" if swept else "")
        try:
            cfg = _job_config(job, sweep, number)
            if shown is not None:
                print(f"# {name}\n{OmegaConf.to_yaml(OmegaConf.structured(cfg))}", end="", flush=True)
                continue
            print(f"attnflow: {name}: training in {cfg.folder}", flush=True)
            _run(cfg)
        except (CheckpointError, ConfigError, NonFiniteStateError) as error:
            failed.append(name)
            print(f"attnflow: error: {name}: {error}", file=sys.stderr, flush=True)
        except KeyboardInterrupt:
            again = "the same command" if given else f"the same command with out={sweep}"
            print(f"attnflow: {again} resumes the sweep, its finished jobs left as they are.", file=sys.stderr)
            raise
    if failed:
        print(f"attnflow: error: {len(failed)} of {len(jobs)} jobs failed: {'; '.join(failed)}.", file=sys.stderr)
        return 2
    return 0
