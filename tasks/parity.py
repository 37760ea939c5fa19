"""Negative eigenvalues: the running parity of one bit per depth step.

Parity flips a sign at every 1-bit. For a recurrence that is *linear* in its state,
``h ← A(u) h + b(u)``, Grazzi et al. (2025) show that this needs eigenvalues of ``A`` below 0:
a delta rule with β ∈ [0, 2] (eigenvalues ``1 − β ∈ [−1, 1]``) solves parity and extrapolates
in length, one with β ∈ [0, 1] does not. Our depth models are not linear in the state — their
``k, v, β`` are functions of it — so within the training depth the branch can compute XOR and
write it even with β ≤ 1. The claim is therefore made where the literature makes it: on the
``long`` split (4× the steps), for a tied model whose shortcut has no negative eigenvalue.

Layout: the input is a random initial bit ``b0``, the controls the bits ``b1..bL`` (0/1); the
targets are the running parities ``b0 ⊕ … ⊕ bl`` at every step (bce on logits). The headline
metric is the accuracy of the final bit; ``step_accuracy`` averages over all steps. Example::

    inputs    (1)
    controls  (0), (1), (1), (0)
    targets   (1), (0), (1), (1)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from ddl_dynamics import Expectation, Task, TaskData, register_task, split_generator


@register_task("parity")
@dataclass(frozen=True)
class Parity(Task):
    """Running parity of one bit per depth step; 4× longer OOD split (length extrapolation).

    Metric: accuracy of the final step's bit; ``step_accuracy`` over all steps.
    """

    depth: int = 8

    regime: ClassVar = "negative eigenvalues (β > 1): a sign flip at every 1-bit"
    regimes: ClassVar = ("over-relaxed", "reflection")
    loss_name: ClassVar = "bce"
    metric_name: ClassVar = "accuracy"
    supervise: ClassVar = "trajectory"
    ood_splits: ClassVar = ("long",)
    expectations: ClassVar = (
        Expectation(
            "ddl", "<", 0.65,
            "with β ≤ 1 the shortcut's eigenvalues lie in [0, 1]; a linear recurrence so "
            "limited cannot extrapolate parity (Grazzi et al. 2025). The state-dependent "
            "branch could still write XOR, so this tests whether it does",
            overrides={"beta_max": 1.0, "tied": True},
            split="long",
        ),
    )

    @property
    def in_dim(self) -> int:
        return 1

    @property
    def out_dim(self) -> int:
        return 1

    @property
    def control_dim(self) -> int:
        return 1

    def sample(self, n: int, seed: int, split: str = "train") -> TaskData:
        steps = self.split_steps(split)
        g = split_generator(seed, split)
        bits = torch.randint(0, 2, (n, steps + 1, 1), generator=g)  # b0, b1..bL
        parity = (bits.cumsum(dim=1) % 2).float()  # (n, steps + 1, 1)
        return TaskData(
            inputs=bits[:, 0].float(),
            targets=parity[:, 1:],
            steps=steps,
            controls=bits[:, 1:].float(),
            trajectory=parity,
        )

    def metric(self, pred: Tensor, target: Tensor) -> float:
        """Accuracy of the final bit: on ``long`` that is the most extrapolated one."""
        return super().metric(pred[:, -1], target[:, -1])

    def extra_metrics(self, pred: Tensor, data: TaskData) -> dict[str, float]:
        return {"step_accuracy": super().metric(pred, data.targets)}
