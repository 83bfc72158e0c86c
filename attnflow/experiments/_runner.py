"""Plan, solve, analyse and draw an experiment: its panels are core studies (validated
and planned before anything is computed), solved in pieces that a rerun resumes from,
then handed to the experiment's own `analyse` and `draw`."""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import itertools
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml
from hydra import compose as hydra_compose
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from .._build import Study, resolve_study
from .._config import Config, _plain, compose, hydra_context, register_schema, to_container, typed_options
from .._ensemble import EnsemblePlan
from .._errors import ConfigError, NonFiniteStateError, RunNote, SolverFailure
from .._cf import describe, history_line, python_call
from .._figures import save, style
from .._store import PieceStore
from .._study import config_yaml, plan_study, prepare_jax, solve_study
from ._animate import check_plotly_js

# Every experiment: conf/experiment/NAME.yaml and attnflow/experiments/NAME.py (or the
# module _MODULES names, where NAME is also a package of attnflow's).
EXPERIMENTS = (
    "single_cluster",
    "metastability",
    "phase_diagram",
    "phase_diagram_random",
    "circle",
    "random_qk",
    "bouncing",
    "token_detection",
    "causal",
    "polytope",
    "polynomial",
    "normalization",
    "flow_matching",
    "checkpoint",
    "lyapunov",
    "lyapunov_polynomial",
    "sensitivity",
    "diffeqformer",
    "adaptive_depth",
    "long_context",
    "noise_transition",
    "hardmax_sinkhorn",
    "meanfield_circle",
    "many_heads",
)
_MODULES = {"diffeqformer": "diffeqformer_vs_gpt"}

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def experiment_module(name: str) -> ModuleType:
    """The module of experiment `name` (its `analyse` and `draw`)."""
    if name not in EXPERIMENTS:
        raise ConfigError(f"unknown experiment {name!r}; choose one of {', '.join(EXPERIMENTS)}.")
    return importlib.import_module(f"{__package__}.{_MODULES.get(name, name)}")


@dataclasses.dataclass
class _NoOptions:
    """The options of an experiment that takes none."""


def option_schema(module: ModuleType) -> type:
    """The dataclass of an experiment's options (`Options` in its module)."""
    return getattr(module, "Options", _NoOptions)


def default_options(module: ModuleType) -> dict:
    """An experiment's options at their defaults, as plain containers."""
    return typed_options(option_schema(module), {}, "experiment.options.")


def _options(module: ModuleType, name: str, given: Any) -> dict:
    """The experiment's options: its `Options` schema's defaults with `given` on top,
    typed by the schema. An unknown name is refused with the nearest one; a wrong type,
    a name outside a choice, a NaN or infinite number and a list that holds an entry
    twice in one sentence (`typed_options`; a field's `metadata` may allow infinity or
    repeats); ranges and combinations are checked by the experiment's `check`."""
    schema = option_schema(module)
    names = [f.name for f in dataclasses.fields(schema)]
    given = _plain(given) if given is not None else {}
    if not isinstance(given, Mapping):
        raise ConfigError(f"experiment.options must be a mapping of option names to values, got {given!r}.")
    unknown = sorted(set(given) - set(names))
    if unknown:
        takes = ", ".join(names) if names else "no options"
        near = difflib.get_close_matches(str(unknown[0]), names, n=1)
        guess = f" (did you mean {near[0]}?)" if near else ""
        raise ConfigError(f"unknown option experiment.options.{unknown[0]} of experiment {name}{guess}; "
                          f"it takes {takes}.")
    return typed_options(schema, given, "experiment.options.")


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
    return _options(experiment_module(name), name, given)


def panel_configs(base: dict, keys: tuple[str, ...]) -> dict[str, dict]:
    """One config per combination of the list-valued `keys` of `base`, labelled
    `key=value,...`; `{"main": base}` when none of them is a list."""
    lists = [(key, base[key]) for key in keys if isinstance(base.get(key), list)]
    if not lists:
        return {"main": base}
    for key, values in lists:
        if not values:
            raise ConfigError(f"{key} is an empty list; give at least one value (one panel each).")
    panels = {}
    for combination in itertools.product(*(values for _, values in lists)):
        label = ",".join(f"{key}={value}" for (key, _), value in zip(lists, combination))
        panels[label] = {**base, **{key: value for (key, _), value in zip(lists, combination)}}
    return panels


