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
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch

from .._registry import did_you_mean
from .._task import TASKS, Task, make_task
from .._task_check import TaskCheckError, check_task
from ..models.base import Model, family, make_model
from ..models.base import model_options as _model_options
from ..models.params import count_parameters, match_hidden, parameter_count
from .config import (
    DEFAULT_BASELINE,
    MAX_DEPTH,
    MAX_LENGTH,
    MAX_PARAMS,
    MAX_STEPS,
    MAX_TOKENS,
    MAX_WIDTH,
    TASK_DIMS,
    Cell,
    ConfigError,
    ConfigWarning,
    ExperimentConfig,
    ModelEntry,
    TaskEntry,
    TrainConfig,
    check_limit,
    check_seeds,
    coerce,
)
from .grid import expand
from .step import compiled_losses


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


def check_experiment(config: ExperimentConfig) -> None:
    """Resolve and build every task × model pair once and run `check_task` on every
    task so built, so that bad options, values and tasks fail at load time, not mid-run
    (the caller's RNG state is left as it was); every problem found is raised at once
    (`ConfigError.of`). Warn about ``[defaults.model]`` values a task replaces, and
    about rows that ``match_params`` sizes to the budget of another kind of row."""
    errors: list[ConfigError] = []
    built: dict[tuple[str, str], tuple[Task, Model]] = {}  # by task and row label
    cells: list[Cell] = []
    tasks: dict[str, tuple[str, Task]] = {}  # one per distinct task spec
    replaced: set[str] = set()
    with torch.random.fork_rng(devices=[]):
        for t_index, m_index in _pairs(config):
            try:
                cell = pair_cells(config, t_index, m_index, [0])[0]
            except ConfigError as err:
                errors.extend(err.errors)
                continue
            try:
                check_size(cell)
                task, model = cell.build()
            except (ValueError, TypeError, RuntimeError) as err:  # torch's errors: RuntimeError
                where = f"task {cell.task_label!r} × model {cell.label!r}"
                errors.append(ConfigError(config.source, where, str(err)))
                continue
            built[cell.task_label, cell.label] = task, model
            cells.append(cell)
            tasks.setdefault(repr((cell.task, sorted(cell.spec.items()))), (cell.task_label, task))
            replaced |= _replaced_defaults(config, cell, task)
        for label, task in tasks.values():
            try:
                _check_task(task, config.source, label)
            except ConfigError as err:
                errors.append(err)
    for note in sorted(replaced | _resized(config, cells, built)):
        warnings.warn(f"{config.source}: {note}", ConfigWarning, stacklevel=2)
    if any(cell.train.compile for cell in cells):
        compiled_losses.check(config.source)
    pairs = _pairs(config)
    for index, entry in enumerate(config.tasks):
        if not any(t == index for t, _ in pairs):
            kind = _task_kind(entry.name)
            errors.append(
                ConfigError(
                    config.source,
                    f"tasks[{index}]",
                    f"no model of kind {kind!r} in this experiment can run task {entry.label!r}",
                )
            )
    for index in range(len(config.models)):
        if not any(m == index for _, m in pairs):
            errors.append(ConfigError(config.source, f"models[{index}]", _idle(config, index)))
            errors += _unchecked(config, index)
    for index in range(len(config.comparisons)):
        try:
            compared_tasks(config, index, built)
        except ConfigError as err:
            errors.append(err)
    if errors:
        raise ConfigError.of(errors)


def _pairs(config: ExperimentConfig) -> list[tuple[int, int]]:
    """Every (task entry, model entry) index pair that runs."""
    return [
        (t, m)
        for t in range(len(config.tasks))
        for m in range(len(config.models))
        if runs(config, t, m)
    ]


