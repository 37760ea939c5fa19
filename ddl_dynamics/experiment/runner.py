"""The runner: expand an experiment into cells, skip finished ones, train the rest.

Cells run in this process (``jobs=1``), in a local pool of spawned processes, or as Ray
tasks. Whoever trains a cell writes its row, so a killed run keeps every finished cell
and a rerun picks up where it stopped. A cell whose worker process dies is recorded as
``"failed"``; the other cells go on. The slowest cells (ODE models) start first. Pool
workers exit when the process that started them dies, so a killed run leaves no process.

Several runs of one experiment (processes, or machines sharing the run folder) split its
cells: a run claims each cell in the store before training it (:class:`CellQueue`), keeps
its claims alive with a heartbeat every :data:`HEARTBEAT` seconds, and takes over a claim
whose owner has been silent for :data:`STALE_AFTER` seconds, or at once when the owner
was a process of this machine that no longer exists. A run returns when every selected
cell is finished, by it or by the others.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import multiprocessing
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ..models.base import MODELS
from .config import COUNTED, FINISHED, Cell, ExperimentConfig, load_experiment
from .store import (
    STATUSES,
    ResultStore,
    RunResult,
    keep_task_files,
    load_task_file,
    store_path,
)
from .train import run_cells, stamp

_CRASHED = "the worker process died while training this cell (killed, or out of memory)"
#: Seconds between a run's heartbeats on its claims.
HEARTBEAT = 10.0
#: Seconds without a heartbeat after which another run takes a claimed cell over.
STALE_AFTER = 120.0
#: Seconds between looks at cells that other runs are training.
POLL = 1.0


@dataclass(frozen=True)
class SuiteSummary:
    """What a run did: ``counts`` are statuses over every selected cell, finished
    earlier or now; ``ran`` cells trained in this call, ``skipped`` were already done,
    ``others`` were trained meanwhile by other runs of the same experiment."""

    name: str
    run_dir: Path
    counts: dict[str, int]
    ran: int
    skipped: int
    wall_time: float
    others: int = 0

    @property
    def ok(self) -> bool:
        """Whether every cell counts: a capped, diverged or failed one is a failure."""
        return all(status in COUNTED for status in self.counts)


def run_experiment(
    config_or_path: ExperimentConfig | str | Path,
    run_dir: str | Path | None = None,
    jobs: int = 1,
    device: str | None = None,
    seeds: Sequence[int] | None = None,
    only: Mapping[str, Sequence[str]] | None = None,
    backend: str = "local",
    progress: bool = True,
    task_files: Sequence[str | Path] = (),
    retry_failed: bool = False,
) -> SuiteSummary:
    """Run every unfinished cell of an experiment and return a summary.

    Args:
        config_or_path: an :class:`ExperimentConfig` or the path of its TOML file.
        run_dir: the run folder (default ``runs/<name>``), holding the store and weights.
        jobs: cells trained at once (worker processes, one torch thread each).
        device: overrides every cell's ``train.device`` (``"cpu"``/``"cuda"``).
        seeds: overrides the experiment's seeds.
        only: ``{"task": [...], "model": [...]}`` labels to restrict to.
        backend: ``"local"`` or ``"ray"`` (needs ``pip install ray``; the run folder must
            be on a filesystem the Ray workers share).
        task_files: user task files; a copy of each is kept in the run folder (see
            :func:`keep_task_files`) and imported here and in every worker.
        retry_failed: also train again the cells that ended ``"diverged"`` or
            ``"capped"`` (``"failed"`` cells always run again); only ``"ok"`` is kept.
    """
    start = time.perf_counter()
    if backend not in ("local", "ray"):
        raise ValueError(f"unknown backend {backend!r}; use 'local' or 'ray'")
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    if backend == "ray":
        _import_ray()
    for task_file in task_files:  # before the experiment names their tasks
        load_task_file(task_file)
    config = (config_or_path if isinstance(config_or_path, ExperimentConfig)
              else load_experiment(config_or_path))
    cells = config.cells(seeds=seeds, device=device, only=only)
    if any(c.train.device.startswith("cuda") for c in cells) and not torch.cuda.is_available():
        raise ValueError("cells ask for device 'cuda' but CUDA is not available here")
    run_dir = Path(run_dir) if run_dir is not None else Path("runs") / config.name
    store = ResultStore(store_path(run_dir))
    kept = keep_task_files(run_dir, task_files)
    copies = [str((run_dir / record["copy"]).resolve()) for record in kept]
    text = config.text or json.dumps(dataclasses.asdict(config), default=str, indent=1)
    run_id = store.start_run(config.name, text, kept)
    with (CellQueue(store, cells, ("ok",) if retry_failed else FINISHED) as queue,
          tqdm(total=len(queue.fresh), disable=not progress, desc=config.name,
               unit="cell") as bar):

        def finished(result: RunResult) -> None:
            bar.update()
            bar.set_postfix_str(f"{result.task}/{result.model}: {result.status}")

        if backend == "ray":
            _run_ray(queue, run_dir, copies, finished)
        elif jobs == 1:
            with _one_thread():
                while (cell := queue.take(block=True)) is not None:
                    finished(_work(cell, run_dir, progress))
        else:
            _run_pool(queue, run_dir, copies, jobs, finished)
    store.finish_run(run_id)
    statuses = {row.key: row.status for row in store.rows()}
    counts = Counter(statuses.get(cell.key, "failed") for cell in cells)
    return SuiteSummary(config.name, run_dir, {s: counts[s] for s in STATUSES if counts[s]},
                        queue.taken, queue.skipped, time.perf_counter() - start, queue.others)


class CellQueue:
    """The cells this run still has to train, each claimed in the store when it is taken,
    so that several runs split one experiment; while open, a background thread sends the
    heartbeat of this run's claims, and closing it releases those not finished."""

    def __init__(self, store: ResultStore, cells: Sequence[Cell],
                 finished: Collection[str]) -> None:
        self.store = store
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.generation = store.todo((c.key for c in cells), finished)
        todo = [c for c in cells if c.key in self.generation]
        self.fresh = deque(sorted(todo, key=_cost, reverse=True))  # not yet tried
        self.busy = deque[Cell]()  # claimed by other runs when last tried
        self.skipped, self.taken, self.others = len(cells) - len(todo), 0, 0
        self._closed = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, daemon=True)

    def __enter__(self) -> CellQueue:
        self._beat.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed.set()
        self._beat.join()
        self.store.release(self.owner)

    def take(self, block: bool) -> Cell | None:
        """The next cell to train, now claimed by this run; None if no cell is free now
        or, with ``block``, once every cell is finished (waiting for the other runs)."""
        while True:
            while self.fresh:
                if self._claim(cell := self.fresh.popleft()):
                    return cell
            if self.busy:
                self._release_dead_owners()
            for _ in range(len(self.busy)):
                if self._claim(cell := self.busy.popleft()):
                    return cell
            if not self.busy or not block:
                return None
            time.sleep(POLL)

    def _claim(self, cell: Cell) -> bool:
        state = self.store.claim(cell.key, self.owner, self.generation[cell.key], STALE_AFTER)
        if state == "busy":
            self.busy.append(cell)
        self.taken += state == "claimed"
        self.others += state == "done"
        return state == "claimed"

    def _release_dead_owners(self) -> None:
        """Free the claims of runs on this machine whose process is gone (killed)."""
        host = socket.gethostname()
        for owner in self.store.owners():
            name, pid, _ = owner.rsplit(":", 2)
            if name == host and not _alive(int(pid)):
                self.store.release(owner)

    def _heartbeat(self) -> None:
        while not self._closed.wait(HEARTBEAT):
            with contextlib.suppress(sqlite3.OperationalError):  # busy: the next beat counts
                self.store.heartbeat(self.owner)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _cost(cell: Cell) -> tuple[bool, int]:
    """A rough order of training cost: ODE cells first, then steps × depth."""
    ode = hasattr(MODELS.get(cell.model), "reset_nfe")
    return ode, cell.train.steps * int(cell.config.get("depth", 1))


