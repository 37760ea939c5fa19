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

# --- analysis and figures

__all__ = [
    "REGIMES",
    "REGIME_BOUNDS",
    "DeltaProbe",
    "DepthModel",
    "Expectation",
    "Task",
    "TaskData",
    "check_model",
    "check_task",
    "count_parameters",
    "delta_update",
    "gate",
    "gate_logit",
    "list_models",
    "list_tasks",
    "load_file",
    "make_model",
    "make_task",
    "match_hidden",
    "normalize_direction",
    "regime",
    "regime_index",
    "register_model",
    "register_task",
    "shortcut_matrix",
    "split_generator",
    "write_update",
]
