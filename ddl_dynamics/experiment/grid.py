"""Tuning grids and what makes cells one row.

A ``tune`` table searches tunable training fields (`TUNABLE`): `check_tune` reads
one, and `expand` resolves a pair's layers of fixed and searched fields into one train
config per combination of grid values. A row (one task × model label) has one cell per seed
and grid value; what its cells share, their config but the seed and the values of the fields
the row searches, is its identity (`row_identity`): the cells that train together as
one ensemble are a row's (`seed_groups`), and a report reads the cells of one
identity as one version of the row (`ddl_dynamics.analysis.run`). Where a cell sits on
its row's grid is `grid_value`.

A task entry's spec is a grid too: a list of values sweeps a field (`swept_values`),
each value then tagged in the entry's label as the file spells it (`spelled`).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, cast

from .._task import make_task
from .config import (
    COUNTED,
    MAX_GRID,
    Cell,
    ConfigError,
    TrainConfig,
    check_limit,
    coerce,
    unknown_key,
)
from .result import RunResult

#: The training fields a ``tune`` grid may search: how a row optimises, never its budget
#: (steps, batch size, data), which every row of a comparison shares. A cell's grid values
#: train as members of its seeds' ensemble, each member with its own.
TUNABLE = ("lr", "weight_decay", "warmup", "grad_clip")

#: One level of a pair's training options, generic to specific: its fixed fields and its
#: searched fields with their values.
Layer = tuple[Mapping[str, Any], Mapping[str, Sequence[Any]]]


def check_tune(data: Mapping[str, Any], where: str, source: str) -> dict[str, tuple[Any, ...]]:
    """A ``tune`` table as a grid: tunable training fields, each with a non-empty list of
    distinct values, each value checked as the field's own; else a `ConfigError`."""
    fields = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    hints = typing.get_type_hints(TrainConfig)
    grid = {}
    for key, values in data.items():
        if key == "extend":
            raise ConfigError(
                source, f"{where}.{key}", "the bound is the experiment's: set it in [defaults.tune]"
            )
        if key in fields and key not in TUNABLE:
            raise ConfigError(
                source,
                f"{where}.{key}",
                "not tunable: a row's budget is the "
                f"same at every grid value; tunable: {', '.join(TUNABLE)}",
            )
        if key not in TUNABLE:
            raise unknown_key(source, where, key, TUNABLE)
        if not isinstance(values, list) or not values:
            raise ConfigError(
                source,
                f"{where}.{key}",
                f"expected a non-empty list of values to try, got {values!r}",
            )
        coerced: list[Any] = []
        for j, value in enumerate(values):
            try:
                coerced.append(coerce(value, fields[key], hints[key]))
            except ValueError as err:
                raise ConfigError(source, f"{where}.{key}[{j}]", str(err)) from None
        for j, value in enumerate(coerced):
            if value in coerced[:j]:
                raise ConfigError(
                    source,
                    f"{where}.{key}[{j}]",
                    f"{value!r} is listed twice; list each value once",
                )
        grid[key] = tuple(coerced)
    size = math.prod(len(v) for v in grid.values())
    try:
        check_limit(f"{size:,} combinations of grid values", size, MAX_GRID)
    except ValueError as err:
        raise ConfigError(source, where, str(err)) from None
    return grid


def contradictions(
    train: Mapping[str, Any], tune: Mapping[str, Any], where: str, source: str
) -> list[ConfigError]:
    """A field both fixed and searched at one level is a contradiction (which one wins
    would be a silent guess)."""
    return [
        ConfigError(
            source,
            f"{where}.tune.{key}",
            f"{key} is also fixed in {where}.train; fix it there or search it here, not both",
        )
        for key in sorted(set(train) & set(tune))
    ]


