"""The checks of the values in an experiment file's tables: each failure a `ConfigError`
naming the file and the key path, and several collected to be raised at once."""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from .._registry import did_you_mean
from .cells import named_entries, references
from .config import (
    MAX_GRID,
    TASK_DIMS,
    ConfigError,
    TaskEntry,
    TrainConfig,
    check_label,
    check_limit,
    check_seeds,
    coerce,
    unknown_key,
)
from .grid import check_tune

T = TypeVar("T")


class Checker:
    """Checks values of one file (``source``), keeping the errors it collects."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.errors: list[ConfigError] = []
        #: Sections with an entry that failed: a label missing from them may be its.
        self.unsure: set[str] = set()

    def fail(self, where: str, message: str) -> ConfigError:
        return ConfigError(self.source, where, message)

    def table(self, value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(where, f"expected a table, got {type(value).__name__}")
        return dict(value)

    def keys(self, data: Mapping[str, Any], allowed: Sequence[str], where: str) -> None:
        for key in data:
            if key not in allowed:
                raise unknown_key(self.source, where, key, allowed)

    def string(self, data: Mapping[str, Any], key: str, where: str, default: Any = None) -> str:
        value = data.get(key, default)
        if not isinstance(value, str):
            raise self.fail(f"{where}.{key}", f"expected a string, got {value!r}")
        return value

    def name(self, value: str, where: str, check: Callable[[str], str] = check_label) -> str:
        """``value`` if it can name files (``check``: `check_label` or `check_name`)."""
        try:
            return check(value)
        except ValueError as err:
            raise self.fail(where, str(err)) from None

    def labels(self, value: Any, where: str) -> tuple[str, ...]:
        value = [value] if isinstance(value, str) else value
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(where, f"expected a label or a list of labels, got {value!r}")
        return tuple(value)

    def known_labels(self, value: Any, where: str, entries: Sequence[Any]) -> tuple[str, ...]:
        """Labels that must each name one of ``entries``."""
        labels = self.labels(value, where)
        known = [e.label for e in entries]
        for label in labels:
            if label not in known and "models" not in self.unsure:
                raise self.fail(
                    where,
                    f"no entry labelled {label!r}; labels: "
                    f"{', '.join(known)}." + did_you_mean(label, known),
                )
        return labels

    def task_labels(self, value: Any, where: str, tasks: Sequence[TaskEntry]) -> tuple[str, ...]:
        """The task entries that labels name: each its own, or every entry of a sweep."""
        found = []
        for label in self.labels(value, where):
            named = named_entries(label, tasks)
            if not named and "tasks" not in self.unsure:
                known = references(tasks)
                raise self.fail(
                    where,
                    f"no entry labelled {label!r}; labels: "
                    f"{', '.join(known)}." + did_you_mean(label, known),
                )
            found += named
        return tuple(dict.fromkeys(found))

    def collect(self, check: Callable[..., Any], *args: Any) -> Any:
        """``check(*args)``, or None with its `ConfigError` kept for the end."""
        try:
            return check(*args)
        except ConfigError as err:
            self.errors.extend(err.errors)
            return None

    def watched(self, what: str, read: Callable[[], T]) -> T:
        """``read()``, and ``what`` marked unsure where reading it found an error."""
        before = len(self.errors)
        value = read()
        if len(self.errors) > before:
            self.unsure.add(what)
        return value

    def each(
        self, check: Callable[..., Any], items: Sequence[Any] | None, section: str, *args: Any
    ) -> tuple[Any, ...]:
        """``check(item, "section[i]", *args)`` of every item that passes it."""
        checked = (
            self.collect(check, item, f"{section}[{i}]", *args)
            for i, item in enumerate(items or [])
        )
        return tuple(c for c in checked if c is not None)

    def seeds(self, value: Any) -> tuple[int, ...]:
        try:
            return check_seeds(value)
        except ValueError as err:
            raise self.fail("seeds", str(err)) from None

    def listed(self, data: Mapping[str, Any], key: str) -> list[Any]:
        """An optional array of tables (``[[overrides]]``, ``[[comparisons]]``)."""
        value = data.get(key, [])
        if not isinstance(value, list):
            raise self.fail(key, f"expected [[{key}]] entries, got {type(value).__name__}")
        return value

    def entries(self, data: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
        value = data.get(key)
        if not isinstance(value, list) or not value:
            raise self.fail(key, f"expected at least one [[{key}]] entry")
        return [self.table(v, f"{key}[{i}]") for i, v in enumerate(value)]

    def model_table(self, data: Any, where: str, option_names: set[str] | None) -> dict[str, Any]:
        """Keys are checked here against every model in play (and ``match_params``); types
        per model on resolve, ``match_params`` values once every label is known."""
        data = self.table(data, where)
        for key in data:
            if key in TASK_DIMS:
                raise self.fail(f"{where}.{key}", "set by the task; it cannot be configured")
            if option_names is not None and key not in option_names and key != "match_params":
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
        table = {k: self.coerce(v, fields[k], hints[k], f"{where}.{k}") for k, v in data.items()}
        try:  # each value alone, here: the combined one is checked per cell
            TrainConfig(**table)
        except ValueError as err:
            raise self.fail(where, str(err)) from None
        return table

    def tune_table(self, data: Any, where: str) -> dict[str, tuple[Any, ...]]:
        return check_tune(self.table(data, where), where, self.source)

    def extend(self, value: Any) -> int:
        """``[defaults.tune] extend``: steps a grid may grow past an end, 0 or more."""
        if type(value) is not int or value < 0:
            raise self.fail(
                "defaults.tune.extend",
                f"expected a number of grid steps ≥ 0 (0: no extension), got {value!r}",
            )
        return value

    def bounded(self, what: str, sizes: Sequence[int], where: str) -> None:
        """Fail when the product of ``sizes`` (entries or cells per seed) is beyond any sane
        run (`MAX_GRID`), before anything expands it."""
        try:
            check_limit(f"{math.prod(sizes):,} {what}", math.prod(sizes), MAX_GRID)
        except ValueError as err:
            raise self.fail(where, str(err)) from None

    def coerce(self, value: Any, default: Any, hint: Any, where: str) -> Any:
        """``value`` if it has the option's type and is finite (`coerce`), else fail."""
        try:
            return coerce(value, default, hint)
        except ValueError as err:
            raise self.fail(where, str(err)) from None
