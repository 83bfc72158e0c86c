"""The public names of `attnflow.experiments`, for editors and type checkers; at run
time `lazy_loader` reads this stub and imports each name's module on first use."""

from ._animate import animate_states as animate_states
from ._animate import animation as animation
from ._animate import sphere_html as sphere_html
from ._experiment import Experiment as Experiment
from ._registry import EXPERIMENTS as EXPERIMENTS
from ._registry import draw_experiment as draw_experiment
from ._registry import experiment_class as experiment_class
from ._registry import experiment_figures as experiment_figures
from ._registry import experiment_module as experiment_module
from ._runner import ExperimentPlan as ExperimentPlan
from ._runner import check_experiment as check_experiment
from ._runner import compose_experiment as compose_experiment
from ._runner import experiment_options as experiment_options
from ._runner import plan_checked as plan_checked
from ._runner import plan_experiment as plan_experiment
from ._runner import run_experiment as run_experiment
from ._runner import solve_experiment as solve_experiment

__all__ = [
    "EXPERIMENTS",
    "Experiment",
    "ExperimentPlan",
    "animate_states",
    "animation",
    "check_experiment",
    "compose_experiment",
    "draw_experiment",
    "experiment_class",
    "experiment_figures",
    "experiment_module",
    "experiment_options",
    "plan_checked",
    "plan_experiment",
    "run_experiment",
    "solve_experiment",
    "sphere_html",
]
