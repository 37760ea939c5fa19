"""The runner: expand an experiment into cells, skip finished ones, train the rest.

Cells that differ only in their seed train together, as one ensemble (`run_cells`), unless
``vectorize`` is off. Groups run in this process (``jobs=1``), in a local pool of spawned
processes, or as Ray tasks. Workers return what they trained (rows and weights) and the
run's own process alone writes the run folder, one group at a time as it finishes (its rows
in one transaction, each with ``metrics["ensemble_id"]``, the same for the cells trained
together), so a killed run keeps every finished group and a rerun trains the rest in the
same groups, to the same bits. A group whose worker process dies is recorded as
``"failed"``; the others go on. The slowest groups (ODE models) start first. Pool workers
exit when the process that started them dies, so a killed run leaves no process, and ignore
Ctrl-C, which ends the run's process alone: it kills the pool's workers and the server that
forks them at once.

Several runs of one experiment (processes, or machines sharing the run folder) split its
cells: a run claims each group in the store before training it (`CellQueue`), and returns
when every selected cell is finished, by it or by the others.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import sys
import tempfile
import threading
import time
import warnings
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from operator import methodcaller
from pathlib import Path
from typing import Any

import torch

from .cells import expand_cells
from .claims import POLL, CellQueue
from .config import COUNTED, FINISHED, Cell, ConfigWarning, ExperimentConfig, cell_key
from .folder import STORE, RunFolder, load_task_file, write_atomically
from .grid import extensions, grid_value, row_identity, searched, value_text
from .options import changes
from .progress import Progress
from .reader import load_experiment
from .result import STATUSES, RunResult
from .store import ResultStore
from .threads import torch_threads
from .train import run_cells, seed_groups, stamp
from .trained import Trained

_CRASHED = "the worker process died while training this cell (killed, or out of memory)"
#: The most cells trained at once: worker processes on one machine.
MAX_JOBS = 1024
#: Keeps the resource tracker quiet (as a ``-W`` option it passes on to the tracker): a
#: worker killed, or this process ended by a signal, leaves the pool's semaphores to it,
#: which it frees, warning in two lines that ask nothing of the user.
_QUIET_TRACKER = "ignore::UserWarning:multiprocessing.resource_tracker"


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
    vectorize: bool = True,
    address: str | None = None,
) -> SuiteSummary:
    """Run every unfinished cell of an experiment and return a summary.

    Args:
        config_or_path: an `ExperimentConfig` or the path of its TOML file.
        run_dir: the run folder (default ``runs/<name>``), holding the store and weights.
        jobs: cells trained at once (worker processes, one torch thread each).
        device: overrides every cell's ``train.device`` (``"cpu"``/``"cuda"``).
        seeds: overrides the experiment's seeds.
        only: ``{"task": [...], "model": [...]}`` labels to restrict to.
        backend: ``"local"`` or ``"ray"`` (needs ``pip install ray``): each group is a Ray
            task (one CPU, and one GPU for cells on ``cuda``) that gets the task files'
            contents and returns rows and weights, so workers need no shared disk.
        task_files: user task files; a copy of each is kept in the run folder (see
            `keep_task_files`) and imported here and in every
            worker.
        retry_failed: also train again the cells that ended ``"diverged"`` or
            ``"capped"`` (``"failed"`` cells always run again); only ``"ok"`` is kept.
        vectorize: train the seeds of a cell together where its model folds; otherwise
            one cell at a time.
        address: the Ray cluster to join (``"auto"``, ``"ray://host:10001"``, ...); by
            default a local Ray instance is started.
    """
    start = time.perf_counter()
    _check_backend(backend, jobs, address)
    for task_file in task_files:  # before the experiment names their tasks
        load_task_file(task_file)
    config = (
        config_or_path
        if isinstance(config_or_path, ExperimentConfig)
        else load_experiment(config_or_path)
    )
    cells = expand_cells(config, seeds=seeds, device=device, only=only)
    _check_devices(cells, backend, address)
    run_dir = Path(run_dir) if run_dir is not None else Path("runs") / config.name
    folder = RunFolder.open(run_dir, "w")  # the one store of this run: all goes through it
    kept = folder.keep_task_files(task_files)
    workers = _Workers(
        [str((run_dir / record["copy"]).resolve()) for record in kept],
        jobs,
        backend,
        address,
        retry_failed,
        vectorize,
        progress,
    )
    text = config.text or json.dumps(dataclasses.asdict(config), default=str, indent=1)
    _warn_beside(folder.store, config.name, cells, run_dir)
    run_id = folder.store.start_run(config.name, text, kept, [cell.key for cell in cells])
    cells, (ran, skipped, others) = workers.rounds(folder, run_id, cells, config)
    statuses = {row.key: row.status for row in folder.store.rows()}
    counts = Counter(statuses.get(cell.key, "failed") for cell in cells)
    return SuiteSummary(
        config.name,
        run_dir,
        {s: counts[s] for s in STATUSES if counts[s]},
        ran,
        skipped,
        time.perf_counter() - start,
        others,
    )


def _check_backend(backend: str, jobs: int, address: str | None) -> None:
    """Refuse a run's options before anything is read or written."""
    if backend not in ("local", "ray"):
        raise ValueError(f"unknown backend {backend!r}; use 'local' or 'ray'")
    if not 1 <= jobs <= MAX_JOBS:
        raise ValueError(f"jobs must be between 1 and {MAX_JOBS}, got {jobs}")
    if address is not None and backend != "ray":
        raise ValueError(f"address {address!r} is the Ray cluster to join: it needs backend 'ray'")
    if backend == "ray":
        _import_ray()


