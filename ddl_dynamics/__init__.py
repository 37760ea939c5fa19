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

# --- depth models

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
    "Expectation",
    "Task",
    "TaskData",
    "check_task",
    "delta_update",
    "gate",
    "gate_logit",
    "list_tasks",
    "load_file",
    "make_task",
    "normalize_direction",
    "regime",
    "regime_index",
    "register_task",
    "shortcut_matrix",
    "split_generator",
    "write_update",
]
