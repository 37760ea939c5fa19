"""One training step, the trainer's and every benchmark's: forward on a folded batch, each
member's loss read back, then backward and the per-member AdamW step
(:func:`~.optim.descend`) of the members still training."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from .._task import Task, TaskData
from ..models.ensemble import Ensemble
from .batches import unfold
from .config import TrainConfig
from .optim import descend

#: ``predict(model, batch)``: the model's float32 output for a task (:func:`predictor`).
Predict = Callable[[nn.Module, TaskData], Tensor]


def predictor(task: Task, bf16: bool) -> Predict:
    """``predict(model, batch)``: the model's output for the task in float32, computed under
    bfloat16 autocast on CUDA if ``bf16``."""

    def predict(model: nn.Module, batch: TaskData) -> Tensor:
        autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if bf16
                    else contextlib.nullcontext())
        with autocast:
            out = model(batch.inputs, u=batch.controls, steps=batch.steps,
                        per_step=task.supervise == "trajectory")
        return out.float()

    return predict


def member_losses(module: nn.Module, task: Task, batch: TaskData, predict: Predict,
                  size: int) -> Tensor:
    """Each member's training loss on its rows of the folded ``batch``, ``(size,)``."""
    preds, targets = unfold(predict(module, batch), size), unfold(batch.targets, size)
    return torch.stack([task.loss(p, t) for p, t in zip(preds, targets, strict=True)])


def training_step(
    ensemble: Ensemble, optimizer: torch.optim.Optimizer, task: Task, batch: TaskData,
    cfgs: TrainConfig | Sequence[TrainConfig], index: int = 0, *,
    keep: Callable[[list[float]], Sequence[bool]] | None = None,
) -> list[float]:
    """Step ``index`` (from 0) of the ensemble's members on their rows of the folded
    ``batch``, each with its config (``cfgs``: one per member, or one for all); returns
    their losses.

    The losses are read back after the forward, as the trainer must to watch them; then
    ``keep(losses)`` (default: every member) says which members still train, and those
    take the backward, clipping and AdamW step (:func:`~.optim.descend`; none where no
    member is kept). The forward runs under bfloat16 autocast where the config asks and
    the batch is on CUDA.
    """
    size = ensemble.size
    cfgs = [cfgs] * size if isinstance(cfgs, TrainConfig) else list(cfgs)
    predict = predictor(task, cfgs[0].bf16 and batch.inputs.device.type == "cuda")
    losses = member_losses(ensemble.module, task, batch, predict, size)
    values = losses.tolist()
    training = [True] * size if keep is None else list(keep(values))
    if any(training):
        descend(ensemble, optimizer, losses, torch.tensor(training, device=losses.device),
                cfgs, index)
    return values
