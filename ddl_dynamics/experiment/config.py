"""Experiment files: TOML → validated, frozen configs → cells.

An experiment lists tasks × models × seeds. Everything is checked when the file is
loaded, before anything trains: unknown keys, names and options, wrong types, non-finite
numbers, seeds outside 0 ≤ seed < 2⁶³ or given twice, a name that is not one path
component, values that a task or model constructor rejects, and tasks that fail
:func:`check_task` all raise one :class:`ConfigError` naming the file, the key path and
the closest valid name.

A model's options resolve from generic to specific::

    constructor defaults < train.ode_max_steps (as the solver cap ``max_steps``)
      < [defaults.model] < the task's ``model_defaults`` < the task entry's ``model``
      < the model entry's options < matching ``[[overrides]]``

and train options likewise (``TrainConfig`` defaults < ``[defaults.train]`` < task entry
< model entry < overrides). A cell's task always runs at its model's ``depth``; a task
entry's ``spec.depth`` is a shorthand for its ``model.depth``.

Two keys configure a cell rather than its model. ``match_params`` (in any model table:
``[defaults.model]``, a task entry's ``model``, a model entry, an override) sizes ``hidden``
so that the model has, on the same task, the parameter count of another model label of the
file or a given number, within ±10% (:func:`~ddl_dynamics.models.params.match_hidden`).
``baseline`` (a model entry's, or the file's default at the top level; default: the label
``resnet`` if there is one) names the row a model is compared with; a row that is some row's
baseline heads its family and takes no default baseline itself.

Only ``[defaults.model]`` ranks below a task's ``model_defaults``: a task that needs, say,
width 1 replaces an experiment-wide ``width = 32``, as suites want, and a
:class:`ConfigWarning` names each value so replaced (an error would forbid the normal
case; a value set for the pair itself always wins over the task's).

A task entry *sweeps* a spec field by giving a list of values::

    spec = { event = ["overwrite", "reflect"], p = [0, 0.5, 1] }

expands into one task entry per combination (the first field outermost), each value checked
like a single one, labelled ``switched[event=overwrite,p=0]`` and so on: the entry's label,
then every swept field and its value as written. A field whose values are themselves lists
(a ``list`` or ``tuple`` type) takes a list as one value; only a list of lists sweeps it.
The entry's own label still names the whole sweep wherever task labels are given (a model
entry's ``tasks``, an override's ``tasks``, ``only``), and each expanded label one entry.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import tomllib
import types
import typing
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from .._registry import did_you_mean
from .._task import TASKS, Task, check_task, list_tasks, make_task
from ..models.base import MODELS, list_models, make_model
from ..models.base import model_options as _model_options
from ..models.params import match_hidden, parameter_count

#: Model arguments a task fixes; an experiment may not set them.
_TASK_DIMS = ("in_dim", "out_dim", "control_dim")
#: Statuses of a finished cell (a resumed run skips them); "failed" cells rerun.
FINISHED = ("ok", "diverged", "capped")
#: Statuses whose metrics enter statistics, figures and expectation checks. A capped,
#: diverged or failed cell is a failure of that model on that seed, never a result.
COUNTED = ("ok",)
#: The baseline of every row that names none, when the file has a model of this label.
DEFAULT_BASELINE = "resnet"
#: Seeds are stored as SQLite integers: 0 ≤ seed < SEED_LIMIT.
SEED_LIMIT = 2**63


class ConfigError(ValueError):
    """An experiment file (or dict) is invalid; the message names file, key and fix."""

    def __init__(self, source: str, where: str, message: str) -> None:
        self.source, self.where = source, where
        super().__init__(f"{source}: {where}: {message}" if where else f"{source}: {message}")


class ConfigWarning(UserWarning):
    """An experiment value that does not apply where one might expect it to."""


@dataclass(frozen=True)
class TrainConfig:
    """How one cell trains.

    ``n_train`` examples are sampled once per seed and reshuffled every epoch: a fixed
    training set is cheaper than fresh batches, deterministic, and gives a meaningful
    train metric. ``n_val`` (default ``n_test``) validation examples score the training
    curve and ``target_metric``, which stops training early once the val metric reaches
    it; the ``n_test`` test examples are scored once, at the end. ``warmup`` is a fraction
    of ``steps`` when below 1, else a step count. A cell's budget is work: ``steps``, and
    for ODE models ``ode_max_steps`` solver steps per solve. ``max_seconds`` is a safety
    net only; a cell stopped by it or by the solver cap is recorded as ``"capped"``, a
    failure. ``bf16`` turns on bfloat16 autocast on CUDA (ignored on CPU).
    """

    steps: int = 1000
    batch_size: int = 128
    lr: float = 3e-3
    weight_decay: float = 0.0
    warmup: float = 0.05
    grad_clip: float = 1.0
    eval_every: int = 100
    n_train: int = 4096
    n_test: int = 1024
    n_val: int | None = None
    target_metric: float | None = None
    max_seconds: float | None = None
    ode_max_steps: int | None = None
    device: str = "cpu"
    bf16: bool = False

    def __post_init__(self) -> None:
        _check_finite(self)
        if self.n_val is None:
            object.__setattr__(self, "n_val", self.n_test)
        positive = ("steps", "batch_size", "lr", "eval_every", "n_train", "n_test", "n_val",
                    "max_seconds", "ode_max_steps")
        for name in positive:
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        for name in ("weight_decay", "warmup", "grad_clip"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be non-negative, got {getattr(self, name)}")
        if self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")

    @property
    def warmup_steps(self) -> int:
        return round(self.warmup * self.steps) if self.warmup < 1 else int(self.warmup)


@dataclass(frozen=True)
class TaskEntry:
    name: str
    label: str
    spec: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    #: The label of the ``[[tasks]]`` entry a sweep expanded this one from ("": not swept).
    sweep: str = ""


@dataclass(frozen=True)
class ModelEntry:
    name: str
    label: str
    options: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    #: Task labels this entry runs on (empty: every applicable task).
    tasks: tuple[str, ...] = ()
    #: The label of the row this one is compared with (None: the file's default).
    baseline: str | None = None


@dataclass(frozen=True)
class Override:
    """Model and train options for the cells whose task and model labels match."""

    tasks: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    model: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)

    def matches(self, task: str, model: str) -> bool:
        return (not self.tasks or task in self.tasks) and (not self.models or model in self.models)


@dataclass(frozen=True)
class Cell:
    """One unit of work: a task, a model, a train config and a seed, all fully resolved.

    ``key`` hashes everything here, so a result row is found again exactly when the
    same configuration is asked for again (changing a row's baseline reruns it).
    """

    task: str
    task_label: str
    spec: dict[str, Any]
    model: str
    label: str
    config: dict[str, Any]
    train: TrainConfig
    seed: int
    #: The label of the row this one is compared with; None for a row that has none.
    baseline: str | None = None
    #: What ``match_params`` asked for (a model label or a count), and the parameter count
    #: it resolved to (``config["hidden"]`` is sized for it; :attr:`RunResult.params` is
    #: the count measured).
    match_params: str | int | None = None
    params_target: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "train": dataclasses.asdict(self.train)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Cell:
        return cls(**{**data, "train": TrainConfig(**data["train"])})

    @property
    def key(self) -> str:
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def build(self) -> tuple[Task, torch.nn.Module]:
        """The task and a freshly initialised model (``torch.manual_seed(seed)`` first)."""
        list_tasks()  # registers the built-in tasks in a fresh worker process
        task = make_task(self.task, **self.spec)
        torch.manual_seed(self.seed)
        model = make_model(
            self.model, in_dim=task.in_dim, out_dim=task.out_dim,
            control_dim=task.control_dim, **self.config,
        )
        return task, model


@dataclass(frozen=True)
class ExperimentConfig:
    """A validated experiment: build with :func:`load_experiment` or :meth:`from_dict`."""

    name: str
    seeds: tuple[int, ...]
    tasks: tuple[TaskEntry, ...]
    models: tuple[ModelEntry, ...]
    model_defaults: dict[str, Any] = field(default_factory=dict)
    train_defaults: dict[str, Any] = field(default_factory=dict)
    overrides: tuple[Override, ...] = ()
    #: The default baseline label as the file gives it (None: ``resnet`` if present).
    baseline: str | None = None
    description: str = ""
    source: str = "<dict>"
    text: str = ""

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], source: str = "<dict>", text: str = ""
    ) -> ExperimentConfig:
        """Parse and fully validate an experiment given as the TOML's dict."""
        config = _Parser(source).experiment(data, text)
        config.check()
        return config

    def cells(
        self,
        seeds: Sequence[int] | None = None,
        device: str | None = None,
        only: Mapping[str, Sequence[str]] | None = None,
    ) -> list[Cell]:
        """Every applicable task × model × seed cell, optionally filtered.

        ``only`` maps ``"task"`` / ``"model"`` to the labels to keep.
        """
        if seeds is not None:
            try:
                seeds = check_seeds(seeds)
            except ValueError as err:
                raise ValueError(f"seeds: {err}") from None
        only = dict(only or {})
        for axis, labels in only.items():
            entries = {"task": self.tasks, "model": self.models}.get(axis)
            if entries is None:
                raise ValueError(f"only: unknown axis {axis!r}; use 'task' or 'model'")
            named = [_named(label, entries) for label in labels]
            for label, found in zip(labels, named, strict=True):
                if not found:
                    known = _references(entries)
                    raise ValueError(
                        f"only: no {axis} labelled {label!r} in experiment {self.name!r}; "
                        f"{axis}s: {', '.join(known)}." + did_you_mean(label, known)
                    )
            only[axis] = [label for found in named for label in found]
        parser = _Parser(self.source)
        cells = []
        for t_index, entry in enumerate(self.tasks):
            if "task" in only and entry.label not in only["task"]:
                continue
            for m_index, model in enumerate(self.models):
                if "model" in only and model.label not in only["model"]:
                    continue
                if not self.runs(t_index, m_index):
                    continue
                pair = parser.resolve(self, t_index, m_index)
                train = pair.train if device is None else dataclasses.replace(pair.train,
                                                                              device=device)
                cells.extend(
                    Cell(entry.name, entry.label, pair.spec, model.name, model.label,
                         pair.config, train, s, baseline=self.baseline_on(t_index, m_index),
                         match_params=pair.match_params, params_target=pair.params_target)
                    for s in (self.seeds if seeds is None else seeds)
                )
        return cells

    def runs(self, t_index: int, m_index: int) -> bool:
        """Whether model entry ``m_index`` runs on task entry ``t_index``."""
        entry, model = self.tasks[t_index], self.models[m_index]
        return (not model.tasks or entry.label in model.tasks) and _same_kind(entry, model)

    def baseline_on(self, t_index: int, m_index: int) -> str | None:
        """The baseline label of a row on a task: its own, else the file's default (which
        is dropped where it does not run); None for a row that is some row's baseline."""
        model = self.models[m_index]
        labels = [m.label for m in self.models]
        if model.baseline is not None:
            if not self.runs(t_index, labels.index(model.baseline)):
                raise ConfigError(
                    self.source, f"models[{m_index}].baseline",
                    f"{model.baseline!r} does not run on task {self.tasks[t_index].label!r}, "
                    f"which {model.label!r} runs on; add the task to its tasks or name another "
                    "baseline",
                )
            return model.baseline
        default = self.baseline or (DEFAULT_BASELINE if DEFAULT_BASELINE in labels else None)
        heads = {default, *(m.baseline for m in self.models)}
        if default is None or model.label in heads or not self.runs(t_index,
                                                                    labels.index(default)):
            return None
        return default

    def check(self) -> None:
        """Resolve and build every task × model pair once and run :func:`check_task` on
        every task so built, so that bad options, values and tasks fail at load time, not
        mid-run (the caller's RNG state is left as it was); warn about ``[defaults.model]``
        values a task replaces."""
        runnable: set[str] = set()
        tasks: dict[str, tuple[str, Task]] = {}  # one per distinct task spec
        replaced: set[str] = set()
        with torch.random.fork_rng(devices=[]):
            for cell in self.cells(seeds=[0]):
                try:
                    task, _ = cell.build()
                except (ValueError, TypeError) as err:
                    where = f"task {cell.task_label!r} × model {cell.label!r}"
                    raise ConfigError(self.source, where, str(err)) from err
                runnable.add(cell.task_label)
                tasks.setdefault(repr((cell.task, sorted(cell.spec.items()))),
                                 (cell.task_label, task))
                replaced |= _replaced_defaults(self, cell, task)
            for label, task in tasks.values():
                _check_task(task, self.source, label)
        for note in sorted(replaced):
            warnings.warn(f"{self.source}: {note}", ConfigWarning, stacklevel=2)
        for index, entry in enumerate(self.tasks):
            if entry.label not in runnable:
                kind = TASKS.get(entry.name).kind
                raise ConfigError(
                    self.source, f"tasks[{index}]",
                    f"no model of kind {kind!r} in this experiment can run task {entry.label!r}",
                )


def load_experiment(path: str | Path) -> ExperimentConfig:
    """Read and validate an experiment TOML file (raises :class:`ConfigError`)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(str(path), "", "no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(str(path), "", f"not a TOML text file ({err.reason} at byte "
                                         f"{err.start})") from err
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(str(path), "", f"malformed TOML: {err}") from err
    data.setdefault("name", path.stem)
    return ExperimentConfig.from_dict(data, source=str(path), text=text)


def model_options(name: str) -> dict[str, tuple[Any, Any]]:
    """``option → (default, type hint)`` an experiment may set (the task fixes the dims)."""
    return {k: v for k, v in _model_options(name).items() if k not in _TASK_DIMS}


class _Parser:
    """Turns the TOML's dict into entries, checking keys and types as it goes."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, message: str) -> ConfigError:
        return ConfigError(self.source, where, message)

    def table(self, value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(where, f"expected a table, got {type(value).__name__}")
        return dict(value)

    def keys(self, data: Mapping[str, Any], allowed: Sequence[str], where: str) -> None:
        for key in data:
            if key not in allowed:
                raise self.fail(
                    f"{where}.{key}" if where else key,
                    f"unknown key; valid keys: {', '.join(allowed)}."
                    + did_you_mean(key, list(allowed)),
                )

    def string(self, data: Mapping[str, Any], key: str, where: str, default: Any = None) -> str:
        value = data.get(key, default)
        if not isinstance(value, str):
            raise self.fail(f"{where}.{key}", f"expected a string, got {value!r}")
        return value

    def labels(self, value: Any, where: str) -> tuple[str, ...]:
        value = [value] if isinstance(value, str) else value
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(where, f"expected a label or a list of labels, got {value!r}")
        return tuple(value)

    def experiment(self, data: Mapping[str, Any], text: str) -> ExperimentConfig:
        data = self.table(data, "")
        self.keys(data, ("name", "description", "seeds", "defaults", "tasks", "models",
                         "overrides", "baseline"), "")
        try:
            seeds = check_seeds(data.get("seeds", [0]))
        except ValueError as err:
            raise self.fail("seeds", str(err)) from None
        name = self.string(data, "name", "", "experiment")
        if name in ("", ".", "..") or Path(name).name != name or "\\" in name:
            raise self.fail("name", f"{name!r} is not one path component (it names the run "
                                    "folder runs/<name>): no '/', '\\' or '..'")
        defaults = self.table(data.get("defaults", {}), "defaults")
        self.keys(defaults, ("model", "train"), "defaults")
        tasks = tuple(entry for i, t in enumerate(self.entries(data, "tasks"))
                      for entry in self.task_entries(t, f"tasks[{i}]"))
        models = tuple(self.model_entry(m, f"models[{i}]", tasks)
                       for i, m in enumerate(self.entries(data, "models")))
        for section, entries in (("tasks", tasks), ("models", models)):
            labels = [e.label for e in entries]
            for i, label in enumerate(labels):
                if label in labels[:i]:
                    raise self.fail(f"{section}.label",
                                    f"duplicate label {label!r}; give each entry its own label")
        option_names = {o for m in models for o in model_options(m.name)}
        model_defaults = self.model_table(defaults.get("model", {}), "defaults.model",
                                          option_names)
        train_defaults = self.train_table(defaults.get("train", {}), "defaults.train")
        for i, entry in enumerate(tasks):
            self.model_table(entry.model, f"tasks[{i}].model", option_names)
        overrides = tuple(
            self.override(o, f"overrides[{i}]", tasks, models, option_names)
            for i, o in enumerate(data.get("overrides", []))
        )
        config = ExperimentConfig(
            name=name,
            description=self.string(data, "description", "", ""),
            seeds=seeds, tasks=tasks, models=models, model_defaults=model_defaults,
            train_defaults=train_defaults, overrides=overrides,
            baseline=self.string(data, "baseline", "") if "baseline" in data else None,
            source=self.source, text=text,
        )
        self.references(config)
        return config

    def references(self, config: ExperimentConfig) -> None:
        """Every ``match_params`` is a model label of the file or a count ≥ 1, and every
        ``baseline`` a model label of the file other than the row's own."""
        tables = [("defaults.model", config.model_defaults),
                  *((f"tasks[{i}].model", t.model) for i, t in enumerate(config.tasks)),
                  *((f"models[{i}]", m.options) for i, m in enumerate(config.models)),
                  *((f"overrides[{i}].model", o.model) for i, o in enumerate(config.overrides))]
        for where, table in tables:
            value = table.get("match_params")
            if isinstance(value, str):
                self.known_labels(value, f"{where}.match_params", config.models)
            elif value is not None and (type(value) is not int or value < 1):
                raise self.fail(f"{where}.match_params",
                                f"expected a model label or a parameter count ≥ 1, got {value!r}")
        if config.baseline is not None:
            self.known_labels(config.baseline, "baseline", config.models)
        for i, model in enumerate(config.models):
            if model.baseline is not None:
                self.known_labels(model.baseline, f"models[{i}].baseline", config.models)
                if model.baseline == model.label:
                    raise self.fail(f"models[{i}].baseline", "a row cannot be its own baseline")

    def entries(self, data: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
        value = data.get(key)
        if not isinstance(value, list) or not value:
            raise self.fail(key, f"expected at least one [[{key}]] entry")
        return [self.table(v, f"{key}[{i}]") for i, v in enumerate(value)]

    def task_entries(self, data: dict[str, Any], where: str) -> list[TaskEntry]:
        """One ``[[tasks]]`` entry, or one per combination of the spec values it sweeps."""
        self.keys(data, ("name", "label", "spec", "model", "train"), where)
        name = self.string(data, "name", where)
        names = list_tasks()
        if name not in TASKS:
            raise self.fail(f"{where}.name", f"unknown task {name!r}; tasks: "
                            f"{', '.join(names)}." + did_you_mean(name, names))
        label = self.string(data, "label", where, name)
        spec = self.table(data.get("spec", {}), f"{where}.spec")
        model = self.table(data.get("model", {}), f"{where}.model")
        train = self.train_table(data.get("train", {}), f"{where}.train")
        cls = TASKS.get(name)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        hints = typing.get_type_hints(cls)
        self.keys(spec, list(fields), f"{where}.spec")
        choices: dict[str, list[tuple[str, Any]]] = {}  # field → (its label tag, value)
        for key, value in spec.items():
            default = fields[key].default
            default = None if default is dataclasses.MISSING else default
            swept = _swept(value, default, hints.get(key))
            if swept == []:
                raise self.fail(f"{where}.spec.{key}", "an empty list sweeps nothing; give at "
                                "least one value")
            here = f"{where}.spec.{key}"
            values = [value] if swept is None else swept
            coerced = [self.coerce(v, default, hints.get(key),
                                   here if swept is None else f"{here}[{j}]")
                       for j, v in enumerate(values)]
            for j, v in enumerate(coerced):
                if v in coerced[:j]:
                    raise self.fail(f"{here}[{j}]",
                                    f"{values[j]!r} is swept twice; list each value once")
            tags = [""] if swept is None else [f"{key}={_spelled(v)}" for v in swept]
            choices[key] = list(zip(tags, coerced, strict=True))
        entries = []
        for combination in itertools.product(*choices.values()):
            resolved = {k: v for k, (_, v) in zip(choices, combination, strict=True)}
            tag = ",".join(t for t, _ in combination if t)
            entry_model = dict(model)
            if "depth" in resolved:  # the task runs at its model's depth; see the docstring
                entry_model.setdefault("depth", resolved.pop("depth"))
            entries.append(TaskEntry(name, f"{label}[{tag}]" if tag else label, resolved,
                                     entry_model, train, label if tag else ""))
        return entries

    def model_entry(self, data: dict[str, Any], where: str,
                    tasks: Sequence[TaskEntry]) -> ModelEntry:
        name = self.string(data, "name", where)
        names = list_models()
        if name not in MODELS:
            raise self.fail(f"{where}.name", f"unknown model {name!r}; models: "
                            f"{', '.join(names)}." + did_you_mean(name, names))
        entry_keys = ("name", "label", "train", "tasks", "baseline")
        options = {k: v for k, v in data.items() if k not in entry_keys}
        return ModelEntry(
            name, self.string(data, "label", where, name),
            self.model_table(options, where, set(model_options(name))),
            self.train_table(data.get("train", {}), f"{where}.train"),
            self.task_labels(data.get("tasks", []), f"{where}.tasks", tasks),
            self.string(data, "baseline", where) if "baseline" in data else None,
        )

    def known_labels(self, value: Any, where: str, entries: Sequence[Any]) -> tuple[str, ...]:
        """Labels that must each name one of ``entries``."""
        labels = self.labels(value, where)
        known = [e.label for e in entries]
        for label in labels:
            if label not in known:
                raise self.fail(where, f"no entry labelled {label!r}; labels: "
                                f"{', '.join(known)}." + did_you_mean(label, known))
        return labels

    def task_labels(self, value: Any, where: str, tasks: Sequence[TaskEntry]) -> tuple[str, ...]:
        """The task entries that labels name: each its own, or every entry of a sweep."""
        found = []
        for label in self.labels(value, where):
            named = _named(label, tasks)
            if not named:
                known = _references(tasks)
                raise self.fail(where, f"no entry labelled {label!r}; labels: "
                                f"{', '.join(known)}." + did_you_mean(label, known))
            found += named
        return tuple(dict.fromkeys(found))

    def override(self, data: Any, where: str, tasks: Sequence[TaskEntry],
                 models: Sequence[ModelEntry], option_names: set[str]) -> Override:
        data = self.table(data, where)
        self.keys(data, ("tasks", "models", "model", "train"), where)
        return Override(
            self.task_labels(data.get("tasks", []), f"{where}.tasks", tasks),
            self.known_labels(data.get("models", []), f"{where}.models", models),
            self.model_table(data.get("model", {}), f"{where}.model", option_names),
            self.train_table(data.get("train", {}), f"{where}.train"),
        )

    def model_table(self, data: Any, where: str, option_names: set[str]) -> dict[str, Any]:
        """Keys are checked here against every model in play (and ``match_params``); types
        per model on resolve, ``match_params`` values once every label is known."""
        data = self.table(data, where)
        for key in data:
            if key in _TASK_DIMS:
                raise self.fail(f"{where}.{key}", "set by the task; it cannot be configured")
            if key not in option_names and key != "match_params":
                raise self.fail(
                    f"{where}.{key}",
                    f"unknown model option; options: {', '.join(sorted(option_names))}."
                    + did_you_mean(key, sorted(option_names)),
                )
        return data

    def train_table(self, data: Any, where: str) -> dict[str, Any]:
        data = self.table(data, where)
        fields = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
        hints = typing.get_type_hints(TrainConfig)
        self.keys(data, list(fields), where)
        return {k: self.coerce(v, fields[k], hints[k], f"{where}.{k}") for k, v in data.items()}

    def coerce(self, value: Any, default: Any, hint: Any, where: str) -> Any:
        """``value`` if it has the option's type (an int may stand for a float) and is
        finite, else fail."""
        if isinstance(value, float) and not math.isfinite(value):
            raise self.fail(where, f"expected a finite number, got {value!r}")
        allowed, choices = _allowed(default, hint)
        if choices is not None and value not in choices:
            raise self.fail(where, f"{value!r} is not one of {', '.join(map(repr, choices))}."
                            + did_you_mean(str(value), [str(c) for c in choices]))
        if allowed is None:
            return value
        if type(value) is int and float in allowed and int not in allowed:
            return float(value)
        if isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed):
            return value
        names = " or ".join(t.__name__ for t in allowed)
        raise self.fail(where, f"expected {names}, got {type(value).__name__} {value!r}")

    def resolve(
        self, config: ExperimentConfig, t_index: int, m_index: int, chain: tuple[str, ...] = ()
    ) -> _Pair:
        """Task spec, model config and train config of one pair of entries of the same kind
        (``chain``: the labels whose ``match_params`` led here, to catch cycles)."""
        entry, model = config.tasks[t_index], config.models[m_index]
        where = f"task {entry.label!r} × model {model.label!r}"
        overrides = [o for o in config.overrides if o.matches(entry.label, model.label)]
        train_layers = [config.train_defaults, entry.train, model.train,
                        *(o.train for o in overrides)]
        try:
            train = TrainConfig(**{k: v for layer in train_layers for k, v in layer.items()})
            task = make_task(entry.name, **entry.spec)
        except ValueError as err:
            raise self.fail(where, str(err)) from err
        options = model_options(model.name)
        layers = [
            {"max_steps": train.ode_max_steps} if train.ode_max_steps else {},
            config.model_defaults, dict(task.model_defaults), entry.model, model.options,
            *(o.model for o in overrides),
        ]
        resolved = {name: default for name, (default, _) in options.items()}
        match = None
        for layer in layers:
            for key, value in layer.items():
                if key in options:
                    resolved[key] = self.coerce(value, *options[key], f"{where}: {key}")
                elif key == "match_params":
                    match = value
        spec = dataclasses.asdict(task)
        if "depth" in resolved:
            spec["depth"] = resolved["depth"]
        target = None
        if match is not None:
            dims = {"in_dim": task.in_dim, "out_dim": task.out_dim,
                    "control_dim": task.control_dim}
            target = self.match(config, t_index, m_index, match, dims, resolved, chain)
        return _Pair(spec, resolved, train, match, target)

    def match(self, config: ExperimentConfig, t_index: int, m_index: int, match: str | int,
              dims: dict[str, int], resolved: dict[str, Any], chain: tuple[str, ...]) -> int:
        """Size ``resolved["hidden"]`` for the parameter count ``match`` asks for on this
        task, and return that count (a row that names itself keeps its size)."""
        entry, model = config.tasks[t_index], config.models[m_index]
        where = f"task {entry.label!r} × model {model.label!r}"
        if match in chain:
            cycle = " → ".join((*chain, model.label, match))
            raise self.fail(where, f"match_params refers back to itself: {cycle}")
        try:
            if match == model.label:
                return parameter_count(model.name, **dims, **resolved)
            if isinstance(match, str):
                index = [m.label for m in config.models].index(match)
                if not _same_kind(entry, config.models[index]):
                    raise self.fail(where, f"match_params: model {match!r} cannot run task "
                                           f"{entry.label!r}, so it has no parameter count there")
                reference = self.resolve(config, t_index, index, (*chain, model.label))
                target = parameter_count(config.models[index].name, **dims, **reference.config)
            else:
                target = match
            others = {k: v for k, v in resolved.items() if k != "hidden"}
            resolved["hidden"] = match_hidden(model.name, target, **dims, **others)
        except ConfigError:
            raise
        except (ValueError, TypeError) as err:
            raise self.fail(where, f"match_params = {match!r}: {err}") from err
        return target


@dataclass(frozen=True)
class _Pair:
    """One task entry × model entry, resolved (see :meth:`_Parser.resolve`)."""

    spec: dict[str, Any]
    config: dict[str, Any]
    train: TrainConfig
    match_params: str | int | None
    params_target: int | None


def _named(label: str, entries: Sequence[TaskEntry] | Sequence[ModelEntry]) -> list[str]:
    """The labels of the entries ``label`` names: the one labelled so, or a sweep's entries."""
    return [e.label for e in entries if label in (e.label, getattr(e, "sweep", ""))]


def _references(entries: Sequence[TaskEntry] | Sequence[ModelEntry]) -> list[str]:
    """Every label that names some of ``entries``: sweeps first, then each entry's."""
    sweeps = [getattr(e, "sweep", "") for e in entries]
    return [r for r in dict.fromkeys([*sweeps, *(e.label for e in entries)]) if r]


def _sequence_typed(default: Any, hint: Any) -> bool:
    """Whether a spec field's single values are lists (a ``list`` or ``tuple`` type)."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union,
                                                                   types.UnionType) else (hint,)
    return isinstance(default, list | tuple) or any(
        a in (list, tuple) or typing.get_origin(a) in (list, tuple) for a in args)


def _swept(value: Any, default: Any, hint: Any) -> list[Any] | None:
    """The values a spec entry sweeps, or None when it is one value: any list sweeps, but a
    field whose values are lists is swept only by a non-empty list of lists."""
    if not isinstance(value, list):
        return None
    if _sequence_typed(default, hint) and not (value and all(isinstance(v, list)
                                                             for v in value)):
        return None
    return value


def _spelled(value: Any) -> str:
    """A spec value as an experiment file writes it, for labels: ``0.05``, ``true``, ``a``."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(map(_spelled, value)) + "]"
    return str(value)


def _same_kind(entry: TaskEntry, model: ModelEntry) -> bool:
    return getattr(MODELS.get(model.name), "kind", "vector") == TASKS.get(entry.name).kind


def _allowed(default: Any, hint: Any) -> tuple[tuple[type, ...] | None, tuple[Any, ...] | None]:
    """The Python types an option accepts and, for ``Literal`` hints, its valid values."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union,
                                                                   types.UnionType) else (hint,)
    choices = tuple(v for a in args if typing.get_origin(a) is Literal for v in typing.get_args(a))
    allowed = tuple(a for a in args if isinstance(a, type) and a is not type(None))
    allowed += tuple({type(c) for c in choices} - set(allowed))
    if not allowed and hint is None and default is not None:
        allowed = (type(default),)
    return allowed or None, choices or None


def check_seeds(seeds: Any) -> tuple[int, ...]:
    """``seeds`` as a tuple if it is a non-empty list of distinct integers
    0 ≤ seed < 2⁶³ (one cell per seed, stored as an SQLite integer); else ``ValueError``."""
    if not isinstance(seeds, list | tuple) or not seeds:
        raise ValueError(f"expected a non-empty list of integers, got {seeds!r}")
    for i, seed in enumerate(seeds):
        if type(seed) is not int or not 0 <= seed < SEED_LIMIT:
            raise ValueError(f"seed {seed!r} is not an integer 0 ≤ seed < 2**63")
        if seed in seeds[:i]:
            raise ValueError(f"seed {seed} is given twice (each seed is one cell)")
    return tuple(seeds)


def _check_finite(config: Any) -> None:
    """Every float field of a dataclass is finite (NaN and ±inf are never meant)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{f.name} must be a finite number, got {value}")


def _check_task(task: Task, source: str, label: str) -> None:
    """:func:`check_task` of one task of an experiment, failing as a :class:`ConfigError`."""
    try:
        check_task(task)
    except Exception as err:  # a user's sampler may fail in any way
        why = str(err) if isinstance(err, AssertionError) else f"{type(err).__name__}: {err}"
        raise ConfigError(source, f"task {label!r}", f"fails check_task: {why}") from err


def _replaced_defaults(config: ExperimentConfig, cell: Cell, task: Task) -> set[str]:
    """Notes on the ``[defaults.model]`` values that the task's ``model_defaults`` replaced
    in ``cell`` (a value its task entry, model entry or an override sets is the file's own
    choice, and silences the note)."""
    entry = next(t for t in config.tasks if t.label == cell.task_label)
    model = next(m for m in config.models if m.label == cell.label)
    explicit = {*entry.model, *model.options,
                *(k for o in config.overrides if o.matches(entry.label, model.label)
                  for k in o.model)}
    defaults = config.model_defaults
    return {
        f"[defaults.model] {key} = {defaults[key]!r} does not apply to task "
        f"{cell.task_label!r}, which sets {key} = {value!r}"
        for key, value in task.model_defaults.items()
        if key in defaults and key not in explicit and defaults[key] != value
    }