def expand(layers: Sequence[Layer]) -> tuple[list[TrainConfig], dict[str, list[Any]]]:
    """The train configs of a pair whose options come in ``layers`` (generic to specific),
    one per combination of grid values (the first field outermost), and the fields it
    searches with their values. At each level a field is fixed or searched; the most
    specific level decides, and a grid of one value fixes its field. A ``ValueError`` for a
    grid beyond `MAX_GRID` or a config that ``TrainConfig`` rejects."""
    fixed: dict[str, Any] = {}
    tune: dict[str, list[Any]] = {}
    for train_layer, tune_layer in layers:
        for key, value in train_layer.items():
            fixed[key] = value
            tune.pop(key, None)
        for key, values in tune_layer.items():
            tune[key] = list(values)
            fixed.pop(key, None)
    fixed |= {key: values[0] for key, values in tune.items() if len(values) == 1}
    tune = {key: values for key, values in tune.items() if len(values) > 1}
    size = math.prod(len(values) for values in tune.values())
    check_limit(f"{size:,} combinations of grid values", size, MAX_GRID)
    grid = [
        TrainConfig(**fixed, **dict(zip(tune, values, strict=True)))
        for values in itertools.product(*tune.values())
    ]
    return grid, tune


def searched(config: Mapping[str, Any]) -> dict[str, list[Any]]:
    """The fields a cell's row searches, with their values (from its stored config; empty:
    the row is not tuned)."""
    return dict(config.get("tune") or {})


def grid_value(config: Mapping[str, Any], fields: Sequence[str]) -> tuple[Any, ...]:
    """A cell's values of the tuned ``fields`` (from its stored config): its point on its
    row's grid."""
    train = config.get("train") or {}
    return tuple(train.get(f) for f in fields)


def _merits(
    cells: Sequence[RunResult], fields: Sequence[str], higher_is_better: bool
) -> dict[tuple[Any, ...], tuple[int, float]]:
    """Each grid value's merit on val: how many of its seeds finished with a finite val
    metric, then their mean in the task's direction (larger is better)."""
    by_value: dict[tuple[Any, ...], list[float]] = {}
    for cell in cells:
        found = by_value.setdefault(grid_value(cell.config, fields), [])
        value = cell.metrics.get("val")
        if cell.status in COUNTED and isinstance(value, int | float) and math.isfinite(value):
            found.append(float(value))
    merits = {}
    for value, vals in by_value.items():
        mean = sum(vals) / len(vals) if vals else -math.inf
        merits[value] = (len(vals), mean if higher_is_better or not vals else -mean)
    return merits


def chosen_value(
    cells: Sequence[RunResult], fields: Sequence[str], higher_is_better: bool
) -> tuple[Any, ...]:
    """The grid value a tuned row is reported at: the one whose seeds finished with a
    finite val metric most often, then the best mean val metric over them in the task's
    direction (the first in grid order on a tie). Test and out-of-distribution data play no
    part."""
    merits = _merits(cells, fields, higher_is_better)
    return max(merits, key=merits.__getitem__)


def edge(values: Sequence[Any], chosen: Any) -> int:
    """Where ``chosen`` sits among a field's grid ``values``: -1 at the smallest, +1 at the
    largest of two or more numbers, 0 inside or where the values are not all numbers."""
    numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if len(numbers) < 2 or len(numbers) < len(values):
        return 0
    return -1 if chosen == min(numbers) else 1 if chosen == max(numbers) else 0


def choice_edge(
    cells: Sequence[RunResult], fields: Sequence[str], i: int, higher_is_better: bool
) -> int:
    """Where a row's choice of its ``i``-th searched field sits among the values it trained
    (`edge`), counted as inside (0) where the next value inward ties it on val: a plateau,
    such as every rate solving the task, says the best does not lie beyond the end."""
    merits = _merits(cells, fields, higher_is_better)
    chosen = max(merits, key=merits.__getitem__)
    tried = sorted({value[i] for value in merits})
    side = edge(tried, chosen[i])
    if side:
        inward = tried[-2] if side > 0 else tried[1]
        neighbour = (*chosen[:i], inward, *chosen[i + 1 :])
        if merits.get(neighbour) == merits[chosen]:
            return 0
    return side


