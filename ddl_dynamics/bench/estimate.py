"""How long a run's groups take to train on this machine, from a few timed training steps
of each: the estimate that ``ddl-dyn run --dry-run`` prints before anything trains."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from ..experiment.config import Cell
from .steps import TrainingStep
from .timing import median_times, timing


def group_seconds(group: Sequence[Cell], repeats: int = 3) -> float:
    """Seconds of training ``group`` (cells that fold into one ensemble): the median of
    ``repeats`` training steps of its models, folded as the trainer folds them and after one
    warm-up step, times the cells' steps, on one torch thread as a ``--jobs`` worker has."""
    built = [cell.build() for cell in group]
    task, cfg = built[0][0], group[0].train
    parts = [task.sample(cfg.batch_size, cell.seed, "train") for cell in group]
    step = TrainingStep.of([model for _, model in built], task, cfg, parts)
    with timing(1, cfg.device) as (clock, sync):
        seconds = median_times({"step": step.run}, repeats, clock, sync, warmup=1)["step"]
    return seconds * cfg.steps


def wall_seconds(seconds: Sequence[float], jobs: int) -> float:
    """The wall time of groups taking ``seconds`` on ``jobs`` workers, each group given to
    the worker that frees first, longest first."""
    workers = [0.0] * max(1, jobs)
    for s in sorted(seconds, reverse=True):
        heapq.heapreplace(workers, workers[0] + s)
    return max(workers)


def estimate_lines(groups: Sequence[Sequence[Cell]], jobs: int = 1) -> list[str]:
    """The estimate in words: the training time of ``groups`` on ``jobs`` workers, and what
    it leaves out."""
    if not groups:
        return []
    seconds = [group_seconds(group) for group in groups]
    compiled = sum(group[0].train.compile is True for group in groups)
    left_out = "evaluation, grid extension, a neural ODE's solver steps growing in training"
    if compiled:
        left_out += f", and compiling ({compiled} compiled groups, timed eager)"
    total, wall = _duration(sum(seconds)), _duration(wall_seconds(seconds, jobs))
    return [
        f"estimated training time on idle cores: {wall} with --jobs {jobs} ({total} on one "
        f"core), from training steps of each of the {len(groups)} groups timed here; not in "
        f"it: {left_out}"
    ]


def _duration(seconds: float) -> str:
    """``seconds`` as the reader plans with them: seconds, minutes or hours."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
