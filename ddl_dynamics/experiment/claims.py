"""How several runs of one experiment split its cells: each claims a group in the store
before training it, keeps its claims alive with a heartbeat every `HEARTBEAT`
seconds, and takes over a claim whose owner has been silent for `STALE_AFTER`
seconds, or at once when the owner was a process of this machine that no longer exists.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections import deque
from collections.abc import Collection, Sequence

from ..models.base import family
from .config import Cell
from .store import ResultStore
from .train import seed_groups

#: Seconds between a run's heartbeats on its claims.
HEARTBEAT = 10.0
#: Seconds without a heartbeat after which another run takes a claimed cell over.
STALE_AFTER = 120.0
#: Seconds between looks at cells that other runs are training.
POLL = 1.0


class CellQueue:
    """The cells this run still has to train, in groups that train together
    (`seed_groups`, or one cell each without
    ``vectorize``); each cell is claimed in the store when its group is taken, so that
    several runs split one experiment. While open, a background thread sends the heartbeat
    of this run's claims, and closing it releases those not finished."""

    def __init__(
        self,
        store: ResultStore,
        cells: Sequence[Cell],
        finished: Collection[str],
        vectorize: bool = True,
        workers: int = 1,
    ) -> None:
        self.store = store
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.generation = store.todo((c.key for c in cells), finished)
        todo = [c for c in cells if c.key in self.generation]
        groups = seed_groups(todo, workers) if vectorize else [[cell] for cell in todo]
        self.fresh = deque(sorted(groups, key=lambda g: _cost(g[0]), reverse=True))
        self.busy = deque[list[Cell]]()  # cells other runs held when last tried
        self.size = len(todo)
        self.skipped, self.taken, self.others = len(cells) - len(todo), 0, 0
        self._freed = False  # dead runs' claims released yet
        self._closed = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, daemon=True)

    def __enter__(self) -> CellQueue:
        self._beat.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed.set()
        self._beat.join()
        self.store.release(self.owner)

    def take(self, block: bool) -> list[Cell]:
        """The next group to train, its cells now claimed by this run (those another run
        holds wait for a later take); empty if no cell is free now or, with ``block``,
        once every cell is finished (waiting for the other runs). The claims of a killed
        run of this machine are freed first, so that its groups train whole, as they would
        have in one uninterrupted run."""
        if not self._freed:
            self._release_dead_owners()
            self._freed = True
        while True:
            while self.fresh:
                if group := self._claim(self.fresh.popleft()):
                    return group
            if self.busy:
                self._release_dead_owners()
            for _ in range(len(self.busy)):
                if group := self._claim(self.busy.popleft()):
                    return group
            if not self.busy or not block:
                return []
            time.sleep(POLL)

    def _claim(self, group: list[Cell]) -> list[Cell]:
        """The cells of ``group`` this run could claim; those others hold go to ``busy``."""
        claimed: list[Cell] = []
        busy: list[Cell] = []
        states = self.store.claim_all(
            {c.key: self.generation[c.key] for c in group}, self.owner, STALE_AFTER
        )
        for cell in group:
            state = states[cell.key]
            (claimed if state == "claimed" else busy if state == "busy" else []).append(cell)
            self.others += state == "done"
        if busy:
            self.busy.append(busy)
        self.taken += len(claimed)
        return claimed

    def _release_dead_owners(self) -> None:
        """Free the claims of runs on this machine whose process is gone (killed)."""
        host = socket.gethostname()
        for owner in self.store.owners():
            name, pid, tag = owner.rsplit(":", 2) if owner.count(":") >= 2 else ("", "", "")
            if not (name and pid.isdigit() and tag):
                raise ValueError(
                    f"damaged claim in {self.store.path}: claims table, owner "
                    f"{owner!r} is not HOST:PID:ID"
                )
            if name == host and not _alive(int(pid)):
                self.store.release(owner)

    def _heartbeat(self) -> None:
        while not self._closed.wait(HEARTBEAT):
            with contextlib.suppress(sqlite3.OperationalError, OSError):  # the next beat counts
                self.store.heartbeat(self.owner)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # gone, or no process ever had that id
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _cost(cell: Cell) -> tuple[bool, int]:
    """A rough order of training cost: ODE cells first, then steps × depth."""
    ode = family(cell.model).solves_ode
    return ode, cell.train.steps * int(cell.config.get("depth", 1))
