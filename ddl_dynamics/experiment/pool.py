"""A run's groups trained in a local pool of worker processes, kept apart from the runner
because outliving a dead worker and a Ctrl-C takes process plumbing of its own: the groups
in flight when a worker dies rerun alone, and one that dies alone is failed; a Ctrl-C kills
the workers and the server that forks them at once. The Ray backend shares the setup of a
worker (`init_worker`) and the rows of a group whose worker died (`crashed`).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import torch

from .claims import POLL, CellQueue
from .config import Cell
from .folder import load_task_file
from .result import RunResult
from .train import run_cells, stamp
from .trained import Trained

#: The message of a cell whose worker died.
CRASHED = "the worker process died while training this cell (killed, or out of memory)"
#: Keeps the resource tracker quiet (as a ``-W`` option it passes on to the tracker): a
#: worker killed, or this process ended by a signal, leaves the pool's semaphores to it,
#: which it frees, warning in two lines that ask nothing of the user.
_QUIET_TRACKER = "ignore::UserWarning:multiprocessing.resource_tracker"


def init_worker(task_files: Sequence[str]) -> None:
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


def crashed(group: Sequence[Cell], message: str = CRASHED) -> list[Trained]:
    """The ``"failed"`` rows of a group whose worker died, with ``message``."""
    return [Trained(stamp(RunResult(status="failed", message=message), cell)) for cell in group]


def run_pool(
    queue: CellQueue,
    task_files: Sequence[str],
    jobs: int,
    finished: Callable[[Sequence[Trained]], None],
) -> None:
    """Train the queue's groups in worker processes, at most ``jobs`` at a time. When a
    worker dies the pool breaks and every group in flight is interrupted. Those groups are
    suspects: each reruns alone in a one-worker pool, and one that dies alone is recorded
    as failed."""
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
            initializer=init_worker,
            initargs=(tuple(task_files),),
        ) as pool:
            try:
                if alone:
                    _rerun_alone(pool, suspects, finished)
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


def _rerun_alone(
    pool: ProcessPoolExecutor,
    suspects: deque[list[Cell]],
    finished: Callable[[Sequence[Trained]], None],
) -> None:
    """Each suspect group in turn in the one-worker ``pool``: one that breaks it is
    recorded as failed (and the break raised on)."""
    while suspects:
        group = suspects.popleft()
        try:
            with _deferred_interrupt():
                future = pool.submit(run_cells, group)
            finished(future.result())
        except BrokenProcessPool:
            finished(crashed(group))
            raise


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
