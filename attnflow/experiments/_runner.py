"""Plan, solve and analyse a run: an experiment, or a plain study (`PlainStudy`, the
experiment of one panel that a config without an experiment describes), through one
pipeline. Its panels are core studies (validated and planned before anything is
computed), solved in pieces that a rerun resumes from, then handed to the experiment's
own `analyse` (`conclude`); `_registry` draws the results. `run(config)` is the public
`attnflow.run`: the command line without Hydra, for either kind."""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple, cast

import numpy as np
import yaml
from hydra import compose as hydra_compose
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from ..running._build import Study, resolve_study
from ..running._components import code_digest
from ..running._ensemble import EnsemblePlan
from ..running._study import config_yaml, plan_study, prepare_jax, run_identity, solve_study
from ..schema._config import (
    Config,
    _plain,
    compose,
    hydra_context,
    register_schema,
    to_container,
)
from ..schema._errors import ConfigError, NonFiniteStateError, RunNote, SolverFailure
from ..schema._schema import typed
from ..storage._cf import describe, history_line, python_call
from ..storage._store import PieceStore
from ._experiment import Experiment, NoOptions, uncounted
from ._plain_study import PlainStudy
from ._registry import EXPERIMENTS, experiment_class


def option_schema(experiment: type | ModuleType) -> type:
    """The dataclass of an experiment's options (its `Options`)."""
    return getattr(experiment, "Options", NoOptions)


def default_options(experiment: type | ModuleType) -> dict:
    """An experiment's options at their defaults, as plain containers."""
    return to_container(typed(option_schema(experiment), {}, "experiment.options."))


def _options(experiment: type | ModuleType, name: str, given: Any) -> dict:
    """The experiment's options: its `Options` schema's defaults with `given` on top,
    typed by the schema (`_schema.typed`), as plain containers. An unknown name is
    refused with the nearest one; a wrong type, a name outside a choice, a NaN or
    infinite number and a list that holds an entry twice in one sentence (a field's
    `metadata` may allow infinity or repeats); ranges and combinations are checked by
    the experiment's `check`."""
    given = _plain(given) if given is not None else {}
    if not isinstance(given, Mapping):
        raise ConfigError(f"experiment.options must be a mapping of option names to values, got {given!r}.")
    options = typed(option_schema(experiment), given, "experiment.options.", owner=f"experiment {name}")
    return to_container(options)


def _instance(schema: type, options: Mapping) -> Any:
    """The typed options (plain containers) as an instance of their dataclass, nested
    dataclasses included."""
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), dict(options)))


def experiment_options(name: str, given: Mapping | None = None) -> dict:
    """The options experiment `name` runs with: its defaults with `given` on top, typed
    by its `Options` schema, as `attnflow experiment=NAME experiment.options.KEY=VALUE`
    would take them.

    An unknown option is refused with the nearest name, a wrong type or a value outside
    a choice in one sentence (a `ConfigError`); the ranges and combinations of values
    are checked when the experiment is composed (`compose_experiment`).

    **Arguments:**

    - `name`: an experiment of `EXPERIMENTS`.
    - `given`: option names to values (`{"steps": [9, 12]}`); None for the defaults.

    **Returns:** the options by name.
    """
    return _options(experiment_class(name), name, given)


