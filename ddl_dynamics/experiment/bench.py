"""Benchmarks as data: rows of measured times and ratios.

``bench_operator`` times one forward + backward of the Delta update against a plain
residual add ``X + F`` and against the dense ``d × d`` operator the model path avoids;
``bench_transformer`` times training steps of the Transformer variants against the
additive baseline; ``format_operator_table`` and ``format_transformer_table`` print their
rows. Scripts and the CLI call these.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..models.base import make_model
from ..models.delta_kernels import choose_backend
from ..models.operator import delta_update, normalize_direction, shortcut_matrix, write_update
from ..models.params import count_parameters

#: label → (model name, options): the rows of ``experiments/transformer.toml``, and TC.
TRANSFORMER_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "transformer": ("transformer", {}),
    "ddl d_v=1": ("ddl-transformer", {}),
    "ddl d_v=4 CC": ("ddl-transformer", {"value_channels": 4}),
    "ddl d_v=4 TC": ("ddl-transformer", {"value_channels": 4, "compressor": "token"}),
    "ddl-write d_v=4 CC": ("ddl-write-transformer", {"value_channels": 4}),
    "additive d_v=4 CC": ("transformer", {"value_channels": 4}),
}

# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


def median_times(
    calls: dict[str, Callable[[], Any]], repeats: int, clock: Callable[[], float],
    sync: Callable[[], None], warmup: int = 3,
) -> dict[str, float]:
    """Median seconds of each call; the calls are interleaved within every repeat, so
    load from other processes falls on all of them alike."""
    for call in calls.values():
        for _ in range(warmup):
            call()
    times: dict[str, list[float]] = {name: [] for name in calls}
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


def _dense_delta(X: Tensor, k: Tensor, v: Tensor, beta: Tensor) -> Tensor:
    """The O(d²) alternative: ``A X + β k vᵀ`` with ``A = I − β k kᵀ`` materialised."""
    return shortcut_matrix(k, beta) @ X + beta[:, None, None] * k.unsqueeze(-1) * v.unsqueeze(-2)


def _fwd_bwd(
    update: Callable[..., Tensor], inputs: tuple[Tensor, ...], grad: Tensor, accumulate: bool
) -> Callable[[], Any]:
    """One forward and backward: gradients returned (``torch.autograd.grad``), or added into
    the inputs' ``.grad`` (``backward``) when ``accumulate``."""
    if accumulate:
        return lambda: update(*inputs).backward(grad)
    return lambda: torch.autograd.grad(update(*inputs), inputs, grad)


def traffic_ratio(d_v: int, accumulate: bool = False) -> float:
    """Least memory traffic of the update's forward + backward over that of an add.

    Reading or writing each tensor once, the add moves ``3S`` (S: the state's bytes; its
    backward passes the gradient through) and the update ``5S + 3K`` (K = S/d_v: the
    direction): forward reads X, k and writes Y; backward reads G, X, k, writes dX, dk.
    Accumulating into ``.grad`` adds ``3S`` per state-sized gradient: ``6S`` to the add
    (X and F), ``3S + 3K`` to the update (X and k).
    """
    add, update = 3.0, 5 + 3 / d_v
    if accumulate:
        add, update = add + 6, update + 3 + 3 / d_v
    return update / add


