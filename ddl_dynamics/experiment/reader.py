"""Experiment files: TOML → a checked `ExperimentConfig`.

Everything is checked when the file is loaded, before anything trains: unknown keys, names
and options, wrong types, non-finite numbers, seeds outside 0 ≤ seed < 2⁶³ or given twice, a
name or label that cannot name a file (`check_name`), baselines that name each other in a
circle, sizes and budgets beyond any sane run (`check_limit`), values that a task or model
constructor rejects, and tasks that fail `check_task` are each a `ConfigError` naming the
file, the key path and the closest valid name (see `cells` for how options resolve), and
every one a file has is raised at once; a byte-order mark and nesting deeper than
`MAX_NESTING` fail alone.

A task entry *sweeps* a spec field by giving a list of values,
``spec = { event = ["overwrite", "reflect"], p = [0, 0.5, 1] }``: one task entry per
combination (the first field outermost), each value checked like a single one, labelled
``switched[event=overwrite,p=0]`` and so on: the entry's label, then every swept field and
its value as written. A field whose values are themselves lists (a ``list`` or ``tuple``
type) takes a list as one value; only a list of lists sweeps it. The entry's own label still
names the whole sweep wherever task labels are given (a model entry's ``tasks``, an
override's ``tasks``, ``only``), and each expanded label one entry.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import tomllib
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, get_args

from .._registry import did_you_mean
from .._task import TASKS, Metric, list_tasks
from ..models.base import MODELS, list_models
from .cells import model_options
from .checker import Checker
from .config import (
    EXTEND,
    ComparisonSpec,
    ConfigError,
    ExperimentConfig,
    ModelEntry,
    Override,
    TaskEntry,
    check_name,
    task_metrics,
    too_deep,
)
from .grid import contradictions, spelled, swept_values
from .options import RunOptions, apply, recorded
from .preflight import check_experiment

#: The most tables and lists an experiment file nests in one another (it needs about 6).
MAX_NESTING = 32
#: The top-level keys of an experiment file.
TOP_KEYS = (
    "name",
    "description",
    "seeds",
    "defaults",
    "tasks",
    "models",
    "overrides",
    "comparisons",
    "baseline",
)


def load_experiment(path: str | Path, options: RunOptions | None = None) -> ExperimentConfig:
    """Read and validate an experiment TOML file (raises `ConfigError`), with what a run
    changes of it (`RunOptions`: keys set, seeds) applied and recorded in its text."""
    path = Path(path)
    if not path.exists():
        # the stems: a shared ".toml" alone makes any two names look alike
        hint = did_you_mean(path.stem, sorted(p.stem for p in path.parent.glob("*.toml")))
        raise ConfigError(str(path), "", "no such file" + ("." + hint if hint else ""))
    if not path.is_file():  # a folder, a device or a FIFO (which reading would block on)
        raise ConfigError(str(path), "", "not a regular file; give an experiment TOML file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            str(path), "", f"not a TOML text file ({err.reason} at byte {err.start})"
        ) from err
    if text.startswith("\ufeff"):
        raise ConfigError(
            str(path),
            "",
            "starts with a UTF-8 byte-order mark, which TOML does "
            "not allow: save it as UTF-8 without one",
        )
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(str(path), "", f"malformed TOML: {err}") from err
    except RecursionError:
        raise ConfigError(
            str(path), "", f"nested more than {MAX_NESTING} tables or lists deep"
        ) from None
    data.setdefault("name", path.stem)
    options = options or RunOptions()
    return parse_experiment(
        apply(data, options, str(path)), source=str(path), text=recorded(text, options)
    )


def parse_experiment(
    data: Mapping[str, Any], source: str = "<dict>", text: str = ""
) -> ExperimentConfig:
    """Parse and fully validate an experiment given as the TOML's dict."""
    deep = too_deep(data, MAX_NESTING)
    if deep is not None:
        raise ConfigError(source, deep, f"nested more than {MAX_NESTING} tables or lists deep")
    config = _Parser(source).experiment(data, text)
    check_experiment(config)
    return config