@dataclasses.dataclass
class ExperimentPlan:
    """A run ready to solve, an experiment's or a plain study's: the config its results
    store (an experiment's with every option filled in, a study's resolved), the
    experiment (an instance of its `Experiment` class, holding the typed options; a
    study's is `PlainStudy`), and one validated, planned study per panel."""

    cfg: Config
    experiment: Experiment
    studies: dict[str, tuple[Study, EnsemblePlan]]  # by panel: the resolved study and its plan

    @property
    def name(self) -> str:
        """The experiment's name (`attnflow` for a plain study)."""
        return self.experiment.name

    @property
    def keeps_pieces_on_failure(self) -> bool:
        """Whether a run stopped by a non-finite state or a solver failure keeps its
        finished pieces (`Experiment.keeps_pieces_on_failure`)."""
        return self.experiment.keeps_pieces_on_failure

    @property
    def pieces(self) -> int:
        """Units of progress: the studies' pieces, and the experiment's own (its `pieces()`)."""
        return sum(plan.pieces for _, plan in self.studies.values()) + self.experiment.pieces()

    def piece_configs(self) -> dict[str, str]:
        """The config (YAML) of each pieces folder of the run, by its label under the
        run's pieces folder: one per panel, and `OWN_PIECES` for the experiment's own
        computation (`OwnPieces`) where it counts one."""
        configs = {label: run_identity(study.config) for label, (study, _) in self.studies.items()}
        if self.experiment.pieces():
            configs[OWN_PIECES] = run_identity(self.cfg)
        return configs


# The pieces folder of an experiment's own computation, beside its panels' (a panel's
# label has an `=`, is `main`, or is `.` for the plain study's one panel).
OWN_PIECES = "analysis"


class OwnPieces:
    """The finished parts of an experiment's own computation (what its `analyse`
    computes beyond the panels' studies: a PDE, one particle system per n), kept as
    pieces of the run, so that a run interrupted or stopped by a failure resumes from
    them as a study resumes from its pieces.

    `keep(compute)` returns the arrays (a mapping of names to NumPy arrays) that
    `compute()` returns: read from the next finished piece of a previous run of the same
    config, or computed and kept. The parts are numbered in the order they are asked
    for, which an experiment keeps the same for a given config. Without a folder every
    part is computed."""

    def __init__(self, folder: Path | None, config: str, *, on_resume=None, on_damaged=None):
        self.store = None if folder is None else PieceStore(folder, f"{config}\npieces: {OWN_PIECES}\n")
        self.on_damaged = on_damaged
        self.index = 0
        found = 0 if self.store is None else self.store.count()
        if found and on_resume is not None:
            on_resume(found)

    def __call__(self, compute: Callable[[], Mapping[str, Any]]) -> dict[str, np.ndarray]:
        index, self.index = self.index, self.index + 1
        if self.store is not None:
            damaged = len(self.store.damaged)
            kept = self.store.load(index)
            for path in self.store.damaged[damaged:]:
                if self.on_damaged is not None:
                    self.on_damaged(path)
            if kept is not None:
                return kept
        out = {name: np.asarray(value) for name, value in compute().items()}
        if self.store is not None:
            self.store.save(index, out)
        return out


class Checked(NamedTuple):
    """A run's config checked (`check_experiment`), before anything is planned: the
    config its results store, the experiment and the resolved study of each panel."""

    cfg: Config
    experiment: Experiment
    studies: dict[str, Study]


def check_experiment(cfg: Config) -> Checked:
    """Check a run's config before anything is planned or computed: the experiment it
    names (its options typed by the experiment's `Options`, `_options`; its `check`; a
    panel key that repeats a value) or, where it names none, the plain study
    (`PlainStudy`), and every panel's study resolved (`resolve_study`: pure checks, no
    program traced). Returns the config its results store (an experiment's with every
    option filled in, a study's resolved), the experiment (an instance of its class)
    and the resolved study of each panel; raises `ConfigError` (naming the panel where
    there are several)."""
    resolved = None
    if cfg.experiment is None:
        # `experiment: null`, the plain study: no options, and its config as the study
        # resolves it (what its results store; its one panel, resolved once).
        resolved = resolve_study(cfg)
        kind, options, cfg = PlainStudy, {}, resolved.config
    else:
        kind = experiment_class(cfg.experiment.name, cfg.experiment._target_)
        options = _options(kind, cfg.experiment.name, cfg.experiment.options)
        cfg = dataclasses.replace(cfg, experiment=dataclasses.replace(cfg.experiment, options=options))
    prepare_jax(cfg)  # float64 and the compilation cache, before `check` may compute anything
    experiment = kind(cfg, _instance(option_schema(kind), options))
    experiment.check()
    base = to_container(cfg)
    base.pop("experiment")
    for key in kind.panel_keys:
        values = base.get(key) if isinstance(base.get(key), list) else []
        # Panels are labelled by their value: a repeated one would be one panel reported twice.
        twice = next((value for i, value in enumerate(values) if value in values[:i]), None)
        if twice is not None:
            raise ConfigError(f"{key} holds {twice!r} twice; give each value once (each is a panel).")
    configs = experiment.panels(base)
    studies = {}
    for label, config in configs.items():
        try:
            same = resolved is not None and config is resolved.config
            studies[label] = resolved if same else resolve_study(config)
        except ConfigError as error:
            if len(configs) == 1:
                raise
            raise ConfigError(f"panel {label} of experiment {experiment.name}: {error}") from None
    return Checked(cfg, experiment, studies)