def bench_operator(
    dims: Iterable[int] = (64, 256, 1024, 4096),
    value_channels: Iterable[int] = (1, 4),
    elements: int = 1 << 20,
    repeats: int = 20,
    threads: int | None = 1,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    dense_elements: int = 1 << 24,
    accumulate: bool = False,
) -> list[dict[str, Any]]:
    """Time the Delta update's forward + backward against a residual add and a dense operator.

    For each ``d`` and ``d_v`` the state is ``(tokens, d, d_v)`` with ``tokens·d =
    elements``, so the time per state element stays flat across ``d`` when the update is
    linear in ``d``. Calls: ``add`` (``X + F``), ``delta`` (:func:`delta_update`, backend
    ``auto``), ``reference`` (the same on the reference torch-op path), ``write``
    (:func:`write_update`) and ``dense`` (``A X + βkvᵀ`` with ``A`` built, on at most
    ``dense_elements // d²`` tokens, compared per element). Gradients are returned, as for
    a state inside a network; ``accumulate`` adds them into the inputs' ``.grad`` instead,
    as for leaves (which adds passes to both sides, more of them to the add's).

    Single-threaded CPU runs are timed by the thread's CPU time (``time.thread_time``),
    which other processes on a shared machine do not inflate; otherwise wall time, with
    CUDA synchronised. Freed memory is kept (:func:`keep_freed_memory`), so that what is
    timed is the arithmetic and memory traffic of the calls, not page faults.

    Returns one row per ``(d, d_v)``: milliseconds of each call, ns per state element,
    the ratios ``delta_x_add``, ``reference_x_add``, ``write_x_add``, ``dense_x_delta``
    (per element) and ``traffic_x_add`` (:func:`traffic_ratio`), and the backend used.
    """
    rows = []
    with timing(threads, device) as (clock, sync):
        for d_v in value_channels:
            for d in dims:
                rows.append(_bench_shape(
                    d, d_v, elements // d, repeats, clock, sync, device, dtype, dense_elements,
                    accumulate,
                ))
    return rows


@contextlib.contextmanager
def timing(
    threads: int | None, device: str
) -> Iterator[tuple[Callable[[], float], Callable[[], None]]]:
    """``(clock, sync)`` for timing on ``device`` with ``threads`` torch threads (restored on
    exit): the thread's CPU time for a single-threaded CPU run, which other processes on a
    shared machine do not inflate, else wall time with CUDA synchronised. Freed memory is
    kept (:func:`keep_freed_memory`), so that page faults are not what is timed."""
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