def _idle(config: ExperimentConfig, m_index: int) -> str:
    """Why model entry ``m_index`` runs on no task, and what would make it run."""
    model = config.models[m_index]
    kind = family(model.name).kind
    kinds = sorted(
        {_task_kind(t.name) for t in config.tasks if not model.tasks or t.label in model.tasks}
    )
    what = f"its tasks {', '.join(model.tasks)} are " if model.tasks else "the tasks are "
    return (
        f"{model.label!r} runs on no task: it is a {kind} model and {what}"
        f"{' and '.join(kinds) or 'none'} tasks; give it a task of kind {kind!r} or drop it"
    )


def _unchecked(config: ExperimentConfig, m_index: int) -> list[ConfigError]:
    """The problems of the options of a model entry that runs on no task (so no pair
    resolves them): each option's type, and its train values at every grid value."""
    model = config.models[m_index]
    where = f"models[{m_index}]"
    options = model_options(model.name)
    errors = []
    for key, value in model.options.items():
        try:
            if key in options:
                coerce(value, *options[key])
        except ValueError as err:
            errors.append(ConfigError(config.source, f"{where}.{key}", str(err)))
    for knob, values in [(None, [None]), *model.tune.items()]:
        for value in values:
            try:
                TrainConfig(**{**model.train, **({} if knob is None else {knob: value})})
            except ValueError as err:
                at = f"{where}.train" if knob is None else f"{where}.tune.{knob}"
                errors.append(ConfigError(config.source, at, str(err)))
    return errors


def _resized(
    config: ExperimentConfig,
    cells: Sequence[Cell],
    built: Mapping[tuple[str, str], tuple[Task, Model]],
) -> set[str]:
    """Notes on rows that ``match_params`` sizes to the parameter count of a row of another
    kind: one set of weights for every step (tied, an ODE) against one per layer, where the
    same count means very different models (a 17k-parameter vector field)."""
    notes = set()
    for cell in cells:
        _, target = (
            built.get((cell.task_label, cell.match_params), (None, None))
            if isinstance(cell.match_params, str)
            else (None, None)
        )
        own = built[cell.task_label, cell.label][1]
        if (
            target is not None
            and cell.match_params != cell.label
            and (own.can_extrapolate != target.can_extrapolate)
        ):
            kinds = {True: "one set of weights for every step", False: "its own weights per layer"}
            notes.add(
                f"match_params = {cell.match_params!r} sizes {cell.label!r} "
                f"({kinds[own.can_extrapolate]}) to the {cell.params_target:,} parameters "
                f"of {cell.match_params!r} ({kinds[target.can_extrapolate]}) on task "
                f"{cell.task_label!r}, hidden = {cell.config.get('hidden')}; set "
                f"match_params on {cell.label!r} to a row of its kind if that is not meant"
            )
    return notes


def compared_tasks(
    config: ExperimentConfig,
    index: int,
    built: Mapping[tuple[str, str], tuple[Task, Model]] | None = None,
) -> list[str]:
    """The task labels on which declared comparison ``index`` is drawn: its ``tasks`` (each
    run by both rows and having its split) or every task both rows run; with the models
    ``built`` per (task, row), each must be able to run the split (an untied row cannot run
    more steps than its depth)."""
    comparison = config.comparisons[index]
    labels = [m.label for m in config.models]
    rows = labels.index(comparison.model), labels.index(comparison.control)
    where = f"comparisons[{index}]"
    shared = []
    for t_index, entry in enumerate(config.tasks):
        if comparison.tasks and entry.label not in comparison.tasks:
            continue
        both = all(runs(config, t_index, m_index) for m_index in rows)
        if not both and comparison.tasks:
            raise ConfigError(
                config.source,
                where,
                f"{comparison.model!r} and "
                f"{comparison.control!r} do not both run task {entry.label!r}",
            )
        task = make_task(entry.name, **entry.spec) if both else None
        splits = task.splits if task is not None else ()
        if both and comparison.split not in splits:
            raise ConfigError(
                config.source,
                f"{where}.split",
                f"task {entry.label!r} has no "
                f"split {comparison.split!r}; splits: {', '.join(splits)}",
            )
        if both:
            for label in (comparison.model, comparison.control):
                own, model = (built or {}).get((entry.label, label), (None, None))
                depth = None if model is None else model.depth
                steps = own.split_steps(comparison.split) if own is not None else depth
                if model is not None and not model.can_extrapolate and steps != depth:
                    raise ConfigError(
                        config.source,
                        f"{where}.split",
                        f"{label!r} cannot run split {comparison.split!r} of task "
                        f"{entry.label!r} ({steps} steps, and it has {depth} untied layers): "
                        "the comparison would have no seed; compare rows with tied = true, "
                        "or on another split",
                    )
            shared.append(entry.label)
    if not shared:
        raise ConfigError(
            config.source, where, f"{comparison.model!r} and {comparison.control!r} share no task"
        )
    return shared


