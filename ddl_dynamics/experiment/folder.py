"""A run folder, opened once: its store, trained weights, kept task files and probes.

A run folder holds ``results.sqlite`` (the `ResultStore`), ``models/<key>.pt``
(the trained weights, so analysis never retrains), ``task_files/`` (a copy of each user task
file the run imported, so the folder can be reported on its own) and ``probes/<key>.npz``
(what each trained model did on its test and OOD splits, a cache the analysis fills). A run
opens it once (`RunFolder.open` with ``"w"``) and saves every finished group through
it; a report opens it once (``"r"``) and reads everything from the one value: each probe
file is read at most once and kept in memory. Every file but the store is written through
`write_atomically`, so a process killed meanwhile leaves no partial file.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import zipfile
import zlib
from collections.abc import Callable, Iterable, Sequence
from operator import methodcaller
from pathlib import Path
from typing import Any, BinaryIO, Literal, cast

import numpy as np
import torch

from .._registry import load_file
from .._task import Task, list_tasks
from ..models.base import Model, list_models
from .config import Cell
from .store import ResultStore
from .trained import Trained

#: The store's file in a run folder.
STORE = "results.sqlite"


class RunFolder:
    """One run folder and its one open store (see the module docstring).

    ``"r"`` reads an existing folder and never writes its store (on read-only storage too);
    the probes it computes are written where the folder takes them, else kept in memory.
    ``"w"`` creates the folder and its store where they are missing.
    """

    def __init__(self, path: Path, store: ResultStore) -> None:
        self.path = path
        self.store = store
        #: Probe arrays by cell key, as read or computed (None: no readable file).
        self._probes: dict[str, dict[str, np.ndarray] | None] = {}

    @classmethod
    def open(
        cls, path: str | Path, mode: Literal["r", "w"] = "r", task_files: bool = True
    ) -> RunFolder:
        """Open a run folder; ``"r"`` refuses a missing one, and imports the run's kept task
        files where what they register is missing (so a ``--task-file`` given again takes
        precedence over the run's copy): Python from the folder, run as this process.
        ``task_files=False`` imports nothing (a folder of built-in tasks, or one not
        trusted)."""
        path = Path(path)
        if mode not in ("r", "w"):
            raise ValueError(f"unknown run folder mode {mode!r}; use 'r' or 'w'")
        if path.is_symlink() and not path.exists():
            raise FileNotFoundError(
                f"{path}: a symbolic link to {os.readlink(path)!r}, which "
                "does not exist or loops; give a folder"
            )
        if mode == "r" and not path.exists():
            raise FileNotFoundError(f"{path}: no such run folder")
        folder = cls(path, ResultStore(path / STORE, create=mode == "w"))
        if mode == "r" and task_files:
            for record in folder.store.task_files():
                if not set(record["registers"]) <= _registered():
                    load_task_file(path / record["copy"])
        return folder

    def model_path(self, key: str) -> Path:
        """Where the trained weights of cell ``key`` live."""
        return self.path / "models" / f"{key}.pt"

    def probe_path(self, key: str) -> Path:
        """Where the probe arrays of cell ``key`` live."""
        return self.path / "probes" / f"{key}.npz"

    def has_weights(self, key: str) -> bool:
        return self.model_path(key).is_file()

    def save(self, group: Sequence[Trained]) -> None:
        """Store a group's weights, each atomically, then its rows in one transaction: a
        stored row never points at half a file, and a run stopped meanwhile keeps all of the
        group or none."""
        for trained in group:
            if trained.weights is not None:
                write_atomically(
                    self.model_path(trained.result.key),
                    functools.partial(torch.save, trained.weights),
                )
        self.store.put_all([trained.result for trained in group])

    def load_model(self, key: str) -> tuple[Task, Model]:
        """Rebuild the task and trained model of cell ``key`` (eval mode)."""
        result = self.store.get(key)
        path = self.model_path(key)
        if result is None or not path.is_file():
            raise ValueError(f"{self.path}: no trained model for cell {key!r}")
        task, model = Cell.from_dict(result.config).build()
        try:
            model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        except Exception as err:  # a truncated or foreign file may fail in any way
            why = str(err).strip().splitlines()[:1] or [""]
            raise ValueError(
                f"damaged weights: {path}, of cell {key} ({result.task!r} × "
                f"{result.model!r}, seed {result.seed}), cannot be read "
                f"({type(err).__name__}: {why[0]})"
            ) from err
        return task, model.eval()

    def probe(self, key: str) -> dict[str, np.ndarray] | None:
        """The probe arrays of cell ``key``, read from its file once; None where the file is
        missing or cannot be read (cut short, damaged): that cell is then not yet probed."""
        if key not in self._probes:
            self._probes[key] = None
            path = self.probe_path(key)
            try:
                if path.is_file():
                    with np.load(path) as data:
                        self._probes[key] = dict(data)
            except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error):
                pass
        return self._probes[key]

    def put_probe(self, key: str, arrays: dict[str, np.ndarray]) -> None:
        """Keep the probe arrays of cell ``key``, and write them where the folder takes
        them (read-only storage, no permission or a full disk: in memory alone)."""
        self._probes[key] = arrays
        with contextlib.suppress(OSError):
            # (Any: numpy's stubs would match an array to allow_pickle)
            write_atomically(
                self.probe_path(key),
                functools.partial(np.savez_compressed, **cast("dict[str, Any]", arrays)),
            )

    def keep_task_files(self, paths: Iterable[str | Path]) -> list[dict[str, Any]]:
        """Copy user task files into ``task_files/<stem>-<hash>.py`` and import them;
        returns one record per file (its path, SHA-256, copy and what it registers) for
        `start_run`. Workers import the copies, so editing a task
        file while a run is going on changes nothing in that run."""
        records = []
        for path in map(Path, paths):
            if not path.is_file():
                raise FileNotFoundError(f"no such file: {path}")
            data = path.read_bytes()
            digest = hashlib.sha256(data).hexdigest()
            copy = Path("task_files") / f"{path.stem}-{digest[:12]}.py"
            target = self.path / copy
            if not target.is_file():  # concurrent runs copying the same file both succeed
                write_atomically(target, methodcaller("write", data))
            records.append(
                {
                    "file": str(path.resolve()),
                    "sha256": digest,
                    "copy": str(copy),
                    "registers": list(load_task_file(target)),
                }
            )
        return records


#: Content hash of each task file imported in this process → the names it registered.
_imported: dict[str, tuple[str, ...]] = {}


def load_task_file(path: str | Path) -> tuple[str, ...]:
    """Import a user task file once per process and per content (importing it twice, or
    its kept copy after it, would register its names twice); returns what it registered,
    as ``"task:<name>"`` and ``"model:<name>"``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest not in _imported:
        before = _registered()
        load_file(path)
        _imported[digest] = tuple(sorted(_registered() - before))
    return _imported[digest]


def write_atomically(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` through ``write(file)`` into a file beside it, then rename that into
    place: a process killed meanwhile leaves no partial file under ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as file:
            write(file)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _registered() -> set[str]:
    return {f"task:{n}" for n in list_tasks()} | {f"model:{n}" for n in list_models()}
