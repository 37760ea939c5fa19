"""The task validator: `check_task` runs a task through the interface of
`_task` (shapes, dtypes, finiteness, determinism, held-out splits) and names the first
thing it breaks. Users run it on their own tasks; the suite runs it on every task of an
experiment before anything trains."""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

from ._task import (
    IGNORE_INDEX,
    IN_DISTRIBUTION,
    MAX_OVERLAP,
    Task,
    TaskData,
    content_overlap,
)
from .models.operator import REGIMES


class TaskCheckError(ValueError):
    """A task breaks the interface (`check_task`); the message names the problem."""


def check_task(task: Task, n: int = 8, seed: int = 0, n_overlap: int = 256) -> str:
    """Validate a task against the interface; raises `TaskCheckError` (a
    ``ValueError``, so it holds under ``python -O``) naming the problem.

    Run it on your own task before a sweep. It checks shapes, dtypes, finiteness,
    determinism, that loss and metric accept the targets, that a stated floor is a value of
    the metric short of its best, and that val and test are held out: at most
    `MAX_OVERLAP` of ``n_overlap`` of their examples may have content
    that also occurs among ``n_overlap`` training examples. Returns what it checked, in
    one line that starts ``"<Task>: ok"``, so that a check at the prompt says it passed.
    """
    if not isinstance(task, Task):
        raise TaskCheckError(f"check_task takes a Task instance (e.g. MyTask()), not {task!r}")
    name = type(task).__name__
    _check_declared(task, name)
    for split in task.splits:
        data = task.sample(n, seed, split)
        if not isinstance(data, TaskData):
            raise TaskCheckError(f"{name}.sample must return TaskData")
        if len(data) != n:
            raise TaskCheckError(f"{name}[{split}]: asked {n} samples, got {len(data)}")
        if task.kind == "sequence":
            _check_tokens(task, data, f"{name}[{split}]")
        else:
            _check_vectors(task, data, f"{name}[{split}]")
        again = task.sample(n, seed, split)
        if not (
            torch.equal(data.inputs, again.inputs) and torch.equal(data.targets, again.targets)
        ):
            raise TaskCheckError(f"{name}[{split}]: sample is not deterministic in its seed")
        _check_scoring(task, data, name)
    overlaps = _check_held_out(task, name, n_overlap, seed)
    return (
        f"{name}: ok ({n} samples of each split: {', '.join(task.splits)}; shapes, "
        "dtypes, finiteness, determinism, loss and metric; content shared with "
        f"train: {', '.join(overlaps)})"
    )


def _check_declared(task: Task, name: str) -> None:
    """What the class states: known regimes, a knob that is a spec field, a floor."""
    unknown = sorted(set(task.regimes) - set(REGIMES))
    if unknown:
        raise TaskCheckError(f"{name}.regimes: unknown regime {unknown[0]!r}; regimes: {REGIMES}")
    fields = [f.name for f in dataclasses.fields(task)]
    if task.knob not in (None, *fields):
        raise TaskCheckError(f"{name}.knob {task.knob!r} is not a spec field")
    _check_floor(task, name)


def _check_vectors(task: Task, data: TaskData, where: str) -> None:
    """A vector task's split: shapes of inputs, targets, controls, trajectory and step
    regimes, float32 and finite."""
    n, steps = len(data), data.steps
    if data.inputs.shape != (n, task.in_dim):
        raise TaskCheckError(f"{where}: inputs {tuple(data.inputs.shape)} != {(n, task.in_dim)}")
    want = (n, task.out_dim) if task.supervise == "final" else (n, steps, task.out_dim)
    if tuple(data.targets.shape) != want:
        raise TaskCheckError(
            f"{where}: targets {tuple(data.targets.shape)} != {want}"
            + _supervise_hint(task, data.targets.dim())
        )
    if task.control_dim:
        if data.controls is None:
            raise TaskCheckError(f"{where}: control_dim>0 but no controls")
        if tuple(data.controls.shape) != (n, steps, task.control_dim):
            raise TaskCheckError(
                f"{where}: controls {tuple(data.controls.shape)} != {(n, steps, task.control_dim)}"
            )
    elif data.controls is not None:
        raise TaskCheckError(f"{where}: controls given but control_dim=0")
    if data.trajectory is not None and data.trajectory.shape[:2] != (n, steps + 1):
        raise TaskCheckError(
            f"{where}: trajectory {tuple(data.trajectory.shape)} is not (n, steps+1, ·)"
        )
    if data.step_regimes is not None:
        regimes = data.step_regimes
        if tuple(regimes.shape) != (n, steps) or regimes.is_floating_point():
            raise TaskCheckError(f"{where}: step_regimes must be integers of shape {(n, steps)}")
        if not ((regimes >= -1) & (regimes < len(REGIMES))).all():
            raise TaskCheckError(f"{where}: step_regimes must be −1 or an index in REGIMES")
    for label, t in (
        ("inputs", data.inputs),
        ("targets", data.targets),
        ("controls", data.controls),
    ):
        if t is not None:
            if t.dtype != torch.float32:  # the models' dtype: other floats fail
                raise TaskCheckError(f"{where}: {label} must be float32, got {t.dtype}")
            if not torch.isfinite(t).all():
                raise TaskCheckError(f"{where}: {label} has NaN/Inf")


