"""ddl_dynamics: where does the Delta operator beat additive residual stacks and neural ODEs?

The public API, in one screen. Implementation lives in private ``_``-modules.
"""

# --- the Delta operator
from ._operator import (
    REGIME_BOUNDS,
    REGIMES,
    delta_update,
    gate,
    gate_logit,
    normalize_direction,
    regime,
    regime_index,
    shortcut_matrix,
    write_update,
)

# --- depth models (importing the family modules registers them)
# isort: split
from . import _delta, _ode, _residual  # noqa: F401
from ._delta import DeltaProbe
from ._model import DepthModel, check_model, list_models, make_model, register_model
from ._params import count_parameters, match_hidden

# --- tasks
from ._registry import load_file
from ._task import (
    Expectation,
    Task,
    TaskData,
    check_task,
    list_tasks,
    make_task,
    register_task,
    split_generator,
)

# --- experiments, training and results
# isort: split
from ._config import Cell, ConfigError, ExperimentConfig, TrainConfig, load_experiment
from ._report import build_report
from ._store import ResultStore, RunResult, load_trained
from ._suite import run_experiment
from ._train import train

# --- analysis and figures
# isort: split
from ._figures import make_figures
from ._html import write_html_report
from ._probes import probe_run

__all__ = [
    "REGIMES",
    "REGIME_BOUNDS",
    "Cell",
    "ConfigError",
    "DeltaProbe",
    "DepthModel",
    "Expectation",
    "ExperimentConfig",
    "ResultStore",
    "RunResult",
    "Task",
    "TaskData",
    "TrainConfig",
    "build_report",
    "check_model",
    "check_task",
    "count_parameters",
    "delta_update",
    "gate",
    "gate_logit",
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
    "probe_run",
    "regime",
    "regime_index",
    "register_model",
    "register_task",
    "run_experiment",
    "shortcut_matrix",
    "split_generator",
    "train",
    "write_html_report",
    "write_update",
]
