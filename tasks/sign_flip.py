"""Reflection: maps that flip a sign, which one Householder step (β = 2, v = 0) does exactly.

``1d`` is g1d of Dupont et al. (2019): ``x ↦ −x`` on the line, with the state being ``x``
itself (identity encoder and decoder, width 1). An ODE flow on the line preserves order, so a
NODE's best map is the constant 0 and its MSE cannot go below ``E[x²]``; an augmented
dimension (ANODE) or a discrete reflection removes the obstruction. ``reflect`` reflects
``x ∈ R^d`` along a unit direction ``n`` given in the input; ``conditional`` flips ``x`` only
when a flag input is 1 (a data-dependent direction ``k = x/‖x‖`` with β = 2 does it).

Hypotheses, with the model each holds for: a ``node`` cannot fit ``1d`` (a theorem about
flows on the line); an ``anode`` and a ``ddl`` stack can. The ``ddl`` claim is that a stack
*can* reflect, not that it needs β > 1: its ``k, v, β`` read the state, so β = 1 with
``v = −kᵀX`` is a reflection too, and ``beta_max = 1`` does not rule reflections out.

Example (dim 2)::

    variant      inputs                    target
    1d           (0.8)                     (-0.8)
    reflect      (x | n) = (1, 2 | 0, 1)   x − 2(nᵀx)n = (1, -2)
    conditional  (x | flag) = (1, 2 | 1)   (-1, -2);   with flag 0: (1, 2)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from ddl_dynamics import Expectation, Task, TaskData, register_task, split_generator

VARIANTS = ("1d", "reflect", "conditional")
#: ``|x|`` of the 1-D variant is uniform on this interval, the sign is a fair coin.
MAGNITUDE = (0.5, 1.5)
#: ``E[x²]`` of the 1-D inputs: the MSE of predicting 0, the best an order-preserving map does.
FLOOR_1D = (MAGNITUDE[1] ** 3 - MAGNITUDE[0] ** 3) / (3 * (MAGNITUDE[1] - MAGNITUDE[0]))


@register_task("sign-flip")
@dataclass(frozen=True)
class SignFlip(Task):
    """Flip a sign: x ↦ −x on the line (NODE-impossible), a given reflection, or on a flag.

    ``variant``: ``"1d"``, ``"reflect"`` or ``"conditional"``; ``dim`` is the dimension of
    ``x`` in the last two. Model defaults and expectations depend on the variant.
    """

    depth: int = 8
    variant: str = "1d"
    dim: int = 4

    regime: ClassVar = (
        "hypothesis: a ddl stack can reflect x to −x (β = 2, v = 0); no node flow on the line can"
    )
    regimes: ClassVar = ("reflection",)

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown sign-flip variant {self.variant!r}; variants: {VARIANTS}")
        if self.dim < 1:
            raise ValueError(f"dim must be at least 1, got {self.dim}")

    @property
    def in_dim(self) -> int:
        return {"1d": 1, "reflect": 2 * self.dim, "conditional": self.dim + 1}[self.variant]

    @property
    def out_dim(self) -> int:
        return 1 if self.variant == "1d" else self.dim

    @property
    def model_defaults(self) -> Mapping[str, Any]:
        """For ``1d`` the state is the input itself, so the order argument applies to it."""
        if self.variant == "1d":
            return {"encoder": "identity", "decoder": "identity", "width": 1}
        return {}

    @property
    def expectations(self) -> tuple[Expectation, ...]:
        if self.variant != "1d":
            return ()
        return (
            Expectation(
                "node",
                "worse",
                0.9 * FLOOR_1D,
                "an analytic floor: a flow preserves order on the line, so a NODE cannot map x "
                "to −x; its best map is the constant 0, with test MSE E[x²] ≈ 1.08 (Dupont et "
                "al., NeurIPS 2019). Judged against 0.9·E[x²], which leaves room for the test "
                "sample's own mean of x²",
            ),
            Expectation(
                "anode",
                "better",
                "node",
                "an augmented dimension lets trajectories pass each other, so an ANODE can map "
                "x to −x where a NODE cannot (Dupont et al., NeurIPS 2019)",
            ),
            Expectation(
                "ddl",
                "better",
                "node",
                "one delta step with β = 2 and v = 0 is the reflection x ↦ −x, a map no flow on "
                "the line reaches",
            ),
        )

    def sample(self, n: int, seed: int, split: str = "train") -> TaskData:
        steps = self.split_steps(split)
        g = split_generator(seed, split)
        if self.variant == "1d":
            sign = torch.randint(0, 2, (n, 1), generator=g) * 2.0 - 1.0
            x = sign * torch.empty(n, 1).uniform_(*MAGNITUDE, generator=g)
            return TaskData(inputs=x, targets=-x, steps=steps)
        x = torch.randn(n, self.dim, generator=g)
        if self.variant == "reflect":
            normal = F.normalize(torch.randn(n, self.dim, generator=g), dim=-1)
            target = x - 2 * (normal * x).sum(-1, keepdim=True) * normal
            return TaskData(inputs=torch.cat([x, normal], -1), targets=target, steps=steps)
        flag = torch.randint(0, 2, (n, 1), generator=g).float()
        return TaskData(inputs=torch.cat([x, flag], -1), targets=(1 - 2 * flag) * x, steps=steps)