@dataclasses.dataclass
class ExperimentPlan:
    """An experiment ready to solve: its config (every option filled in), its module,
    and one validated, planned study per panel."""

    cfg: Config
    options: dict
    module: ModuleType
    studies: dict[str, tuple[Study, EnsemblePlan]]  # by panel: the resolved study and its plan

    @property
    def name(self) -> str:
        return self.cfg.experiment.name

    @property
    def pieces(self) -> int:
        """Units of progress: the studies' pieces, and the experiment's own (its `pieces`)."""
        own = getattr(self.module, "pieces", None)
        return sum(plan.pieces for _, plan in self.studies.values()) + (own(self.cfg, self.options) if own else 0)

    def piece_configs(self) -> dict[str, str]:
        """The config (YAML) of each pieces folder of the run, by its label under the
        run's pieces folder: one per panel, and `OWN_PIECES` for the experiment's own
        computation (`OwnPieces`) where it counts one."""
        configs = {label: config_yaml(study.config) for label, (study, _) in self.studies.items()}
        if getattr(self.module, "pieces", None) is not None:
            configs[OWN_PIECES] = config_yaml(self.cfg)
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


def check_experiment(cfg: Config) -> tuple[Config, dict, dict[str, Study]]:
    """Check an experiment config before anything is planned or computed: its options
    typed by the module's `Options` (`_options`), the module's `check`, a panel key
    that repeats a value, and every panel's study resolved (`resolve_study`: pure
    checks, no program traced). Returns the config with every option filled in, the
    options, and the resolved study of each panel; raises `ConfigError` (naming the
    panel where there are several)."""
    if cfg.experiment is None:
        raise ConfigError("this config names no experiment; set experiment=NAME.")
    module = experiment_module(cfg.experiment.name)
    options = _options(module, cfg.experiment.name, cfg.experiment.options)
    cfg = dataclasses.replace(cfg, experiment=dataclasses.replace(cfg.experiment, options=options))
    prepare_jax(cfg)  # float64 and the compilation cache, before `check` may compute anything
    check = getattr(module, "check", None)
    if check is not None:
        check(cfg, options)
    base = to_container(cfg)
    base.pop("experiment")
    make = getattr(module, "panels", None)
    if make is None:
        keys = getattr(module, "PANEL_KEYS", ())
        for key in keys:
            values = base.get(key) if isinstance(base.get(key), list) else []
            # Panels are labelled by their value: a repeated one would be one panel reported twice.
            twice = next((value for i, value in enumerate(values) if value in values[:i]), None)
            if twice is not None:
                raise ConfigError(f"{key} holds {twice!r} twice; give each value once (each is a panel).")
        configs = panel_configs(base, keys)
    else:
        configs = make(base, options)
    studies = {}
    for label, config in configs.items():
        try:
            studies[label] = resolve_study(config)
        except ConfigError as error:
            if len(configs) == 1:
                raise
            raise ConfigError(f"panel {label} of experiment {cfg.experiment.name}: {error}") from None
    return cfg, options, studies


def plan_experiment(cfg: Config) -> ExperimentPlan:
    """Check every panel of an experiment config (`check_experiment`) and plan its
    studies; raises `ConfigError` (naming the panel) before anything is computed."""
    cfg, options, studies = check_experiment(cfg)
    planned = {}
    for label, study in studies.items():
        try:
            planned[label] = (study, plan_study(study))
        except ConfigError as error:
            if len(studies) == 1:
                raise
            raise ConfigError(f"panel {label} of experiment {cfg.experiment.name}: {error}") from None
    return ExperimentPlan(cfg, options, experiment_module(cfg.experiment.name), planned)