class _Parser(Checker):
    """Turns the TOML's dict into entries, checking keys and types as it goes."""

    def experiment(self, data: Mapping[str, Any], text: str) -> ExperimentConfig:
        """The whole file, every entry checked even after another fails: the errors found
        are raised together (`ConfigError.of`)."""
        data = self.table(data, "")
        self.keys(data, TOP_KEYS, "")
        seeds = self.collect(self.seeds, data.get("seeds", [0]))
        name = self.collect(
            lambda: self.name(
                self.string(data, "name", "", "experiment"),
                "name",
                lambda n: check_name(n, "it names the run folder runs/<name>"),
            )
        )
        defaults = self.collect(self.table, data.get("defaults", {}), "defaults") or {}
        self.collect(self.keys, defaults, ("model", "train", "tune"), "defaults")
        tasks, models = self.rows(data)
        option_names = self.option_names(tasks, models)
        model_defaults, train_defaults, tune_defaults, extend = self.defaults(
            defaults, option_names
        )
        overrides = self.each(
            self.override,
            self.collect(self.listed, data, "overrides"),
            "overrides",
            tasks,
            models,
            option_names,
        )
        comparisons = self.each(
            self.comparison,
            self.collect(self.listed, data, "comparisons"),
            "comparisons",
            tasks,
            models,
        )
        self.mirrors(comparisons)
        baseline = self.collect(self.string, data, "baseline", "") if "baseline" in data else None
        description = self.collect(self.string, data, "description", "", "")
        if self.errors:
            raise ConfigError.of(self.errors)
        config = ExperimentConfig(
            name=name,
            description=description,
            seeds=seeds,
            tasks=tasks,
            models=models,
            model_defaults=model_defaults,
            train_defaults=train_defaults,
            overrides=overrides,
            tune_defaults=tune_defaults,
            comparisons=comparisons,
            baseline=baseline,
            source=self.source,
            text=text,
            extend=extend,
        )
        self.references(config)
        if self.errors:
            raise ConfigError.of(self.errors)
        return config

    def rows(self, data: Mapping[str, Any]) -> tuple[tuple[TaskEntry, ...], tuple[ModelEntry, ...]]:
        """The task and model entries that pass, each section marked unsure where one
        failed, their labels unique."""
        tasks = self.watched(
            "tasks",
            lambda: tuple(
                entry
                for i, t in enumerate(self.collect(self.entries, data, "tasks") or [])
                for entry in self.collect(self.task_entries, t, f"tasks[{i}]") or []
            ),
        )
        models = self.watched(
            "models",
            lambda: self.each(
                self.model_entry, self.collect(self.entries, data, "models"), "models", tasks
            ),
        )
        self.unique_labels(tasks, models)
        return tasks, models

    def option_names(
        self, tasks: Sequence[TaskEntry], models: Sequence[ModelEntry]
    ) -> set[str] | None:
        """The model options any row takes, with every task entry's ``model`` table checked
        against them; None where a model entry failed, its options unknown, the names then
        unchecked."""
        if "models" in self.unsure:
            names = None
        else:
            names = {o for m in models for o in model_options(m.name)}
        for i, entry in enumerate(tasks):
            self.collect(self.model_table, entry.model, f"tasks[{i}].model", names)
        return names

    def defaults(
        self, defaults: Mapping[str, Any], option_names: set[str] | None
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, tuple[Any, ...]], int]:
        """``[defaults]``'s model, train and tune tables, and the tune bound ``extend``."""
        model_defaults = (
            self.collect(
                self.model_table, defaults.get("model", {}), "defaults.model", option_names
            )
            or {}
        )
        train_defaults = (
            self.collect(self.train_table, defaults.get("train", {}), "defaults.train") or {}
        )
        tune = self.collect(self.table, defaults.get("tune", {}), "defaults.tune") or {}
        extend = self.collect(self.extend, tune.pop("extend", EXTEND))
        tune_defaults = self.collect(self.tune_table, tune, "defaults.tune") or {}
        self.errors += contradictions(train_defaults, tune_defaults, "defaults", self.source)
        return model_defaults, train_defaults, tune_defaults, extend

    def unique_labels(self, tasks: Sequence[TaskEntry], models: Sequence[ModelEntry]) -> None:
        """A label names one entry: a repeated one is an error (its results would merge)."""
        for section, entries in (("tasks", tasks), ("models", models)):
            labels = [e.label for e in entries]
            for i, label in enumerate(labels):
                if label in labels[:i]:
                    self.errors.append(
                        self.fail(
                            f"{section}.label",
                            f"duplicate label {label!r}; give each entry its own label",
                        )
                    )

    def mirrors(self, comparisons: Sequence[ComparisonSpec]) -> None:
        """A comparison and its mirror (the same rows swapped, on one split) would be drawn
        and counted twice: the second is refused."""
        seen: dict[tuple[str, str, str], int] = {}
        for i, c in enumerate(comparisons):
            first = seen.get((c.control, c.model, c.split))
            shared = first is not None and (
                not c.tasks
                or not comparisons[first].tasks
                or set(c.tasks) & set(comparisons[first].tasks)
            )
            if shared:
                self.errors.append(
                    self.fail(
                        f"comparisons[{i}]",
                        f"mirrors comparisons[{first}] ({c.control!r} "
                        f"against {c.model!r}): one test already judges both directions; drop "
                        "this one",
                    )
                )
            seen.setdefault((c.model, c.control, c.split), i)

    def references(self, config: ExperimentConfig) -> None:
        """Every ``match_params`` is a model label of the file or a count ≥ 1, and every
        ``baseline`` a model label of the file other than the row's own."""
        tables = [
            ("defaults.model", config.model_defaults),
            *((f"tasks[{i}].model", t.model) for i, t in enumerate(config.tasks)),
            *((f"models[{i}]", m.options) for i, m in enumerate(config.models)),
            *((f"overrides[{i}].model", o.model) for i, o in enumerate(config.overrides)),
        ]
        for where, table in tables:
            value = table.get("match_params")
            if isinstance(value, str):
                self.collect(self.known_labels, value, f"{where}.match_params", config.models)
            elif value is not None and (type(value) is not int or value < 1):
                self.errors.append(
                    self.fail(
                        f"{where}.match_params",
                        f"expected a model label or a parameter count ≥ 1, got {value!r}",
                    )
                )
        if config.baseline is not None:
            self.collect(self.known_labels, config.baseline, "baseline", config.models)
        for i, model in enumerate(config.models):
            if model.baseline is not None:
                self.collect(
                    self.known_labels, model.baseline, f"models[{i}].baseline", config.models
                )
                if model.baseline == model.label:
                    self.errors.append(
                        self.fail(f"models[{i}].baseline", "a row cannot be its own baseline")
                    )
        baselines = {m.label: m.baseline for m in config.models}
        for i, model in enumerate(config.models):
            chain = [model.label]
            while (label := baselines.get(chain[-1])) is not None and label not in chain:
                chain.append(label)
            if label is not None and model.baseline != model.label:  # each against the next
                self.errors.append(
                    self.fail(
                        f"models[{i}].baseline",
                        f"baselines name each other in a circle: {' → '.join([*chain, label])}",
                    )
                )

    def task_entries(self, data: dict[str, Any], where: str) -> list[TaskEntry]:
        """One ``[[tasks]]`` entry, or one per combination of the spec values it sweeps."""
        self.keys(data, ("name", "label", "spec", "model", "train", "tune"), where)
        name = self.string(data, "name", where)
        names = list_tasks()
        if name not in TASKS:
            raise self.fail(
                f"{where}.name",
                f"unknown task {name!r}; tasks: {', '.join(names)}." + did_you_mean(name, names),
            )
        label = self.name(self.string(data, "label", where, name), f"{where}.label")
        spec = self.table(data.get("spec", {}), f"{where}.spec")
        model = self.table(data.get("model", {}), f"{where}.model")
        train = self.train_table(data.get("train", {}), f"{where}.train")
        tune = self.tune_table(data.get("tune", {}), f"{where}.tune")
        self.errors += contradictions(train, tune, where, self.source)
        cls: Any = TASKS.get(name)  # a Task dataclass
        fields = {f.name: f for f in dataclasses.fields(cls)}
        hints = typing.get_type_hints(cls)
        self.keys(spec, list(fields), f"{where}.spec")
        choices: dict[str, list[tuple[str, Any]]] = {}  # field → (its label tag, value)
        for key, value in spec.items():
            default = fields[key].default
            default = None if default is dataclasses.MISSING else default
            swept = swept_values(value, default, hints.get(key))
            if swept == []:
                raise self.fail(
                    f"{where}.spec.{key}", "an empty list sweeps nothing; give at least one value"
                )
            here = f"{where}.spec.{key}"
            values = [value] if swept is None else swept
            coerced = [
                self.coerce(v, default, hints.get(key), here if swept is None else f"{here}[{j}]")
                for j, v in enumerate(values)
            ]
            for j, v in enumerate(coerced):
                if v in coerced[:j]:
                    raise self.fail(
                        f"{here}[{j}]", f"{values[j]!r} is swept twice; list each value once"
                    )
            tags = [""] if swept is None else [f"{key}={spelled(v)}" for v in swept]
            choices[key] = list(zip(tags, coerced, strict=True))
        self.bounded(
            "combinations of swept values", [len(c) for c in choices.values()], f"{where}.spec"
        )
        entries = []
        for combination in itertools.product(*choices.values()):
            resolved = {k: v for k, (_, v) in zip(choices, combination, strict=True)}
            tag = ",".join(t for t, _ in combination if t)
            entry_model = dict(model)
            if "depth" in resolved:  # the task runs at its model's depth; see the docstring
                entry_model.setdefault("depth", resolved.pop("depth"))
            entry_label = self.name(f"{label}[{tag}]", f"{where}.spec") if tag else label
            entries.append(
                TaskEntry(
                    name, entry_label, resolved, entry_model, train, label if tag else "", tune
                )
            )
        return entries

    def model_entry(
        self, data: dict[str, Any], where: str, tasks: Sequence[TaskEntry]
    ) -> ModelEntry:
        name = self.string(data, "name", where)
        names = list_models()
        if name not in MODELS:
            raise self.fail(
                f"{where}.name",
                f"unknown model {name!r}; models: {', '.join(names)}." + did_you_mean(name, names),
            )
        entry_keys = ("name", "label", "train", "tune", "tasks", "baseline")
        options = {k: v for k, v in data.items() if k not in entry_keys}
        entry = ModelEntry(
            name,
            self.name(self.string(data, "label", where, name), f"{where}.label"),
            self.model_table(options, where, set(model_options(name))),
            self.train_table(data.get("train", {}), f"{where}.train"),
            self.task_labels(data.get("tasks", []), f"{where}.tasks", tasks),
            self.string(data, "baseline", where) if "baseline" in data else None,
            self.tune_table(data.get("tune", {}), f"{where}.tune"),
        )
        self.errors += contradictions(entry.train, entry.tune, where, self.source)
        return entry

    def override(
        self,
        data: Any,
        where: str,
        tasks: Sequence[TaskEntry],
        models: Sequence[ModelEntry],
        option_names: set[str] | None,
    ) -> Override:
        data = self.table(data, where)
        self.keys(data, ("tasks", "models", "model", "train", "tune"), where)
        override = Override(
            self.task_labels(data.get("tasks", []), f"{where}.tasks", tasks),
            self.known_labels(data.get("models", []), f"{where}.models", models),
            self.model_table(data.get("model", {}), f"{where}.model", option_names),
            self.train_table(data.get("train", {}), f"{where}.train"),
            self.tune_table(data.get("tune", {}), f"{where}.tune"),
        )
        self.errors += contradictions(override.train, override.tune, where, self.source)
        return override

    def comparison(
        self, data: Any, where: str, tasks: Sequence[TaskEntry], models: Sequence[ModelEntry]
    ) -> ComparisonSpec:
        data = self.table(data, where)
        self.keys(
            data,
            ("model", "control", "tasks", "split", "requires", "question", "control_larger"),
            where,
        )
        model, control = (
            self.known_labels(self.string(data, key, where), f"{where}.{key}", models)[0]
            for key in ("model", "control")
        )
        if model == control:
            raise self.fail(where, f"{model!r} is compared with itself; name another control")
        split = self.string(data, "split", where, "test")
        named = self.task_labels(data.get("tasks", []), f"{where}.tasks", tasks)
        spanned = task_metrics(
            [
                t
                for t in tasks
                if (not named or t.label in named)
                and all(m.runs(t.label) for m in models if m.label in (model, control))
            ]
        )
        requires = self.requires(data.get("requires"), f"{where}.requires", spanned)
        if split != "test" and requires is None:
            raise self.fail(
                where,
                f"a comparison on split {split!r} must state `requires`, the "
                "test metric both rows have to reach first",
            )
        larger = data.get("control_larger", False)
        if not isinstance(larger, bool):
            raise self.fail(f"{where}.control_larger", f"expected true or false, got {larger!r}")
        question = self.string(data, "question", where, "")
        return ComparisonSpec(model, control, named, split, requires, question, larger)

    def requires(
        self, value: Any, where: str, spanned: dict[str, list[str]]
    ) -> float | dict[str, float] | None:
        """A comparison's ``requires``: one number where its tasks share a metric (``spanned``:
        metric → task labels), else a table by metric, finite, an accuracy in [0, 1]."""
        if value is None:
            return None
        table = value if isinstance(value, dict) else dict.fromkeys(spanned or [""], value)
        if not isinstance(value, dict) and len(spanned) > 1:
            tasks = "; ".join(f"{m} on {', '.join(labels)}" for m, labels in spanned.items())
            raise self.fail(
                where,
                f"one threshold for tasks whose metrics differ ({tasks}); give "
                "one per metric, e.g. requires = { accuracy = 0.99, mse = 0.01 }",
            )
        for metric, number in table.items():
            at = f"{where}.{metric}" if isinstance(value, dict) else where
            if isinstance(value, dict) and metric not in get_args(Metric):
                raise self.fail(at, f"not a metric; metrics: {', '.join(get_args(Metric))}")
            if (
                isinstance(number, bool)
                or not isinstance(number, int | float)
                or not math.isfinite(number)
            ):  # "test ≥ nan" means nothing
                raise self.fail(at, f"expected a finite number, got {number!r}")
            if metric == "accuracy" and not 0 <= number <= 1:
                raise self.fail(at, f"an accuracy lies in [0, 1], got {number!r}")
        if isinstance(value, dict):
            if missing := [m for m in spanned if m not in value]:
                raise self.fail(
                    where, f"no threshold for {missing[0]} (on {', '.join(spanned[missing[0]])})"
                )
            return {metric: float(number) for metric, number in value.items()}
        return float(value)
