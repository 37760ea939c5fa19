"""ddl_dynamics: where does the Delta operator beat additive residual stacks and neural ODEs?

The public API, in one screen. The implementation is in three wings whose imports run one
way, ``analysis`` → ``experiment`` → task interface → ``models`` → registry:

- ``models/``: the Delta operator and the depth-model families;
- ``experiment/``: experiment files, the trainer, the runner and the results store;
- ``analysis/``: report, expectations, probes, regime analysis, figures and HTML.
"""

# --- the Delta operator
from .models.operator import (
    REGIME_BOUNDS,
    REGIMES,
    delta_update,
    gate,
    gate_logit,
    generated_update,
    normalize_direction,
    regime,
    regime_index,
    shortcut_matrix,
    split_generators,
    write_update,
)

# --- depth models (importing the family modules registers them)
# isort: split
# --- tasks
from ._registry import load_file
from ._task import (
    IGNORE_INDEX,
    Expectation,
    SequenceTask,
    Subject,
    Task,
    TaskData,
    check_task,
    content_overlap,
    held_out,
    list_tasks,
    make_task,
    register_task,
    split_generator,
)
from .models import decoupled, delta, hyper, ode, product, residual, transformer  # noqa: F401
from .models.base import DepthModel, check_model, list_models, make_model, register_model
from .models.delta import DeltaProbe
from .models.params import count_parameters, match_hidden, parameter_count

# --- experiments, training and results
# isort: split
from .experiment.cells import expand_cells
from .experiment.config import Cell, Comparison, ConfigError, ExperimentConfig, TrainConfig
from .experiment.reader import load_experiment, parse_experiment
from .experiment.runner import run_experiment
from .experiment.store import ResultStore, RunResult, load_trained
from .experiment.train import train

# --- analysis and figures
# isort: split
from .analysis.figures import make_figures
from .analysis.html import write_html_report
from .analysis.probes import probe_run
from .analysis.report import build_report

__all__ = [
    "IGNORE_INDEX",
    "REGIMES",
    "REGIME_BOUNDS",
    "Cell",
    "Comparison",
    "ConfigError",
    "DeltaProbe",
    "DepthModel",
    "Expectation",
    "ExperimentConfig",
    "ResultStore",
    "RunResult",
    "SequenceTask",
    "Subject",
    "Task",
    "TaskData",
    "TrainConfig",
    "build_report",
    "check_model",
    "check_task",
    "content_overlap",
    "count_parameters",
    "delta_update",
    "expand_cells",
    "gate",
    "gate_logit",
    "generated_update",
    "held_out",
    "list_models",
    "list_tasks",
    "load_experiment",
    "load_file",
    "load_trained",
    "make_figures",
    "make_model",
    "make_task",
    "match_hidden",
    "normalize_direction",
    "parameter_count",
    "parse_experiment",
    "probe_run",
    "regime",
    "regime_index",
    "register_model",
    "register_task",
    "run_experiment",
    "shortcut_matrix",
    "split_generator",
    "split_generators",
    "train",
    "write_html_report",
    "write_update",
]
