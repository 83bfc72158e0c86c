"""The plain study (`attnflow KEY=VALUE ...`, `attnflow.run(config)`: a config with
`experiment: null`) as an experiment of one panel, so that a study and an experiment go
through one pipeline (plan, solve, pieces, resume, write, draw).

Its one panel is the run's config itself, solved into the run's own pieces folder
(labelled `.`), its results are the study's as `attnflow.running._study.solve_study` makes them
(no experiment's attributes), and its figure is the summary figure, `summary.png`. It is
not a figure of the gallery: `EXPERIMENTS` (the YAML files of `conf/experiment/`) does
not list it. No JAX is imported here: `attnflow plot` draws a study's results without it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ._experiment import Counter, Experiment, Keeper
from ._lazy import lazy

if TYPE_CHECKING:
    import xarray as xr
    from matplotlib.figure import Figure

    from ..presentation import _plots
    from ..schema._config import Config
else:
    _plots = lazy("attnflow.presentation._plots")

# The label of the study's one panel: its pieces folder is the run's pieces folder itself
# (as a study of earlier versions kept its pieces, which therefore still resume).
PANEL = "."


class PlainStudy(Experiment):
    """The study a config without an experiment describes: one panel, the config itself."""

    title = "a study of the configured system"
    # A failed study's incomplete.nc holds all it computed: its pieces are removed.
    keeps_pieces_on_failure = False

    @property
    def name(self) -> str:
        """What the progress bar names (the command)."""
        return "attnflow"

    def panels(self, base: dict) -> Mapping[str, Mapping | Config]:
        """The run's config itself (resolved once already, as its results store it)."""
        return {PANEL: self.cfg}

    def analyse(self, results: dict[str, xr.Dataset], *, on_piece: Counter, keep: Keeper) -> xr.Dataset:
        """The one panel's results, unchanged."""
        return results[PANEL]

    def conclude(
        self,
        results: dict[str, xr.Dataset],
        *,
        on_piece: Counter,
        keep: Keeper,
        describe: Callable[[xr.Dataset], xr.Dataset],
    ) -> xr.Dataset:
        """The study's results as the study wrote them: the runner's description of an
        experiment (its name, the panels' configs, an experiment's title) is not theirs."""
        return self.analyse(results, on_piece=on_piece, keep=keep)

    @staticmethod
    def draw(ds: xr.Dataset) -> dict[str, Figure]:
        """The summary figure, titled with the run's system and solver."""
        return {"summary": _plots.summary_figure(ds, title=_plots.summary_title(ds))}

    @classmethod
    def write_figures(cls, ds: xr.Dataset, folder: Path) -> list[Path]:
        """`summary.png`, as `attnflow.presentation._plots.plot_summary` writes it (a PNG, in
        matplotlib's own style)."""
        return [_plots.plot_summary(ds, Path(folder) / "summary.png", title=_plots.summary_title(ds))]