def _work(cell: Cell, run_dir: Path, progress: bool = False) -> RunResult:
    """Train one cell and store its row (runs in a worker process)."""
    [trained] = run_cells([cell], progress=progress)
    trained.save(run_dir)
    return trained.result


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Train on one torch thread: small models run fastest so (and far faster than with
    several threads on a busy machine), and ``jobs`` then scales over cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _init_worker(task_files: Sequence[str]) -> None:
    """Set up a worker: one torch thread, the run's task files, and an exit when the run's
    process dies (an idle worker would otherwise wait forever, keeping the forkserver and
    the resource tracker alive too)."""
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()
    torch.set_num_threads(1)
    for task_file in task_files:
        load_task_file(task_file)


def _exit_with(parent: multiprocessing.process.BaseProcess) -> None:
    parent.join()  # returns when the parent process is gone
    os._exit(1)


def _record_crash(cell: Cell, run_dir: Path, message: str = _CRASHED) -> RunResult:
    result = stamp(RunResult(status="failed", message=message), cell)
    ResultStore(store_path(run_dir)).put(result)
    return result


def _run_pool(queue: CellQueue, run_dir: Path, task_files: Sequence[str], jobs: int,
              finished: Callable[[RunResult], None]) -> None:
    """Run the queue's cells in worker processes, at most ``jobs`` at a time.

    When a worker dies the pool breaks and every cell in flight is interrupted. Those
    cells are suspects: each reruns alone in a one-worker pool, and one that dies alone
    is recorded as failed.
    """
    suspects = deque[Cell]()
    context = _context()
    while True:
        alone = bool(suspects)
        running: dict[Future[RunResult], Cell] = {}
        with ProcessPoolExecutor(1 if alone else jobs, mp_context=context,
                                 initializer=_init_worker, initargs=(tuple(task_files),)) as pool:
            try:
                while alone and suspects:
                    cell = suspects.popleft()
                    try:
                        finished(pool.submit(_work, cell, run_dir).result())
                    except BrokenProcessPool:
                        finished(_record_crash(cell, run_dir))
                        raise
                while not alone:
                    while len(running) < jobs:
                        if (cell := queue.take(block=not running)) is None:
                            break
                        try:
                            running[pool.submit(_work, cell, run_dir)] = cell
                        except BrokenProcessPool:  # broke since the last wait: keep the cell
                            suspects.append(cell)
                            raise
                    if not running:
                        break
                    ready, _ = wait(running, timeout=POLL if queue.busy else None,
                                    return_when=FIRST_COMPLETED)
                    for future in ready:
                        result = future.result()
                        del running[future]
                        finished(result)
            except BrokenProcessPool:
                for future, cell in running.items():
                    if future.done() and not future.exception():
                        finished(future.result())
                    else:
                        suspects.append(cell)
        if not alone and not suspects:
            return


