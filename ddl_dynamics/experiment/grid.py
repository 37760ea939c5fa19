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
from typing import Any

from .config import MAX_GRID, ConfigError, TrainConfig, check_limit, coerce, unknown_key

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
        if key in fields and key not in TUNABLE:
            raise ConfigError(source, f"{where}.{key}", "not tunable: a row's budget is the "
                              f"same at every grid value; tunable: {', '.join(TUNABLE)}")
        if key not in TUNABLE:
            raise unknown_key(source, where, key, TUNABLE)
        if not isinstance(values, list) or not values:
            raise ConfigError(source, f"{where}.{key}", f"expected a non-empty list of values "
                              f"to try, got {values!r}")
        coerced: list[Any] = []
        for j, value in enumerate(values):
            try:
                coerced.append(coerce(value, fields[key], hints[key]))
            except ValueError as err:
                raise ConfigError(source, f"{where}.{key}[{j}]", str(err)) from None
        for j, value in enumerate(coerced):
            if value in coerced[:j]:
                raise ConfigError(source, f"{where}.{key}[{j}]",
                                  f"{value!r} is listed twice; list each value once")
        grid[key] = tuple(coerced)
    size = math.prod(len(v) for v in grid.values())
    try:
        check_limit(f"{size:,} combinations of grid values", size, MAX_GRID)
    except ValueError as err:
        raise ConfigError(source, where, str(err)) from None
    return grid


def contradictions(train: Mapping[str, Any], tune: Mapping[str, Any], where: str,
                   source: str) -> list[ConfigError]:
    """A field both fixed and searched at one level is a contradiction (which one wins
    would be a silent guess)."""
    return [ConfigError(source, f"{where}.tune.{key}", f"{key} is also fixed in {where}.train; "
                        "fix it there or search it here, not both")
            for key in sorted(set(train) & set(tune))]


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
    grid = [TrainConfig(**fixed, **dict(zip(tune, values, strict=True)))
            for values in itertools.product(*tune.values())]
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
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union,
                                                                   types.UnionType) else (hint,)
    return isinstance(default, list | tuple) or any(
        a in (list, tuple) or typing.get_origin(a) in (list, tuple) for a in args)


def swept_values(value: Any, default: Any, hint: Any) -> list[Any] | None:
    """The values a spec entry sweeps, or None when it is one value: any list sweeps, but a
    field whose values are lists is swept only by a non-empty list of lists."""
    if not isinstance(value, list):
        return None
    if _sequence_typed(default, hint) and not (value and all(isinstance(v, list)
                                                             for v in value)):
        return None
    return value


def spelled(value: Any) -> str:
    """A spec value as an experiment file writes it, for labels: ``0.05``, ``true``, ``a``."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(map(spelled, value)) + "]"
    return str(value)