def _check_devices(cells: Sequence[Cell], backend: str, address: str | None) -> None:
    """Refuse cells on ``cuda`` where the backend has no GPU to give them."""
    if any(c.train.device.startswith("cuda") for c in cells):
        if backend == "ray" and not _ray(address).cluster_resources().get("GPU"):
            raise ValueError("cells ask for device 'cuda' but the Ray cluster has no GPU")
        if backend == "local" and not torch.cuda.is_available():
            raise ValueError("cells ask for device 'cuda' but CUDA is not available here")


@dataclass(frozen=True)
class _Workers:
    """Where and how a run's groups train (`run_experiment`); ``copies``: its task files."""

    copies: Sequence[str]
    jobs: int
    backend: str
    address: str | None
    retry_failed: bool
    vectorize: bool
    progress: bool

    def rounds(
        self, folder: RunFolder, run_id: int, cells: list[Cell], config: ExperimentConfig
    ) -> tuple[list[Cell], tuple[int, int, int]]:
        """Train the selected cells, then each round of grid extensions they call for:
        every cell of the run, and how many were trained, skipped and taken by others."""
        todo, ran, skipped, others = cells, 0, 0, 0
        while todo:
            queue = self.train(
                folder, todo, config.name if todo is cells else f"{config.name} (grid extension)"
            )
            ran, skipped, others = (
                ran + queue.taken,
                skipped + queue.skipped,
                others + queue.others,
            )
            todo = extensions(cells, {row.key: row for row in folder.store.rows()}, config.extend)
            folder.store.add_cells(run_id, [cell.key for cell in todo])
            cells = [*cells, *todo]
        folder.store.finish_run(run_id)
        return cells, (ran, skipped, others)

    def train(self, folder: RunFolder, cells: Sequence[Cell], desc: str) -> CellQueue:
        """Train the unfinished ``cells``; their queue counts what it trained and skipped."""
        vectorize = self.vectorize
        kept = ("ok",) if self.retry_failed else FINISHED
        with (
            CellQueue(folder.store, cells, kept, vectorize) as queue,
            Progress(queue.size, desc, self.progress, self.jobs) as bar,
        ):

            def finished(group: Sequence[Trained]) -> None:
                """Store a group's weights, then its rows in one transaction: a run stopped
                meanwhile keeps all of the group or none, and a resume trains it whole
                again."""
                ensemble = cell_key(sorted(t.result.key for t in group))
                for trained in group:
                    trained.result.metrics["vectorize"] = vectorize  # the keys do not say it
                    if "ensemble" in trained.result.metrics:  # it trained: with which cells
                        trained.result.metrics["ensemble_id"] = ensemble
                folder.save(group)
                last = group[-1].result
                bar.finished(len(group), f"{last.task}/{last.model}: {last.status}")

            if self.backend == "ray":
                _run_ray(queue, self.copies, self.address, finished)
            elif self.jobs == 1:
                with torch_threads(1):
                    while group := queue.take(block=True):
                        finished(run_cells(group))
            else:
                _run_pool(queue, self.copies, self.jobs, finished)
        return queue


