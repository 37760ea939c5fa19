"""The runner: expand an experiment into cells, skip finished ones, train the rest.

Cells run in this process (``jobs=1``), in a local pool of spawned processes, or as Ray
tasks. Whoever trains a cell writes its row, so a killed run keeps every finished cell
and a rerun picks up where it stopped. A cell whose worker process dies is recorded as
``"failed"``; the other cells go on. The slowest cells (ODE models) start first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import multiprocessing
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..models.base import MODELS
from .config import COUNTED, Cell, ExperimentConfig, load_experiment
from .store import STATUSES, ResultStore, RunResult, load_task_file, store_path
from .train import run_cell, stamp

_CRASHED = "the worker process died while training this cell (killed, or out of memory)"


@dataclass(frozen=True)
class SuiteSummary:
    """What a run did: ``counts`` are statuses over every selected cell, finished
    earlier or now; ``ran`` cells trained in this call, ``skipped`` were already done."""

    name: str
    run_dir: Path
    counts: dict[str, int]
    ran: int
    skipped: int
    wall_time: float

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
        task_files: user task files, imported here and in every worker.
    """
    start = time.perf_counter()
    if backend not in ("local", "ray"):
        raise ValueError(f"unknown backend {backend!r}; use 'local' or 'ray'")
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    if backend == "ray":
        _import_ray()
    task_files = [str(Path(f).resolve()) for f in task_files]
    for task_file in task_files:
        load_task_file(task_file)
    config = (config_or_path if isinstance(config_or_path, ExperimentConfig)
              else load_experiment(config_or_path))
    cells = config.cells(seeds=seeds, device=device, only=only)
    if any(c.train.device.startswith("cuda") for c in cells) and not torch.cuda.is_available():
        raise ValueError("cells ask for device 'cuda' but CUDA is not available here")
    run_dir = Path(run_dir) if run_dir is not None else Path("runs") / config.name
    store = ResultStore(store_path(run_dir))
    done = store.done_keys()
    todo = sorted((c for c in cells if c.key not in done), key=_cost, reverse=True)
    text = config.text or json.dumps(dataclasses.asdict(config), default=str, indent=1)
    run_id = store.start_run(config.name, text, task_files)
    with tqdm(total=len(todo), disable=not progress, desc=config.name, unit="cell") as bar:

        def finished(result: RunResult) -> None:
            bar.update()
            bar.set_postfix_str(f"{result.task}/{result.model}: {result.status}")

        if backend == "ray":
            _run_ray(todo, run_dir, task_files, finished)
        elif jobs == 1:
            with _one_thread():
                for cell in todo:
                    finished(_work(cell, run_dir, progress))
        else:
            _run_pool(todo, run_dir, task_files, jobs, finished)
    store.finish_run(run_id)
    statuses = {row.key: row.status for row in store.rows()}
    counts = Counter(statuses.get(cell.key, "failed") for cell in cells)
    return SuiteSummary(config.name, run_dir, {s: counts[s] for s in STATUSES if counts[s]},
                        len(todo), len(cells) - len(todo), time.perf_counter() - start)


def _cost(cell: Cell) -> tuple[bool, int]:
    """A rough order of training cost: ODE cells first, then steps × depth."""
    ode = hasattr(MODELS.get(cell.model), "reset_nfe")
    return ode, cell.train.steps * int(cell.config.get("depth", 1))


def _work(cell: Cell, run_dir: Path, progress: bool = False) -> RunResult:
    """Train one cell and store its row (runs in a worker process)."""
    result = run_cell(cell, run_dir, progress=progress)
    ResultStore(store_path(run_dir)).put(result)
    return result


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
    torch.set_num_threads(1)
    for task_file in task_files:
        load_task_file(task_file)


def _record_crash(cell: Cell, run_dir: Path, message: str = _CRASHED) -> RunResult:
    result = stamp(RunResult(status="failed", message=message), cell)
    ResultStore(store_path(run_dir)).put(result)
    return result


def _run_pool(cells: Sequence[Cell], run_dir: Path, task_files: Sequence[str], jobs: int,
              finished: Callable[[RunResult], None]) -> None:
    """Run cells in worker processes, at most ``jobs`` at a time.

    When a worker dies the pool breaks and every cell in flight is interrupted. Those
    cells are suspects: each reruns alone in a one-worker pool, and one that dies alone
    is recorded as failed.
    """
    pending, suspects = deque(cells), deque[Cell]()
    context = _context()
    while pending or suspects:
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
                while not alone and (pending or running):
                    while pending and len(running) < jobs:
                        cell = pending.popleft()
                        running[pool.submit(_work, cell, run_dir)] = cell
                    ready, _ = wait(running, return_when=FIRST_COMPLETED)
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


def _run_ray(cells: Sequence[Cell], run_dir: Path, task_files: Sequence[str],
             finished: Callable[[RunResult], None]) -> None:
    """Run each cell as a Ray task (one CPU each); a task whose worker dies is failed."""
    ray = _import_ray()
    if not ray.is_initialized():
        ray.init()
    remote = ray.remote(num_cpus=1, max_retries=0)(_ray_work)
    refs = {remote.remote(cell, run_dir, tuple(task_files)): cell for cell in cells}
    while refs:
        ready, _ = ray.wait(list(refs), num_returns=1)
        cell = refs.pop(ready[0])
        try:
            finished(ray.get(ready[0]))
        except Exception as err:  # a crashed Ray worker: record it and go on
            finished(_record_crash(cell, run_dir, f"{_CRASHED}: {err}"))
