"""Benchmarks as data: rows of measured times and ratios, and a table for each.

``bench_operator`` times one forward + backward of the Delta update against a plain
residual add ``X + F`` and against the dense ``d × d`` operator the model path avoids;
``bench_transformer`` times training steps of the Transformer variants against the
additive baseline; ``bench_steps`` one training step of each vector family against its
additive baseline, alone and with seeds trained together; ``bench_ode`` where a neural
ODE's training step goes; ``bench_scaling`` a step's time and memory against members
folded, width and depth; ``bench_suite`` an experiment's wall time with seeds together or
one by one, on one or more workers. ``format_*_table``
print their rows; ``run_bench`` (``ddl-dyn bench``) and the scripts in ``experiments/``
call these.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from .._task import Task, TaskData, make_task
from ..models.base import MODELS, join, list_models, make_model
from ..models.delta_kernels import choose_backend
from ..models.ensemble import Ensemble, alone, fold
from ..models.operator import delta_update, normalize_direction, shortcut_matrix, write_update
from ..models.params import count_parameters
from .cells import expand_cells
from .config import ExperimentConfig, TrainConfig
from .reader import load_experiment
from .runner import run_experiment
from .train import descend, fold_data, make_optimizer, member_losses, predictor, to_device

if TYPE_CHECKING:
    from ..models.ode import NeuralODE

#: label → (model name, options): the rows of ``experiments/transformer.toml``, and TC.
TRANSFORMER_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "transformer": ("transformer", {}),
    "transformer + EC": ("transformer", {"expansion": "conv"}),
    "ddl d_v=1": ("ddl-transformer", {}),
    "ddl d_v=1 v-map": ("ddl-transformer", {"generator": "v-map"}),
    "ddl d_v=4 CC": ("ddl-transformer", {"value_channels": 4}),
    "ddl d_v=4 CC w/o EC": ("ddl-transformer", {"value_channels": 4, "expansion": "repeat"}),
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
    to the first variant's, and ``gflop_per_s`` (FLOPs counted on one call) beside
    ``matmul_gflop_per_s``, :func:`matmul_rate` in the same run. Only ratios measured in one
    call are comparable.
    """
    gen = torch.Generator().manual_seed(0)
    tokens, targets = (torch.randint(0, vocab, (batch, length), generator=gen).to(device)
                       for _ in range(2))
    calls, params, flops = {}, {}, {}
    for label, (name, options) in variants.items():
        torch.manual_seed(0)
        model = make_model(name, in_dim=vocab, out_dim=vocab, width=width, depth=depth,
                           **options).to(device)
        params[label] = count_parameters(model)
        calls[label] = _training_steps(model, tokens, targets, steps)
        with FlopCounterMode(display=False) as counter:
            calls[label]()
        flops[label] = counter.get_total_flops()
    with timing(threads, device) as (clock, sync):
        seconds = median_times(calls, repeats, clock, sync, warmup=1)
        rate = matmul_rate(clock, sync, device)
    first = next(iter(seconds.values()))
    return [
        {"variant": label, "model": name, "options": options, "width": width, "depth": depth,
         "batch": batch, "length": length, "params": params[label],
         "ms_per_step": 1e3 * seconds[label] / steps,
         "tokens_per_s": batch * length * steps / seconds[label],
         "x_transformer": first / seconds[label],
         "gflop_per_s": flops[label] / seconds[label] / 1e9, "matmul_gflop_per_s": rate}
        for label, (name, options) in variants.items()
    ]


def matmul_rate(clock: Callable[[], float], sync: Callable[[], None] = lambda: None,
                device: str = "cpu", size: int = 256, repeats: int = 20) -> float:
    """GFLOP/s of a ``size``³ float32 matmul on ``device`` (median): what the machine's
    arithmetic gives in the same run, against which a step's achieved rate reads."""
    a, b = (torch.randn(size, size, device=device) for _ in range(2))
    seconds = median_times({"matmul": lambda: a @ b}, repeats, clock, sync)["matmul"]
    return 2 * size**3 / seconds / 1e9


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
    lines = [f"{'variant':<20} {'params':>10} {'ms/step':>8} {'tokens/s':>9} {'×transformer':>12} "
             f"{'GFLOP/s':>7} {'matmul 256³':>11}"]
    for r in rows:
        lines.append(f"{r['variant']:<20} {r['params']:>10,} {r['ms_per_step']:>8.1f} "
                     f"{r['tokens_per_s']:>9.0f} {r['x_transformer']:>12.2f} "
                     f"{r['gflop_per_s']:>7.1f} {r['matmul_gflop_per_s']:>11.1f}")
    return "\n".join(lines)