def _context() -> multiprocessing.context.BaseContext:
    """Workers fork from a server that imported the package once (fast to start, unlike
    ``spawn``, which is the fallback where ``forkserver`` is unavailable). The server also
    imports ``torch._dynamo``, which torch's optimisers otherwise import, slowly, on first use
    in every worker."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["ddl_dynamics", "torch._dynamo"])
    return context


def _import_ray():
    try:
        import ray
    except ImportError as err:
        raise ImportError("--backend ray needs Ray, which is not installed: pip install ray "
                          "(or pip install 'ddl-dynamics[ray]')") from err
    return ray


def _ray_work(cell: Cell, run_dir: Path, task_files: Sequence[str]) -> RunResult:
    _init_worker(task_files)
    return _work(cell, run_dir)


def _run_ray(queue: CellQueue, run_dir: Path, task_files: Sequence[str],
             finished: Callable[[RunResult], None]) -> None:
    """Run each cell as a Ray task (one CPU each); a task whose worker dies is failed."""
    ray = _import_ray()
    if not ray.is_initialized():
        ray.init()
    remote = ray.remote(num_cpus=1, max_retries=0)(_ray_work)
    refs: dict[Any, Cell] = {}
    while True:
        while (cell := queue.take(block=not refs)) is not None:  # Ray queues what it gets
            refs[remote.remote(cell, run_dir, tuple(task_files))] = cell
        if not refs:
            return
        ready, _ = ray.wait(list(refs), num_returns=1, timeout=POLL if queue.busy else None)
        for ref in ready:
            cell = refs.pop(ref)
            try:
                finished(ray.get(ref))
            except Exception as err:  # a crashed Ray worker: record it and go on
                finished(_record_crash(cell, run_dir, f"{_CRASHED}: {err}"))
