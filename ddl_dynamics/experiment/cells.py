"""An experiment expanded into cells: every option of every task × model pair resolved.

A model's options resolve from generic to specific::

    constructor defaults < train.ode_max_steps (as the solver cap ``max_steps``)
      < [defaults.model] < the task's ``model_defaults`` < the task entry's ``model``
      < the model entry's options < matching ``[[overrides]]``

and train options likewise (``TrainConfig`` defaults < ``[defaults.train]`` < task entry
< model entry < overrides). A cell's task always runs at its model's ``depth``.

A ``tune`` table beside any ``train`` table gives a *grid* for tunable training fields
(`TUNABLE`; `expand`), e.g. ``[defaults.tune] lr = [1e-3, 3e-3,
1e-2]``: the row trains at every combination of grid values, on every seed, and the report
takes, per task and row, the value with the best mean val metric. At each level a field is
either fixed (``train``) or searched (``tune``); the most specific level decides, so a model
entry's ``train = { lr = 1e-3 }`` fixes the rate that ``[defaults.tune]`` searches. A grid of one
value fixes the field.

Only ``[defaults.model]`` ranks below a task's ``model_defaults``: a task that needs, say,
width 1 replaces an experiment-wide ``width = 32``, as suites want, and a
`ConfigWarning` names each value so replaced (an error would forbid the normal
case; a value set for the pair itself always wins over the task's).

``match_params`` sizes ``hidden`` so that the model has, on the same task, the parameter
count of another model label of the file or a given number, within ±10%
(`match_hidden`). ``baseline`` (a model entry's, or the
file's default; default: the label ``resnet`` if there is one) names the row a model is
compared with; a row that is some row's baseline heads its family and takes no default
baseline itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from .._registry import did_you_mean
from .._task import TASKS, Task, make_task
from ..models.base import family
from ..models.base import model_options as _model_options
from ..models.params import match_hidden, parameter_count
from .config import (
    DEFAULT_BASELINE,
    MAX_PARAMS,
    TASK_DIMS,
    Cell,
    ConfigError,
    ExperimentConfig,
    ModelEntry,
    TaskEntry,
    TrainConfig,
    check_limit,
    check_seeds,
    coerce,
)
from .grid import expand


def expand_cells(
    config: ExperimentConfig,
    seeds: Sequence[int] | None = None,
    device: str | None = None,
    only: Mapping[str, Sequence[str]] | None = None,
) -> list[Cell]:
    """Every applicable task × model × seed cell of ``config``, optionally filtered.

    ``seeds`` replaces the experiment's, ``device`` every cell's train device, and ``only``
    maps ``"task"`` / ``"model"`` to the labels to keep (a sweep's label keeps its entries).
    """
    if seeds is not None:
        try:
            seeds = check_seeds(seeds)
        except ValueError as err:
            raise ValueError(f"seeds: {err}") from None
    only = dict(only or {})
    for axis, labels in only.items():
        tables: dict[str, Sequence[TaskEntry] | Sequence[ModelEntry]] = {
            "task": config.tasks,
            "model": config.models,
        }
        entries = tables.get(axis)
        if entries is None:
            raise ValueError(f"only: unknown axis {axis!r}; use 'task' or 'model'")
        named = [named_entries(label, entries) for label in labels]
        for label, found in zip(labels, named, strict=True):
            if not found:
                known = references(entries)
                raise ValueError(
                    f"only: no {axis} labelled {label!r} in experiment {config.name!r}; "
                    f"{axis}s: {', '.join(known)}." + did_you_mean(label, known)
                )
        only[axis] = [label for found in named for label in found]
    cells = []
    for t_index, entry in enumerate(config.tasks):
        if "task" in only and entry.label not in only["task"]:
            continue
        for m_index, model in enumerate(config.models):
            if "model" in only and model.label not in only["model"]:
                continue
            if runs(config, t_index, m_index):
                cells += pair_cells(
                    config, t_index, m_index, config.seeds if seeds is None else seeds, device
                )
    return cells


def pair_cells(
    config: ExperimentConfig,
    t_index: int,
    m_index: int,
    seeds: Sequence[int],
    device: str | None = None,
) -> list[Cell]:
    """The cells of one task entry × model entry: every grid value at every seed."""
    entry, model = config.tasks[t_index], config.models[m_index]
    pair = _resolve(config, t_index, m_index)
    baseline = baseline_on(config, t_index, m_index)
    return [
        Cell(
            entry.name,
            entry.label,
            pair.spec,
            model.name,
            model.label,
            pair.config,
            train if device is None else dataclasses.replace(train, device=device),
            s,
            baseline=baseline,
            match_params=pair.match_params,
            params_target=pair.params_target,
            tune=pair.tune,
        )
        for train in pair.grid
        for s in seeds
    ]


def runs(config: ExperimentConfig, t_index: int, m_index: int) -> bool:
    """Whether model entry ``m_index`` runs on task entry ``t_index``."""
    entry, model = config.tasks[t_index], config.models[m_index]
    return (not model.tasks or entry.label in model.tasks) and same_kind(entry, model)


def baseline_on(config: ExperimentConfig, t_index: int, m_index: int) -> str | None:
    """The baseline label of a row on a task: its own, else the file's default (which is
    dropped where it does not run); None for a row that is some row's baseline."""
    model = config.models[m_index]
    labels = [m.label for m in config.models]
    if model.baseline is not None:
        if not runs(config, t_index, labels.index(model.baseline)):
            raise ConfigError(
                config.source,
                f"models[{m_index}].baseline",
                f"{model.baseline!r} does not run on task {config.tasks[t_index].label!r}, "
                f"which {model.label!r} runs on; add the task to its tasks or name another "
                "baseline",
            )
        return model.baseline
    default = config.baseline or (DEFAULT_BASELINE if DEFAULT_BASELINE in labels else None)
    heads = {default, *(m.baseline for m in config.models)}
    if default is None or model.label in heads or not runs(config, t_index, labels.index(default)):
        return None
    return default


