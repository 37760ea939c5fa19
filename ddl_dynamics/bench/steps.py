"""One training step of each vector model family against its additive baseline at the same
width, alone and with seeds folded into one ensemble (or stepped one by one where a model
does not fold, as the trainer would)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .._task import Task, TaskData, make_task
from ..experiment.batches import fold_data, to_device
from ..experiment.config import TrainConfig
from ..experiment.optim import make_optimizer
from ..experiment.step import training_step
from ..models.base import family, list_models, make_model
from ..models.ensemble import Ensemble, alone, fold
from .timing import median_times, timing

#: The additive baseline the vector families are timed against at the same width, and the
#: task they are timed on (the Transformer variants: `transformer`).
STEP_BASELINE, STEP_TASK = "resnet", "overwrite"


@dataclass
class TrainingStep:
    """One training step of several seeds, the trainer's
    (`training_step`), on ``groups``: one folded
    ensemble, or one ensemble of one per seed stepped one after another, each on its batch
    with its own optimiser."""

    task: Task
    cfg: TrainConfig
    groups: list[Ensemble]
    batches: list[TaskData]
    optimizers: list[torch.optim.Optimizer] = field(init=False)

    def __post_init__(self) -> None:
        self.optimizers = [make_optimizer(group.module) for group in self.groups]

    @classmethod
    def of(
        cls,
        models: Sequence[torch.nn.Module],
        task: Task,
        cfg: TrainConfig,
        parts: Sequence[TaskData],
    ) -> TrainingStep:
        """The step of ``models``, each on its data ``parts`` (on ``cfg.device``): folded
        where they fold, else one by one."""
        folded = fold(models)
        if folded is not None:
            return cls(task, cfg, [folded], [to_device(fold_data(parts), cfg.device)])
        return cls(
            task, cfg, [alone(m) for m in models], [to_device(part, cfg.device) for part in parts]
        )

    def run(self) -> None:
        for group in range(len(self.groups)):
            self.run_group(group)

    def run_group(self, group: int) -> list[float]:
        """The step of ``groups[group]`` alone; its members' losses."""
        return training_step(
            self.groups[group], self.optimizers[group], self.task, self.batches[group], self.cfg
        )

    @property
    def folded(self) -> bool:
        return len(self.groups) == 1 and self.groups[0].size > 1


def family_step(
    family: str, task: Task, cfg: TrainConfig, size: int, width: int, depth: int, **options: Any
) -> TrainingStep:
    """One training step of ``size`` seeds of ``family`` (see `bench_steps`)."""
    models = []
    for seed in range(size):
        torch.manual_seed(seed)
        models.append(
            make_model(
                family,
                in_dim=task.in_dim,
                out_dim=task.out_dim,
                control_dim=task.control_dim,
                width=width,
                depth=depth,
                **options,
            ).to(cfg.device)
        )
    parts = [task.sample(cfg.batch_size, seed, "train") for seed in range(size)]
    return TrainingStep.of(models, task, cfg, parts)


def vector_families() -> list[str]:
    """The registered model families that run on vector-state tasks."""
    return [name for name in list_models() if family(name).kind == "vector"]


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

    A step is what the trainer does per batch (`TrainingStep`): forward, each
    member's loss (read back, as the trainer reads it), backward, per-member gradient
    clipping and the AdamW update, on ``batch_size`` examples per seed of
    `STEP_TASK` at ``width`` and ``depth``. For each ``S`` in ``seeds`` the family's
    ``S`` seeds step as one folded ensemble where the model folds, else one after another
    (as the trainer would). The calls of one ``S`` are interleaved (`median_times`)
    and timed as `bench_operator` times its own. ``bf16``: under bfloat16
    autocast (CUDA).

    Returns one row per family and ``S``: ``ms`` per step of all ``S`` seeds, ``folded``,
    ``x_baseline`` (over `STEP_BASELINE` at the same ``S``) and, where ``S = 1`` was
    timed, ``x_one_by_one`` (over ``S`` steps of one seed alone).
    """
    baseline = STEP_BASELINE
    families = [baseline, *(f for f in families or vector_families() if f != baseline)]
    task = make_task(STEP_TASK, depth=depth)
    cfg = TrainConfig(batch_size=batch_size, device=device, bf16=bf16)
    rows: list[dict[str, Any]] = []
    alone_ms: dict[str, float] = {}
    with timing(threads, device) as (clock, sync):
        for size in seeds:
            calls = {
                family: family_step(family, task, cfg, size, width, depth) for family in families
            }
            times = median_times({f: step.run for f, step in calls.items()}, repeats, clock, sync)
            for family in families:
                ms = 1e3 * times[family]
                if size == 1:
                    alone_ms[family] = ms
                row = {
                    "family": family,
                    "seeds": size,
                    "folded": calls[family].folded,
                    "ms": ms,
                    "x_baseline": ms / (1e3 * times[baseline]),
                }
                if family in alone_ms:
                    row["x_one_by_one"] = ms / (size * alone_ms[family])
                rows.append(row)
    return rows


def format_steps_table(rows: list[dict[str, Any]]) -> str:
    """The rows of `bench_steps` as a plain-text table."""
    lines = [
        f"{'family':>12} {'seeds':>5} {'folded':>6} {'ms/step':>8} {'×baseline':>9} "
        f"{'×one by one':>11}"
    ]
    for r in rows:
        one = f"{r['x_one_by_one']:>11.2f}" if "x_one_by_one" in r else f"{'—':>11}"
        lines.append(
            f"{r['family']:>12} {r['seeds']:>5} {'yes' if r['folded'] else 'no':>6} "
            f"{r['ms']:>8.2f} {r['x_baseline']:>9.2f} {one}"
        )
    return "\n".join(lines)
