"""Which class runs an experiment or draws a results file, and the drawing itself: the
experiments attnflow ships (`EXPERIMENTS`, the names of `conf/experiment/*.yaml`), the
`Experiment` subclass of a name (`experiment_class`), the class that draws a results
file (the plain study's, `PlainStudy`, where it names no experiment), and
`draw_experiment` / `experiment_figures`.

No JAX is imported here (nor by `PlainStudy`): `attnflow plot` draws a study's results
without loading it; a shipped experiment's module loads what it needs."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from ..presentation._figures import style
from ..schema._config import config_source
from ..schema._errors import ConfigError
from ._animate import check_plotly_js
from ._experiment import Experiment
from ._plain_study import PlainStudy

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _shipped() -> tuple[str, ...]:
    """The experiments attnflow ships: the names of its `conf/experiment/*.yaml` (the one
    list of them; each names its module `attnflow.experiments.NAME`, or another with
    `experiment._target_`)."""
    folder = config_source()[1].joinpath("experiment")
    return tuple(sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml")))


EXPERIMENTS = _shipped()
# The module of an experiment whose name is also a package of attnflow's.
_MODULES = {"diffeqformer": "diffeqformer_vs_gpt"}


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
        from ..schema._plugins import import_target  # lazy: only a config that names code of its own

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


def _drawing_class(ds) -> type[Experiment]:
    """The class that draws a results Dataset: a study's (it names no experiment), or a
    shipped experiment's, by its name. A Dataset of a researcher's own experiment names
    its class (`experiment_target`), which is never imported because a file names it:
    `attnflow plot DIR --config-dir CFG` names it from the user's own config folder."""
    name = ds.attrs.get("experiment")
    if not name:
        return PlainStudy
    target = ds.attrs.get("experiment_target")
    if target is not None:
        raise ConfigError(
            f"this results file was written by the experiment {name} of your own code ({target}), "
            "which attnflow imports only from a config folder you give: add --config-dir with the "
            "folder of its experiment/NAME.yaml."
        )
    return experiment_class(name)


def experiment_figures(ds) -> dict[str, Figure]:
    """The figures of a results Dataset (as read from its `results.nc`: an experiment's,
    or a study's summary figure), by name: `matplotlib.figure.Figure` objects outside
    pyplot, drawn in attnflow's style without changing the backend or the rcParams.
    `draw_experiment` saves them."""
    with style():
        return dict(_drawing_class(ds).draw(ds))


def draw_experiment(
    ds, folder: str | os.PathLike, *, plotly_js: str = "embed", experiment: type[Experiment] | None = None
) -> list[Path]:
    """Draw the figures of a results Dataset (as read from its `results.nc`) into
    `folder`, with the experiment's other files (animations, interactive HTML views,
    tables); returns their paths. An experiment's figures are each NAME.png and NAME.pdf,
    a study's is `summary.png` (`Experiment.write_figures`). `plotly_js`: where the HTML
    views find plotly.js, `"embed"` (inside each page) or `"directory"` (one
    plotly.min.js beside them). `experiment`: the class that draws it (by default the
    study, or the shipped experiment the Dataset names)."""
    check_plotly_js(plotly_js)  # before anything is drawn
    kind = experiment or _drawing_class(ds)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return kind.write_figures(ds, folder) + list(kind.write_files(ds, folder, plotly_js=plotly_js))