def solve_experiment(plan: ExperimentPlan, *, pieces: str | os.PathLike | None = None,
                     on_piece: Callable[[], None] | None = None,
                     on_resume: Callable[[str, int, int], None] | None = None,
                     on_damaged: Callable[[Path], None] | None = None, history: str | None = None):
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
            results[label] = solve_study(study, ensemble, pieces=folder, on_resume=resume, on_piece=on_piece,
                                         on_damaged=on_damaged).to_xarray()
        except (NonFiniteStateError, SolverFailure) as error:
            if len(plan.studies) > 1:
                error.args = (f"panel {label}: {error}",)
            raise
    if getattr(plan.module, "pieces", None) is not None:
        # An experiment that counts its own pieces reports them as it computes them, and
        # keeps each finished one (`OwnPieces`) beside the panels' pieces.
        keep = OwnPieces(None if pieces is None else Path(pieces) / OWN_PIECES, config_yaml(plan.cfg),
                         on_resume=None if on_resume is None else lambda found: on_resume(
                             OWN_PIECES, found, plan.module.pieces(plan.cfg, plan.options)),
                         on_damaged=on_damaged)
        ds = plan.module.analyse(plan.cfg, plan.options, results, on_piece=on_piece, keep=keep)
    else:
        ds = plan.module.analyse(plan.cfg, plan.options, results)
    config = config_yaml(plan.cfg)
    # What the panels' runs note (a switch that never happens, a missed Sinkhorn
    # tolerance), each once, naming its panel where there are several.
    notes = [f"panel {label}: {note}" if len(results) > 1 else note for label, panel in results.items()
             for note in str(panel.attrs.get("notes", "")).splitlines() if note]
    notes = list(dict.fromkeys([*notes, *filter(None, str(ds.attrs.get("notes", "")).splitlines())]))
    if notes:
        ds.attrs["notes"] = "\n".join(notes)
    ds.attrs.update(
        config=config,
        experiment=plan.name,
        panel_configs=yaml.safe_dump({label: yaml.safe_load(config_yaml(study.config))
                                      for label, (study, _) in plan.studies.items()}, sort_keys=False),
    )
    # The CF attributes (long names, units, the settings, what wrote the file): the
    # command line replaces `history` with its own command.
    return describe(ds, title=f"attnflow experiment {plan.name}: {plan.module.TITLE}", config=yaml.safe_load(config),
                    history=history_line(history or "attnflow.solve_experiment(...)"),
                    references=getattr(plan.module, "PAPER", None),
                    coordinates=getattr(plan.module, "COORDINATES", None))


def _drawing_module(ds) -> ModuleType:
    name = ds.attrs.get("experiment")
    if not name:
        raise ConfigError("this results file was not written by an experiment (it names none).")
    return experiment_module(name)


def experiment_figures(ds) -> dict[str, Figure]:
    """The figures of an experiment's Dataset (as read from its `results.nc`), by name:
    `matplotlib.figure.Figure` objects outside pyplot, drawn in attnflow's style
    without changing the backend or the rcParams. `draw_experiment` saves them."""
    with style():
        return dict(_drawing_module(ds).draw(ds))


def draw_experiment(ds, folder: str | os.PathLike, *, plotly_js: str = "embed") -> list[Path]:
    """Draw the figures of an experiment's Dataset (as read from its `results.nc`)
    into `folder`, each as NAME.png and NAME.pdf, with the experiment's other files
    (animations, interactive HTML views, tables); returns their paths. `plotly_js`:
    where the HTML views find plotly.js, `"embed"` (inside each page) or `"directory"`
    (one plotly.min.js beside them)."""
    check_plotly_js(plotly_js)  # before anything is drawn
    module = _drawing_module(ds)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with style():
        paths = [path for name, fig in module.draw(ds).items() for path in save(fig, folder, name)]
    write_files = getattr(module, "write_files", None)
    return paths + (list(write_files(ds, folder, plotly_js=plotly_js)) if write_files else [])


def merge_overrides(base: dict, over: Mapping) -> dict:
    """`over` merged into the config mapping `base`, key by key; a new initial-condition
    kind replaces `init` whole (none of the old kind's keys apply to it)."""
    merged = dict(base)
    for key, value in over.items():
        if key == "init" and isinstance(value, str):
            value = {"kind": value}
        if key == "init" and isinstance(value, Mapping) and value.get("kind", base["init"]["kind"]) != base["init"]["kind"]:
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
    container = OmegaConf.to_container(composed, resolve=True, enum_to_str=True)
    container.pop("hydra", None)
    user = _plain(overrides or {})
    if not isinstance(user, Mapping):
        raise ConfigError(f"overrides must be a mapping of keys to values, got {type(overrides).__name__}.")
    return compose(merge_overrides(container, user))


def run_experiment(name: str, overrides: Mapping | None = None, *, pieces: str | os.PathLike | None = None):
    """Run experiment `name` (as `attnflow experiment=NAME` with `overrides`) and return
    its Dataset; `draw_experiment(ds, folder)` draws its figures.

    `pieces` keeps finished pieces in a folder, as in `run`."""
    ds = solve_experiment(plan_experiment(compose_experiment(name, overrides)), pieces=pieces,
                          history=python_call("attnflow.run_experiment", {"name": name, **dict(overrides or {})}))
    for note in filter(None, str(ds.attrs.get("notes", "")).splitlines()):
        warnings.warn(note, RunNote, stacklevel=2)
    return ds
