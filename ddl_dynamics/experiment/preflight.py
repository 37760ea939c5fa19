"""The checks of a whole experiment before anything trains: every task × model pair resolved
and built once, its sizes bounded and every task run through `check_task`, so that a bad
option, size or task fails at load time rather than mid-run. Kept apart from `cells`, which
only resolves and expands pairs, since these checks build models and tasks to judge them."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import torch

from .._task import Task, make_task
from .._task_check import TaskCheckError, check_task
from ..models.base import Model, family, make_model
from ..models.params import count_parameters
from .cells import model_options, pair_cells, runs, task_kind
from .config import (
    MAX_DEPTH,
    MAX_LENGTH,
    MAX_PARAMS,
    MAX_STEPS,
    MAX_TOKENS,
    MAX_WIDTH,
    Cell,
    ConfigError,
    ConfigWarning,
    ExperimentConfig,
    TrainConfig,
    check_limit,
    coerce,
)
from .step import compiled_losses


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
    if any(cell.train.compile is True for cell in cells):
        compiled_losses.check(config.source)
    pairs = _pairs(config)
    for index, entry in enumerate(config.tasks):
        if not any(t == index for t, _ in pairs):
            kind = task_kind(entry.name)
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
        {task_kind(t.name) for t in config.tasks if not model.tasks or t.label in model.tasks}
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
