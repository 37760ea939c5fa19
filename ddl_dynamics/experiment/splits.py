"""A member's train, val and test data: sampled from the task for its seed, each checked
before anything trains on it (a bad sample is the task's failure, not the model's)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from .._task import MAX_OVERLAP, Task, TaskData, shared_content
from .config import TrainConfig


class TaskDataError(ValueError):
    """A task's sampler returned data that cannot be trained on: a failure of the task."""


#: The splits a member samples before it trains (test is scored once, at the end).
SPLITS = ("train", "val", "test")


def sample_splits(
    task: Task, cfg: TrainConfig, seed: int, splits: Sequence[str] = SPLITS
) -> list[TaskData]:
    """The task's ``splits`` for one seed, at the sizes ``cfg`` asks for, each checked
    (`check_sample`), val and test also for content they share with train (which
    comes first)."""
    sizes = {"train": cfg.n_train, "val": cast(int, cfg.n_val)}  # (n_test where not given)
    found: dict[str, TaskData] = {}
    for split in splits:
        n = sizes.get(split, cfg.n_test)
        found[split] = check_sample(task.sample(n, seed, split), n, seed, split)
        if split in ("val", "test") and "train" in found:
            check_held_out(found["train"], found[split], seed, split)
    return list(found.values())


def check_held_out(train: TaskData, data: TaskData, seed: int, split: str) -> None:
    """`TaskDataError` unless at most `MAX_OVERLAP` of the
    examples of ``split`` also occur in ``train``, at the run's own sizes and seed (a small
    sample can miss an overlap that a large training set makes)."""
    shared = shared_content(train, data)
    if shared > MAX_OVERLAP:
        raise TaskDataError(
            f"{shared:.1%} of the {split} examples for seed {seed} also occur "
            f"among its {len(train)} training examples (at most "
            f"{MAX_OVERLAP:.0%} allowed): hold whole inputs out, e.g. with "
            "held_out()"
        )


def check_sample(data: TaskData, n: int, seed: int, split: str) -> TaskData:
    """``data`` if it holds ``n`` examples with finite inputs and targets, else
    `TaskDataError` naming what is wrong (a bad sample would otherwise read as the
    model diverging, or train on less than asked for without a word)."""
    where = f"the task's {split} split for seed {seed}"
    if len(data) != n or len(data.targets) != n:
        raise TaskDataError(
            f"{where} has {len(data)} inputs and {len(data.targets)} targets; {n} were asked for"
        )
    for name in ("inputs", "targets", "controls"):
        value = getattr(data, name)
        if value is not None and value.is_floating_point() and not value.isfinite().all():
            raise TaskDataError(f"{where}: the task returned non-finite {name} (NaN or ±inf)")
    return data