def beyond(field: str, declared: Sequence[Any], side: int, step: int) -> float | None:
    """The ``step``-th value past one end (``side`` -1 or +1) of a field's ``declared`` grid,
    at the ratio of the two values at that end, to 3 significant digits so that every run
    names it alike; None where there is no such value: a value at that end is not positive
    (no ratio), or the field's config would reject it or read it otherwise (a ``warmup``
    fraction would become a step count)."""
    if len(declared) < 2:
        return None
    ordered = sorted(declared)
    end, near = (ordered[-1], ordered[-2]) if side > 0 else (ordered[0], ordered[1])
    if min(end, near) <= 0:
        return None
    value = float(f"{end * (end / near) ** step:.3g}")
    if field == "warmup" and (end < 1) != (value < 1):
        return None
    try:
        TrainConfig(**cast("dict[str, Any]", {field: value}))
    except ValueError:
        return None
    return value


def extensions(cells: Sequence[Cell], results: Mapping[str, RunResult], bound: int) -> list[Cell]:
    """The cells one step past the grid edge where each row of ``cells`` chose an end of a
    searched field, once the row's every cell has a result (``results`` by key): for each
    such field, every cell of the row at that end, moved one step beyond (`beyond`),
    while fewer than ``bound`` steps were taken past the declared grid on that side. Empty
    when every row's choice is inside its grid or stopped by the bound. The new cells keep
    their row's declared grid (``tune``), so they are cells of the same row."""
    rows: dict[str, list[Cell]] = {}
    for cell in cells:
        rows.setdefault(row_identity(cell.to_dict()), []).append(cell)
    added: dict[str, Cell] = {}
    for row in rows.values():
        fields = list(row[0].tune)
        done = [results[c.key] for c in row if c.key in results]
        if not fields or len(done) < len(row):
            continue
        task = make_task(row[0].task, **row[0].spec)
        chosen = chosen_value(done, fields, task.higher_is_better)
        for i, field in enumerate(fields):
            tried = sorted({getattr(c.train, field) for c in row})
            side = choice_edge(done, fields, i, task.higher_is_better)
            declared = row[0].tune[field]
            taken = len(
                [v for v in tried if (v > max(declared) if side > 0 else v < min(declared))]
            )
            if not side or taken >= bound:
                continue
            value = beyond(field, declared, side, taken + 1)
            if value is None:
                continue
            for cell in row:
                if getattr(cell.train, field) == chosen[i]:
                    moved = cast("dict[str, Any]", {field: value})
                    new = dataclasses.replace(cell, train=dataclasses.replace(cell.train, **moved))
                    added.setdefault(new.key, new)
    known = {c.key for c in cells}
    return [c for key, c in added.items() if key not in known]


def row_identity(config: Mapping[str, Any]) -> str:
    """What every cell of one version of a row shares (from a cell's stored config): all
    but its seed and the values of the fields its row searches."""
    tuned = searched(config)
    train = config.get("train") or {}
    rest = {**config, "seed": None, "train": {k: v for k, v in train.items() if k not in tuned}}
    return json.dumps(rest, sort_keys=True)


def value_text(value: Any) -> str:
    """A grid value as reports write it: ``0.003``, ``100``."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def point_text(fields: Sequence[str], values: Sequence[Any]) -> str:
    """A point of a grid as reports write it: ``"lr=0.003, warmup=0.1"`` (empty: none)."""
    return ", ".join(f"{f}={value_text(v)}" for f, v in zip(fields, values, strict=True))


def _sequence_typed(default: Any, hint: Any) -> bool:
    """Whether a spec field's single values are lists (a ``list`` or ``tuple`` type)."""
    args = (
        typing.get_args(hint)
        if typing.get_origin(hint) in (typing.Union, types.UnionType)
        else (hint,)
    )
    return isinstance(default, list | tuple) or any(
        a in (list, tuple) or typing.get_origin(a) in (list, tuple) for a in args
    )


def swept_values(value: Any, default: Any, hint: Any) -> list[Any] | None:
    """The values a spec entry sweeps, or None when it is one value: any list sweeps, but a
    field whose values are lists is swept only by a non-empty list of lists."""
    if not isinstance(value, list):
        return None
    if _sequence_typed(default, hint) and not (value and all(isinstance(v, list) for v in value)):
        return None
    return value


def spelled(value: Any) -> str:
    """A spec value as an experiment file writes it, for labels: ``0.05``, ``true``, ``a``."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(map(spelled, value)) + "]"
    return str(value)
