"""Additive residual stacks: the baselines the Delta operator is measured against."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .base import DepthModel, join, register_model


@register_model("resnet")
class ResNet(DepthModel):
    """Additive residual stack x + h·f_l(x, u_l): explicit Euler with step size h."""

    compile_gain = 1.2

    def __init__(self, *, step_size: float = 1.0, **common: Any) -> None:
        super().__init__(**common)
        if not step_size > 0:
            raise ValueError(f"step_size must be > 0, got {step_size!r}")
        self.step_size = float(step_size)
        context = self.state_dim + self.control_dim
        self.layers = self.per_layer(lambda: self.branch(context, self.state_dim))

    def step(self, i: int, state: Tensor, u_i: Tensor | None) -> Tensor:
        # One op, not a scaling and an add: at the default step size 1 the same bits
        # (training steps measured ~4% faster).
        return torch.add(state, self.layer(i)(join(state, u_i)), alpha=self.step_size)


class _GatedLayer(nn.Module):
    def __init__(self, branch: nn.Module, context: int, state_dim: int) -> None:
        super().__init__()
        self.branch = branch
        self.gate = nn.Linear(context, state_dim)

    def forward(self, state: Tensor, z: Tensor) -> Tensor:
        return state + torch.sigmoid(self.gate(z)) * self.branch(z)


@register_model("gated")
class GatedResNet(DepthModel):
    """Highway-style gated residual stack x + σ(W_g[x; u_l] + b_g) ⊙ f_l(x, u_l)."""

    compile_gain = 1.2

    def __init__(self, **common: Any) -> None:
        super().__init__(**common)
        context = self.state_dim + self.control_dim
        self.layers = self.per_layer(
            lambda: _GatedLayer(self.branch(context, self.state_dim), context, self.state_dim)
        )

    def step(self, i: int, state: Tensor, u_i: Tensor | None) -> Tensor:
        return self.layer(i)(state, join(state, u_i))
