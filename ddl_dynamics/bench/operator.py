"""The Delta update's forward + backward against a residual add ``X + F`` and against the
dense ``d × d`` operator the model path avoids, beside the least memory traffic each needs."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from ..models.delta_kernels import choose_backend
from ..models.operator import delta_update, normalize_direction, shortcut_matrix, write_update
from .timing import median_times, timing


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
    linear in ``d``. Calls: ``add`` (``X + F``), ``delta`` (`delta_update`, backend
    ``auto``), ``reference`` (the same on the reference torch-op path), ``write``
    (`write_update`) and ``dense`` (``A X + βkvᵀ`` with ``A`` built, on at most
    ``dense_elements // d²`` tokens, compared per element). Gradients are returned, as for
    a state inside a network; ``accumulate`` adds them into the inputs' ``.grad`` instead,
    as for leaves (which adds passes to both sides, more of them to the add's).

    Single-threaded CPU runs are timed by the thread's CPU time (``time.thread_time``),
    which other processes on a shared machine do not inflate; otherwise wall time, with
    CUDA synchronised. Freed memory is kept (`keep_freed_memory`), so that what is
    timed is the arithmetic and memory traffic of the calls, not page faults.

    Returns one row per ``(d, d_v)``: milliseconds of each call, ns per state element,
    the ratios ``delta_x_add``, ``reference_x_add``, ``write_x_add``, ``dense_x_delta``
    (per element) and ``traffic_x_add`` (`traffic_ratio`), and the backend used.
    """
    rows = []
    with timing(threads, device) as (clock, sync):
        for d_v in value_channels:
            for d in dims:
                rows.append(
                    _bench_shape(
                        d,
                        d_v,
                        elements // d,
                        repeats,
                        clock,
                        sync,
                        device,
                        dtype,
                        dense_elements,
                        accumulate,
                    )
                )
    return rows


def _bench_shape(
    d: int,
    d_v: int,
    tokens: int,
    repeats: int,
    clock: Callable[[], float],
    sync: Callable[[], None],
    device: str,
    dtype: torch.dtype,
    dense_elements: int,
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
            max(1, repeats // 4),
            clock,
            sync,
            warmup=1,
        )["dense"]
        per_element = 1e9 * dense / (dense_tokens * d * d_v)
        row |= {
            "dense_tokens": dense_tokens,
            "dense_ms": 1e3 * dense,
            "dense_ns_per_element": per_element,
            "dense_x_delta": per_element / row["delta_ns_per_element"],
        }
    row["traffic_x_add"] = traffic_ratio(d_v, accumulate)
    return row


def format_operator_table(rows: list[dict[str, Any]]) -> str:
    """The rows of `bench_operator` as a plain-text table."""
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
