"""What a trained member scores and costs: the val metric of the curve, the final train,
val, test and OOD metrics with the ODE checks, and FLOPs counted per sample or per member.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from .._task import Task, TaskData
from ..models.ensemble import Ensemble
from ..models.flops import flop_counter
from .batches import to_device, unfold
from .caps import Capped, solver_cap
from .config import TrainConfig
from .step import Predict, member_losses

if TYPE_CHECKING:
    from ..models.ode import NeuralODE


@torch.no_grad()
def member_metrics(
    model: nn.Module, task: Task, data: TaskData, predict: Predict, size: int
) -> list[float]:
    """Each member's metric on its rows of the folded ``data``."""
    model.eval()
    try:
        preds, targets = unfold(predict(model, data), size), unfold(data.targets, size)
        return [task.metric(p, t) for p, t in zip(preds, targets, strict=True)]
    finally:
        model.train()


def final_metrics(
    model: nn.Module,
    task: Task,
    cfg: TrainConfig,
    seed: int,
    splits: tuple[TaskData, TaskData, TaskData],
    predict: Predict,
    ode: bool,
) -> tuple[dict[str, Any], str]:
    """Train/val/test/OOD metrics of one member on its ``splits`` (train, val, test), task
    extras and ODE checks: the only time the test split is scored. A solver cap hit here
    leaves the affected figures ``None``. On train or val it is returned as a note (the
    cell is capped); on test, OOD data or the reconstruction check it is kept per split in
    ``metrics["capped"]``, a failure of that split alone, so that test data never steers
    the choice of a grid value or fails the trained split."""
    metrics: dict[str, Any] = {
        "metric": task.metric_name,
        "higher_is_better": task.higher_is_better,
        "train": None,
        "val": None,
        "test": None,
        "ood": {},
        "skipped": {},
        "extra": {},
        "capped": {},
    }
    notes = []
    data, val, test = splits
    test = to_device(test, val.inputs.device)

    @torch.no_grad()
    def score(split: str, split_data: TaskData, extras: bool = True) -> float | None:
        model.eval()
        try:
            with solver_cap():
                pred = predict(model, split_data)
        except Capped as cap:
            if split in ("train", "val"):
                notes.append(f"{split}: {cap}")
            else:
                metrics["capped"][split] = str(cap)
            return None
        finally:
            model.train()
        prefix = "" if split == "test" else f"{split}/"
        for name, value in (task.extra_metrics(pred, split_data) if extras else {}).items():
            metrics["extra"][prefix + name] = value
        return task.metric(pred, split_data.targets)

    metrics["train"] = score("train", data.subset(slice(0, cfg.n_val)), extras=False)
    metrics["val"] = score("val", val, extras=False)
    solver = cast("NeuralODE", model)  # its ODE counters and checks: read only where ode
    if ode:
        solver.reset_nfe()
    metrics["test"] = score("test", test)
    if ode:
        metrics["nfe_test"] = float(solver.nfe_forward[0])  # the model alone: one member
        _reconstruction(solver, test, metrics)
    _score_ood(model, task, cfg.n_test, seed, test.inputs.device, score, metrics)
    return metrics, "; ".join(notes)


def _score_ood(
    model: nn.Module,
    task: Task,
    n: int,
    seed: int,
    device: torch.device,
    score: Callable[[str, TaskData], float | None],
    metrics: dict[str, Any],
) -> None:
    """Each OOD split's metric into ``metrics["ood"]``; a split an untied model cannot run
    (more steps than its depth) is None, and why in ``metrics["skipped"]``."""
    depth = getattr(model, "depth", None)
    for split in task.ood_splits:
        split_data = to_device(task.sample(n, seed, split), device)
        if model.can_extrapolate or split_data.steps == depth:
            metrics["ood"][split] = score(split, split_data)
        else:
            metrics["ood"][split] = None
            metrics["skipped"][split] = (
                f"an untied model of depth {depth} cannot run {split_data.steps} steps"
            )


def _reconstruction(solver: NeuralODE, test: TaskData, metrics: dict[str, Any]) -> None:
    """The ODE's reconstruction check 0 → T → 0 on the test inputs, into ``metrics``: its
    error, tolerance and flag (None, and the cap kept, where the solver hit its cap)."""
    metrics["reconstruction_tolerance"] = solver.reconstruction_tolerance
    try:
        with solver_cap(), torch.no_grad():
            error = float(solver.reconstruction_error(test.inputs, test.controls))
    except Capped as cap:
        error = None
        metrics["capped"]["reconstruction"] = str(cap)
    metrics["reconstruction_error"] = error
    metrics["reconstruction_flag"] = (
        None if error is None else not error <= solver.reconstruction_tolerance
    )


@torch.no_grad()
def forward_flops(model: nn.Module, batch: TaskData, predict: Predict) -> float | None:
    """Forward FLOPs per sample, counted on one test batch of the trained model."""
    model.eval()
    counter = flop_counter()
    try:
        with solver_cap(), counter:
            predict(model, batch)
    except Capped:
        return None
    finally:
        model.train()
    return counter.get_total_flops() / len(batch)


def own_flops(ensemble: Ensemble, task: Task, batch: TaskData, predict: Predict) -> list[float]:
    """Each member's FLOPs in a forward and backward of its own on its rows of ``batch``.

    An ODE member's evaluations in an ensemble are its own, but the ensemble evaluates every
    member's rows until the slowest is done, so its FLOPs do not split by NFE."""
    flops: list[float] = []
    rows = len(batch) // ensemble.size
    for i, model in enumerate(ensemble.members):
        counter = flop_counter()
        with counter:
            member_losses(
                model, task, batch.subset(slice(i * rows, (i + 1) * rows)), predict, 1
            ).sum().backward()
        model.zero_grad(set_to_none=True)
        flops.append(counter.get_total_flops())
    return flops
