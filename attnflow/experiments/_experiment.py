"""The protocol of an experiment: one class, `Experiment`, that a figure of the gallery (or
a researcher's own study, in their own module) subclasses.

An experiment is its config (`conf/experiment/NAME.yaml`, or the user's own folder given
with `--config-dir`), whose `experiment` block names it and holds its options, and one
subclass of `Experiment` that says what to compute beyond the core studies and how to
draw it. The runner (`attnflow.experiments._runner`) asks the class, never the module:

- `title`, `paper`: what the figure shows and what it reproduces (the results' `title`
  and `references`);
- `Options`: a dataclass of its own settings (`experiment.options.KEY=...`), their types
  (choices as `attnflow.schema._config.choice(...)`), defaults and meanings (the `help` of each
  field's metadata, `setting(default, "meaning")` of `attnflow.schema._schema`, which the help
  shows). The runner types what is given by it (`_schema.typed`: unknown keys, wrong
  types, NaN and infinity, repeated list entries are refused there) and hands the
  experiment an instance: `self.options.sizes`;
- `check()`: what a type cannot say (ranges, combinations), one sentence each;
- `panels(base)`: the studies to solve, each a config mapping; by default one per
  combination of the list-valued `panel_keys` (`d: [2, 8, 32, 128]`);
- `pieces()`: the units of work of its own `analyse` beyond the studies (0: none), each
  kept by `keep` so that a stopped run resumes from them;
- `analyse(results, on_piece=..., keep=...)`: every panel's data and the derived
  quantities in one xarray Dataset;
- `draw(ds)` (a static method): the figures, from that Dataset alone, as `attnflow plot`
  redraws them; `write_files(ds, folder, plotly_js)` (static, optional) the other files;
- `coordinates`: `{name: (long name, units)}` of the Dataset's own coordinates, for its
  CF attributes (units None for text).

Three hooks let one class run what is not a figure: a plain study (`attnflow
KEY=VALUE ...`) is the experiment of one panel, `experiments._plain_study.PlainStudy`,
that overrides them (an experiment of the gallery leaves them):

- `conclude(results, on_piece=..., keep=..., describe=...)`: what the run writes, by
  default its `analyse` described by the runner (its config, the panels' configs, the CF
  attributes);
- `write_figures(ds, folder)` (a class method): the figures saved, by default each of
  `draw` as NAME.png and NAME.pdf in attnflow's style;
- `keeps_pieces_on_failure`: whether a run stopped by a non-finite state or a solver
  failure keeps its finished pieces (by default it does: its `incomplete.nc` holds only
  the failed panel's statistics).
"""

from __future__ import annotations

import abc
import dataclasses
import itertools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..presentation._figures import save, style
from ..schema._errors import ConfigError

if TYPE_CHECKING:
    import xarray as xr
    from matplotlib.figure import Figure

    from ..schema._config import Config


@dataclasses.dataclass
class NoOptions:
    """The options of an experiment that takes none."""


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


# What `analyse` is handed: `on_piece()` counts one unit of the experiment's own work;
# `keep(compute)` returns what `compute()` returns (a mapping of names to arrays), kept as
# a piece of the run (see `attnflow.experiments._runner.OwnPieces`).
Counter = Callable[[], None]
Keeper = Callable[[Callable[[], Mapping[str, Any]]], Mapping[str, Any]]


def computed(compute: Callable[[], Mapping[str, Any]]) -> Mapping[str, Any]:
    """A `Keeper` that keeps nothing: `compute()`."""
    return compute()


def uncounted() -> None:
    """A `Counter` that counts nothing."""


