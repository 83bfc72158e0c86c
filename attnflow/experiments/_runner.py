"""Plan, solve, analyse and draw an experiment: its panels are core studies (validated
and planned before anything is computed), solved in pieces that a rerun resumes from,
then handed to the experiment's own `analyse` and `draw`."""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import itertools
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import yaml
from hydra import compose as hydra_compose
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from .._build import Study, resolve_study
from .._config import Config, _plain, compose, hydra_context, register_schema, to_container, typed_options
from .._ensemble import EnsemblePlan
from .._errors import ConfigError, NonFiniteStateError, SolverFailure
from .._cf import describe, history_line, python_call
from .._figures import save, style
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
    typed by the schema. An unknown name is refused with the nearest one; a wrong type
    or a name outside a choice in one sentence (the schema's); ranges and combinations
    are checked by the experiment's `check`."""
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


def plan_experiment(cfg: Config) -> ExperimentPlan:
    """Check every panel of an experiment config and plan its studies; raises
    `ConfigError` (naming the panel) before anything is computed."""
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
    configs = make(base, options) if make is not None else panel_configs(base, getattr(module, "PANEL_KEYS", ()))
    studies = {}
    for label, config in configs.items():
        try:
            panel = resolve_study(config)
            studies[label] = (panel, plan_study(panel))
        except ConfigError as error:
            if len(configs) == 1:
                raise
            raise ConfigError(f"panel {label} of experiment {cfg.experiment.name}: {error}") from None
    return ExperimentPlan(cfg, options, module, studies)


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
        # An experiment that counts its own pieces reports them as it computes them.
        ds = plan.module.analyse(plan.cfg, plan.options, results, on_piece=on_piece)
    else:
        ds = plan.module.analyse(plan.cfg, plan.options, results)
    config = config_yaml(plan.cfg)
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
    return solve_experiment(plan_experiment(compose_experiment(name, overrides)), pieces=pieces,
                            history=python_call("attnflow.run_experiment", {"name": name, **dict(overrides or {})}))