def _check_scoring(task: Task, data: TaskData, name: str) -> None:
    """The loss of a perfect prediction is 0, and a sequence task's metric of one is its
    best; a vector task's metric accepts its targets."""
    loss = task.loss(data.targets.clone(), data.targets) if task.loss_name == "mse" else None
    if loss is not None and loss.item() != 0.0:
        raise TaskCheckError(f"{name}: loss of a perfect prediction != 0")
    if task.kind == "sequence":  # sure logits: accuracy 1, or (bits per char) 0
        perfect = 100 * F.one_hot(data.targets.clamp(min=0), task.out_dim).float()
        best = 1.0 if task.higher_is_better else 0.0
        if abs(task.metric(perfect, data.targets) - best) >= 1e-6:
            raise TaskCheckError(f"{name}: metric of a perfect prediction != {best}")
    else:
        task.metric(torch.zeros_like(data.targets), data.targets)


def _check_held_out(task: Task, name: str, n_overlap: int, seed: int) -> list[str]:
    """Val and test share at most `MAX_OVERLAP` of their content with train; returns each
    split's share, for the summary line."""
    overlaps = []
    for split in IN_DISTRIBUTION[1:]:
        overlap = content_overlap(task, split, n_overlap, seed)
        overlaps.append(f"{split} {overlap:.0%}")
        if overlap > MAX_OVERLAP:
            raise TaskCheckError(
                f"{name}: {overlap:.0%} of {split} examples also occur in train (at most "
                f"{MAX_OVERLAP:.0%} allowed); hold whole inputs out, e.g. with held_out()"
            )
    return overlaps


def _check_floor(task: Task, name: str) -> None:
    """A floor is a finite value of the metric short of its best: an accuracy in [0, 1), a
    positive error."""
    floor = task.floor
    if floor is None:
        return
    accuracy = task.metric_name == "accuracy"
    if not (math.isfinite(floor) and (0 <= floor < 1 if accuracy else floor > 0)):
        wanted = "an accuracy in [0, 1)" if accuracy else f"a positive {task.metric_name}"
        raise TaskCheckError(f"{name}.floor must be None or {wanted}, got {floor!r}")


def _check_tokens(task: Task, data: TaskData, where: str) -> None:
    """The split of a sequence task: int64 tokens and targets ``(n, T)`` in range, and at
    least one scored position in every sequence."""
    shape = (len(data), data.steps)
    for label, t, size in (
        ("inputs", data.inputs, task.in_dim),
        ("targets", data.targets, task.out_dim),
    ):
        if t.dtype != torch.int64:
            raise TaskCheckError(f"{where}: {label} must be int64 tokens, got {t.dtype}")
        if tuple(t.shape) != shape:
            raise TaskCheckError(f"{where}: {label} {tuple(t.shape)} != {shape}")
        ids = t[t != IGNORE_INDEX] if label == "targets" else t
        if not ((ids >= 0) & (ids < size)).all():
            raise TaskCheckError(f"{where}: {label} outside [0, {size})")
    if data.controls is not None:
        raise TaskCheckError(f"{where}: a sequence task has no controls")
    scored = data.targets != IGNORE_INDEX
    if not scored.any(dim=1).all():
        raise TaskCheckError(f"{where}: a sequence has no scored position")


def _supervise_hint(task: Task, dims: int) -> str:
    """The fix when a task's targets have the other supervision's shape."""
    other = {2: "final", 3: "trajectory"}.get(dims)
    if other is None or other == task.supervise:
        return ""
    per = "every depth step" if other == "trajectory" else "the final state only"
    return (
        f"; the targets supervise {per}: set supervise = {other!r} on "
        f"{type(task).__name__} (a class attribute)"
    )
