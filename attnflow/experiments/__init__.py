"""The figures of the self-attention-dynamics literature, one experiment each.

An experiment is a config, `conf/experiment/NAME.yaml` (run as `attnflow
experiment=NAME`, any key overridable on top), and a module `attnflow.experiments.NAME`
that says what to compute beyond the core study and how to draw it. A module holds:

- `TITLE` and `PAPER`: what the figure shows and what it reproduces;
- `Options`: a dataclass of the experiment's own settings (`experiment.options.KEY=...`):
  their types (choices as `choice(...)`) and defaults, which type and check what is given;
  `check(cfg, options)` (optional) then tests ranges and combinations only;
- `PANEL_KEYS` (optional): top-level keys that may hold a list, one panel per entry
  (`d: [2, 8, 32, 128]` in the phase diagram; `d=8` draws one panel);
- `panels(base, options) -> {label: config}` (optional): the studies to solve, each a
  config mapping; by default one per combination of the panel keys;
- `analyse(cfg, options, results) -> xarray.Dataset`: every panel's data and the
  derived quantities (a curve, merge times, a trained surrogate), in one Dataset;
- `draw(ds) -> {name: Figure}`: the figures, from that Dataset alone (drawn in the
  shared style, saved as NAME.png and NAME.pdf);
- `write_files(ds, folder, plotly_js) -> [paths]` (optional): the other files beside
  them (animations, interactive HTML views, tables).
- `COORDINATES` (optional): `{name: (long name, units)}` of the Dataset's own
  coordinates (units None for text), for its CF attributes; every variable the Dataset
  holds says what it is with a `description` (or `long_name`) attribute, and `units`
  where it is not a pure number ("1", the default).

`run_experiment(name, overrides)` runs one from Python; `experiment_figures(ds)` returns
its figures; `draw_experiment(ds, folder)` writes them and the other files. The command
line runs the same code and writes `results.nc` and the figures into the run directory;
`attnflow plot DIR` redraws them from `results.nc`. `animate_states`, `animation` and `sphere_html` draw
the GIF and the interactive HTML view of stored token states.
"""

from ._animate import animate_states, animation, sphere_html
from ._runner import (
    EXPERIMENTS,
    ExperimentPlan,
    compose_experiment,
    draw_experiment,
    experiment_figures,
    experiment_module,
    experiment_options,
    plan_experiment,
    run_experiment,
    solve_experiment,
)

__all__ = [
    "EXPERIMENTS",
    "animate_states",
    "animation",
    "sphere_html",
    "ExperimentPlan",
    "compose_experiment",
    "draw_experiment",
    "experiment_figures",
    "experiment_module",
    "experiment_options",
    "plan_experiment",
    "run_experiment",
    "solve_experiment",
]
