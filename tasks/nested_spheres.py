"""Control for the NODE limitation: separate a ball from the shell around it.

Concentric spheres of Dupont et al. (2019): points of the inner ball ``r ≤ 0.5`` (label 1)
against the annulus ``1.0 ≤ r ≤ 1.5`` (label 0) in ``dim`` dimensions, classified by a
linear read-out of the final state. With the state being the point itself (identity encoder,
width ``dim``) a NODE's flow is a homeomorphism, so the shell's image still surrounds the
ball's and no hyperplane separates them: a NODE fits it only approximately, with growing NFE.
An augmented dimension (ANODE) or a discrete step that can fold space avoids that.

Example (dim 2)::

    inputs (0.1, -0.3) → target 1        inputs (0.0, 1.2) → target 0
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from ddl_dynamics import Expectation, Task, TaskData, register_task, split_generator

INNER = (0.0, 0.5)
OUTER = (1.0, 1.5)


@register_task("nested-spheres")
@dataclass(frozen=True)
class NestedSpheres(Task):
    """Inner ball r ≤ 0.5 (label 1) vs annulus 1 ≤ r ≤ 1.5 (label 0), uniform in volume."""

    depth: int = 8
    dim: int = 2

    regime: ClassVar = (
        "control; hypothesis: a node flow cannot pull the ball out of the "
        "shell, an anode or a discrete stack can"
    )
    loss_name: ClassVar = "bce"
    metric_name: ClassVar = "accuracy"
    expectations: ClassVar = (
        Expectation(
            "anode",
            "better",
            "node",
            "a NODE's flow is a homeomorphism of the plane, so the shell's image still "
            "surrounds the ball's; an augmented dimension lets the ball pass the shell "
            "(Dupont et al., NeurIPS 2019)",
        ),
    )

    def __post_init__(self) -> None:
        if self.dim < 1:
            raise ValueError(f"dim must be at least 1, got {self.dim}")

    @property
    def in_dim(self) -> int:
        return self.dim

    @property
    def out_dim(self) -> int:
        return 1

    @property
    def floor(self) -> float:
        """A coin: the ball and the shell are drawn with probability 1/2 each."""
        return 0.5

    @property
    def model_defaults(self) -> Mapping[str, Any]:
        """The state is the point itself, so the topological argument applies to it."""
        return {"encoder": "identity", "width": self.dim}

    def sample(self, n: int, seed: int, split: str = "train") -> TaskData:
        steps = self.split_steps(split)
        g = split_generator(seed, split)
        label = torch.randint(0, 2, (n, 1), generator=g).float()
        direction = F.normalize(torch.randn(n, self.dim, generator=g), dim=-1)
        # Uniform in volume: r^dim is uniform between the shell's bounds raised to dim.
        inner = label > 0
        lo = torch.where(inner, INNER[0], OUTER[0]) ** self.dim
        hi = torch.where(inner, INNER[1], OUTER[1]) ** self.dim
        r = (lo + (hi - lo) * torch.rand(n, 1, generator=g)) ** (1 / self.dim)
        return TaskData(inputs=r * direction, targets=label, steps=steps)
