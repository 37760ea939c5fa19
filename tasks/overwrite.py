"""Projection: overwrite one register per depth step.

A register file of ``R`` slots starts at the input values; depth step ``l`` writes the value
``c_l`` into slot ``s_l``. The delta update with ``k = e_s``, ``v = c_l`` and β = 1 is exactly
this write: the readout error becomes ``(1 − β)e = 0``, so nothing of the old value survives.
An additive step has to compute the old value and subtract it; a write-only step cannot erase.
The hypothesis is therefore that ``ddl`` beats ``resnet`` and its write-only control
``ddl-write`` (same generators, no erase term) here, and that its gates sit near β = 1.

Example (R = 3, depth 2)::

    inputs    (0.5, -1.0, 2.0)        initial registers
    controls  (0, 1, 0 | 0.7)         step 1: write 0.7 into slot 1
              (1, 0, 0 | -0.3)        step 2: write -0.3 into slot 0
    target    (-0.3, 0.7, 2.0)        final registers; with per_step, also (0.5, 0.7, 2.0) first
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F

from ddl_dynamics import Expectation, Task, TaskData, register_task, split_generator


@register_task("overwrite")
@dataclass(frozen=True)
class Overwrite(Task):
    """Register file: step l writes value c_l into slot s_l; target the final registers.

    Controls are ``(one-hot slot | value)``; registers and values are standard normal.
    ``per_step=True`` supervises the registers after every step instead of the final ones.
    """

    depth: int = 8
    slots: int = 4
    per_step: bool = False

    regime: ClassVar = (
        "hypothesis: a ddl step overwrites a slot exactly (β ≈ 1), which resnet "
        "must compute and ddl-write cannot erase"
    )
    regimes: ClassVar = ("projection",)
    expectations: ClassVar = (
        Expectation(
            "ddl",
            "better",
            "ddl-write",
            "the erase term matters: with β = 1, k along the slot and v = c_l one delta step "
            "is the write itself, the old value erased exactly; the write-only step X + βkvᵀ "
            "adds to the old value unless its branch computes and cancels it",
        ),
        Expectation(
            "ddl",
            "better",
            "resnet",
            "an additive step must compute the old value and subtract it through its branch; "
            "the delta rule's erase term does it in the operator (the delta rule of fast "
            "weight programmers: Schlag, Irie & Schmidhuber, ICML 2021)",
        ),
    )

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError(f"slots must be at least 1, got {self.slots}")

    @property
    def supervise(self) -> Literal["final", "trajectory"]:
        return "trajectory" if self.per_step else "final"

    @property
    def in_dim(self) -> int:
        return self.slots

    @property
    def out_dim(self) -> int:
        return self.slots

    @property
    def control_dim(self) -> int:
        return self.slots + 1

    def sample(self, n: int, seed: int, split: str = "train") -> TaskData:
        steps = self.split_steps(split)
        g = split_generator(seed, split)
        registers = torch.randn(n, self.slots, generator=g)
        slot = torch.randint(0, self.slots, (n, steps), generator=g)
        value = torch.randn(n, steps, generator=g)
        states = [registers]
        for step in range(steps):
            registers = registers.scatter(1, slot[:, step : step + 1], value[:, step : step + 1])
            states.append(registers)
        trajectory = torch.stack(states, dim=1)  # (n, steps + 1, R)
        return TaskData(
            inputs=trajectory[:, 0],
            targets=trajectory[:, 1:] if self.per_step else trajectory[:, -1],
            steps=steps,
            controls=torch.cat([F.one_hot(slot, self.slots).float(), value[..., None]], dim=-1),
            trajectory=trajectory,
        )
