"""Accuracy against model width: how much stream a row needs to solve a task (Zoology's
accuracy against state size).

A *width sweep* is found in the run itself, with no declaration in the experiment file: the
task labels of one task family with the same resolved spec (every field, the knob among
them) whose rows run at different model widths (``width`` of the cells' model config) make
one panel, e.g. ``var-chain-w16[hops=4]``, ``var-chain-w32[hops=4]`` and
``var-chain-w64[hops=4]``. A task whose family and spec no other task shares, or whose rows
all run at one width, is in no panel; so is a panel where one row meets one width twice
(two task labels that differ in something else than the width, which one point per width
cannot show).

Each point is a row at one width, at its chosen grid value (`selected`, the
cells the report reads): the test metric's mean and 95% CI over the seeds that finished,
and how many of the seeds run there did not finish. `smallest_solving` marks, per row,
the smallest width whose mean reaches `SOLVED`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...experiment.config import COUNTED
from ..run import Row, Run
from .stats import Estimate

#: The accuracy a row must reach (its mean over seeds) to count as solving the task.
SOLVED = 0.99


@dataclass(frozen=True)
class WidthPoint:
    """One row at one width: its test metric over the seeds that finished, at its chosen
    grid value (``chosen``, e.g. ``"lr=0.003"``; empty: not tuned)."""

    width: int
    task: str
    test: Estimate
    #: Seeds run at the chosen grid value that did not finish (failed, diverged, capped).
    failed: int
    #: Seeds run at the chosen grid value.
    run: int
    chosen: str


@dataclass(frozen=True)
class WidthPanel:
    """One task setting at several widths: per row label, its points by increasing width."""

    family: str
    #: The spec values that tell this panel from the family's other panels
    #: (``"hops=4, reassign=True"``); empty when the family has one panel.
    label: str
    metric: str
    higher_is_better: bool
    rows: dict[str, tuple[WidthPoint, ...]]

    @property
    def title(self) -> str:
        return f"{self.family}, {self.label}" if self.label else self.family


def row_width(row: Row) -> int | None:
    """The model width a row's cells run at (None: a model without one)."""
    width = row.cells[0].config.get("config", {}).get("width")
    return int(width) if isinstance(width, int | float) else None


def point(row: Row) -> WidthPoint | None:
    """A row's point at its width and chosen grid value (None: no width)."""
    width = row_width(row)
    if width is None:
        return None
    cells = row.selected
    finished = [c for c in cells if c.status in COUNTED]
    return WidthPoint(
        width,
        row.task,
        Estimate.of([c.metrics.get("test") for c in finished]),
        len(cells) - len(finished),
        len(cells),
        row.chosen_text(),
    )


def _setting(run: Run, task: str) -> tuple[str, str] | None:
    """A task's family and its resolved spec (as sorted JSON): the tasks of one panel share
    both; None for a cell config without them."""
    config = next(iter(run.task_rows(task).values())).cells[0].config
    if "task" not in config:
        return None
    return config["task"], json.dumps(config.get("spec", {}), sort_keys=True, default=str)


def width_panels(run: Run) -> list[WidthPanel]:
    """Every width sweep of the run (see the module docstring), one panel each, ordered by
    family and spec."""
    tasks: dict[tuple[str, str], list[str]] = defaultdict(list)
    for task in run.tasks:
        setting = _setting(run, task)
        if setting is not None:
            tasks[setting].append(task)
    panels: list[tuple[str, dict[str, Any], dict[str, tuple[WidthPoint, ...]]]] = []
    for (family, spec), labels in sorted(tasks.items()):
        by_row: dict[str, list[WidthPoint]] = defaultdict(list)
        for task in labels:
            for label, row in run.task_rows(task).items():
                if (found := point(row)) is not None:
                    by_row[label].append(found)
        widths = [[p.width for p in points] for points in by_row.values()]
        if any(len(set(w)) < len(w) for w in widths) or not any(len(set(w)) > 1 for w in widths):
            continue
        panels.append(
            (
                family,
                json.loads(spec),
                {
                    label: tuple(sorted(points, key=lambda p: p.width))
                    for label, points in sorted(by_row.items())
                },
            )
        )
    out = []
    for family, fields, rows in panels:
        peers = [s for f, s, _ in panels if f == family]
        shown = [f"{k}={v}" for k, v in sorted(fields.items()) if any(p.get(k) != v for p in peers)]
        some = next(iter(rows))
        described = run.rows[rows[some][0].task, some].described
        out.append(
            WidthPanel(
                family,
                ", ".join(shown),
                described.get("metric", "metric"),
                bool(described.get("higher_is_better", False)),
                rows,
            )
        )
    return out


def smallest_solving(
    points: Sequence[WidthPoint], higher_is_better: bool = True, solved: float = SOLVED
) -> int | None:
    """The smallest width whose mean test metric reaches ``solved`` (None: none does, or
    the metric is one where lower is better, which has no such mark)."""
    if not higher_is_better:
        return None
    reached = [p.width for p in points if p.test.mean is not None and p.test.mean >= solved]
    return min(reached, default=None)