def _bench_shape(
    d: int, d_v: int, tokens: int, repeats: int, clock: Callable[[], float],
    sync: Callable[[], None], device: str, dtype: torch.dtype, dense_elements: int,
    accumulate: bool,
) -> dict[str, Any]:
    gen = torch.Generator(device=device).manual_seed(0)

    def draw(*shape: int, unit: bool = False) -> Tensor:
        t = torch.randn(shape, generator=gen, device=device, dtype=dtype)
        return (normalize_direction(t) if unit else t).requires_grad_()

    X, F, grad = draw(tokens, d, d_v), draw(tokens, d, d_v), draw(tokens, d, d_v).detach()
    k, v = draw(tokens, d, unit=True), draw(tokens, d_v)
    beta = torch.rand(tokens, generator=gen, device=device, dtype=dtype).requires_grad_()
    inputs = (X, k, v, beta)
    calls = {
        name: _fwd_bwd(update, (X, F) if name == "add" else inputs, grad, accumulate)
        for name, update in (
            ("add", torch.add),
            ("delta", delta_update),
            ("reference", lambda *a: delta_update(*a, backend="reference")),
            ("write", write_update),
        )
    }
    seconds = median_times(calls, repeats, clock, sync)
    n = tokens * d * d_v
    row: dict[str, Any] = {"d": d, "d_v": d_v, "tokens": tokens, "backend": choose_backend(X)}
    row |= {f"{name}_ms": 1e3 * s for name, s in seconds.items()}
    row |= {f"{name}_ns_per_element": 1e9 * s / n for name, s in seconds.items()}
    row |= {f"{name}_x_add": seconds[name] / seconds["add"] for name in calls if name != "add"}
    dense_tokens = min(tokens, dense_elements // (d * d))
    if dense_tokens:
        few = tuple(t[:dense_tokens].detach().requires_grad_() for t in inputs)
        dense = median_times(
            {"dense": _fwd_bwd(_dense_delta, few, grad[:dense_tokens], accumulate)},
            max(1, repeats // 4), clock, sync, warmup=1,
        )["dense"]
        per_element = 1e9 * dense / (dense_tokens * d * d_v)
        row |= {
            "dense_tokens": dense_tokens, "dense_ms": 1e3 * dense,
            "dense_ns_per_element": per_element,
            "dense_x_delta": per_element / row["delta_ns_per_element"],
        }
    row["traffic_x_add"] = traffic_ratio(d_v, accumulate)
    return row


def format_operator_table(rows: list[dict[str, Any]]) -> str:
    """The rows of :func:`bench_operator` as a plain-text table."""
    header = (
        f"{'d':>5} {'d_v':>3} {'tokens':>6} {'add ms':>8} {'delta ms':>8} {'delta×add':>9} "
        f"{'traffic×add':>11} {'ref×add':>7} {'write×add':>9} {'dense×delta':>11} "
        f"{'ns/elem add':>11} {'delta':>6} {'backend':>9}"
    )
    lines = [header]
    for r in rows:
        dense = f"{r['dense_x_delta']:>11.0f}" if "dense_x_delta" in r else f"{'—':>11}"
        lines.append(
            f"{r['d']:>5} {r['d_v']:>3} {r['tokens']:>6} {r['add_ms']:>8.3f} "
            f"{r['delta_ms']:>8.3f} {r['delta_x_add']:>9.2f} {r['traffic_x_add']:>11.2f} "
            f"{r['reference_x_add']:>7.2f} {r['write_x_add']:>9.2f} {dense} "
            f"{r['add_ns_per_element']:>11.3f} {r['delta_ns_per_element']:>6.3f} "
            f"{r['backend']:>9}"
        )
    return "\n".join(lines)


def bench_transformer(
    width: int = 64, depth: int = 2, length: int = 64, batch: int = 32, vocab: int = 64,
    steps: int = 3, repeats: int = 5, threads: int | None = 1, device: str = "cpu",
    variants: Mapping[str, tuple[str, dict[str, Any]]] = TRANSFORMER_VARIANTS,
) -> list[dict[str, Any]]:
    """Training throughput of each Transformer variant relative to the first (``transformer``).

    Every variant trains at the same width, depth, batch and sequence length on random
    tokens: ``steps`` training steps (forward, cross-entropy, backward, AdamW step) per call,
    the variants' calls interleaved within every repeat and timed as in
    :func:`bench_operator`. Returns one row per variant: its model and options, parameter
    count, ms per step, training tokens/s and ``x_transformer``, the ratio of its tokens/s
    to the first variant's. Only ratios measured in one call are comparable.
    """
    gen = torch.Generator().manual_seed(0)
    tokens, targets = (torch.randint(0, vocab, (batch, length), generator=gen).to(device)
                       for _ in range(2))
    calls, params = {}, {}
    for label, (name, options) in variants.items():
        torch.manual_seed(0)
        model = make_model(name, in_dim=vocab, out_dim=vocab, width=width, depth=depth,
                           **options).to(device)
        params[label] = count_parameters(model)
        calls[label] = _training_steps(model, tokens, targets, steps)
    with timing(threads, device) as (clock, sync):
        seconds = median_times(calls, repeats, clock, sync, warmup=1)
    first = next(iter(seconds.values()))
    return [
        {"variant": label, "model": name, "options": options, "width": width, "depth": depth,
         "batch": batch, "length": length, "params": params[label],
         "ms_per_step": 1e3 * seconds[label] / steps,
         "tokens_per_s": batch * length * steps / seconds[label],
         "x_transformer": first / seconds[label]}
        for label, (name, options) in variants.items()
    ]


def _training_steps(model: torch.nn.Module, tokens: Tensor, targets: Tensor,
                    steps: int) -> Callable[[], None]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def run() -> None:
        for _ in range(steps):
            logits = model(tokens)
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

    return run


def format_transformer_table(rows: list[dict[str, Any]]) -> str:
    """The rows of :func:`bench_transformer` as a plain-text table."""
    lines = [f"{'variant':<20} {'params':>10} {'ms/step':>8} {'tokens/s':>9} {'×transformer':>12}"]
    for r in rows:
        lines.append(f"{r['variant']:<20} {r['params']:>10,} {r['ms_per_step']:>8.1f} "
                     f"{r['tokens_per_s']:>9.0f} {r['x_transformer']:>12.2f}")
    return "\n".join(lines)


def machine_load() -> str:
    """The 1, 5 and 15 minute load averages: other processes share the cores being timed."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
