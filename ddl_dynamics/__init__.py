"""ddl_dynamics: where does the Delta operator beat additive residual stacks and neural ODEs?

The public API, in one screen, by group (`API`). The implementation is in wings
whose imports run one way, ``publish`` → ``analysis`` and ``bench`` → ``experiment`` → task
interface → ``models`` → registry:

- ``models/``: the Delta operator and the depth-model families;
- ``experiment/``: experiment files, the trainer, the runner and the run folder;
- ``analysis/``: reading a run: probes, the judged report, figures, and its renderings to
  Markdown, CSV, JSON and HTML;
- ``publish/``: published studies (``results/``) and the documentation pages made from them;
- ``bench/``: the benchmarks behind ``ddl-dyn bench``.

Names load on first use, so ``import ddl_dynamics`` (and ``ddl-dyn --help``) imports
neither torch nor matplotlib; everything else is importable from its own module.
"""

from __future__ import annotations

import importlib as _importlib
from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _distribution_version
from pathlib import Path as _Path
from typing import Any as _Any

from ._registry import BUILTINS as _BUILTINS

#: The public names, by group: ``module → names`` (modules relative to this package).
API: dict[str, dict[str, tuple[str, ...]]] = {
    "the Delta operator": {
        ".models.operator": (
            "REGIMES",
            "delta_update",
            "gate",
            "normalize_direction",
            "write_update",
        ),
    },
    "tasks": {
        "._task": (
            "IGNORE_INDEX",
            "Expectation",
            "SequenceTask",
            "Subject",
            "Task",
            "TaskData",
            "held_out",
            "list_tasks",
            "make_task",
            "register_task",
            "split_generator",
        ),
        "._task_check": ("check_task",),
    },
    "depth models": {
        ".models.base": (
            "DepthModel",
            "check_model",
            "list_models",
            "make_model",
            "register_model",
        ),
        ".models.params": ("count_parameters",),
    },
    "experiments and training": {
        ".experiment.config": (
            "ComparisonSpec",
            "ConfigError",
            "ExperimentConfig",
            "ModelEntry",
            "TaskEntry",
            "TrainConfig",
        ),
        ".experiment.reader": ("load_experiment", "parse_experiment"),
        ".experiment.cells": ("expand_cells",),
        ".experiment.runner": ("run_experiment",),
        ".experiment.train": ("train",),
    },
    "results, reports and figures": {
        ".analysis.results": ("load_results",),
        ".experiment.folder": ("RunFolder",),
        ".experiment.result": ("RunResult",),
        ".analysis.report.build": ("build_report",),
        ".analysis.render.html": ("write_html_report",),
        ".analysis.figures": ("make_figures",),
    },
}
_HOME = {
    name: module for group in API.values() for module, names in group.items() for name in names
}
#: The subpackages, reachable as attributes (``ddl_dynamics.experiment.store``) once imported.
_SUBPACKAGES = ("analysis", "bench", "experiment", "models", "publish", "tasks")

__all__ = sorted(_HOME)

# The packages whose modules register the built-in tasks and model families, each module
# imported on its registry's first lookup (a new family registers by being in the package):
# named here, above the registries, so that no registry names the modules that import it.
_BUILTINS.update(task="ddl_dynamics.tasks", model="ddl_dynamics.models")


def _version() -> str:
    """The installed distribution's version, else (a source tree) the one pyproject states."""
    try:
        return _distribution_version("ddl-dynamics")
    except _PackageNotFoundError:
        import tomllib

        pyproject = _Path(__file__).resolve().parents[1] / "pyproject.toml"
        return str(tomllib.loads(pyproject.read_text())["project"]["version"])


__version__ = _version()


def __getattr__(name: str) -> _Any:
    if name in _HOME:
        value = getattr(_importlib.import_module(_HOME[name], __name__), name)
        globals()[name] = value  # later lookups skip this function
        return value
    if name in _SUBPACKAGES:
        return _importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public API only: the names of `__all__`, the groups, the version, the subpackages."""
    return sorted({*__all__, "API", "__version__", *_SUBPACKAGES})
