"""A run folder as one tidy table: a row per cell, a column per figure.

The table is a list of dicts with the same keys in the same order (``pandas.DataFrame`` takes
it as it is, and ``ddl-dyn report --format csv`` writes it), so that a reader needs no
knowledge of the store: the identity of a cell (task label, row label, seed, its values of
the searched training fields, whether it is at its row's chosen value), how it ended, and
every figure it recorded, one column each.

A published study ships the same table as ``cells.csv``, every cell the store holds (earlier
attempts and cells of older configs included), with three more columns that make it the data
and not a summary of it: ``attempt`` (an earlier attempt a later result replaced),
``created_at``, and the cell's resolved ``config`` and full ``metrics`` as JSON. From it
`published_run` rebuilds the run the report judges, so that a change of rule judges the
shipped cells again without a rerun.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..experiment.folder import RunFolder
from ..experiment.grid import searched
from ..experiment.result import RunResult
from .run import Run, load_run, run_of

#: A published study's per-cell data, and what its run recorded beside the cells.
CELLS, RECORD = "cells.csv", "record.json"

#: The figures every cell has a column for, after its identity and status: what the store
#: records beside the metrics (``RunResult``'s counts) and the ODE checks.
COUNTS = (
    "params",
    "flops",
    "nfe_forward",
    "nfe_backward",
    "nfe_test",
    "wall_time",
    "peak_mem",
    "reconstruction_error",
    "reconstruction_flag",
)


def load_results(run: Run | str | Path) -> list[dict[str, Any]]:
    """One dict per cell of a run folder or of a published study (``results/<study>``, read
    from its ``cells.csv``): the current version of each row's config, at every seed and grid
    value, with these keys, ``None`` where a cell has no value:

    ``task``, ``model`` (the row's labels), ``seed``, one key per searched training field
    (the cell's value, e.g. ``lr``), ``chosen`` (the cell is at its row's chosen grid value,
    the one the report shows), ``status``, ``message``, ``metric`` (its name) and
    ``higher_is_better``, ``train``, ``val``, ``test``, ``ood/<split>`` for each OOD split,
    ``extra/<name>`` for each task extra, ``steps`` trained, then `COUNTS`, and the
    cell ``key``.
    """
    if not isinstance(run, Run):
        run = published_run(run) if (Path(run) / CELLS).is_file() else load_run(run)
    return _records([c for row in run.rows.values() for c in row.cells], _chosen(run))


def _chosen(run: Run) -> set[str]:
    """The keys of the cells at their row's chosen grid value."""
    return {c.key for row in run.rows.values() for c in row.selected}


def _records(cells: Sequence[RunResult], chosen: set[str]) -> list[dict[str, Any]]:
    """One record per cell, ordered by task, row, seed and grid value."""
    grid, ood, extra = _columns(cells)
    ordered = sorted(cells, key=lambda c: (c.task, c.model, c.seed, _grid(c, grid)))
    return [_record(c, c.key in chosen, grid, ood, extra) for c in ordered]


def _columns(cells: Sequence[RunResult]) -> tuple[list[str], list[str], list[str]]:
    """The searched fields, OOD splits and task extras of ``cells``, in first-seen order."""
    return (
        list(dict.fromkeys(f for c in cells for f in searched(c.config))),
        list(dict.fromkeys(s for c in cells for s in c.metrics.get("ood", {}))),
        list(dict.fromkeys(n for c in cells for n in c.metrics.get("extra", {}))),
    )


def write_cells(folder: RunFolder, run: Run, path: str | Path) -> Path:
    """Write every cell of the run folder's store, then every earlier attempt, in the store's
    order, to ``path`` as CSV: `load_results`' columns, then ``attempt``,
    ``created_at``, ``config`` and ``metrics`` (JSON), the data `published_run` reads
    back into the same run."""
    store, chosen = folder.store, _chosen(run)
    tagged = [*((c, False) for c in store.rows()), *((a, True) for a in store.attempts())]
    grid, ood, extra = _columns([c for c, _ in tagged])
    records = [
        {
            **_record(c, not attempt and c.key in chosen, grid, ood, extra),
            "attempt": attempt,
            "created_at": c.created_at,
            "config": json.dumps(c.config, sort_keys=True),
            "metrics": json.dumps(c.metrics, sort_keys=True),
        }
        for c, attempt in tagged
    ]
    path = Path(path)
    path.write_text(results_csv(records))
    return path


def published_run(folder: str | Path) -> Run:
    """The run a published study's ``cells.csv`` holds, with the experiment record of its
    ``record.json``, as `load_run` read it from the run folder (no weights, no
    probes)."""
    folder = Path(folder)
    try:
        with (folder / CELLS).open(newline="") as file:
            rows = list(csv.DictReader(file))
        record = json.loads((folder / RECORD).read_text())
        tagged = [(_cell(row), row["attempt"] == "True") for row in rows]
        experiment, run_dir = record["experiment"], record["run_dir"]
    except (OSError, KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{folder / CELLS}: damaged ({type(err).__name__}: {err})") from None
    return run_of(
        [c for c, attempt in tagged if not attempt],
        [c for c, attempt in tagged if attempt],
        experiment,
        run_dir,
    )


def _cell(row: dict[str, str]) -> RunResult:
    """A cell from its ``cells.csv`` row (``""``: None)."""

    def number(name: str, kind: type) -> Any:
        return kind(row[name]) if row[name] else None

    def record(name: str) -> dict[str, Any]:
        found = json.loads(row[name])
        if not isinstance(found, dict):
            raise ValueError(f"cell {row['key']}: its {name} is not a JSON object")
        return found

    return RunResult(
        row["status"],
        row["message"],
        row["key"],
        row["task"],
        row["model"],
        int(row["seed"]),
        record("metrics"),
        [],
        number("params", int),
        number("flops", float),
        number("nfe_forward", float),
        number("nfe_backward", float),
        number("wall_time", float),
        number("peak_mem", int),
        record("config"),
        row["created_at"],
    )


def _grid(cell: RunResult, fields: Sequence[str]) -> tuple[str, ...]:
    """The cell's values of the searched ``fields``, as text to sort by."""
    train = cell.config.get("train", {})
    return tuple(repr(train.get(f)) for f in fields)


def _record(
    cell: RunResult, chosen: bool, grid: Sequence[str], ood: Sequence[str], extra: Sequence[str]
) -> dict[str, Any]:
    metrics, train = cell.metrics, cell.config.get("train", {})
    return {
        "task": cell.task,
        "model": cell.model,
        "seed": cell.seed,
        **{f: train.get(f) for f in grid},
        "chosen": chosen,
        "status": cell.status,
        "message": cell.message,
        "metric": metrics.get("metric"),
        "higher_is_better": metrics.get("higher_is_better"),
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
