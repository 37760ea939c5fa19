"""The results store: one SQLite file per run folder, one row per cell.

A run folder holds ``results.sqlite`` and ``models/<key>.pt`` (the trained weights, so
analysis never retrains). Every row is written in its own transaction, in WAL mode, by
the process that trained the cell: a run killed at any moment keeps every finished cell,
and a rerun skips them (see :data:`FINISHED`; ``"failed"`` cells run again).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sqlite3
import sys
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch

from .._registry import load_file
from .._task import Task
from .config import FINISHED, Cell

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    key TEXT PRIMARY KEY,
    task TEXT NOT NULL,
    model TEXT NOT NULL,
    seed INTEGER NOT NULL,
    status TEXT NOT NULL,
    message TEXT NOT NULL,
    metrics TEXT NOT NULL,
    curve TEXT NOT NULL,
    params INTEGER,
    flops REAL,
    nfe_forward REAL,
    nfe_backward REAL,
    wall_time REAL,
    peak_mem INTEGER,
    config TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    config TEXT NOT NULL,
    task_files TEXT NOT NULL,
    versions TEXT NOT NULL,
    machine TEXT NOT NULL,
    started_at TEXT NOT NULL,
    ended_at TEXT
);
"""
_JSON_COLUMNS = ("metrics", "curve", "config")
#: Statuses a cell can end with.
STATUSES = ("ok", "capped", "diverged", "failed")


@dataclass
class RunResult:
    """The record of one trained cell, as stored.

    Attributes:
        status: ``"ok"``; or a failure of the model on this seed, which never enters a
            mean (``config.COUNTED``): ``"capped"`` (a time or solver cap stopped training or
            the final evaluation; what was reached is kept), ``"diverged"`` (non-finite
            loss; scored as it stands) or ``"failed"`` (an exception; no metrics).
        metrics: ``metric``/``higher_is_better`` (how to read the numbers), ``train``,
            ``val``, ``test`` (scored once, after training; None only where the model could
            not be scored), ``ood`` (split → value, None when the model cannot run it) with
            ``skipped`` (split → reason), ``extra`` (task extras; ``"split/name"`` for OOD
            splits), ``steps`` trained, ``peak_mem_measure`` (what ``peak_mem`` measured),
            and for ODE models ``nfe_test``, ``reconstruction_error``,
            ``reconstruction_tolerance`` and ``reconstruction_flag`` (True when the error
            exceeds the tolerance: the solver, not the vector field alone, shaped the result).
        curve: ``[step, mean train loss since last point, val metric, cumulative FLOPs,
            mean forward NFE since last point (None for discrete models)]``.
        flops: forward FLOPs per sample (matmul-class ops, as counted by torch).
        nfe_forward, nfe_backward: ODE function evaluations per training batch, averaged.
        peak_mem: bytes, the peak during this cell (CUDA: memory allocated; CPU: resident set
            size, where the platform can reset its high-water mark, else the worker
            process's peak so far; ``metrics["peak_mem_measure"]`` says which).
        config: the fully resolved cell (:meth:`Cell.to_dict`), every model option with
            its default filled in: the gate's ``beta_init``/``value_source``, an ODE's
            ``method``, ``rtol``, ``atol`` and ``max_steps``; and the row's ``baseline``,
            ``match_params`` and ``params_target``.
    """

    status: str
    message: str = ""
    key: str = ""
    task: str = ""
    model: str = ""
    seed: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)
    curve: list[list[float]] = field(default_factory=list)
    params: int | None = None
    flops: float | None = None
    nfe_forward: float | None = None
    nfe_backward: float | None = None
    wall_time: float | None = None
    peak_mem: int | None = None
    config: dict[str, Any] = field(default_factory=dict)
    created_at: str = ""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def model_path(run_dir: str | Path, key: str) -> Path:
    """Where the trained weights of cell ``key`` live in a run folder."""
    return Path(run_dir) / "models" / f"{key}.pt"


def store_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "results.sqlite"


