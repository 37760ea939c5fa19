"""How a training step's time and memory grow with the members folded, the width and the
depth, per vector family, beside the additive baseline."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from .._task import make_task
from ..experiment.config import TrainConfig
from .steps import STEP_BASELINE, STEP_TASK, TrainingStep, family_step, vector_families
from .timing import median_times, timing

#: The axes of `bench_scaling` and their values; the others stay at the first one's
#: ``members = 1``, ``width = 32``, ``depth = 8``.
SCALING_AXES: dict[str, tuple[int, ...]] = {
    "members": (1, 3, 8, 24),
    "width": (32, 64, 128, 256, 512),
    "depth": (4, 8, 16, 32, 64),
}


def step_memory(step: TrainingStep) -> int:
    """Bytes a training step holds at its peak, at the start of its backward: the tensors
    its forward saved for the backward (each storage once), and the parameters with their
    gradients and AdamW's two moments (four copies); for seeds stepped one by one, the
    largest of theirs. Counted, not sampled, so that it is the same on any device and
    under any load."""
    peaks = []
    for group, ensemble in enumerate(step.groups):
        params = list(ensemble.module.parameters())
        kept = {p.untyped_storage().data_ptr() for p in params}
        saved: dict[int, int] = {}

        def pack(tensor: Tensor, kept: set[int] = kept, saved: dict[int, int] = saved) -> Tensor:
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in kept:
                saved[storage.data_ptr()] = storage.nbytes()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            step.run_group(group)
        peaks.append(sum(saved.values()) + 4 * sum(p.nbytes for p in params))
    return max(peaks)


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
    depth, per vector family, beside `STEP_BASELINE`.

    Along each axis the others stay at ``base`` (default: members 1, width 32, depth 8;
    ``hidden`` stays the families' default). At every point each family's step (as in
    `bench_steps`; ``members`` seeds folded) is timed interleaved with the
    others' and its memory counted (`step_memory`). Returns one row per axis, value
    and family: ``ms``, ``bytes`` and their ratios to the baseline's, ``x_baseline`` and
    ``memory_x_baseline``, and ``folded``.
    """
    base = {"members": 1, "width": 32, "depth": 8, **(base or {})}
    baseline = STEP_BASELINE
    families = [baseline, *(f for f in families or vector_families() if f != baseline)]
    cfg = TrainConfig(batch_size=batch_size, device=device)
    rows: list[dict[str, Any]] = []
    with timing(threads, device) as (clock, sync):
        for axis, values in axes.items():
            for value in values:
                point = {**base, axis: value}
                task = make_task(STEP_TASK, depth=point["depth"])
                steps = {
                    f: family_step(f, task, cfg, point["members"], point["width"], point["depth"])
                    for f in families
                }
                memory = {f: step_memory(step) for f, step in steps.items()}
                times = median_times(
                    {f: step.run for f, step in steps.items()}, repeats, clock, sync, warmup=1
                )
                rows += [
                    {
                        "axis": axis,
                        "value": value,
                        **point,
                        "family": f,
                        "folded": steps[f].folded,
                        "ms": 1e3 * times[f],
                        "x_baseline": times[f] / times[baseline],
                        "bytes": memory[f],
                        "memory_x_baseline": memory[f] / memory[baseline],
                    }
                    for f in families
                ]
    return rows


def format_scaling_table(rows: list[dict[str, Any]]) -> str:
    """The rows of `bench_scaling` as a plain-text table."""
    lines = [
        f"{'axis':>7} {'value':>5} {'family':>10} {'ms/step':>8} {'×baseline':>9} "
        f"{'MiB':>8} {'×baseline':>9}"
    ]
    for r in rows:
        lines.append(
            f"{r['axis']:>7} {r['value']:>5} {r['family']:>10} {r['ms']:>8.2f} "
            f"{r['x_baseline']:>9.2f} {r['bytes'] / 2**20:>8.2f} "
            f"{r['memory_x_baseline']:>9.2f}"
        )
    return "\n".join(lines)
