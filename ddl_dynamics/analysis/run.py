"""A run folder read once: its cells grouped into rows, each at its chosen grid value.

Analysis opens a run folder once, through `load_run`, and hands the one `Run`
it returns (which keeps the open `RunFolder`) to the
report, the figures and the probes, so they all read the same cells, weights and probes.

Which cells a row shows: the store holds one result per cell key (earlier attempts at it
come along, see `attempts`). A row (one
model label on one task) shows one *version* of its config, that of its newest cell: the
whole cell config but the seed and the tuned values. Cells of an older version (the
experiment file was edited between runs) are left out, and counted, so that one mean never
mixes two configs. A tuned row is reported at its chosen grid value
(`chosen_value`).
"""

from __future__ import annotations

import json
import tomllib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from .._task import make_task
from ..experiment.config import COUNTED, DEFAULT_BASELINE, ComparisonSpec
from ..experiment.folder import RunFolder
from ..experiment.grid import (
    choice_edge,
    chosen_value,
    grid_value,
    point_text,
    row_identity,
    searched,
)
from ..experiment.provenance import Progress
from ..experiment.result import RunResult


@dataclass(frozen=True)
class Row:
    """One model label on one task: its cells at every seed and grid value."""

    task: str
    label: str
    #: The current version's cells, by seed and grid value.
    cells: tuple[RunResult, ...]
    #: Earlier attempts at these cells (each replaced by a later result), oldest first.
    attempts: tuple[RunResult, ...] = ()
    #: Cells of older versions of this row's config, left out.
    older: int = 0

    @property
    def grid(self) -> dict[str, list[Any]]:
        """The searched training fields and their values (empty: not tuned)."""
        return searched(self.cells[0].config)

    @cached_property
    def chosen(self) -> tuple[Any, ...]:
        """The grid value the row is reported at (``()`` when it is not tuned)."""
        return chosen_value(self.cells, list(self.grid), self.higher_is_better)

    def at(self, value: tuple[Any, ...]) -> list[RunResult]:
        """The cells at one grid value, by seed."""
        return sorted(
            (c for c in self.cells if grid_value(c.config, list(self.grid)) == value),
            key=lambda c: c.seed,
        )

    @property
    def selected(self) -> list[RunResult]:
        """The cells the row is reported with: those at its chosen grid value."""
        return self.at(self.chosen)

    def chosen_text(self) -> str:
        """``"lr=0.003"``, or empty when the row is not tuned (or "no grid value finished");
        ``"lr=0.03 (grid edge)"`` where the choice is an end of the values trained
        (`edge_steps`), ``"lr=0.3 (grid edge after 2 extensions)"`` where the grid grew
        past its declared end and the choice still sits at the last value (the run's
        ``extend`` bound stopped it)."""
        if self.grid and not any(c.status in COUNTED for c in self.cells):
            return "no grid value finished"
        text = point_text(list(self.grid), self.chosen)
        steps = self.edge_steps
        if steps is None:
            return text
        return (
            f"{text} (grid edge after {steps} extension{'s' * (steps != 1)})"
            if steps
            else f"{text} (grid edge)"
        )

    @property
    def at_grid_edge(self) -> bool:
        """Whether the chosen value of a searched numeric field is the smallest or largest
        the row trained, beating the next value inward on val (`choice_edge`): its best
        may lie beyond."""
        return self.edge_steps is not None

    @property
    def edge_steps(self) -> int | None:
        """None where every searched field's choice lies inside the values the row trained;
        else how many values past the declared grid the row trained on the side its choice
        sits at (0: the grid never grew there)."""
        for i, (field, declared) in enumerate(self.grid.items()):
            tried = list({grid_value(c.config, [field])[0] for c in self.cells})
            side = choice_edge(self.cells, list(self.grid), i, self.higher_is_better)
            if side:
                return (
                    sum(1 for v in tried if v > max(declared))
                    if side > 0
                    else sum(1 for v in tried if v < min(declared))
                )
        return None

    @property
    def ensembles(self) -> list[int]:
        """The sizes of the ensembles the selected cells trained in, where they trained in
        more than one (their last bits differ by the float rounding of folding); empty
        where they trained together, or alone each, or before ensembles were recorded."""
        sizes = {
            c.metrics["ensemble_id"]: c.metrics.get("ensemble", 1)
            for c in self.selected
            if "ensemble_id" in c.metrics
        }
        return (
            sorted(sizes.values(), reverse=True)
            if len(sizes) > 1 and max(sizes.values()) > 1
            else []
        )

    @property
    def baseline(self) -> str | None:
        """The label the row's cells name as their baseline."""
        return self.cells[0].config.get("baseline")

    @property
    def described(self) -> dict[str, Any]:
        """How the task's numbers read (``metric``, ``higher_is_better``), from any cell, or
        from the task itself where no cell was scored (every one failed)."""
        found = next(
            (c.metrics for c in self.cells if {"metric", "higher_is_better"} & set(c.metrics)), None
        )
        if found is not None:
            return found
        config = self.cells[0].config
        try:
            task = make_task(config["task"], **config.get("spec", {}))
        except (KeyError, TypeError, ValueError):  # a hand-made or foreign config
            return {}
        return {"metric": task.metric_name, "higher_is_better": task.higher_is_better}

    @cached_property
    def higher_is_better(self) -> bool:
        """The task's direction: from its resolved config where a cell stored it, else as
        any cell states it (a failed cell states nothing)."""
        config = self.cells[0].config
        if "task" in config:
            return make_task(config["task"], **config.get("spec", {})).higher_is_better
        return bool(self.described.get("higher_is_better", False))


