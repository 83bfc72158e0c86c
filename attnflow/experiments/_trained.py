"""The `attnflow train` runs that experiments diffeqformer and adaptive_depth read: a
finished run read, a missing or unfinished one trained (or resumed) first; a run's
metrics and record; and the `attnflow train` settings an experiment takes as an option."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ..diffeqformer._settings import corpus_name, read_json, read_state, train_config
from ..schema._errors import ConfigError
from ._lazy import lazy

if TYPE_CHECKING:
    from ..diffeqformer import _train
else:
    _train = lazy("attnflow.diffeqformer._train")

REFUSED = ("model", "out", "init", "lora_rank")  # settings the experiment chooses itself


def _stored_config(folder: Path) -> tuple[dict | None, int]:
    """The settings and step of the latest state of the run in `folder` (None, -1 when
    it holds none)."""
    state = read_state(folder / "state")
    return (None, -1) if state is None else (state["config"], state["step"])


def finished(folder: str | Path) -> bool:
    """Whether `folder` holds a finished training run: its latest state at its last
    step and its final model written."""
    stored, step = _stored_config(Path(folder))
    return stored is not None and step >= int(stored.get("train_steps", math.inf)) and (Path(folder) / "model").is_dir()


def trained_run(folder: str | Path, model: str, overrides: Mapping | None = None, **settings) -> Path:
    """The finished training run of `model` in `folder`: read when it is there,
    trained (or resumed) there first otherwise, by `attnflow.diffeqformer.train` with
    the defaults of conf/train.yaml, `overrides` and `settings` on top. A finished run
    whose settings disagree with a given one is refused (one sentence)."""
    folder = Path(folder)
    given = {**dict(overrides or {}), **settings, "model": model}
    if finished(folder):
        stored, _ = _stored_config(folder)
        assert stored is not None  # finished: its config is there
        typed = train_config(given)  # the given settings, typed and checked
        for key in given:
            want = getattr(typed, key)
            have = stored.get(key, want)
            if key == "corpus":
                want, have = corpus_name(want), corpus_name(have)
            if have != want:
                raise ConfigError(
                    f"{folder} holds a finished {stored.get('model')} run with {key}={have!r}, not "
                    f"{want!r}; give another out= or the run's own settings."
                )
        return folder
    print(f"attnflow: training the {model} run in {folder} (it is missing or unfinished).", flush=True)
    _train.train(train_config({**given, "out": str(folder)}))
    return folder


def read_metrics(folder: str | Path) -> list[dict]:
    """The lines of a run's `metrics.jsonl` (a line cut by an interruption is skipped)."""
    lines = []
    for line in (Path(folder) / "metrics.jsonl").read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return lines


def run_record(folder: str | Path) -> dict:
    """A run's `train.json` (its settings, model sizes and corpus record)."""
    return read_json(Path(folder) / "train.json")


def check_train_overrides(name: str, overrides, option: str = "train") -> dict:
    """`experiment.options.<option>`: a mapping of `attnflow train` settings, checked
    by `train_config`; the settings the experiment chooses itself are refused."""
    if not isinstance(overrides, Mapping):
        raise ConfigError(
            f"experiment.options.{option} must be a mapping of attnflow train settings (e.g. "
            f"{{lr: 0.001}}), got {overrides!r}."
        )
    chosen = sorted(set(overrides) & set(REFUSED))
    if chosen:
        raise ConfigError(f"experiment {name} sets {chosen[0]} itself; leave it out of experiment.options.{option}.")
    try:
        train_config(dict(overrides))  # unknown settings and bad values stop here
    except ConfigError as error:
        raise ConfigError(f"experiment.options.{option}: {error}") from None
    return dict(overrides)