def plan(
    config: ExperimentConfig,
    run_dir: str | Path | None = None,
    device: str | None = None,
    only: Mapping[str, Sequence[str]] | None = None,
    vectorize: bool = True,
    estimate: Callable[[list[list[Cell]]], list[str]] | None = None,
) -> list[str]:
    """What `run_experiment` would train, in lines, training nothing: the cells and the
    groups that train together, per row (grid, seeds, members folded into one ensemble),
    those the run folder already holds, at most how many cells extending the grids
    (`extensions`) adds, and ``estimate``'s lines on the groups (the CLI's: how long they
    take here)."""
    cells = expand_cells(config, device=device, only=only)
    run_dir = Path(run_dir) if run_dir is not None else Path("runs") / config.name
    stored = (
        RunFolder.open(run_dir).store.todo([c.key for c in cells])
        if (run_dir / STORE).is_file()
        else None
    )
    todo = [c for c in cells if stored is None or c.key in stored]
    groups = seed_groups(todo) if vectorize else [[cell] for cell in todo]
    rows: dict[str, list[list[Cell]]] = {}
    for group in groups:
        rows.setdefault(row_identity(group[0].to_dict()), []).append(group)
    extra = 0
    lines = []
    for row_groups in rows.values():
        row = [cell for group in row_groups for cell in group]
        first, seeds = row[0], sorted({c.seed for c in row})
        grid = "; ".join(f"{f}={'/'.join(map(value_text, v))}" for f, v in first.tune.items())
        sizes = Counter(len(group) for group in row_groups)
        folded = ", ".join(f"{n} group{'s' * (n > 1)} of {size}" for size, n in sizes.items())
        lines.append(
            f"  {first.task_label} × {first.label}: {first.train.steps} steps; "
            f"{grid or 'not tuned'}; "
            f"{len(seeds)} seed{'s' * (len(seeds) > 1)}; {len(row)} cells in {folded}"
        )
        extensible = [len(v) for v in first.tune.values() if min(v) > 0]
        extra += (
            len(seeds) * (math.prod(n + config.extend for n in extensible) - math.prod(extensible))
            if extensible
            else 0
        )
    done = len(cells) - len(todo)
    head = (
        f"{config.name}: {len(todo)} cells to train in {len(groups)} group"
        + "s" * (len(groups) != 1)
        + (f" ({done} of {len(cells)} already in {run_dir})" if done else "")
    )
    tail = (
        f"grid extension (tune.extend = {config.extend}): up to {extra} more cells, for "
        "rows whose choice sits at an end of their grid"
        if extra
        else ""
    )
    return [head, *lines, *([tail] if tail else []), *(estimate(groups) if estimate else [])]


def _warn_beside(store: ResultStore, name: str, cells: Sequence[Cell], run_dir: Path) -> None:
    """Warn in one line where this run adds results beside others they could be taken for:
    another experiment's, or the same cells' under another config (a file edited between
    runs, rerun with ``--only`` or ``--seeds`` or not)."""
    latest = store.experiment()
    if latest is not None and latest["name"] != name:
        warnings.warn(
            f"{run_dir} holds results of experiment {latest['name']!r}: those of "
            f"{name!r} are stored beside them",
            ConfigWarning,
            stacklevel=2,
        )
    rows = store.rows()  # oldest first: each cell below keeps its newest row
    stored = {_place(row.config, row.task, row.model, row.seed): row for row in rows}
    keys = {row.key for row in rows}
    places = [
        (cell, _place(cell.to_dict(), cell.task_label, cell.label, cell.seed))
        for cell in cells
        if cell.key not in keys
    ]
    changed = [(cell, stored[place]) for cell, place in places if place in stored]
    if changed:
        cell, row = changed[0]
        change = next(changes(row.config, cell.to_dict()), "")
        warnings.warn(
            f"{run_dir}: {len(changed)} of the selected cells have results under "
            f"another config (e.g. {cell.task_label} × {cell.label}, seed "
            f"{cell.seed}: {change}); the new results are stored beside them",
            ConfigWarning,
            stacklevel=2,
        )


