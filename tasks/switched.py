"""A switched system over depth: one knob ``p`` from a smooth flow to erase/rewrite events.

The state ``x ∈ R^dim`` (``dim`` even) starts at the input. At every depth step, for every
sample independently, an *event* happens with probability ``p``, given in that step's control;
otherwise the step is a fixed smooth flow:

- **flow**: the exact one-step map of a slow damped rotation, ``x ← e^{−γ} R x``, where ``R``
  turns each coordinate plane ``(x_{2i}, x_{2i+1})`` by its own angle (`ANGLES`) and
  ``γ`` = `DAMPING`;
- **overwrite** along a unit direction ``n``: the readout ``nᵀx`` is set to a value ``c``,
  ``x ← x + n(c − nᵀx)``: the Delta update with ``k = n``, ``v = c``, β = 1 (projection);
- **reflect** along ``n``: ``nᵀx`` is negated, ``x ← x − 2(nᵀx)n``: the Delta update with
  ``k = n``, ``v = 0``, β = 2 (reflection).

``event`` says which events occur: ``"overwrite"``, ``"reflect"``, or ``"mixed"`` (each event
either, with equal odds). Directions are uniform on the sphere, not coordinate axes: on an axis
an additive branch erases by gating one coordinate, while along a random direction the erase
``n nᵀx`` is bilinear in the control and the state, which is the operation the Delta update
has built in and an additive step must learn. Every setting of ``p`` and ``event`` has the
same state space, horizon and control layout, so only the share of erase/rewrite dynamics
changes: ``p = 0`` is a pure flow, ``p = 1`` an event at every step. Targets: the state after
every depth step.

Hypotheses, with their reasons (the task's expectations state them as comparisons):

- at ``p = 1`` ``ddl`` beats ``resnet`` and its write-only control ``ddl-write``: every step
  is one Delta update whose ``k, v, β`` are read off the control, while the other two must
  compute the readout ``nᵀx`` in their branch to erase it;
- at ``p = 1`` the linear-in-state ``ddl`` (``context = "control"``) beats ``resnet``: it
  represents each event exactly, with a transition that depends on the control alone;
- at ``p = 0`` ``ddl`` does not beat ``resnet`` or ``node`` (a smooth flow, which an Euler
  step and an ODE discretise directly; as for the oscillator controls), and the
  linear-in-state ``ddl`` loses to ``resnet``: with no event its layer is a fixed rank-one
  change of the identity, and no product of those reproduces a rotation of two planes at
  every step (``M² − M`` would have to have rank one, while it has full rank);
- in between, the advantage of ``ddl`` grows with ``p``; where its paired difference against
  ``resnet`` first stays significant is the crossover ``p*`` the crossover figure estimates.

Layout (``dim = d``)::

    inputs    x_0                                        (d)
    controls  (overwrite? | reflect? | n | c)            (2 + d + 1); all zero on a flow step
    targets   x_1 … x_L                                  (L, d)

Example (d = 2, depth 2, angle θ and damping ignored for brevity)::

    inputs (1.0, 2.0); controls (1, 0 | 0, 1 | 0.5)   step 1: overwrite x_2 with 0.5 → (1.0, 0.5)
                                (0, 1 | 1, 0 | 0)     step 2: reflect along e_1      → (-1.0, 0.5)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from ddl_dynamics import (
    REGIMES,
    Expectation,
    Subject,
    Task,
    TaskData,
    delta_update,
    register_task,
    split_generator,
)

from .oscillators import smooth_flow_expectations

EVENTS = ("overwrite", "reflect", "mixed")
#: Rotation angle per depth step of the coordinate planes, slowest first (spread evenly
#: between these two for any number of planes).
ANGLES = (0.2, 0.4)
#: Damping per depth step: the flow multiplies the state by ``e^{−DAMPING}``.
DAMPING = 0.02
#: The linear-in-state Delta stack: its generators read the step's control alone.
LINEAR_DDL = Subject("ddl", {"context": "control"})


def flow_map(dim: int) -> Tensor:
    """The flow's one-step map ``e^{−γ} R`` as a ``(dim, dim)`` matrix (``dim`` even)."""
    planes = dim // 2
    angles = torch.linspace(*ANGLES, planes) if planes > 1 else torch.tensor(ANGLES[:1])
    block = torch.zeros(planes, 2, 2)
    block[:, 0, 0] = block[:, 1, 1] = angles.cos()
    block[:, 0, 1], block[:, 1, 0] = -angles.sin(), angles.sin()
    return math.exp(-DAMPING) * torch.block_diag(*block)