class Experiment(abc.ABC):
    """An experiment: a figure of the literature, or any study beyond one run of the core.

    Subclass it, give `title` (and `paper`, `Options`, `coordinates`, `panel_keys` where
    it has them), and write `analyse` and `draw`; override `check`, `panels`, `pieces`
    and `write_files` where the defaults do not fit (`conclude`, `write_figures` and
    `keeps_pieces_on_failure` are for a run that is not a figure: the plain study). An
    instance holds the checked config (`self.cfg`, a `attnflow.Config` whose
    `experiment.options` is the mapping stored in the results) and the typed options
    (`self.options`, an instance of `Options`).
    """

    title: ClassVar[str] = ""
    paper: ClassVar[str | None] = None
    Options: ClassVar[type] = NoOptions
    coordinates: ClassVar[Mapping[str, tuple[str, str | None]]] = {}
    panel_keys: ClassVar[tuple[str, ...]] = ()
    # A run stopped by a non-finite state or a solver failure writes the failed panel's
    # statistics to incomplete.nc and keeps its finished pieces for the next run (the
    # other panels' work is in no file); False removes them (a plain study, whose
    # incomplete.nc holds all it computed).
    keeps_pieces_on_failure: ClassVar[bool] = True

    def __init__(self, cfg: Config, options: Any):
        self.cfg = cfg
        self.options = options

    @property
    def name(self) -> str:
        """The experiment's name (`experiment=NAME`)."""
        assert self.cfg.experiment is not None  # an experiment's config has its experiment block
        return self.cfg.experiment.name

    def check(self) -> None:  # noqa: B027 (a hook: an experiment without checks of its own leaves it)
        """Refuse, with a `ConfigError` of one sentence naming the key, the value and what
        is allowed, what the options' types cannot say: ranges and combinations."""

    def panels(self, base: dict) -> Mapping[str, Mapping | Config]:
        """The studies to solve, by label (the name of the panel's pieces folder under the
        run's): each a config mapping over `base` (the experiment's config without its
        `experiment` block), or a `Config`. By default one per combination of the
        list-valued `panel_keys`, or `{"main": base}`."""
        return panel_configs(base, self.panel_keys)

    def pieces(self) -> int:
        """How many units of its own work `analyse` does beyond the panels' studies, each
        kept with `keep` and counted with `on_piece` (0: none)."""
        return 0

    @abc.abstractmethod
    def analyse(self, results: dict[str, xr.Dataset], *, on_piece: Counter, keep: Keeper) -> xr.Dataset:
        """Every panel's results (by label) and the derived quantities, in one Dataset
        whose variables say what they are (`description`, `units`). `keep(compute)`
        returns what `compute()` returns (a mapping of names to arrays), kept as a piece of
        the run; `on_piece()` counts one unit of `pieces()`. (Called directly, give
        `on_piece=uncounted, keep=computed`.)"""

    def conclude(
        self,
        results: dict[str, xr.Dataset],
        *,
        on_piece: Counter,
        keep: Keeper,
        describe: Callable[[xr.Dataset], xr.Dataset],
    ) -> xr.Dataset:
        """What the run writes to `results.nc`, from every panel's results (by label): by
        default `analyse`, given to `describe` (the runner's: the config, the experiment's
        name, the panels' configs and notes, the CF attributes). The plain study returns
        its one panel's results as the study wrote them."""
        return describe(self.analyse(results, on_piece=on_piece, keep=keep))

    @staticmethod
    @abc.abstractmethod
    def draw(ds: xr.Dataset) -> dict[str, Figure]:
        """The figures, by file name, from the Dataset alone (as read from `results.nc`)."""

    @classmethod
    def write_figures(cls, ds: xr.Dataset, folder: Path) -> list[Path]:
        """Draw the figures (`draw`) in attnflow's style and save each as NAME.png and
        NAME.pdf in `folder`; returns their paths."""
        with style():
            return [path for name, fig in cls.draw(ds).items() for path in save(fig, folder, name)]

    @staticmethod
    def write_files(ds: xr.Dataset, folder: Path, plotly_js: str = "embed") -> list[Path]:
        """The files beside the figures (animations, interactive views, tables)."""
        return []