def plan_checked(checked: Checked) -> ExperimentPlan:
    """Plan the studies of a checked run (`check_experiment`); raises `ConfigError`
    (naming the panel where there are several) for one that does not fit in memory,
    before anything is computed."""
    cfg, experiment, studies = checked
    planned = {}
    for label, study in studies.items():
        try:
            planned[label] = (study, plan_study(study))
        except ConfigError as error:
            if len(studies) == 1:
                raise
            raise ConfigError(f"panel {label} of experiment {experiment.name}: {error}") from None
    return ExperimentPlan(cfg, experiment, planned)


def plan_experiment(cfg: Config) -> ExperimentPlan:
    """Check a run's config (`check_experiment`: an experiment's every panel, or a plain
    study's one) and plan its studies (`plan_checked`); raises `ConfigError` (naming the
    panel) before anything is computed."""
    return plan_checked(check_experiment(cfg))


def solve_experiment(
    plan: ExperimentPlan,
    *,
    pieces: str | os.PathLike | None = None,
    on_piece: Callable[[], None] | None = None,
    on_resume: Callable[[str, int, int], None] | None = None,
    on_damaged: Callable[[Path], None] | None = None,
    history: str | None = None,
):
    """Solve every panel (keeping finished pieces under `pieces/<panel>` when given; a
    plain study's one panel, `.`, in `pieces` itself), then conclude
    (`Experiment.conclude`): returns the run's xarray Dataset. An experiment's holds its
    config, its panels' configs and the experiment's name in the attributes, every
    variable described as the CF conventions ask (`attnflow.storage._cf.describe`); a study's is
    its results as `solve_study` makes them. `history` is the command that ran it. The
    callbacks are `solve_study`'s (`on_resume` is also told the panel).

    A failed solve raises as `run` does, its message naming the panel and its
    `error.results` holding that panel's statistics."""
    results = {}
    for label, (study, ensemble) in plan.studies.items():
        folder = None if pieces is None else Path(pieces) / label
        resume = None if on_resume is None else (lambda found, total, label=label: on_resume(label, found, total))
        try:
            results[label] = solve_study(
                study, ensemble, pieces=folder, on_resume=resume, on_piece=on_piece, on_damaged=on_damaged
            ).to_xarray()
        except (NonFiniteStateError, SolverFailure) as error:
            if len(plan.studies) > 1:
                error.args = (f"panel {label}: {error}",)
            raise
    experiment = plan.experiment
    # The experiment's own work is counted as it goes (`on_piece`), and each finished
    # part kept (`OwnPieces`) beside the panels' pieces.
    keep = OwnPieces(
        None if pieces is None or not experiment.pieces() else Path(pieces) / OWN_PIECES,
        run_identity(plan.cfg),
        on_resume=None if on_resume is None else lambda found: on_resume(OWN_PIECES, found, experiment.pieces()),
        on_damaged=on_damaged,
    )
    line = history_line(history or "attnflow.solve_experiment(...)")
    ds = experiment.conclude(
        results, on_piece=on_piece or uncounted, keep=keep, describe=lambda ds: _described(ds, plan, results, line)
    )
    ds.attrs["history"] = line
    return ds


