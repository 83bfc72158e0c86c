"""Plan, solve, analyse and draw an experiment: its panels are core studies (validated
and planned before anything is computed), solved in pieces that a rerun resumes from,
then handed to the experiment's own `analyse` and `draw`."""

from __future__ import annotations

import dataclasses
import importlib
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import yaml
from hydra import compose as hydra_compose
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from .._build import Study, resolve_study
from .._cf import describe, history_line, python_call
from .._components import code_digest
from .._config import (
    Config,
    _plain,
    compose,
    config_source,
    hydra_context,
    register_schema,
    to_container,
)
from .._ensemble import EnsemblePlan
from .._errors import ConfigError, NonFiniteStateError, RunNote, SolverFailure
from .._figures import save, style
from .._schema import typed
from .._store import PieceStore
from .._study import config_yaml, plan_study, prepare_jax, run_identity, solve_study
from ._animate import check_plotly_js
from ._experiment import Experiment, NoOptions, uncounted


def _shipped() -> tuple[str, ...]:
    """The experiments attnflow ships: the names of its `conf/experiment/*.yaml` (the one
    list of them; each names its module `attnflow.experiments.NAME`, or another with
    `experiment._target_`)."""
    folder = config_source()[1].joinpath("experiment")
    return tuple(sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml")))


EXPERIMENTS = _shipped()
# The module of an experiment whose name is also a package of attnflow's.
_MODULES = {"diffeqformer": "diffeqformer_vs_gpt"}

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def experiment_module(name: str) -> ModuleType:
    """The module of the shipped experiment `name`."""
    if name not in EXPERIMENTS:
        raise ConfigError(f"unknown experiment {name!r}; choose one of {', '.join(EXPERIMENTS)}.")
    return importlib.import_module(f"{__package__}.{_MODULES.get(name, name)}")


def experiment_class(name: str, target: str | None = None) -> type[Experiment]:
    """The `Experiment` subclass of experiment `name`: the class `target` names (a config's
    `experiment._target_`, `module.Class`: a researcher's own, from their config folder),
    or the one the module of the shipped experiment `name` defines."""
    if target is not None:
        from .._plugins import import_target  # lazy: only a config that names code of its own

        found = import_target(target, "experiment._target_")
        if not (isinstance(found, type) and issubclass(found, Experiment)):
            raise ConfigError(f"experiment._target_={target} is not a subclass of attnflow.experiments.Experiment.")
        return found
    module = experiment_module(name)
    defined = [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, Experiment)
        and value.__module__ == module.__name__
        and not getattr(value, "__abstractmethods__", None)
    ]
    if len(defined) != 1:
        raise ConfigError(
            f"the module {module.__name__} defines {len(defined)} experiment classes; it must define "
            "exactly one subclass of attnflow.experiments.Experiment."
        )
    return defined[0]


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
    """An experiment ready to solve: its config (every option filled in), the
    experiment (an instance of its `Experiment` class, holding the typed options), and
    one validated, planned study per panel."""

    cfg: Config
    options: dict
    experiment: Experiment
    studies: dict[str, tuple[Study, EnsemblePlan]]  # by panel: the resolved study and its plan

    @property
    def name(self) -> str:
        assert self.cfg.experiment is not None  # set by check_experiment
        return self.cfg.experiment.name

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
# label has an `=` or is `main`).
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


def check_experiment(cfg: Config) -> tuple[Config, Experiment, dict[str, Study]]:
    """Check an experiment config before anything is planned or computed: its options
    typed by the experiment's `Options` (`_options`), its `check`, a panel key that
    repeats a value, and every panel's study resolved (`resolve_study`: pure checks, no
    program traced). Returns the config with every option filled in, the experiment
    (an instance of its class) and the resolved study of each panel; raises
    `ConfigError` (naming the panel where there are several)."""
    if cfg.experiment is None:
        raise ConfigError("this config names no experiment; set experiment=NAME.")
    kind = experiment_class(cfg.experiment.name, cfg.experiment._target_)
    options = _options(kind, cfg.experiment.name, cfg.experiment.options)
    cfg = dataclasses.replace(cfg, experiment=dataclasses.replace(cfg.experiment, options=options))
    assert cfg.experiment is not None  # replaced just above
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
            studies[label] = resolve_study(config)
        except ConfigError as error:
            if len(configs) == 1:
                raise
            raise ConfigError(f"panel {label} of experiment {cfg.experiment.name}: {error}") from None
    return cfg, experiment, studies