@dataclass(frozen=True)
class Run:
    """A run folder: its rows by ``(task, label)``, the latest run's record (name, config
    text, versions, machine, times) and the comparisons its experiment declares."""

    run_dir: Path
    rows: dict[tuple[str, str], Row]
    experiment: dict[str, Any]
    comparisons: tuple[ComparisonSpec, ...] = ()
    #: How far the latest run got (None: no run started).
    progress: Progress | None = None
    #: The open run folder (None: a run made of rows alone, with no weights or probes).
    folder: RunFolder | None = None

    @property
    def tasks(self) -> list[str]:
        return sorted({task for task, _ in self.rows})

    def task_rows(self, task: str) -> dict[str, Row]:
        """The rows of one task by label."""
        return {label: row for (t, label), row in self.rows.items() if t == task}

    def baseline(self, task: str, label: str) -> str | None:
        """The label a row is compared with: the one its cells name (None: it heads its
        family); cells stored before baselines were recorded: ``resnet`` where the task has
        it."""
        row = self.rows[task, label]
        if "baseline" in row.cells[0].config:
            return row.baseline
        return (
            DEFAULT_BASELINE
            if label != DEFAULT_BASELINE and (task, DEFAULT_BASELINE) in self.rows
            else None
        )

    def selected(self) -> list[RunResult]:
        """Every row's cells at its chosen grid value: what tables, probes and figures read."""
        return [cell for row in self.rows.values() for cell in row.selected]


def load_run(run: str | Path | RunFolder) -> Run:
    """Read a run folder's store once (see the module docstring for which cells count),
    opening the folder unless it is open already."""
    folder = run if isinstance(run, RunFolder) else RunFolder.open(run)
    store = folder.store
    experiment = store.experiment() or {}
    return replace(
        run_of(store.rows(), store.attempts(), experiment, folder.path),
        progress=store.progress(),
        folder=folder,
    )


def run_of(
    cells: Sequence[RunResult],
    attempts: Sequence[RunResult] = (),
    experiment: dict[str, Any] | None = None,
    run_dir: str | Path = ".",
) -> Run:
    """The run these results make: its cells grouped into rows, each row at its newest
    config version, and the comparisons its experiment record declares."""
    experiment = experiment or {}
    history: dict[str, list[RunResult]] = defaultdict(list)
    for attempt in attempts:
        history[attempt.key].append(attempt)
    by_row: dict[tuple[str, str], list[RunResult]] = defaultdict(list)
    for cell in cells:
        by_row[cell.task, cell.model].append(cell)
    rows = {}
    for (task, label), found in sorted(by_row.items()):
        newest = max(found, key=lambda c: c.created_at)
        current = [c for c in found if row_identity(c.config) == row_identity(newest.config)]
        rows[task, label] = Row(
            task,
            label,
            tuple(current),
            tuple(a for c in current for a in history[c.key]),
            len(found) - len(current),
        )
    return Run(Path(run_dir), rows, experiment, recorded_comparisons(experiment.get("config", "")))


def recorded_config(text: str) -> dict[str, Any]:
    """An experiment as its run recorded it: the TOML file's text, or the JSON of a config
    built in Python (empty where it is neither)."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        try:
            found = json.loads(text)
        except json.JSONDecodeError:
            return {}
    return found if isinstance(found, dict) else {}


def recorded_comparisons(text: str) -> tuple[ComparisonSpec, ...]:
    """The ``[[comparisons]]`` of an experiment as its run recorded it; checked when the
    run started."""
    entries = recorded_config(text).get("comparisons", [])
    for i, c in enumerate(entries if isinstance(entries, list) else [entries]):
        missing = [
            key
            for key in ("model", "control")
            if not isinstance(c, dict) or not isinstance(c.get(key), str)
        ]
        if missing:
            raise ValueError(
                f"damaged experiment record: its comparisons[{i}] has no "
                f"{missing[0]!r} label (the run checked it when it started)"
            )
    return tuple(
        ComparisonSpec(
            c["model"],
            c["control"],
            tuple(c.get("tasks", ())),
            c.get("split", "test"),
            c.get("requires"),
            control_larger=bool(c.get("control_larger", False)),
        )
        for c in entries
    )


def in_tasks(label: str, names: Sequence[str]) -> bool:
    """Whether a task label is among ``names``, directly or through its sweep's label
    (``switched[p=0.5]`` is among ``["switched"]``)."""
    return not names or label in names or label.split("[", 1)[0] in names
