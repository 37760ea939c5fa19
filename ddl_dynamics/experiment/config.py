"""Experiment files: TOML → validated, frozen configs → cells.

An experiment lists tasks × models × seeds. Everything is checked when the file is
loaded, before anything trains: unknown keys, names and options, wrong types and values
that a task or model constructor rejects all raise one :class:`ConfigError` naming the
file, the key path and the closest valid name.

A model's options resolve from generic to specific::

    constructor defaults < train.ode_max_steps (as the solver cap ``max_steps``)
      < [defaults.model] < the task's ``model_defaults`` < the task entry's ``model``
      < the model entry's options < matching ``[[overrides]]``

and train options likewise (``TrainConfig`` defaults < ``[defaults.train]`` < task entry
< model entry < overrides). A cell's task always runs at its model's ``depth``; a task
entry's ``spec.depth`` is a shorthand for its ``model.depth``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from .._registry import did_you_mean
from .._task import TASKS, Task, list_tasks, make_task
from ..models.base import MODELS, list_models, make_model
from ..models.base import model_options as _model_options

#: Model arguments a task fixes; an experiment may not set them.
_TASK_DIMS = ("in_dim", "out_dim", "control_dim")
#: Statuses of a finished cell (a resumed run skips them); "failed" cells rerun.
FINISHED = ("ok", "diverged", "capped")
#: Statuses whose metrics enter statistics, figures and expectation checks.
COUNTED = ("ok", "capped")


class ConfigError(ValueError):
    """An experiment file (or dict) is invalid; the message names file, key and fix."""

    def __init__(self, source: str, where: str, message: str) -> None:
        self.source, self.where = source, where
        super().__init__(f"{source}: {where}: {message}" if where else f"{source}: {message}")


@dataclass(frozen=True)
class TrainConfig:
    """How one cell trains.

    ``n_train`` examples are sampled once per seed and reshuffled every epoch: a fixed
    training set is cheaper than fresh batches, deterministic, and gives a meaningful
    train metric. ``warmup`` is a fraction of ``steps`` when below 1, else a step count.
    ``max_seconds`` caps a cell's training time and ``ode_max_steps`` an ODE solver's
    steps per solve; a cell stopped by either is recorded as ``"capped"`` with what it
    reached. ``target_metric`` stops training early once the test metric reaches it.
    ``bf16`` turns on bfloat16 autocast on CUDA (ignored on CPU).
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
    target_metric: float | None = None
    max_seconds: float | None = None
    ode_max_steps: int | None = None
    device: str = "cpu"
    bf16: bool = False

    def __post_init__(self) -> None:
        positive = ("steps", "batch_size", "lr", "eval_every", "n_train", "n_test",
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


@dataclass(frozen=True)
class ModelEntry:
    name: str
    label: str
    options: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    #: Task labels this entry runs on (empty: every applicable task).
    tasks: tuple[str, ...] = ()


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
    same configuration is asked for again.
    """

    task: str
    task_label: str
    spec: dict[str, Any]
    model: str
    label: str
    config: dict[str, Any]
    train: TrainConfig
    seed: int

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
        only = dict(only or {})
        for axis, labels in only.items():
            known = {"task": [t.label for t in self.tasks], "model": [m.label for m in self.models]}
            if axis not in known:
                raise ValueError(f"only: unknown axis {axis!r}; use 'task' or 'model'")
            for label in labels:
                if label not in known[axis]:
                    raise ValueError(
                        f"only: no {axis} labelled {label!r} in experiment {self.name!r}; "
                        f"{axis}s: {', '.join(known[axis])}." + did_you_mean(label, known[axis])
                    )
        parser = _Parser(self.source)
        cells = []
        for t_index, entry in enumerate(self.tasks):
            if "task" in only and entry.label not in only["task"]:
                continue
            for m_index, model in enumerate(self.models):
                if "model" in only and model.label not in only["model"]:
                    continue
                if model.tasks and entry.label not in model.tasks:
                    continue
                resolved = parser.resolve(self, t_index, m_index)
                if resolved is None:
                    continue
                spec, config, train = resolved
                if device is not None:
                    train = dataclasses.replace(train, device=device)
                cells.extend(
                    Cell(entry.name, entry.label, spec, model.name, model.label, config, train, s)
                    for s in (self.seeds if seeds is None else seeds)
                )
        return cells

    def check(self) -> None:
        """Resolve and build every task × model pair once, so that bad options and values
        fail at load time, not mid-run (the caller's RNG state is left as it was)."""
        runnable: set[str] = set()
        with torch.random.fork_rng(devices=[]):
            for cell in self.cells(seeds=[0]):
                try:
                    cell.build()
                except (ValueError, TypeError) as err:
                    where = f"task {cell.task_label!r} × model {cell.label!r}"
                    raise ConfigError(self.source, where, str(err)) from err
                runnable.add(cell.task_label)
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
    text = path.read_text()
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
                         "overrides"), "")
        seeds = data.get("seeds", [0])
        if (not isinstance(seeds, list) or not seeds
                or not all(type(s) is int and s >= 0 for s in seeds)):
            raise self.fail("seeds", f"expected a non-empty list of integers ≥ 0, got {seeds!r}")
        defaults = self.table(data.get("defaults", {}), "defaults")
        self.keys(defaults, ("model", "train"), "defaults")
        tasks = tuple(self.task_entry(t, f"tasks[{i}]")
                      for i, t in enumerate(self.entries(data, "tasks")))
        models = tuple(self.model_entry(m, f"models[{i}]", tasks)
                       for i, m in enumerate(self.entries(data, "models")))
        for section, entries in (("tasks", tasks), ("models", models)):
            labels = [e.label for e in entries]
            for i, label in enumerate(labels):
                if label in labels[:i]:
                    raise self.fail(f"{section}[{i}].label",
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
        return ExperimentConfig(
            name=self.string(data, "name", "", "experiment"),
            description=self.string(data, "description", "", ""),
            seeds=tuple(seeds), tasks=tasks, models=models, model_defaults=model_defaults,
            train_defaults=train_defaults, overrides=overrides, source=self.source, text=text,
        )

    def entries(self, data: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
        value = data.get(key)
        if not isinstance(value, list) or not value:
            raise self.fail(key, f"expected at least one [[{key}]] entry")
        return [self.table(v, f"{key}[{i}]") for i, v in enumerate(value)]

    def task_entry(self, data: dict[str, Any], where: str) -> TaskEntry:
        self.keys(data, ("name", "label", "spec", "model", "train"), where)
        name = self.string(data, "name", where)
        names = list_tasks()
        if name not in TASKS:
            raise self.fail(f"{where}.name", f"unknown task {name!r}; tasks: "
                            f"{', '.join(names)}." + did_you_mean(name, names))
        spec = self.table(data.get("spec", {}), f"{where}.spec")
        model = self.table(data.get("model", {}), f"{where}.model")
        cls = TASKS.get(name)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        hints = typing.get_type_hints(cls)
        self.keys(spec, list(fields), f"{where}.spec")
        for key, value in spec.items():
            default = fields[key].default
            spec[key] = self.coerce(value, None if default is dataclasses.MISSING else default,
                                    hints.get(key), f"{where}.spec.{key}")
        if "depth" in spec:  # the task runs at its model's depth; see the module docstring
            model.setdefault("depth", spec.pop("depth"))
        return TaskEntry(name, self.string(data, "label", where, name), spec, model,
                         self.train_table(data.get("train", {}), f"{where}.train"))

    def model_entry(self, data: dict[str, Any], where: str,
                    tasks: Sequence[TaskEntry]) -> ModelEntry:
        name = self.string(data, "name", where)
        names = list_models()
        if name not in MODELS:
            raise self.fail(f"{where}.name", f"unknown model {name!r}; models: "
                            f"{', '.join(names)}." + did_you_mean(name, names))
        options = {k: v for k, v in data.items() if k not in ("name", "label", "train", "tasks")}
        return ModelEntry(
            name, self.string(data, "label", where, name),
            self.model_table(options, where, set(model_options(name))),
            self.train_table(data.get("train", {}), f"{where}.train"),
            self.known_labels(data.get("tasks", []), f"{where}.tasks", tasks),
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

    def override(self, data: Any, where: str, tasks: Sequence[TaskEntry],
                 models: Sequence[ModelEntry], option_names: set[str]) -> Override:
        data = self.table(data, where)
        self.keys(data, ("tasks", "models", "model", "train"), where)
        return Override(
            self.known_labels(data.get("tasks", []), f"{where}.tasks", tasks),
            self.known_labels(data.get("models", []), f"{where}.models", models),
            self.model_table(data.get("model", {}), f"{where}.model", option_names),
            self.train_table(data.get("train", {}), f"{where}.train"),
        )

    def model_table(self, data: Any, where: str, option_names: set[str]) -> dict[str, Any]:
        """Keys are checked here against every model in play; types per model on resolve."""
        data = self.table(data, where)
        for key in data:
            if key in _TASK_DIMS:
                raise self.fail(f"{where}.{key}", "set by the task; it cannot be configured")
            if key not in option_names:
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
        """``value`` if it has the option's type (an int may stand for a float), else fail."""
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
        self, config: ExperimentConfig, t_index: int, m_index: int
    ) -> tuple[dict[str, Any], dict[str, Any], TrainConfig] | None:
        """The (task spec, model config, train config) of one pair; None if not applicable."""
        entry, model = config.tasks[t_index], config.models[m_index]
        cls = TASKS.get(entry.name)
        if getattr(MODELS.get(model.name), "kind", "vector") != cls.kind:
            return None
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
        for layer in layers:
            for key, value in layer.items():
                if key in options:
                    resolved[key] = self.coerce(value, *options[key], f"{where}: {key}")
        spec = dataclasses.asdict(task)
        if "depth" in resolved:
            spec["depth"] = resolved["depth"]
        return spec, resolved, train


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
