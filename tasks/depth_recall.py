"""The delta rule over depth with ``d_v > 1``: an associative memory written layer by layer.

The state is a memory ``M ∈ R^{d×d_v}`` that starts at the input. Each example draws ``d``
orthonormal keys (a random rotation per example) and every depth step writes a value
``v ∈ R^{d_v}`` under one of them, keys drawn with replacement. A rewritten key must
*replace* its old value: the delta update ``M ← M + β k (vᵀ − kᵀM)`` with β = 1 does this
exactly, whereas a write-only memory returns the sum. ``trajectory`` holds that ideal memory.
The hypothesis: ``ddl`` with ``value_channels = value_dim`` beats ``resnet`` and the
write-only ``ddl-write``, its gates near β = 1.

``read="memory"`` (default) asks for ``M_L`` itself: the answer ``qᵀM_L`` to every query at
once through a fixed linear read-out. ``read="query"`` spends the last step on one query
``q`` and asks for ``qᵀM_L``; the model must then build the bilinear read itself (a DDL can:
the reflection along ``q − e`` swaps rows ``q`` and ``e``), which takes far more training.

Layout (``d`` = key_dim, ``d_v`` = value_dim, ``L`` = depth)::

    inputs    M_0, flattened              (d·d_v)
    controls  (k_l | v_l)                 write v_l under k_l, at every step
              read="query": (k_l | v_l | 0) at steps 1..L−1, then (q | 0 | 1) at step L
    target    M_L flattened;  read="query": qᵀM_L

Example (d = 2, d_v = 1, L = 2, keys e1, e2)::

    inputs (0.5, 0.9); controls (1, 0 | 0.2), (1, 0 | -0.4)  →  target (-0.4, 0.9)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from ddl_dynamics import (
    Expectation,
    Task,
    TaskData,
    delta_update,
    register_task,
    split_generator,
)

READS = ("memory", "query")


@register_task("depth-recall")
@dataclass(frozen=True)
class DepthRecall(Task):
    """Depth-wise associative memory: key/value writes over depth into a d×d_v state.

    ``key_dim`` orthonormal keys per example, ``value_dim`` value channels, memory and
    values standard normal; DDL models default to ``value_channels = value_dim``.
    """

    depth: int = 8
    key_dim: int = 4
    value_dim: int = 2
    read: str = "memory"

    regime: ClassVar = (
        "hypothesis: ddl with d_v = value_dim replaces a rewritten key's value "
        "(β ≈ 1); ddl-write sums them"
    )
    regimes: ClassVar = ("projection",)

    def __post_init__(self) -> None:
        if self.key_dim < 1 or self.value_dim < 1:
            raise ValueError(
                f"key_dim and value_dim must be at least 1, got {self.key_dim}, {self.value_dim}"
            )
        if self.read not in READS:
            raise ValueError(f"unknown depth-recall read {self.read!r}; reads: {READS}")

    @property
    def in_dim(self) -> int:
        return self.key_dim * self.value_dim

    @property
    def out_dim(self) -> int:
        return self.value_dim if self.read == "query" else self.key_dim * self.value_dim

    @property
    def control_dim(self) -> int:
        return self.key_dim + self.value_dim + (self.read == "query")

    @property
    def model_defaults(self) -> Mapping[str, Any]:
        """A DDL state of shape ``(width / d_v, d_v)`` can hold the memory as it is."""
        return {"value_channels": self.value_dim}

    @property
    def expectations(self) -> tuple[Expectation, ...]:
        if self.read == "query":
            return ()
        return (
            Expectation(
                "ddl",
                "better",
                "ddl-write",
                "the erase term matters: a rewritten key must replace its value. With d_v = "
                "value_dim one delta step (β = 1, k the key, v the value) is that write, while "
                "a write-only memory returns the sum of the values written under the key (the "
                "capacity problem the delta rule solves in fast weight programmers: Schlag, "
                "Irie & Schmidhuber, ICML 2021)",
            ),
            Expectation(
                "ddl",
                "better",
                "resnet",
                "an additive step has no read-out of the old value to erase: its branch must "
                "learn kᵀM and subtract it, which the delta update does by construction",
            ),
        )

    def sample(self, n: int, seed: int, split: str = "train") -> TaskData:
        steps = self.split_steps(split)
        writes = steps - 1 if self.read == "query" else steps
        g = split_generator(seed, split)
        d, dv, rows = self.key_dim, self.value_dim, torch.arange(n)
        basis = torch.linalg.qr(torch.randn(n, d, d, generator=g)).Q  # (n, d, d), orthonormal
        memory = torch.randn(n, d, dv, generator=g)  # M_0
        keys = basis[rows[:, None], torch.randint(0, d, (n, writes), generator=g)]
        values = torch.randn(n, writes, dv, generator=g)

        history = [memory]
        for step in range(writes):
            memory = delta_update(memory, keys[:, step], values[:, step], torch.ones(n))
            history.append(memory)
        controls = torch.cat([keys, values], dim=-1)  # (n, writes, d + d_v)
        targets = memory.flatten(1)
        if self.read == "query":
            history.append(memory)  # the query step writes nothing
            query = basis[rows, torch.randint(0, d, (n,), generator=g)]  # (n, d)
            ask = torch.cat([query, torch.zeros(n, dv), torch.ones(n, 1)], dim=-1)
            controls = torch.cat([F.pad(controls, (0, 1)), ask[:, None]], dim=1)  # flag column
            targets = torch.einsum("nd,ndv->nv", query, memory)  # qᵀM_L
        return TaskData(
            inputs=history[0].flatten(1),
            targets=targets,
            steps=steps,
            controls=controls,
            trajectory=torch.stack(history, dim=1).flatten(2),  # (n, steps + 1, d·d_v)
        )