def check_size(cell: Cell) -> None:
    """``ValueError`` for a model too large for any sane run, before anything allocates it:
    its sizes first (`MAX_DEPTH`, `MAX_WIDTH`; counting builds every layer),
    then its parameters (`MAX_PARAMS`), counted on the meta device."""
    for option, limit in (
        ("depth", MAX_DEPTH),
        ("width", MAX_WIDTH),
        ("hidden", MAX_WIDTH),
        ("max_steps", MAX_STEPS),
    ):
        value = cell.config.get(option)
        if isinstance(value, int):
            check_limit(f"{option} = {value}", value, limit)
    task = make_task(cell.task, **cell.spec)
    if task.kind == "sequence":  # sampling a split builds its whole data before training
        examples = max(cell.train.n_train, cell.train.n_val or 0, cell.train.n_test)
        for split in task.splits:
            length = task.split_steps(split)
            check_limit(f"sequence length {length:,} of split {split!r}", length, MAX_LENGTH)
            check_limit(
                f"{examples:,} examples × {length:,} tokens of split {split!r}",
                examples * length,
                MAX_TOKENS,
                " tokens",
            )
    with torch.device("meta"):
        count = count_parameters(
            make_model(
                cell.model,
                in_dim=task.in_dim,
                out_dim=task.out_dim,
                control_dim=task.control_dim,
                **cell.config,
            )
        )
    check_limit(
        f"a model of {count:,} parameters (≈ {16 * count / 1e9:,.0f} GB to train: "
        "weights, gradients and AdamW state)",
        count,
        MAX_PARAMS,
        " parameters",
    )


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


def _task_kind(name: str) -> str:
    """The kind (vector or sequence) of a registered task: its factory is a `Task`."""
    return cast("type[Task]", TASKS.get(name)).kind


def same_kind(entry: TaskEntry, model: ModelEntry) -> bool:
    """Whether the model's kind (vector or sequence) is the task's."""
    return family(model.name).kind == _task_kind(entry.name)


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


def _check_task(task: Task, source: str, label: str) -> None:
    """`check_task` of one task of an experiment, failing as a `ConfigError`."""
    try:
        check_task(task)
    except Exception as err:  # a user's sampler may fail in any way
        why = str(err) if isinstance(err, TaskCheckError) else f"{type(err).__name__}: {err}"
        raise ConfigError(source, f"task {label!r}", f"fails check_task: {why}") from err


def _replaced_defaults(config: ExperimentConfig, cell: Cell, task: Task) -> set[str]:
    """Notes on the ``[defaults.model]`` values that the task's ``model_defaults`` replaced
    in ``cell`` (a value its task entry, model entry or an override sets is the file's own
    choice, and silences the note)."""
    entry = next(t for t in config.tasks if t.label == cell.task_label)
    model = next(m for m in config.models if m.label == cell.label)
    explicit = {
        *entry.model,
        *model.options,
        *(k for o in config.overrides if o.matches(entry.label, model.label) for k in o.model),
    }
    defaults = config.model_defaults
    return {
        f"[defaults.model] {key} = {defaults[key]!r} does not apply to task "
        f"{cell.task_label!r}, which sets {key} = {value!r}"
        for key, value in task.model_defaults.items()
        if key in defaults and key not in explicit and defaults[key] != value
    }
