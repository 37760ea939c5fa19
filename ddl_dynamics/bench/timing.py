"""How the benchmarks time: interleaved medians on a clock other processes do not inflate,
with freed memory kept, beside the machine's matmul rate and load measured in the same run."""

from __future__ import annotations

import contextlib
import ctypes
import os
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any, TypeVar

import torch

from ..models.flops import flop_counter

K = TypeVar("K", bound=Hashable)

# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


def median_times(
    calls: Mapping[K, Callable[[], Any]],
    repeats: int,
    clock: Callable[[], float],
    sync: Callable[[], None],
    warmup: int = 3,
) -> dict[K, float]:
    """Median seconds of each call; the calls are interleaved within every repeat, so
    load from other processes falls on all of them alike."""
    for call in calls.values():
        for _ in range(warmup):
            call()
    times: dict[K, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            sync()
            start = clock()
            call()
            sync()
            times[name].append(clock() - start)
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def keep_freed_memory() -> None:
    """Ask glibc's malloc to keep freed memory for reuse, for the rest of the process.

    By default it returns large freed blocks to the system, and the next call of the same
    size faults every page back in: on a virtual machine that can cost more than the
    arithmetic of a memory-bound op, and how often it happens depends on the heap's layout,
    not on the op. Elsewhere than glibc this does nothing.
    """
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, 32 << 20)  # blocks up to 32 MiB come from the heap
        mallopt(M_TRIM_THRESHOLD, 2**31 - 1)  # and the heap is never trimmed


@contextlib.contextmanager
def timing(
    threads: int | None, device: str
) -> Iterator[tuple[Callable[[], float], Callable[[], None]]]:
    """``(clock, sync)`` for timing on ``device`` with ``threads`` torch threads (restored on
    exit): the thread's CPU time for a single-threaded CPU run, which other processes on a
    shared machine do not inflate, else wall time with CUDA synchronised. Freed memory is
    kept (`keep_freed_memory`), so that page faults are not what is timed."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    cpu_clock = device == "cpu" and torch.get_num_threads() == 1
    clock = time.thread_time if cpu_clock else time.perf_counter
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    keep_freed_memory()
    try:
        yield clock, sync
    finally:
        torch.set_num_threads(previous)


def matmul_rate(
    clock: Callable[[], float],
    sync: Callable[[], None] = lambda: None,
    device: str = "cpu",
    size: int = 256,
    repeats: int = 20,
) -> float:
    """GFLOP/s of a ``size``³ float32 matmul on ``device`` (median): what the machine's
    arithmetic gives in the same run, against which a step's achieved rate reads."""
    a, b = (torch.randn(size, size, device=device) for _ in range(2))
    seconds = median_times({"matmul": lambda: a @ b}, repeats, clock, sync)["matmul"]
    return 2 * size**3 / seconds / 1e9


def achieved_rates(
    calls: Mapping[K, Callable[[], Any]],
    repeats: int,
    clock: Callable[[], float],
    sync: Callable[[], None],
    device: str,
    warmup: int = 1,
) -> dict[K, dict[str, float]]:
    """Each call's FLOPs (counted on one call), median ``seconds`` (`median_times`)
    and achieved ``gflop_per_s``, beside ``matmul_gflop_per_s`` (`matmul_rate`)
    measured in the same run: only rates measured together are comparable."""
    flops = {}
    for name, call in calls.items():
        with flop_counter() as counter:
            call()
        flops[name] = float(counter.get_total_flops())
    seconds = median_times(calls, repeats, clock, sync, warmup=warmup)
    rate = matmul_rate(clock, sync, device)
    return {
        name: {
            "seconds": s,
            "flops": flops[name],
            "gflop_per_s": flops[name] / s / 1e9,
            "matmul_gflop_per_s": rate,
        }
        for name, s in seconds.items()
    }


def first_call_seconds(call: Callable[[], Any], sync: Callable[[], None]) -> float:
    """Wall seconds of ``call``'s first run: for a compiled step, its compile (or the load of
    inductor's cached kernels) and one step."""
    sync()
    start = time.perf_counter()
    call()
    sync()
    return time.perf_counter() - start


def eager_against_compiled(
    eager: Mapping[str, float], compiled: Mapping[str, float], compile_s: float
) -> dict[str, float]:
    """One step's `achieved_rates` eager and compiled as a bench row's figures: ``eager_ms``,
    ``compiled_ms``, ``x_compiled`` (eager over compiled), ``compile_s``, each one's GFLOP/s
    and the matmul rate of the same run."""
    return {
        "eager_ms": 1e3 * eager["seconds"],
        "compiled_ms": 1e3 * compiled["seconds"],
        "x_compiled": eager["seconds"] / compiled["seconds"],
        "compile_s": compile_s,
        "eager_gflop_per_s": eager["gflop_per_s"],
        "compiled_gflop_per_s": compiled["gflop_per_s"],
        "matmul_gflop_per_s": eager["matmul_gflop_per_s"],
    }


def machine_load() -> str:
    """The 1, 5 and 15 minute load averages: other processes share the cores being timed."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