def model_options(name: str) -> dict[str, tuple[Any, Any]]:
    """``option → (default, type hint)`` an experiment may set (the task fixes the dims)."""
    return {k: v for k, v in _model_options(name).items() if k not in TASK_DIMS}


def named_entries(label: str, entries: Sequence[TaskEntry] | Sequence[ModelEntry]) -> list[str]:
    """The labels of the entries ``label`` names: the one labelled so, or a sweep's entries."""
    return [e.label for e in entries if label in (e.label, getattr(e, "sweep", ""))]


def references(entries: Sequence[TaskEntry] | Sequence[ModelEntry]) -> list[str]:
    """Every label that names some of ``entries``: sweeps first, then each entry's."""
    sweeps = [getattr(e, "sweep", "") for e in entries]
    return [r for r in dict.fromkeys([*sweeps, *(e.label for e in entries)]) if r]


def task_kind(name: str) -> str:
    """The kind (vector or sequence) of a registered task: its factory is a `Task`."""
    return cast("type[Task]", TASKS.get(name)).kind


def same_kind(entry: TaskEntry, model: ModelEntry) -> bool:
    """Whether the model's kind (vector or sequence) is the task's."""
    return family(model.name).kind == task_kind(entry.name)


@dataclass(frozen=True)
class _Pair:
    """One task entry × model entry, resolved (see `_resolve`)."""

    spec: dict[str, Any]
    config: dict[str, Any]
    #: One train config per combination of grid values (one when nothing is tuned).
    grid: list[TrainConfig]
    match_params: str | int | None
    params_target: int | None
    #: The searched fields and their values (empty when nothing is tuned).
    tune: dict[str, list[Any]]


def _resolve(
    config: ExperimentConfig, t_index: int, m_index: int, chain: tuple[str, ...] = ()
) -> _Pair:
    """Task spec, model config and train config of one pair of entries of the same kind
    (``chain``: the labels whose ``match_params`` led here, to catch cycles)."""
    entry, model = config.tasks[t_index], config.models[m_index]
    where = f"task {entry.label!r} × model {model.label!r}"
    overrides = [o for o in config.overrides if o.matches(entry.label, model.label)]
    try:
        grid, tune = expand(
            [
                (config.train_defaults, config.tune_defaults),
                (entry.train, entry.tune),
                (model.train, model.tune),
                *((o.train, o.tune) for o in overrides),
            ]
        )
        task = make_task(entry.name, **entry.spec)
    except ValueError as err:
        raise ConfigError(config.source, where, str(err)) from err
    train = grid[0]
    options = model_options(model.name)
    layers = [
        {"max_steps": train.ode_max_steps} if train.ode_max_steps else {},
        config.model_defaults,
        dict(task.model_defaults),
        entry.model,
        model.options,
        *(o.model for o in overrides),
    ]
    resolved = {name: default for name, (default, _) in options.items()}
    match = None
    for layer in layers:
        for key, value in layer.items():
            if key in options:
                try:
                    resolved[key] = coerce(value, *options[key])
                except ValueError as err:
                    raise ConfigError(config.source, f"{where}: {key}", str(err)) from None
            elif key == "match_params":
                match = value
    spec = dataclasses.asdict(task)
    if "depth" in resolved:
        spec["depth"] = resolved["depth"]
    target = None
    if match is not None:
        dims = {"in_dim": task.in_dim, "out_dim": task.out_dim, "control_dim": task.control_dim}
        target = _match(config, t_index, m_index, match, dims, resolved, chain)
    return _Pair(spec, resolved, grid, match, target, tune)


def _match(
    config: ExperimentConfig,
    t_index: int,
    m_index: int,
    match: str | int,
    dims: dict[str, int],
    resolved: dict[str, Any],
    chain: tuple[str, ...],
) -> int:
    """Size ``resolved["hidden"]`` for the parameter count ``match`` asks for on this task,
    and return that count (a row that names itself keeps its size)."""
    entry, model = config.tasks[t_index], config.models[m_index]
    where = f"task {entry.label!r} × model {model.label!r}"
    if match in chain:
        cycle = " → ".join((*chain, model.label, match))
        raise ConfigError(config.source, where, f"match_params refers back to itself: {cycle}")
    try:
        if match == model.label:
            return parameter_count(model.name, **dims, **resolved)
        if isinstance(match, str):
            index = [m.label for m in config.models].index(match)
            if not same_kind(entry, config.models[index]):
                raise ConfigError(
                    config.source,
                    where,
                    f"match_params: model {match!r} cannot run task "
                    f"{entry.label!r}, so it has no parameter count there",
                )
            reference = _resolve(config, t_index, index, (*chain, model.label))
            target = parameter_count(config.models[index].name, **dims, **reference.config)
        else:
            target = match
        check_limit(f"{target:,} parameters", target, MAX_PARAMS)  # before sizing for it
        others = {k: v for k, v in resolved.items() if k != "hidden"}
        resolved["hidden"] = match_hidden(model.name, target, **dims, **others)
    except ConfigError:
        raise
    except (ValueError, TypeError) as err:
        raise ConfigError(config.source, where, f"match_params = {match!r}: {err}") from err
    return target
