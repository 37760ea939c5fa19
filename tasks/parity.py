"""Negative eigenvalues: the running parity of one bit per depth step.

Parity flips a sign at every 1-bit. The hypothesis this task tests is Grazzi et al.'s (ICLR
2025): a recurrence *linear in its state*, ``h ← A(u) h + b(u)``, solves parity and
extrapolates in length only if ``A`` can have negative eigenvalues. For the delta rule
``A = I − βkkᵀ`` has eigenvalues 1 and ``1 − β``: β ∈ [0, 2] can, β ∈ [0, 1] cannot (they
report 1.000 against 0.017). Here that model is ``ddl`` with ``context = "control"`` (``k, v,
β`` read only the step's bit), tied, trained at depth 8 and scored on the ``long`` split (4×
the steps). The claim says nothing about the default, state-dependent stacks: their ``k, v,
β`` read the state, so a branch can compute XOR and write it even with β ≤ 1 (β = 1 with
``v = −kᵀX`` is a reflection). They are measured as what they are.

Held out by content: at depth 8 there are only 2⁹ = 512 sequences, so train, val and test
each own a fixed share of them (`held_out`) and no val or test sequence
ever occurs in train, however large ``n_train``; ``long`` sequences are new by length.

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

from ddl_dynamics import (
    Expectation,
    Subject,
    Task,
    TaskData,
    held_out,
    register_task,
    split_generator,
)

#: The linear-in-state Delta recurrence: generators from the control only, tied weights.
LINEAR = {"tied": True, "context": "control"}


@register_task("parity")
@dataclass(frozen=True)
class Parity(Task):
    """Running parity of one bit per depth step; 4× longer OOD split (length extrapolation).

    Metric: accuracy of the final step's bit; ``step_accuracy`` over all steps.
    """

    depth: int = 8

    regime: ClassVar = (
        "hypothesis: a linear recurrence (ddl, context=control, tied) needs "
        "negative eigenvalues (β > 1) to extrapolate parity to long"
    )
    regimes: ClassVar = ("over-relaxed", "reflection")
    loss_name: ClassVar = "bce"
    metric_name: ClassVar = "accuracy"
    supervise: ClassVar = "trajectory"
    ood_splits: ClassVar = ("long",)
    expectations: ClassVar = (
        Expectation(
            Subject("ddl", {**LINEAR, "beta_max": 2.0}),
            "better",
            Subject("ddl", {**LINEAR, "beta_max": 1.0}),
            "Grazzi et al. (ICLR 2025): a recurrence linear in its state, h ← A(u)h + b(u), "
            "tracks parity at every length only if A can have a negative eigenvalue. The delta "
            "rule's transition I − βkkᵀ has eigenvalue 1 − β along k: in [−1, 1] for "
            "β ≤ 2, only in [0, 1] for β ≤ 1. With generators read from the control alone "
            "and tied weights the stack is that recurrence (DeltaNet's, over depth); it must "
            "first solve the trained length, then is scored 4× longer. The state-dependent "
            "stacks are not linear in the state (β = 1 with v = −kᵀX reflects), so the claim "
            "is not made for them",
            split="long",
            requires=0.95,
        ),
    )

    @property
    def in_dim(self) -> int:
        return 1

    @property
    def out_dim(self) -> int:
        return 1

    @property
    def floor(self) -> float:
        """A coin: the final parity bit is 0 or 1 with probability 1/2 whatever came before."""
        return 0.5

    @property
    def control_dim(self) -> int:
        return 1

    def sample(self, n: int, seed: int, split: str = "train") -> TaskData:
        steps = self.split_steps(split)
        g = split_generator(seed, split)
        bits = held_out(lambda m: torch.randint(0, 2, (m, steps + 1), generator=g), n, split)
        bits = bits[..., None]  # b0, b1..bL
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