def _described(ds, plan: ExperimentPlan, results: Mapping[str, Any], history: str):
    """An experiment's Dataset (`analyse`) with what the runner knows of it: the panels'
    notes, its config, its name, the panels' configs, the class of a researcher's own
    experiment, the digest of their code and the CF attributes."""
    experiment = plan.experiment
    config = config_yaml(plan.cfg)
    # What the panels' runs note (a switch that never happens, a missed Sinkhorn
    # tolerance), each once, naming its panel where there are several.
    notes = [
        f"panel {label}: {note}" if len(results) > 1 else note
        for label, panel in results.items()
        for note in str(panel.attrs.get("notes", "")).splitlines()
        if note
    ]
    notes = list(dict.fromkeys([*notes, *filter(None, str(ds.attrs.get("notes", "")).splitlines())]))
    if notes:
        ds.attrs["notes"] = "\n".join(notes)
    ds.attrs.update(
        config=config,
        experiment=plan.name,
        panel_configs=yaml.safe_dump(
            {label: yaml.safe_load(config_yaml(study.config)) for label, (study, _) in plan.studies.items()},
            sort_keys=False,
        ),
    )
    # The CF attributes (long names, units, the settings, what wrote the file): the
    # command line replaces `history` with its own command.
    assert plan.cfg.experiment is not None  # an experiment's config has its experiment block
    if plan.cfg.experiment._target_ is not None:
        ds.attrs["experiment_target"] = plan.cfg.experiment._target_
    digest = code_digest(plan.cfg)
    if digest:
        ds.attrs["code_digest"] = digest
    return describe(
        ds,
        title=f"attnflow experiment {plan.name}: {experiment.title}",
        config=yaml.safe_load(config),
        history=history,
        references=experiment.paper,
        coordinates=dict(experiment.coordinates) or None,
    )


def merge_overrides(base: dict, over: Mapping) -> dict:
    """`over` merged into the config mapping `base`, key by key; a new initial-condition
    kind replaces `init` whole (none of the old kind's keys apply to it)."""
    merged = dict(base)
    for key, value in over.items():
        if key == "init" and isinstance(value, str):
            value = {"kind": value}
        if (
            key == "init"
            and isinstance(value, Mapping)
            and value.get("kind", base["init"]["kind"]) != base["init"]["kind"]
        ):
            merged[key] = dict(value)  # another initial condition: none of the old one's keys apply
        elif isinstance(value, Mapping) and isinstance(base.get(key), Mapping):
            merged[key] = merge_overrides(base[key], value)
        else:
            merged[key] = value
    return merged


def compose_experiment(name: str, overrides: Mapping | None = None) -> Config:
    """The config of `attnflow experiment=NAME` with `overrides` (a nested mapping, as
    in `run`) on top, checked against the schema."""
    if name not in EXPERIMENTS:
        raise ConfigError(f"unknown experiment {name!r}; choose one of {', '.join(EXPERIMENTS)}.")
    register_schema()
    GlobalHydra.instance().clear()
    with hydra_context():
        composed = hydra_compose("config", overrides=[f"experiment={name}"])
    # The composed config is a mapping.
    container = cast(dict, OmegaConf.to_container(composed, resolve=True, enum_to_str=True))
    container.pop("hydra", None)
    user = _plain(overrides or {})
    if not isinstance(user, Mapping):
        raise ConfigError(f"overrides must be a mapping of keys to values, got {type(overrides).__name__}.")
    return compose(merge_overrides(container, user))


