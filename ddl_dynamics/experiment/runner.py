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

import dataclasses
import json
import math
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import methodcaller
from pathlib import Path
from typing import Any

import torch

from .cells import expand_cells
from .claims import POLL, CellQueue
from .compiling import use_cache_folder
from .config import COUNTED, FINISHED, Cell, ConfigWarning, ExperimentConfig, cell_key
from .folder import STORE, RunFolder, load_task_file, write_atomically
from .grid import extensions, grid_value, row_identity, searched, value_text
from .options import changes
from .pool import CRASHED, crashed, init_worker, run_pool
from .progress import Progress
from .reader import load_experiment
from .result import STATUSES
from .store import ResultStore
from .threads import torch_threads
from .train import run_cells, seed_groups
from .trained import Trained

#: The most cells trained at once: worker processes on one machine.
MAX_JOBS = 1024


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
    #: The seconds compiling took, for each group trained here whose steps ran compiled.
    compiles: tuple[float, ...] = ()

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
            `keep_task_files`) and imported here and in every worker.
        retry_failed: also train again the cells that ended ``"diverged"`` or
            ``"capped"`` (``"failed"`` cells always run again); only ``"ok"`` is kept.
        vectorize: train the seeds of a cell together where its model folds; otherwise
            one cell at a time.
        address: the Ray cluster to join (``"auto"``, ``"ray://host:10001"``, ...); by
            default a local Ray instance is started.
    """
    start = time.perf_counter()
    _check_backend(backend, jobs, address)
    config = _configured(config_or_path, task_files)
    cells = expand_cells(config, seeds=seeds, device=device, only=only)
    _check_devices(cells, backend, address)
    run_dir = Path(run_dir) if run_dir is not None else Path("runs") / config.name
    folder = RunFolder.open(run_dir, "w")  # the one store of this run: all goes through it
    kept = folder.keep_task_files(task_files)
    copies = [str((run_dir / record["copy"]).resolve()) for record in kept]
    workers = _Workers(copies, jobs, backend, address, retry_failed, vectorize, progress)
    text = config.text or json.dumps(dataclasses.asdict(config), default=str, indent=1)
    _warn_beside(folder.store, config.name, cells, run_dir)
    run_id = folder.store.start_run(config.name, text, kept, [cell.key for cell in cells])
    cells, (ran, skipped, others) = workers.rounds(folder, run_id, cells, config)
    statuses = {row.key: row.status for row in folder.store.rows()}
    counts = Counter(statuses.get(cell.key, "failed") for cell in cells)
    counted = {s: counts[s] for s in STATUSES if counts[s]}
    wall = time.perf_counter() - start
    return SuiteSummary(
        config.name, run_dir, counted, ran, skipped, wall, others, tuple(workers.compiles)
    )


def _configured(
    config_or_path: ExperimentConfig | str | Path, task_files: Sequence[str | Path]
) -> ExperimentConfig:
    """The experiment, read from its file if given one, after the task files it may name."""
    for task_file in task_files:
        load_task_file(task_file)
    if isinstance(config_or_path, ExperimentConfig):
        return config_or_path
    return load_experiment(config_or_path)


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
    #: The compile seconds of each group trained compiled.
    compiles: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        use_cache_folder()  # one inductor cache for this process and every worker it starts

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
            CellQueue(folder.store, cells, kept, vectorize, self.jobs) as queue,
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
                compiled = [t.result.metrics for t in group if t.result.metrics.get("compiled")]
                if compiled:
                    self.compiles.append(sum(m["compile_s"] for m in compiled))
                last = group[-1].result
                bar.finished(len(group), f"{last.task}/{last.model}: {last.status}")

            if self.backend == "ray":
                _run_ray(queue, self.copies, self.address, finished)
            elif self.jobs == 1:
                with torch_threads(1):
                    while group := queue.take(block=True):
                        finished(run_cells(group))
            else:
                run_pool(queue, self.copies, self.jobs, finished)
        return queue


def plan(
    config: ExperimentConfig,
    run_dir: str | Path | None = None,
    device: str | None = None,
    only: Mapping[str, Sequence[str]] | None = None,
    vectorize: bool = True,
    estimate: Callable[[list[list[Cell]]], list[str]] | None = None,
    jobs: int = 1,
) -> list[str]:
    """What `run_experiment` would train, in lines, training nothing: the cells and the
    groups that train together on ``jobs`` workers, per row (grid, seeds, members folded
    into one ensemble), those the run folder already holds, at most how many cells
    extending the grids (`extensions`) adds, and ``estimate``'s lines on the groups (the
    CLI's: how long they take here)."""
    cells = expand_cells(config, device=device, only=only)
    run_dir = Path(run_dir) if run_dir is not None else Path("runs") / config.name
    stored = (
        RunFolder.open(run_dir).store.todo([c.key for c in cells])
        if (run_dir / STORE).is_file()
        else None
    )
    todo = [c for c in cells if stored is None or c.key in stored]
    groups = seed_groups(todo, jobs) if vectorize else [[cell] for cell in todo]
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
    init_worker([str(folder / name) for name, _ in task_files])
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
                trained = crashed(group, f"{CRASHED}: {err}")
            finished(trained)