class ResultStore:
    """Rows of :class:`RunResult` in SQLite; safe to write from several processes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._transaction() as con:
            con.execute("PRAGMA journal_mode=WAL")
            con.executescript(_SCHEMA)

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """A short-lived connection whose work commits as one transaction, or not at all."""
        with closing(sqlite3.connect(self.path, timeout=60)) as con:
            con.execute("PRAGMA busy_timeout = 60000")
            con.row_factory = sqlite3.Row
            with con:
                yield con

    def put(self, result: RunResult) -> None:
        """Insert or replace the row of ``result.key``."""
        row = dataclasses.asdict(result)
        row["created_at"] = _now()
        for column in _JSON_COLUMNS:
            row[column] = json.dumps(row[column])
        names = ", ".join(row)
        with self._transaction() as con:
            con.execute(
                f"INSERT OR REPLACE INTO results ({names}) VALUES "
                f"({', '.join(':' + n for n in row)})",
                row,
            )

    def get(self, key: str) -> RunResult | None:
        rows = self._select("WHERE key = ?", (key,))
        return rows[0] if rows else None

    def done_keys(self) -> set[str]:
        """Keys of finished cells, which a resumed run skips."""
        marks = ", ".join("?" for _ in FINISHED)
        with self._transaction() as con:
            found = con.execute(f"SELECT key FROM results WHERE status IN ({marks})", FINISHED)
            return {row["key"] for row in found}

    def rows(self, task: str | None = None, model: str | None = None) -> list[RunResult]:
        """All rows, or those of one task and/or model label, ordered by task, model, seed."""
        where, args = [], []
        for column, value in (("task", task), ("model", model)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        return self._select(f"{clause} ORDER BY task, model, seed, created_at", tuple(args))

    def _select(self, clause: str, args: Sequence[Any]) -> list[RunResult]:
        with self._transaction() as con:
            rows = [dict(row) for row in con.execute(f"SELECT * FROM results {clause}", args)]
        for row in rows:
            for column in _JSON_COLUMNS:
                row[column] = json.loads(row[column])
        return [RunResult(**row) for row in rows]

    def start_run(self, name: str, config_text: str, task_files: Sequence[str] = ()) -> int:
        """Record that a run (or a resume) of experiment ``name`` starts now."""
        with self._transaction() as con:
            cursor = con.execute(
                "INSERT INTO runs (name, config, task_files, versions, machine, started_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (name, config_text, json.dumps(list(task_files)), json.dumps(_versions()),
                 json.dumps(_machine()), _now()),
            )
            return int(cursor.lastrowid)

    def finish_run(self, run_id: int) -> None:
        with self._transaction() as con:
            con.execute("UPDATE runs SET ended_at = ? WHERE id = ?", (_now(), run_id))

    def experiment(self) -> dict[str, Any] | None:
        """The latest run's record: name, config text, task files, versions, machine, times."""
        with self._transaction() as con:
            row = con.execute("SELECT * FROM runs ORDER BY id DESC LIMIT 1").fetchone()
        if row is None:
            return None
        record = dict(row)
        for column in ("task_files", "versions", "machine"):
            record[column] = json.loads(record[column])
        return record


def load_trained(run_dir: str | Path, key: str) -> tuple[Task, torch.nn.Module]:
    """Rebuild the task and trained model of cell ``key`` from a run folder (eval mode).

    Task files the run was started with are imported first if their tasks are missing.
    """
    store = ResultStore(store_path(run_dir))
    result = store.get(key)
    path = model_path(run_dir, key)
    if result is None or not path.is_file():
        raise ValueError(f"{run_dir}: no trained model for cell {key!r}")
    cell = Cell.from_dict(result.config)
    for task_file in (store.experiment() or {}).get("task_files", []):
        load_task_file(task_file)
    task, model = cell.build()
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return task, model.eval()


_loaded_files: set[str] = set()


def load_task_file(path: str | Path) -> None:
    """Import a user task file once per process (importing twice would re-register)."""
    resolved = str(Path(path).resolve())
    if resolved not in _loaded_files:
        load_file(resolved)
        _loaded_files.add(resolved)


def _versions() -> dict[str, str]:
    found = {"python": sys.version.split()[0]}
    for package in ("torch", "torchdiffeq", "numpy", "scipy", "ddl-dynamics"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "absent"
    return found


def _machine() -> dict[str, Any]:
    machine = {"platform": platform.platform(), "processor": platform.machine(),
               "cpu_count": os.cpu_count()}
    if torch.cuda.is_available():
        machine["cuda"] = torch.cuda.get_device_name()
    return machine
