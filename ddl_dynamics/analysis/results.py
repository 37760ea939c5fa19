"""A run folder as one tidy table: a row per cell, a column per figure.

The table is a list of dicts with the same keys in the same order (``pandas.DataFrame`` takes
it as it is, and ``ddl-dyn report --format csv`` writes it), so that a reader needs no
knowledge of the store: the identity of a cell (task label, row label, seed, its values of
the searched training fields, whether it is at its row's chosen value), how it ended, and
every figure it recorded, one column each.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..experiment.result import RunResult
from .run import Row, Run, load_run

#: The figures every cell has a column for, after its identity and status: what the store
#: records beside the metrics (``RunResult``'s counts) and the ODE checks.
COUNTS = ("params", "flops", "nfe_forward", "nfe_backward", "nfe_test", "wall_time",
          "peak_mem", "reconstruction_error", "reconstruction_flag")


def load_results(run: Run | str | Path) -> list[dict[str, Any]]:
    """One dict per cell of a run folder (the current version of each row's config, at every
    seed and grid value), with these keys, ``None`` where a cell has no value:

    ``task``, ``model`` (the row's labels), ``seed``, one key per searched training field
    (the cell's value, e.g. ``lr``), ``chosen`` (the cell is at its row's chosen grid value,
    the one the report shows), ``status``, ``message``, ``metric`` (its name) and
    ``higher_is_better``, ``train``, ``val``, ``test``, ``ood/<split>`` for each OOD split,
    ``extra/<name>`` for each task extra, ``steps`` trained, then `COUNTS`, and the
    cell ``key``.
    """
    run = run if isinstance(run, Run) else load_run(run)
    rows = sorted(run.rows.values(), key=lambda row: (row.task, row.label))
    grid = list(dict.fromkeys(f for row in rows for f in row.grid))
    cells = [(row, cell, cell.key in {c.key for c in row.selected}) for row in rows
             for cell in sorted(row.cells, key=lambda c: (c.seed, _grid(c, grid)))]
    ood = list(dict.fromkeys(s for _, c, _ in cells for s in c.metrics.get("ood", {})))
    extra = list(dict.fromkeys(n for _, c, _ in cells for n in c.metrics.get("extra", {})))
    return [_record(row, cell, chosen, grid, ood, extra) for row, cell, chosen in cells]


def _grid(cell: RunResult, fields: Sequence[str]) -> tuple[str, ...]:
    """The cell's values of the searched ``fields``, as text to sort by."""
    train = cell.config.get("train", {})
    return tuple(repr(train.get(f)) for f in fields)


def _record(row: Row, cell: RunResult, chosen: bool, grid: Sequence[str], ood: Sequence[str],
            extra: Sequence[str]) -> dict[str, Any]:
    metrics, train = cell.metrics, cell.config.get("train", {})
    return {
        "task": row.task, "model": row.label, "seed": cell.seed,
        **{f: train.get(f) for f in grid},
        "chosen": chosen, "status": cell.status, "message": cell.message,
        "metric": metrics.get("metric"), "higher_is_better": metrics.get("higher_is_better"),
        **{split: metrics.get(split) for split in ("train", "val", "test")},
        **{f"ood/{s}": metrics.get("ood", {}).get(s) for s in ood},
        **{f"extra/{n}": metrics.get("extra", {}).get(n) for n in extra},
        "steps": metrics.get("steps"),
        **{name: getattr(cell, name, metrics.get(name)) for name in COUNTS},
        "key": cell.key,
    }


def results_csv(records: Sequence[dict[str, Any]]) -> str:
    """The table of `load_results` as CSV, a header row first (empty cells: None)."""
    buffer = io.StringIO()
    if records:
        writer = csv.DictWriter(buffer, list(records[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(records)
    return buffer.getvalue()