def run(config: Mapping | Config | None = None, *, pieces: str | os.PathLike | None = None):
    """Run what a config describes, as the command line does, and return its results as
    an xarray Dataset: a study, or the experiment it names.

    `config` is a mapping with any of the keys of `conf/config.yaml` (missing keys
    take their defaults), checked as the command line checks it. A config that names a
    shipped experiment (`{"experiment": "circle", ...}`, or `{"experiment": {"name":
    "circle", "options": {...}}, ...}`) takes its missing keys from that experiment's
    config, as `attnflow experiment=circle ...` does, and returns the experiment's
    Dataset (as `run_experiment`); a researcher's own experiment is named by its class
    (`"experiment": {"name": NAME, "_target_": "module.Class"}`), its keys over the
    defaults. A stored config (`yaml.safe_load(ds.attrs["config"])`) runs again.

    A study's Dataset has dimensions `member` and `time` (and `beta` when beta is a
    list), one variable per metric, the states `x` when `save_states`, `num_steps`, the
    per-solve `status` (0 ok, 1 non-finite, 2 solver stopped) and `failure_time`, and
    the resolved config as YAML in `attrs["config"]`.

    The solves run in pieces of equal size. With `pieces` (a folder), each finished
    piece is kept there (an experiment's in a folder per panel), and a run interrupted
    or killed before the end resumes from the finished ones when it is started again
    with the same config and folder; the pieces of another config there are refused (a
    `ConfigError` naming the settings that differ) unless the config says
    `overwrite: true`. Ctrl-C stops a run at once.

    `dtype: float64` switches on `jax_enable_x64` for the process (JAX's float64 is a
    global setting); float32 runs stay float32 either way.

    Raises `ConfigError` for an impossible config (or one that does not fit in
    memory), `StorageError` when a piece cannot be written (a full disk),
    `NonFiniteStateError` when a state becomes NaN or infinite,
    `SolverFailure` when a solve stops early; the last two carry the computed Dataset
    (an experiment's: the failed panel's) as `error.dataset`, its statistics missing
    (NaN) from each failed solve's first bad output time on.
    """
    return _run(_composed(config), pieces, python_call("attnflow.run", config))


def _composed(config: Mapping | Config | None) -> Config:
    """The config `run` runs: a mapping that names a shipped experiment over that
    experiment's config (`compose_experiment`, which refuses an unknown name given as
    `experiment: NAME`), anything else over the defaults (`compose`)."""
    if isinstance(config, Mapping):
        block = config.get("experiment")
        if isinstance(block, str):
            block = {"name": block}
        name = block.get("name") if isinstance(block, Mapping) else None
        if isinstance(config.get("experiment"), str) or name in EXPERIMENTS:
            return compose_experiment(str(name), {**config, "experiment": block})
    return compose(config)


def run_experiment(name: str, overrides: Mapping | None = None, *, pieces: str | os.PathLike | None = None):
    """Run experiment `name` (as `attnflow experiment=NAME` with `overrides`) and return
    its Dataset; `draw_experiment(ds, folder)` draws its figures.

    `pieces` keeps finished pieces in a folder, as in `run`."""
    return _run(
        compose_experiment(name, overrides),
        pieces,
        python_call("attnflow.run_experiment", {"name": name, **dict(overrides or {})}),
    )


def _run(cfg: Config, pieces: str | os.PathLike | None, command: str):
    """Plan, solve and return the Dataset of `run` and `run_experiment` (`command`: the
    call, for `history`); the notes of the run are warned (`RunNote`) at the caller's
    call."""
    plan = plan_experiment(cfg)
    try:
        ds = solve_experiment(plan, pieces=pieces, history=command)
    except (NonFiniteStateError, SolverFailure) as error:
        results = getattr(error, "results", None)
        if results is not None:  # a panel's statistics (an experiment's own computation has none)
            results.attrs["history"] = history_line(command)
            error.dataset = results.to_xarray()
        raise
    for note in filter(None, str(ds.attrs.get("notes", "")).splitlines()):
        warnings.warn(note, RunNote, stacklevel=3)
    return ds