def plan_experiment(cfg: Config) -> ExperimentPlan:
    """Check every panel of an experiment config (`check_experiment`) and plan its
    studies; raises `ConfigError` (naming the panel) before anything is computed."""
    cfg, experiment, studies = check_experiment(cfg)
    assert cfg.experiment is not None  # check_experiment refuses a config without one
    planned = {}
    for label, study in studies.items():
        try:
            planned[label] = (study, plan_study(study))
        except ConfigError as error:
            if len(studies) == 1:
                raise
            raise ConfigError(f"panel {label} of experiment {cfg.experiment.name}: {error}") from None
    return ExperimentPlan(cfg, cfg.experiment.options, experiment, planned)


def solve_experiment(
    plan: ExperimentPlan,
    *,
    pieces: str | os.PathLike | None = None,
    on_piece: Callable[[], None] | None = None,
    on_resume: Callable[[str, int, int], None] | None = None,
    on_damaged: Callable[[Path], None] | None = None,
    history: str | None = None,
):
    """Solve every panel (keeping finished pieces under `pieces/<panel>` when given),
    then analyse: returns the experiment's xarray Dataset with its config, its panels'
    configs and the experiment's name in the attributes, every variable described as
    the CF conventions ask (`attnflow._cf.describe`; `history` is the command that ran
    it). The callbacks are `solve_study`'s (`on_resume` is also told the panel).

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
    ds = experiment.analyse(results, on_piece=on_piece or uncounted, keep=keep)
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
    assert plan.cfg.experiment is not None  # a plan's config has its experiment block
    if plan.cfg.experiment._target_ is not None:
        ds.attrs["experiment_target"] = plan.cfg.experiment._target_
    digest = code_digest(plan.cfg)
    if digest:
        ds.attrs["code_digest"] = digest
    return describe(
        ds,
        title=f"attnflow experiment {plan.name}: {experiment.title}",
        config=yaml.safe_load(config),
        history=history_line(history or "attnflow.solve_experiment(...)"),
        references=experiment.paper,
        coordinates=dict(experiment.coordinates) or None,
    )


def _drawing_class(ds) -> type[Experiment]:
    """The class that draws an experiment's Dataset: a shipped experiment's, by its name.
    A Dataset of a researcher's own experiment names its class (`experiment_target`),
    which is never imported because a file names it: `attnflow plot DIR --config-dir CFG`
    names it from the user's own config folder."""
    name = ds.attrs.get("experiment")
    if not name:
        raise ConfigError("this results file was not written by an experiment (it names none).")
    target = ds.attrs.get("experiment_target")
    if target is not None:
        raise ConfigError(
            f"this results file was written by the experiment {name} of your own code ({target}), "
            "which attnflow imports only from a config folder you give: add --config-dir with the "
            "folder of its experiment/NAME.yaml."
        )
    return experiment_class(name)


def experiment_figures(ds) -> dict[str, Figure]:
    """The figures of an experiment's Dataset (as read from its `results.nc`), by name:
    `matplotlib.figure.Figure` objects outside pyplot, drawn in attnflow's style
    without changing the backend or the rcParams. `draw_experiment` saves them."""
    with style():
        return dict(_drawing_class(ds).draw(ds))


def draw_experiment(
    ds, folder: str | os.PathLike, *, plotly_js: str = "embed", experiment: type[Experiment] | None = None
) -> list[Path]:
    """Draw the figures of an experiment's Dataset (as read from its `results.nc`)
    into `folder`, each as NAME.png and NAME.pdf, with the experiment's other files
    (animations, interactive HTML views, tables); returns their paths. `plotly_js`:
    where the HTML views find plotly.js, `"embed"` (inside each page) or `"directory"`
    (one plotly.min.js beside them). `experiment`: the class that draws it (by default
    the shipped experiment the Dataset names)."""
    check_plotly_js(plotly_js)  # before anything is drawn
    kind = experiment or _drawing_class(ds)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with style():
        paths = [path for name, fig in kind.draw(ds).items() for path in save(fig, folder, name)]
    return paths + list(kind.write_files(ds, folder, plotly_js=plotly_js))


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


def run_experiment(name: str, overrides: Mapping | None = None, *, pieces: str | os.PathLike | None = None):
    """Run experiment `name` (as `attnflow experiment=NAME` with `overrides`) and return
    its Dataset; `draw_experiment(ds, folder)` draws its figures.

    `pieces` keeps finished pieces in a folder, as in `run`."""
    ds = solve_experiment(
        plan_experiment(compose_experiment(name, overrides)),
        pieces=pieces,
        history=python_call("attnflow.run_experiment", {"name": name, **dict(overrides or {})}),
    )
    for note in filter(None, str(ds.attrs.get("notes", "")).splitlines()):
        warnings.warn(note, RunNote, stacklevel=2)
    return ds
