"""The results store's SQLite schema, its version, and the tables a store file holds: what
`ResultStore` creates and what it checks a file it opens against."""

from __future__ import annotations

import sqlite3
from contextlib import closing

#: A result's columns after its key: a cell's row in ``results``, and each earlier attempt at
#: it in ``attempts``, which copies them over when the cell is retried.
_RESULT_COLUMNS = """
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
"""
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS results (
    key TEXT PRIMARY KEY,{_RESULT_COLUMNS});
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    config TEXT NOT NULL,
    task_files TEXT NOT NULL,
    versions TEXT NOT NULL,
    machine TEXT NOT NULL,
    started_at TEXT NOT NULL,
    ended_at TEXT,
    cells TEXT
);
CREATE TABLE IF NOT EXISTS attempts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,{_RESULT_COLUMNS});
CREATE TABLE IF NOT EXISTS claims (
    key TEXT PRIMARY KEY,
    owner TEXT,
    heartbeat REAL,
    generation INTEGER NOT NULL DEFAULT 0
);
"""
#: The version of `SCHEMA`, kept in the file as SQLite's ``user_version``: a store
#: written under another one is refused. 0 is a store from before versions were kept; one
#: whose tables are exactly version 1's (the 0.x releases wrote them) is read as version 1.
SCHEMA_VERSION = 1


def table_sql(source: sqlite3.Connection | str) -> list[str]:
    """The ``CREATE TABLE`` statements of a store (or of a schema script), in name order."""
    if isinstance(source, str):
        with closing(sqlite3.connect(":memory:")) as con:
            con.executescript(source)
            return table_sql(con)
    return [
        row[0]
        for row in source.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' ORDER BY name"
        )
    ]