@register_task("switched")
@dataclass(frozen=True)
class Switched(Task):
    """Switched system: a damped rotation, or with probability p an overwrite/reflection event.

    ``p`` ∈ [0, 1] is the event rate per sample and step, ``event`` the kind of event
    (``"overwrite"``, ``"reflect"`` or ``"mixed"``), ``dim`` the (even) state size.
    """

    depth: int = 8
    p: float = 0.5
    event: str = "mixed"
    dim: int = 4

    regime: ClassVar = (
        "hypothesis: the more of the dynamics is erase/rewrite (p), the more a "
        "ddl step (β ≈ 1 overwrite, β ≈ 2 reflect) beats resnet; not at p = 0"
    )
    supervise: ClassVar = "trajectory"
    knob: ClassVar = "p"
    #: The states have unit scale (predicting zero scores about 1): a trajectory MSE within
    #: 1e-3 of the control's, a thousandth of that scale, is practically the same.
    margin: ClassVar = (0.1, 1e-3)

    def __post_init__(self) -> None:
        if self.event not in EVENTS:
            raise ValueError(f"unknown switched event {self.event!r}; events: {EVENTS}")
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"p must lie in [0, 1], got {self.p}")
        if self.dim < 2 or self.dim % 2:
            raise ValueError(f"dim must be even and at least 2, got {self.dim}")

    @property
    def in_dim(self) -> int:
        return self.dim

    @property
    def out_dim(self) -> int:
        return self.dim

    @property
    def control_dim(self) -> int:
        return self.dim + 3

    @property
    def regimes(self) -> tuple[str, ...]:
        """The regimes of this setting's events; none at ``p = 0`` (a control)."""
        if self.p == 0:
            return ()
        return {
            "overwrite": ("projection",),
            "reflect": ("reflection",),
            "mixed": ("projection", "reflection"),
        }[self.event]

    @property
    def expectations(self) -> tuple[Expectation, ...]:
        if self.p == 0:
            return (
                *smooth_flow_expectations(),
                Expectation(
                    LINEAR_DDL,
                    "worse",
                    "resnet",
                    "with no event the control is zero, so a layer of the linear-in-state stack "
                    "is a fixed map (I − βkkᵀ)z + βkv, a rank-one change of the identity; "
                    "matching M at step 1 and M² at step 2 would need M² − M = M(M − I) of rank "
                    "one, and for a damped rotation it has full rank",
                ),
            )
        if self.p < 1:
            return ()
        return (
            Expectation(
                "ddl",
                "better",
                "resnet",
                "every step is an event, one Delta update with k = n, v = c and β = 1 "
                "(overwrite) or v = 0 and β = 2 (reflect), all read off the control; an "
                "additive branch must compute the readout nᵀx, bilinear in control and state, "
                "to erase it",
            ),
            Expectation(
                "ddl",
                "better",
                "ddl-write",
                "the erase term matters: a write-only step X + βkvᵀ must compute the readout "
                "nᵀx in its branch to cancel it, which the Delta update does by construction",
            ),
            Expectation(
                LINEAR_DDL,
                "better",
                "resnet",
                "each event is exactly one step of the linear recurrence "
                "(I − βkkᵀ)z + βkv with k, v, β functions of the control alone",
            ),
        )

    def sample(self, n: int, seed: int, split: str = "train") -> TaskData:
        steps = self.split_steps(split)
        g = split_generator(seed, split)
        x = torch.randn(n, self.dim, generator=g)
        happens = torch.rand(n, steps, generator=g) < self.p
        coin = torch.rand(n, steps, generator=g) < 0.5
        reflects = {
            "overwrite": torch.zeros_like(coin),
            "reflect": torch.ones_like(coin),
            "mixed": coin,
        }[self.event]
        reflect, overwrite = happens & reflects, happens & ~reflects
        direction = F.normalize(torch.randn(n, steps, self.dim, generator=g), dim=-1)
        value = torch.where(overwrite, torch.randn(n, steps, generator=g), 0.0)
        flow = flow_map(self.dim)
        states = [x]
        for step in range(steps):
            gate = overwrite[:, step] + 2.0 * reflect[:, step]  # β: 1 overwrite, 2 reflect
            jump = delta_update(x, direction[:, step], value[:, step], gate)
            x = torch.where(happens[:, step, None], jump, x @ flow.T)
            states.append(x)
        trajectory = torch.stack(states, dim=1)  # (n, steps + 1, dim)
        flags = torch.stack([overwrite, reflect], dim=-1).float()
        direction = torch.where(happens[..., None], direction, 0.0)
        controls = torch.cat([flags, direction, value[..., None]], dim=-1)
        step_regimes = torch.full((n, steps), -1)
        step_regimes[overwrite] = REGIMES.index("projection")
        step_regimes[reflect] = REGIMES.index("reflection")
        return TaskData(
            inputs=trajectory[:, 0],
            targets=trajectory[:, 1:],
            steps=steps,
            controls=controls,
            trajectory=trajectory,
            step_regimes=step_regimes,
        )
