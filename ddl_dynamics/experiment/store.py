"""The results store: one SQLite file per run folder, one row per cell.

The rows of the cells trained together are written in one transaction
(`ResultStore.put_all`), in WAL mode, by the run's own process (through its
`RunFolder`): a run killed at any moment keeps every finished group, and a
rerun skips them (see `FINISHED`; ``"failed"`` cells run again).

Several processes split one experiment by *claiming* cells before training them
(`ResultStore.claim`, `heartbeat`, `release`):
a claim is a row of the ``claims`` table with its owner and the owner's last heartbeat,
taken in one transaction; a claim whose heartbeat is older than ``stale_after`` seconds
is taken over. Each cell also counts the results written for it (its *generation*), so a
process that saw a cell unfinished learns, when it comes to claim it, that another
process has finished it meanwhile.

A store carries its schema's version (SQLite's ``user_version``, `SCHEMA_VERSION`); a
store of another version is refused, never read half-right.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sqlite3
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from .config import FINISHED, cell_key, check_label
from .provenance import Progress, machine, versions
from .result import STATUSES, RunResult
from .schema import SCHEMA, SCHEMA_VERSION, table_sql

#: The columns stored as JSON, and the type each holds.
_JSON_COLUMNS = {"metrics": dict, "curve": list, "config": dict}
#: SQLite errors that are the storage's problem, not the file's, by their names' prefix
#: (``SQLITE_READONLY_DIRECTORY`` is read-only); any other means it is not a results store.
_STORAGE_ERRORS = {
    "SQLITE_FULL": "disk full",
    "SQLITE_READONLY": "read-only",
    "SQLITE_PERM": "permission denied",
    "SQLITE_AUTH": "permission denied",
    "SQLITE_IOERR": "I/O error",
    "SQLITE_CANTOPEN": "cannot open",
}
#: What `ResultStore.claim` found: the cell is now the caller's; another live
#: process holds it; or a result was written for it since the caller looked.
Claim = Literal["claimed", "busy", "done"]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


class ResultStore:
    """Rows of `RunResult` in SQLite; safe to write from several processes.

    ``create=False`` opens an existing store read-only (on read-only storage too): it never
    writes to the file. A file that is not a results store (corrupt, truncated, or another
    program's SQLite database) raises ``ValueError("not a results store: …")`` and is left
    as it was; a problem of the storage raises ``OSError`` saying which (disk full,
    read-only, permission denied, an I/O error).
    """

    def __init__(self, path: str | Path, create: bool = True) -> None:
        self.path = Path(path)
        folder = self.path.parent
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"{folder}: a file, not a run folder")
        if not create and not self.path.is_file():
            raise FileNotFoundError(f"{folder}: no results store ({self.path.name}) here")
        self._uri = None if create else self._read_only_uri()
        if create:
            folder.mkdir(parents=True, exist_ok=True)
        with self._transaction() as con:
            tables = {
                row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
            if tables or not create:  # an empty file becomes a store only when creating
                self._check_version(con, tables)
        if create:
            self._use_wal()
            if not tables:  # one transaction: no reader sees the tables without the version
                with self._transaction() as con:  # (two runs creating one store both may)
                    con.executescript(
                        f"BEGIN IMMEDIATE;{SCHEMA}PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
                    )

    def _read_only_uri(self) -> str:
        """A URI that reads the store and never writes: ``mode=ro``, or where the folder
        cannot take SQLite's shared-memory file (read-only storage) ``immutable=1``, which
        reads the file as it is."""
        uri = f"{self.path.resolve().as_uri()}?mode=ro"
        try:
            with closing(sqlite3.connect(uri, uri=True)) as con:
                con.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.DatabaseError as err:
            if getattr(err, "sqlite_errorname", "").startswith("SQLITE_READONLY"):
                return f"{uri}&immutable=1"
        return uri

    def _refusal(self, err: sqlite3.DatabaseError) -> OSError | ValueError:
        """What a SQLite error other than a busy or locked database means: a problem of the
        storage (``OSError``, named) or a file that is not a results store (``ValueError``)."""
        name = getattr(err, "sqlite_errorname", "")
        why = next(
            (why for prefix, why in _STORAGE_ERRORS.items() if name.startswith(prefix)), None
        )
        if why == "cannot open":  # the OS knows why: permission denied, most often
            try:
                self.path.open("rb").close()
            except OSError as denied:
                why = (denied.strerror or why).lower()
        if why is None:
            return ValueError(f"not a results store: {self.path} ({err})")
        return OSError(f"{why}: {self.path} ({err})")

    def _use_wal(self, wait: float = 60.0) -> None:
        """Put the file in WAL mode (it stays so) unless it is already. Two runs creating
        one store both ask, and SQLite may answer one "locked" at once (waiting could
        deadlock): it asks again for up to ``wait`` seconds, and then finds WAL mode on."""
        deadline = time.monotonic() + wait
        while True:
            try:
                with closing(sqlite3.connect(self.path, timeout=wait, isolation_level=None)) as con:
                    if con.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                        con.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as err:
                busy = getattr(err, "sqlite_errorname", "").startswith(
                    ("SQLITE_BUSY", "SQLITE_LOCKED")
                )
                if not busy:
                    raise self._refusal(err) from err
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _check_version(self, con: sqlite3.Connection, tables: set[str]) -> None:
        """``ValueError`` unless the file is a results store of `SCHEMA_VERSION`."""
        columns = (
            {row[1] for row in con.execute("PRAGMA table_info(results)")}
            if "results" in tables
            else set()
        )
        missing = [f.name for f in dataclasses.fields(RunResult) if f.name not in columns]
        if missing:
            why = f"its results table has no {missing[0]!r}" if columns else "no results table"
            raise ValueError(f"not a results store: {self.path} ({why})")
        found = con.execute("PRAGMA user_version").fetchone()[0]
        if found == 0 and table_sql(con) == table_sql(SCHEMA):
            found = 1  # version 1's layout, written before the version was kept
        if found != SCHEMA_VERSION:
            raise ValueError(
                f"{self.path}: a results store of schema version {found}; this "
                f"version of ddl_dynamics reads version {SCHEMA_VERSION} alone "
                "(rerun the experiment into a new run folder)"
            )

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """A short-lived connection (read-only where the store was opened so) whose work
        commits as one transaction, or not at all. SQLite errors other than a busy or
        locked database become `_refusal`s."""
        try:
            with closing(
                sqlite3.connect(self.path, timeout=60)
                if self._uri is None
                else sqlite3.connect(self._uri, uri=True, timeout=60)
            ) as con:
                con.execute("PRAGMA busy_timeout = 60000")
                con.row_factory = sqlite3.Row
                with con:
                    yield con
        except sqlite3.DatabaseError as err:
            if getattr(err, "sqlite_errorname", "").startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
                raise
            raise self._refusal(err) from err

    def put(self, result: RunResult) -> None:
        """Write the row of ``result.key`` (`put_all` of one)."""
        self.put_all([result])

    def put_all(self, results: Sequence[RunResult]) -> None:
        """Write the rows of ``results`` in one transaction (the cells of an ensemble are
        stored all or none, so a resumed run trains the same ensembles), keeping each row
        one replaces (an earlier attempt at the cell: a failure retried, say) in the
        attempts table; this ends any claim on the cells and advances their generation."""
        with self._transaction() as con:
            for result in results:
                row = dataclasses.asdict(result)
                row["created_at"] = _now()
                for column in _JSON_COLUMNS:
                    row[column] = json.dumps(row[column])
                names = ", ".join(row)
                con.execute(
                    f"INSERT INTO attempts ({names}) SELECT {names} FROM results WHERE key = ?",
                    (result.key,),
                )
                con.execute(
                    f"INSERT OR REPLACE INTO results ({names}) VALUES "
                    f"({', '.join(':' + n for n in row)})",
                    row,
                )
                con.execute(
                    "INSERT INTO claims (key, generation) VALUES (?, 1) ON CONFLICT (key) DO "
                    "UPDATE SET generation = generation + 1, owner = NULL, heartbeat = NULL",
                    (result.key,),
                )

    def get(self, key: str) -> RunResult | None:
        """The row of cell ``key``, if any."""
        rows = self._select("WHERE key = ?", (key,))
        return rows[0] if rows else None

    def todo(self, keys: Iterable[str], finished: Collection[str] = FINISHED) -> dict[str, int]:
        """The cells among ``keys`` without a row of a ``finished`` status, each with its
        generation (results written for it so far), to pass to `claim`."""
        with self._transaction() as con:
            con.execute("BEGIN")  # one snapshot of both tables
            status = {r["key"]: r["status"] for r in con.execute("SELECT key, status FROM results")}
            generation = {
                r["key"]: r["generation"] for r in con.execute("SELECT key, generation FROM claims")
            }
        return {key: generation.get(key, 0) for key in keys if status.get(key) not in finished}

    def claim(self, key: str, owner: str, generation: int, stale_after: float) -> Claim:
        """Take cell ``key`` for ``owner`` (`claim_all` of one)."""
        return self.claim_all({key: generation}, owner, stale_after)[key]

    def claim_all(
        self, generations: Mapping[str, int], owner: str, stale_after: float
    ) -> dict[str, Claim]:
        """Take the cells ``generations`` names for ``owner``, in one transaction (a group
        another run claims at the same time is never split between the two), each unless a
        result was written for it since it was at its generation (``"done"``) or another
        owner holds it and sent a heartbeat within ``stale_after`` seconds (``"busy"``)."""
        now = time.time()
        found: dict[str, Claim] = {}
        with self._transaction() as con:
            con.execute("BEGIN IMMEDIATE")
            for key, generation in generations.items():
                con.execute("INSERT OR IGNORE INTO claims (key) VALUES (?)", (key,))
                taken = con.execute(
                    "UPDATE claims SET owner = ?, heartbeat = ? WHERE key = ? AND generation = ? "
                    "AND (owner IS NULL OR owner = ? OR heartbeat < ?)",
                    (owner, now, key, generation, owner, now - stale_after),
                ).rowcount
                current = con.execute(
                    "SELECT generation FROM claims WHERE key = ?", (key,)
                ).fetchone()
                found[key] = (
                    "claimed"
                    if taken
                    else "busy"
                    if current["generation"] == generation
                    else "done"
                )
        return found

    def heartbeat(self, owner: str) -> None:
        """Mark every claim of ``owner`` as alive now."""
        with self._transaction() as con:
            con.execute("UPDATE claims SET heartbeat = ? WHERE owner = ?", (time.time(), owner))

    def release(self, owner: str, keys: Iterable[str] | None = None) -> None:
        """Give up the claims of ``owner`` (on ``keys``, or all) without a result."""
        where, args = "owner = ?", [owner]
        if keys is not None:
            keys = list(keys)
            where += f" AND key IN ({', '.join('?' for _ in keys)})"
            args += keys
        with self._transaction() as con:
            con.execute(f"UPDATE claims SET owner = NULL, heartbeat = NULL WHERE {where}", args)

    def owners(self) -> set[str]:
        """The owners holding claims now."""
        with self._transaction() as con:
            found = con.execute("SELECT DISTINCT owner FROM claims WHERE owner IS NOT NULL")
            return {row["owner"] for row in found}

    def rows(self, task: str | None = None, model: str | None = None) -> list[RunResult]:
        """All rows, or those of one task and/or model label, ordered by task, model, seed."""
        where, args = [], []
        for column, value in (("task", task), ("model", model)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        return self._select(f"{clause} ORDER BY task, model, seed, created_at", tuple(args))

    def attempts(self) -> list[RunResult]:
        """Every row a later attempt at its cell replaced, oldest first: a retried failure
        stays on record."""
        return self._select("ORDER BY id", (), table="attempts")

    def _select(self, clause: str, args: Sequence[Any], table: str = "results") -> list[RunResult]:
        with self._transaction() as con:
            rows = [dict(row) for row in con.execute(f"SELECT * FROM {table} {clause}", args)]
        for row in rows:
            row.pop("id", None)
        return [self._result(row) for row in rows]

    def _run_cells(self, run_id: int, text: str) -> list[str]:
        try:
            keys = json.loads(text)
        except (TypeError, ValueError):
            keys = None
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise ValueError(
                f"damaged run record in {self.path}: runs row {run_id}: its cells "
                "are not a JSON list of cell keys"
            )
        return keys

    def _result(self, row: dict[str, Any]) -> RunResult:
        """A stored row as a `RunResult`, or ``ValueError`` naming the cell where the
        row is damaged: a JSON column that does not hold its JSON, a label that cannot name
        files, a seed that is not an integer, an unknown status, scores that are not numbers,
        no metrics for an ``"ok"`` cell, or a key made from a config (`cell_key`, 16
        hex digits) that its config no longer hashes to."""
        try:
            for column, kind in _JSON_COLUMNS.items():
                try:
                    row[column] = json.loads(row[column])
                except (TypeError, ValueError) as err:
                    raise ValueError(f"its {column} is not JSON ({err})") from None
                if not isinstance(row[column], kind):
                    raise ValueError(
                        f"its {column} is not a JSON {'object' if kind is dict else 'array'}"
                    )
            for column in ("task", "model"):
                check_label(row[column])
            _check_row(row)
        except ValueError as err:
            raise ValueError(
                f"damaged row in {self.path}: cell {row['key']} ({row['task']!r} "
                f"× {row['model']!r}, seed {row['seed']!r}): {err}"
            ) from None
        return RunResult(**row)

    def start_run(
        self,
        name: str,
        config_text: str,
        task_files: Sequence[dict[str, Any]] = (),
        cells: Sequence[str] = (),
    ) -> int:
        """Record that a run (or a resume) of experiment ``name`` starts now, with the records
        of `keep_task_files` and the keys of the cells it selected."""
        with self._transaction() as con:
            cursor = con.execute(
                "INSERT INTO runs (name, config, task_files, versions, machine, started_at, "
                "cells) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    name,
                    config_text,
                    json.dumps(list(task_files)),
                    json.dumps(versions()),
                    json.dumps(machine()),
                    _now(),
                    json.dumps(list(cells)),
                ),
            )
            if cursor.lastrowid is None:  # (an INSERT sets it)
                raise RuntimeError(f"the store gave no id to the new run {name!r}")
            return int(cursor.lastrowid)

    def add_cells(self, run_id: int, keys: Sequence[str]) -> None:
        """Add cells a run selected as it went (a grid's extension) to its record."""
        with self._transaction() as con:
            con.execute("BEGIN IMMEDIATE")
            row = con.execute("SELECT cells FROM runs WHERE id = ?", (run_id,)).fetchone()
            cells = [*self._run_cells(run_id, row["cells"]), *keys]
            con.execute("UPDATE runs SET cells = ? WHERE id = ?", (json.dumps(cells), run_id))

    def finish_run(self, run_id: int) -> None:
        with self._transaction() as con:
            con.execute("UPDATE runs SET ended_at = ? WHERE id = ?", (_now(), run_id))

    def progress(self) -> Progress | None:
        """How far the latest run got, or None where no run started yet."""
        with self._transaction() as con:
            con.execute("BEGIN")  # one snapshot of both tables
            run = con.execute("SELECT * FROM runs ORDER BY id DESC LIMIT 1").fetchone()
            stored = {row["key"] for row in con.execute("SELECT key FROM results")}
        if run is None:
            return None
        keys = set(self._run_cells(run["id"], run["cells"]))
        return Progress(len(keys & stored), len(keys), run["ended_at"] is not None)

    def spans(self) -> list[tuple[str, str | None]]:
        """When each run into the store started and ended, oldest first: a study resumed or
        grown in several runs took their sum. A run that did not end (killed) counts to its
        last stored result before the next run began (None: it stored none), so the part a
        kill lost is left out, never the part it kept."""
        with self._transaction() as con:
            runs = [
                (r["started_at"], r["ended_at"])
                for r in con.execute("SELECT started_at, ended_at FROM runs ORDER BY id")
            ]
            spans = []
            for i, (start, end) in enumerate(runs):
                if end is None:
                    until = runs[i + 1][0] if i + 1 < len(runs) else "~"  # after any date
                    end = con.execute(
                        "SELECT max(created_at) FROM (SELECT created_at FROM results UNION ALL "
                        "SELECT created_at FROM attempts) WHERE created_at >= ? AND "
                        "created_at < ?",
                        (start, until),
                    ).fetchone()[0]
                spans.append((start, end))
            return spans

    def experiment(self) -> dict[str, Any] | None:
        """The latest run's record: name, config text, task files, versions, machine, times."""
        with self._transaction() as con:
            row = con.execute("SELECT * FROM runs ORDER BY id DESC LIMIT 1").fetchone()
        if row is None:
            return None
        record = dict(row)
        for column, kind in (("task_files", list), ("versions", dict), ("machine", dict)):
            try:
                record[column] = json.loads(record[column])
            except (TypeError, ValueError):
                record[column] = None
            if not isinstance(record[column], kind):
                raise ValueError(
                    f"damaged run record in {self.path}: runs row {row['id']}: "
                    f"its {column} is not a JSON "
                    f"{'array' if kind is list else 'object'}"
                )
        return record

    def task_files(self) -> list[dict[str, Any]]:
        """The kept task files of every run in this store, newest run first, one per
        content."""
        with self._transaction() as con:
            runs = con.execute("SELECT task_files FROM runs ORDER BY id DESC").fetchall()
        kept: dict[str, dict[str, Any]] = {}
        for run in runs:
            for record in json.loads(run["task_files"]):
                kept.setdefault(record["sha256"], record)
        return list(kept.values())


def _check_row(row: dict[str, Any]) -> None:
    """``ValueError`` saying what is wrong with a decoded row's values (see
    `ResultStore._result`)."""
    if type(row["seed"]) is not int:
        raise ValueError(f"its seed is not an integer ({row['seed']!r})")
    if row["status"] not in STATUSES:
        raise ValueError(f"unknown status {row['status']!r}; statuses: {', '.join(STATUSES)}")
    metrics = row["metrics"]
    if not metrics and row["status"] == "ok":  # a failure may stop before any score
        raise ValueError("an 'ok' cell without metrics")
    scores = {split: metrics.get(split) for split in ("train", "val", "test")}
    ood = metrics.get("ood", {})
    if not isinstance(ood, dict):
        raise ValueError("its metrics' ood is not a JSON object")
    for split, value in {**scores, **{f"ood {k}": v for k, v in ood.items()}}.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"its {split} metric is not a number ({value!r})")
    made = isinstance(row["key"], str) and re.fullmatch(r"[0-9a-f]{16}", row["key"])
    if made and cell_key(row["config"]) != row["key"]:
        raise ValueError("its config is not the one its key was made from (edited or cut)")