def _place(config: Mapping[str, Any], task: str, label: str, seed: int) -> str:
    """Where a cell sits in its experiment: task, row, seed and grid value (the values of
    the fields its row searches), whatever else its config says."""
    fields = sorted(searched(config))
    return json.dumps([task, label, seed, fields, list(grid_value(config, fields))])


def _init_worker(task_files: Sequence[str]) -> None:
    """Set up a worker: Ctrl-C ignored, one torch thread, the run's task files, and an exit
    when the run's process dies (an idle worker would otherwise wait forever, keeping the
    forkserver and the resource tracker alive too)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the run's to handle
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()
    torch.set_num_threads(1)
    for task_file in task_files:
        load_task_file(task_file)


def _exit_with(parent: multiprocessing.process.BaseProcess) -> None:
    parent.join()  # returns when the parent process is gone
    os._exit(1)


def _crashed(group: Sequence[Cell], message: str = _CRASHED) -> list[Trained]:
    return [Trained(stamp(RunResult(status="failed", message=message), cell)) for cell in group]


def _run_pool(
    queue: CellQueue,
    task_files: Sequence[str],
    jobs: int,
    finished: Callable[[Sequence[Trained]], None],
) -> None:
    """Train the queue's groups in worker processes, at most ``jobs`` at a time.

    When a worker dies the pool breaks and every group in flight is interrupted. Those
    groups are suspects: each reruns alone in a one-worker pool, and one that dies alone
    is recorded as failed.
    """
    suspects = deque[list[Cell]]()
    try:
        context = _context()
    except KeyboardInterrupt:
        _stop_server()
        raise
    while True:
        alone = bool(suspects)
        running: dict[Future[list[Trained]], list[Cell]] = {}
        with ProcessPoolExecutor(
            1 if alone else jobs,
            mp_context=context,
            initializer=_init_worker,
            initargs=(tuple(task_files),),
        ) as pool:
            try:
                while alone and suspects:
                    group = suspects.popleft()
                    try:
                        with _deferred_interrupt():
                            future = pool.submit(run_cells, group)
                        finished(future.result())
                    except BrokenProcessPool:
                        finished(_crashed(group))
                        raise
                while not alone:
                    while len(running) < jobs:
                        if not (group := queue.take(block=not running)):
                            break
                        try:
                            with _deferred_interrupt():  # a worker it starts is the pool's
                                running[pool.submit(run_cells, group)] = group
                        except BrokenProcessPool:  # broke since the last wait: keep the group
                            suspects.append(group)
                            raise
                    if not running:
                        break
                    ready, _ = wait(
                        running, timeout=POLL if queue.busy else None, return_when=FIRST_COMPLETED
                    )
                    for future in ready:
                        trained = future.result()
                        del running[future]
                        finished(trained)
            except KeyboardInterrupt:  # workers ignore it: end them rather than wait
                _stop(pool)
                _stop_server()
                raise
            except BrokenProcessPool:
                for future, group in running.items():
                    if future.done() and not future.exception():
                        finished(future.result())
                    else:
                        suspects.append(group)
        if not alone and not suspects:
            return


@contextlib.contextmanager
def _deferred_interrupt() -> Iterator[None]:
    """Hold a Ctrl-C until the block ends: a worker process being started is then in the
    pool's list when the pool is stopped, never a half-started one that outlives the run
    (and prints a traceback when the run's semaphores are gone)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[tuple[int, Any]] = []
    before = signal.signal(signal.SIGINT, lambda number, frame: caught.append((number, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
        if caught and callable(before):
            before(*caught[0])


def _stop(pool: ProcessPoolExecutor) -> None:
    """End a pool now: its workers killed (what they were training is lost, and claimed by
    no one once this run ends), its queued groups dropped, nothing waited for."""
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        with contextlib.suppress(OSError, ValueError):
            process.kill()
    pool.shutdown(wait=False, cancel_futures=True)


def _stop_server() -> None:
    """Kill the server that forks the workers, if one runs: it ignores Ctrl-C and ends with
    this process, but only after its preload and then its interpreter's teardown (seconds of
    CPU with torch loaded, a minute on a cold and busy machine), holding the run's stderr open
    all that while. It is not reaped: multiprocessing starts a new one when next needed."""
    pid = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    if pid is not None:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _context() -> multiprocessing.context.BaseContext:
    """Workers fork from a server that imported the package once (fast to start, unlike
    ``spawn``, which is the fallback where ``forkserver`` is unavailable). The server also
    imports ``torch._dynamo``, which torch's optimisers otherwise import, slowly, on first use
    in every worker."""
    if _QUIET_TRACKER not in sys.warnoptions:  # before the pool starts the tracker
        sys.warnoptions.append(_QUIET_TRACKER)
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["ddl_dynamics", "torch._dynamo"])
    if threading.current_thread() is threading.main_thread():
        # Started with Ctrl-C ignored, the server ignores it from its first instruction, and
        # so does every worker it forks: a Ctrl-C to the process group reaches this process
        # alone, which ends the pool (a worker's KeyboardInterrupt would print a traceback).
        before = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            signal.signal(signal.SIGINT, before)
        # The server preloads before it forks anything (seconds on a busy machine): wait for
        # that here, where a Ctrl-C ends the run at once, not while a worker starts, where
        # it waits for the start (`_deferred_interrupt`).
        ready = context.Process(target=int)
        ready.start()
        ready.join()
    return context


def _import_ray():
    try:
        import ray
    except ImportError as err:
        raise ImportError(
            "--backend ray needs Ray, which is not installed: pip install ray "
            "(or pip install 'ddl-dynamics[ray]')"
        ) from err
    return ray


def _ray(address: str | None) -> Any:
    """Ray, connected to the cluster at ``address`` (default: a new local instance)."""
    ray = _import_ray()
    if not ray.is_initialized():
        ray.init(address=address)
    return ray


def _ray_work(group: Sequence[Cell], task_files: Sequence[tuple[str, bytes]]) -> list[Trained]:
    """A Ray task: import the run's task files from their contents (the worker may share
    no disk with the driver), train the group and return its rows and weights."""
    folder = Path(tempfile.gettempdir()) / "ddl_dynamics_task_files"
    for name, data in task_files:
        path = folder / name  # named by content hash: never two contents under one name
        if not path.is_file():
            write_atomically(path, methodcaller("write", data))
    _init_worker([str(folder / name) for name, _ in task_files])
    return run_cells(group)


def _run_ray(
    queue: CellQueue,
    task_files: Sequence[str],
    address: str | None,
    finished: Callable[[Sequence[Trained]], None],
) -> None:
    """Train each group as a Ray task (one CPU; one GPU on ``cuda``) on the cluster at
    ``address`` (default: a new local instance); a group whose worker dies is failed."""
    ray = _ray(address)
    remote = ray.remote(max_retries=0)(_ray_work)
    sources = tuple((Path(f).name, Path(f).read_bytes()) for f in task_files)
    refs: dict[Any, list[Cell]] = {}
    while True:
        while group := queue.take(block=not refs):  # Ray queues what it gets
            gpus = 1 if group[0].train.device.startswith("cuda") else 0
            refs[remote.options(num_cpus=1, num_gpus=gpus).remote(group, sources)] = group
        if not refs:
            return
        ready, _ = ray.wait(list(refs), num_returns=1, timeout=POLL if queue.busy else None)
        for ref in ready:
            group = refs.pop(ref)
            try:
                trained = ray.get(ref)
            except Exception as err:  # a crashed Ray worker: record it and go on
                trained = _crashed(group, f"{_CRASHED}: {err}")
            finished(trained)