def machine_load() -> str:
    """The 1, 5 and 15 minute load averages: other processes share the cores being timed."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


#: The additive baseline the vector families are timed against at the same width, and the
#: task they are timed on (the Transformer variants: :func:`bench_transformer`).
STEP_BASELINE, STEP_TASK = "resnet", "overwrite"


def bench_steps(
    families: Sequence[str] | None = None,
    seeds: Iterable[int] = (1, 3, 5),
    width: int = 32,
    depth: int = 8,
    batch_size: int = 128,
    repeats: int = 20,
    threads: int | None = 1,
    device: str = "cpu",
    bf16: bool = False,
) -> list[dict[str, Any]]:
    """Time one training step of each vector model family (default: every one registered),
    alone and as ensembles.

    A step is what the trainer does per batch: forward, each member's loss (read back, as
    the trainer reads it), backward, per-member gradient clipping and the AdamW update, on
    ``batch_size`` examples per seed of :data:`STEP_TASK` at ``width`` and ``depth``. For
    each ``S`` in ``seeds`` the family's ``S`` seeds step as one folded ensemble where the
    model folds, else one after another (as the trainer would). The calls of one ``S`` are
    interleaved (:func:`median_times`) and timed as :func:`bench_operator` times its own.
    ``bf16``: under bfloat16 autocast (CUDA).

    Returns one row per family and ``S``: ``ms`` per step of all ``S`` seeds, ``folded``,
    ``x_baseline`` (over :data:`STEP_BASELINE` at the same ``S``) and, where ``S = 1`` was
    timed, ``x_one_by_one`` (over ``S`` steps of one seed alone).
    """
    baseline = STEP_BASELINE
    families = [baseline, *(f for f in families or _vector_families() if f != baseline)]
    task = make_task(STEP_TASK, depth=depth)
    cfg = TrainConfig(batch_size=batch_size, device=device, bf16=bf16)
    rows: list[dict[str, Any]] = []
    alone_ms: dict[str, float] = {}
    with timing(threads, device) as (clock, sync):
        for size in seeds:
            calls = {family: _training_step(family, task, cfg, size, width, depth)
                     for family in families}
            times = median_times({f: step.run for f, step in calls.items()}, repeats, clock,
                                 sync)
            for family in families:
                ms = 1e3 * times[family]
                if size == 1:
                    alone_ms[family] = ms
                row = {"family": family, "seeds": size, "folded": calls[family].folded,
                       "ms": ms, "x_baseline": ms / (1e3 * times[baseline])}
                if family in alone_ms:
                    row["x_one_by_one"] = ms / (size * alone_ms[family])
                rows.append(row)
    return rows


@dataclasses.dataclass
class TrainingStep:
    """One training step of several seeds of a family, on ``groups`` (one folded ensemble,
    or one ensemble of one per seed, stepped one after another by ``steps``)."""

    steps: list[Callable[[], None]]
    groups: list[Ensemble]
    batches: list[TaskData]

    def run(self) -> None:
        for step in self.steps:
            step()

    @property
    def folded(self) -> bool:
        return len(self.groups) == 1 and self.groups[0].size > 1


def _vector_families() -> list[str]:
    return [name for name in list_models()
            if getattr(MODELS.get(name), "kind", "vector") == "vector"]


def _training_step(family: str, task: Task, cfg: TrainConfig, size: int, width: int,
                   depth: int, **options: Any) -> TrainingStep:
    """One training step of ``size`` seeds of ``family`` (see :func:`bench_steps`)."""
    device = torch.device(cfg.device)
    models = []
    for seed in range(size):
        torch.manual_seed(seed)
        models.append(make_model(family, in_dim=task.in_dim, out_dim=task.out_dim,
                                 control_dim=task.control_dim, width=width, depth=depth,
                                 **options).to(device))
    folded = fold(models)
    groups = [folded] if folded is not None else [alone(m) for m in models]
    parts = [task.sample(cfg.batch_size, seed, "train") for seed in range(size)]
    predict = predictor(task, cfg.bf16 and device.type == "cuda")
    steps: list[Callable[[], None]] = []
    batches: list[TaskData] = []
    for ensemble in groups:
        mine = parts if folded is not None else parts[len(steps):len(steps) + 1]
        batch = to_device(fold_data(mine), device)
        optimizer = make_optimizer(ensemble.module)
        training = torch.ones(ensemble.size, dtype=torch.bool, device=device)

        def step(ensemble: Ensemble = ensemble, batch: TaskData = batch,
                 optimizer: torch.optim.Optimizer = optimizer, training: Tensor = training
                 ) -> None:
            losses = member_losses(ensemble.module, task, batch, predict, ensemble.size)
            losses.tolist()
            descend(ensemble, optimizer, losses, training, [cfg] * ensemble.size, 0)

        steps.append(step)
        batches.append(batch)
    return TrainingStep(steps, groups, batches)


def format_steps_table(rows: list[dict[str, Any]]) -> str:
    """The rows of :func:`bench_steps` as a plain-text table."""
    lines = [f"{'family':>12} {'seeds':>5} {'folded':>6} {'ms/step':>8} {'×baseline':>9} "
             f"{'×one by one':>11}"]
    for r in rows:
        one = f"{r['x_one_by_one']:>11.2f}" if "x_one_by_one" in r else f"{'—':>11}"
        lines.append(f"{r['family']:>12} {r['seeds']:>5} {'yes' if r['folded'] else 'no':>6} "
                     f"{r['ms']:>8.2f} {r['x_baseline']:>9.2f} {one}")
    return "\n".join(lines)


def step_memory(step: TrainingStep) -> int:
    """Bytes a training step holds at its peak, at the start of its backward: the tensors
    its forward saved for the backward (each storage once), and the parameters with their
    gradients and AdamW's two moments (four copies); for seeds stepped one by one, the
    largest of theirs. Counted, not sampled, so that it is the same on any device and
    under any load."""
    peaks = []
    for run, group in zip(step.steps, step.groups, strict=True):
        params = list(group.module.parameters())
        kept = {p.untyped_storage().data_ptr() for p in params}
        saved: dict[int, int] = {}

        def pack(tensor: Tensor, kept: set[int] = kept, saved: dict[int, int] = saved
                 ) -> Tensor:
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in kept:
                saved[storage.data_ptr()] = storage.nbytes()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            run()
        peaks.append(sum(saved.values()) + 4 * sum(p.nbytes for p in params))
    return max(peaks)


#: The axes of :func:`bench_scaling` and their values; the others stay at the first one's
#: ``members = 1``, ``width = 32``, ``depth = 8``.
SCALING_AXES: dict[str, tuple[int, ...]] = {
    "members": (1, 3, 8, 24),
    "width": (32, 64, 128, 256, 512),
    "depth": (4, 8, 16, 32, 64),
}


def bench_scaling(
    families: Sequence[str] | None = None,
    axes: Mapping[str, Sequence[int]] = SCALING_AXES,
    base: Mapping[str, int] | None = None,
    batch_size: int = 128,
    repeats: int = 5,
    threads: int | None = 1,
    device: str = "cpu",
) -> list[dict[str, Any]]:
    """How the cost of a training step grows with the members folded, the width and the
    depth, per vector family, beside :data:`STEP_BASELINE`.

    Along each axis the others stay at ``base`` (default: members 1, width 32, depth 8;
    ``hidden`` stays the families' default). At every point each family's step (as in
    :func:`bench_steps`; ``members`` seeds folded) is timed interleaved with the others'
    and its memory counted (:func:`step_memory`). Returns one row per axis, value and
    family: ``ms``, ``bytes`` and their ratios to the baseline's, ``x_baseline`` and
    ``memory_x_baseline``, and ``folded``.
    """
    base = {"members": 1, "width": 32, "depth": 8, **(base or {})}
    baseline = STEP_BASELINE
    families = [baseline, *(f for f in families or _vector_families() if f != baseline)]
    cfg = TrainConfig(batch_size=batch_size, device=device)
    rows: list[dict[str, Any]] = []
    with timing(threads, device) as (clock, sync):
        for axis, values in axes.items():
            for value in values:
                point = {**base, axis: value}
                task = make_task(STEP_TASK, depth=point["depth"])
                steps = {f: _training_step(f, task, cfg, point["members"], point["width"],
                                           point["depth"]) for f in families}
                memory = {f: step_memory(step) for f, step in steps.items()}
                times = median_times({f: step.run for f, step in steps.items()}, repeats,
                                     clock, sync, warmup=1)
                rows += [{"axis": axis, "value": value, **point, "family": f,
                          "folded": steps[f].folded, "ms": 1e3 * times[f],
                          "x_baseline": times[f] / times[baseline], "bytes": memory[f],
                          "memory_x_baseline": memory[f] / memory[baseline]}
                         for f in families]
    return rows


def format_scaling_table(rows: list[dict[str, Any]]) -> str:
    """The rows of :func:`bench_scaling` as a plain-text table."""
    lines = [f"{'axis':>7} {'value':>5} {'family':>10} {'ms/step':>8} {'×baseline':>9} "
             f"{'MiB':>8} {'×baseline':>9}"]
    for r in rows:
        lines.append(f"{r['axis']:>7} {r['value']:>5} {r['family']:>10} {r['ms']:>8.2f} "
                     f"{r['x_baseline']:>9.2f} {r['bytes'] / 2**20:>8.2f} "
                     f"{r['memory_x_baseline']:>9.2f}")
    return "\n".join(lines)


def bench_ode(
    members: Iterable[int] = (1, 8),
    width: int = 32,
    depth: int = 8,
    batch_size: int = 128,
    repeats: int = 20,
    threads: int | None = 1,
    device: str = "cpu",
    family: str = "node",
) -> list[dict[str, Any]]:
    """Where a neural ODE's training step goes, on the own solver and on torchdiffeq.

    For each solver (torchdiffeq's only alone: its adaptive solves do not fold) and number
    of members folded, the step (as in :func:`bench_steps`) is split into its forward (to
    the members' losses) and the rest (backward, clipping, AdamW: ``backward_ms``), each
    timed in every repeat (medians);
    beside it, one evaluation of the vector field on the same folded batch, forward and
    forward + backward, timed alone. ``field_ms`` = NFE × that evaluation is the field's
    arithmetic and call overhead; ``solver_ms``, the rest of forward and backward, is the
    solver's own work (stage combinations, error norms, step control, dense output)
    together with the encoder, decoder and loss. NFE are per member and per step.
    """
    cfg = TrainConfig(batch_size=batch_size, device=device)
    task = make_task(STEP_TASK, depth=depth)
    predict = predictor(task, bf16=False)
    rows = []
    with timing(threads, device) as (clock, sync):
        for solver, size in [("torchdiffeq", 1), *(("auto", m) for m in members)]:
            step = _training_step(family, task, cfg, size, width, depth, solver=solver)
            (ensemble,), (batch,) = step.groups, step.batches
            module = cast("NeuralODE", ensemble.module)  # an ODE family: its counters
            optimizer = make_optimizer(ensemble.module)
            training = torch.ones(size, dtype=torch.bool, device=device)
            parts: dict[str, list[float]] = {"forward": [], "backward": []}
            for repeat in range(repeats + 3):
                module.reset_nfe()
                sync()
                start = clock()
                losses = member_losses(module, task, batch, predict, size)
                losses.tolist()
                forward = clock()
                descend(ensemble, optimizer, losses, training, [cfg] * size, 0)
                sync()
                if repeat >= 3:  # warm-up
                    parts["forward"].append(forward - start)
                    parts["backward"].append(clock() - forward)
            nfe = (module.nfe_forward[0], module.nfe_backward[0])
            field = _field_evaluation(module, batch, repeats, clock, sync)
            ms = {name: 1e3 * sorted(t)[len(t) // 2] for name, t in parts.items()}
            field_ms = (nfe[0] * field["forward_backward"] + nfe[1] * field["forward"]) * 1e3
            rows.append({"solver": solver, "members": size, "width": width, "depth": depth,
                         "nfe_forward": nfe[0], "nfe_backward": nfe[1],
                         "forward_ms": ms["forward"], "backward_ms": ms["backward"],
                         "step_ms": ms["forward"] + ms["backward"],
                         "eval_forward_us": 1e6 * field["forward"],
                         "eval_forward_backward_us": 1e6 * field["forward_backward"],
                         "field_ms": field_ms, "solver_ms": ms["forward"] + ms["backward"]
                         - field_ms})
    return rows


def _field_evaluation(module: NeuralODE, batch: TaskData, repeats: int,
                      clock: Callable[[], float], sync: Callable[[], None]) -> dict[str, float]:
    """Seconds of one evaluation of ``module``'s vector field on its folded batch, forward
    and forward + backward (medians)."""
    field = module.layer(0)
    z = torch.randn(len(batch), module.state_dim, device=batch.inputs.device,
                    requires_grad=True)
    u = None if batch.controls is None else batch.controls[:, 0]
    calls = {"forward": lambda: field(join(z, u)),
             "forward_backward": lambda: field(join(z, u)).sum().backward()}
    return median_times(calls, repeats, clock, sync)


def format_ode_table(rows: list[dict[str, Any]]) -> str:
    """The rows of :func:`bench_ode` as a plain-text table."""
    lines = [f"{'solver':>11} {'members':>7} {'NFE f/b':>8} {'step ms':>8} {'forward':>8} "
             f"{'backward':>8} {'eval µs f/f+b':>13} {'field ms':>8} {'solver ms':>9}"]
    for r in rows:
        lines.append(f"{r['solver']:>11} {r['members']:>7} "
                     f"{r['nfe_forward']:>4}/{r['nfe_backward']:<3} {r['step_ms']:>8.2f} "
                     f"{r['forward_ms']:>8.2f} {r['backward_ms']:>8.2f} "
                     f"{r['eval_forward_us']:>6.0f}/{r['eval_forward_backward_us']:<6.0f} "
                     f"{r['field_ms']:>8.2f} {r['solver_ms']:>9.2f}")
    return "\n".join(lines)


#: (vectorize, jobs) of the suite benchmark's runs, the first being the reference.
SUITE_RUNS = ((False, 1), (True, 1), (False, 2), (True, 2))


def bench_suite(
    experiment: str | Path | ExperimentConfig,
    only: Mapping[str, Sequence[str]] | None = None,
    seeds: Sequence[int] | None = None,
    runs: Iterable[tuple[bool, int]] = SUITE_RUNS,
    device: str | None = None,
    bf16: bool = False,
) -> list[dict[str, Any]]:
    """Wall time of an experiment (or its ``only`` subset) trained from scratch, once per
    ``(vectorize, jobs)`` in ``runs``, each into a fresh temporary run folder.

    Wall time counts every core a run uses, so other processes on the machine inflate it:
    each row carries the load averages before and after. ``device`` overrides the cells'
    device; ``bf16`` turns on bfloat16 autocast for them (CUDA only).

    Returns one row per run: ``vectorize``, ``jobs``, ``cells``, ``counts`` (statuses),
    ``wall_s`` and ``x_first`` (over the first run's wall time).
    """
    config = (experiment if isinstance(experiment, ExperimentConfig)
              else load_experiment(experiment))
    if bf16:
        config = dataclasses.replace(config, train_defaults={**config.train_defaults,
                                                             "bf16": True})
    rows: list[dict[str, Any]] = []
    for vectorize, jobs in runs:
        load = machine_load()
        with tempfile.TemporaryDirectory() as run_dir:
            summary = run_experiment(config, run_dir, jobs=jobs, device=device, seeds=seeds,
                                     only=only, vectorize=vectorize, progress=False)
        rows.append({"vectorize": vectorize, "jobs": jobs, "cells": sum(summary.counts.values()),
                     "counts": summary.counts, "wall_s": summary.wall_time,
                     "x_first": summary.wall_time / (rows[0]["wall_s"] if rows
                                                     else summary.wall_time),
                     "load_before": load, "load_after": machine_load()})
    return rows


def format_suite_table(rows: list[dict[str, Any]]) -> str:
    """The rows of :func:`bench_suite` as a plain-text table."""
    lines = [f"{'seeds':>12} {'jobs':>4} {'cells':>5} {'wall s':>8} {'×first':>6}  load"]
    for r in rows:
        seeds = "together" if r["vectorize"] else "one by one"
        lines.append(f"{seeds:>12} {r['jobs']:>4} {r['cells']:>5} {r['wall_s']:>8.1f} "
                     f"{r['x_first']:>6.2f}  {r['load_before']} → {r['load_after']}")
    return "\n".join(lines)


#: The most timed repeats per call: beyond it a typo would time for days.
MAX_REPEATS = 10_000


def bench_output(run_dir: str | Path, output: str | Path | None) -> Path:
    """Where :func:`run_bench`'s JSON goes (``output``, else ``run_dir/bench.json``), checked
    before anything is timed: ``ValueError`` where a folder on the way is a file."""
    path = Path(output) if output else Path(run_dir) / "bench.json"
    for folder in (path.parent, *path.parent.parents):
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"{folder}: a file, not a folder; give another "
                             f"{'--output' if output else '--run-dir'}")
    if path.is_dir():
        raise ValueError(f"{path}: a folder, not a file; give another --output")
    return path


#: The parts of :func:`run_bench`, in the order they run.
BENCH_PARTS = ("operator", "steps", "ode", "scaling", "suite", "cuda")


def run_bench(
    parts: Iterable[str] = BENCH_PARTS,
    experiment: str | Path = "experiments/regimes.toml",
    only: Mapping[str, Sequence[str]] | None = None,
    seeds: Sequence[int] | None = None,
    repeats: int = 20,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the benchmarks in ``parts`` and return what they measured, echoing each table.

    ``operator``: :func:`bench_operator`; ``steps``: :func:`bench_steps` of the vector
    families and :func:`bench_transformer` of the Transformer variants; ``ode``: where a
    neural ODE's step goes (:func:`bench_ode`); ``scaling``: a step's time and memory
    against members, width and depth (:func:`bench_scaling`, CPU only); ``suite``:
    :func:`bench_suite` of ``experiment`` (restricted to ``only`` and ``seeds``); ``cuda``:
    the same three on CUDA in bfloat16 (autocast for training), or a note that it was
    skipped where CUDA is not available.
    """
    parts = list(parts)
    unknown = sorted(set(parts) - set(BENCH_PARTS))
    if unknown:
        raise ValueError(f"unknown benchmark {unknown[0]!r}; choose from {', '.join(BENCH_PARTS)}")
    if not 1 <= repeats <= MAX_REPEATS:
        raise ValueError(f"--repeats: expected 1 to {MAX_REPEATS:,} timed repeats (more would "
                         f"time for days), got {repeats}")
    suite: ExperimentConfig | None = None
    if "suite" in parts or ("cuda" in parts and torch.cuda.is_available()):
        # checked before anything is timed, so that a typo fails at once, not at the end
        suite = load_experiment(experiment)
        expand_cells(suite, seeds=seeds, only=only)
    results: dict[str, Any] = {"torch": torch.__version__, "threads": 1, "load": machine_load()}
    devices = [("cpu", torch.float32)] if set(parts) - {"cuda"} else []
    if "cuda" in parts:
        if torch.cuda.is_available():
            devices.append(("cuda", torch.bfloat16))
        else:
            results["cuda"] = {"skipped": "CUDA is not available here"}
            echo("cuda: skipped, CUDA is not available here")
    for device, dtype in devices:
        cuda = device == "cuda"
        into = results
        if cuda:
            into = results["cuda"] = {"device": torch.cuda.get_device_name()}
        threads = None if cuda else 1
        if "operator" in parts or cuda:
            echo(f"\n{device}: the Delta update against an add ({dtype})")
            into["operator"] = bench_operator(repeats=repeats, threads=threads, device=device,
                                              dtype=dtype)
            echo(format_operator_table(into["operator"]))
        if "steps" in parts or cuda:
            autocast = " (bf16 autocast)" if cuda else ""
            echo(f"\n{device}: one training step, vector families against "
                 f"{STEP_BASELINE}{autocast}")
            into["steps"] = bench_steps(repeats=repeats, threads=threads, device=device,
                                        bf16=cuda)
            echo(format_steps_table(into["steps"]))
            echo(f"\n{device}: training steps of the Transformer variants{autocast}")
            with (torch.autocast("cuda", dtype=torch.bfloat16) if cuda
                  else contextlib.nullcontext()):
                into["transformer"] = bench_transformer(threads=threads, device=device)
            echo(format_transformer_table(into["transformer"]))
        if "ode" in parts or cuda:
            echo(f"\n{device}: where a node training step goes")
            into["ode"] = bench_ode(repeats=repeats, threads=threads, device=device)
            echo(format_ode_table(into["ode"]))
        if "scaling" in parts and not cuda:
            echo(f"\n{device}: a training step against members, width and depth, "
                 f"beside {STEP_BASELINE}")
            into["scaling"] = bench_scaling(repeats=max(1, repeats // 4), threads=threads,
                                            device=device)
            echo(format_scaling_table(into["scaling"]))
        if "suite" in parts or cuda:
            subset = f" ({only})" if only else ""
            echo(f"\n{device}: wall time of {experiment}{subset}")
            into["suite_of"] = {"experiment": str(experiment), "only": only, "seeds": seeds}
            into["suite"] = bench_suite(suite or experiment, only, seeds, device=device,
                                        bf16=cuda)
            echo(format_suite_table(into["suite"]))
    results["load_after"] = machine_load()
    return results
