"""The Delta sublayer's residual update of the Transformer (`ddl_dynamics.models.transformer`):
how a sublayer's output ``h`` makes the direction ``k̃``, target ``v`` and gate ``β``
(`Generators`), and the update they drive (`DeltaResidual`), one or, with ``product`` n_h > 1,
n_h in turn (a Householder product). A module of its own so that the Transformer file holds
the backbone.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor, nn

from .._checks import check_choice, check_int
from .operator import gate, gate_logit, normalize_direction
from .transformer_leaves import FloatLinear

VALUE_MAPS = ("sigmoid", "linear", "constant")
VALUE_INPUTS = ("stream", "context")
GENERATORS = ("k-map", "v-map")

Update = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class Generators:
    """How a Delta sublayer makes its direction ``k̃``, target ``v`` and gate ``β``.

    Attributes:
        generator: ``"k-map"``: ``k̃ = h``, the sublayer output, and ``v`` from a light map
            of the stream (the authors' released layout); ``"v-map"``: ``v`` from the sublayer
            output ``h`` and ``k̃ = Linear(c)`` from a light branch on the context.
        beta_init: β of a token whose gate input is 0, in (0, beta_max).
        beta_hidden: 0 for ``β = β_max σ(Linear(c))``; else the width of the two-layer gate
            ``β_max σ(Linear(tanh(Linear(c))))``.
        value: ``"sigmoid"``: ``v = value_scale · σ(Linear(·))``; ``"linear"``: ``Linear(·)``;
            ``"constant"`` (k-Map only): ``v = value_scale / 2``, what the sigmoid map gives
            with zero weights.
        value_scale: see ``value``.
        value_input: k-Map only: ``"stream"`` reads v from the residual stream ``x_in`` (the
            authors' code), ``"context"`` from ``c = RMSNorm(x_in)`` (the paper's
            ``v = W_v c``).
        beta_max: the gate's ceiling, in (0, 2]: 2 lets a sublayer reflect (β > 1, the
            transition ``I − βkkᵀ`` has eigenvalue ``1 − β < 0`` along k), 1 does not.
        product: n_h ≥ 1, the delta updates a sublayer takes in turn (DeltaProduct's
            Householder product), each with its own ``k̃, v, β`` from the same sublayer pass:
            every map above emits n_h of them (k-Map: the sublayer's output projection is
            n_h·d wide, one ``k̃`` per d), each gate starting at ``beta_init``. 1: the block.
    """

    generator: str = "k-map"
    beta_init: float = 1.0
    beta_hidden: int = 0
    value: str = "sigmoid"
    value_scale: float = 4.0
    value_input: str = "stream"
    beta_max: float = 2.0
    product: int = 1

    def __post_init__(self) -> None:
        check_choice("generator", self.generator, GENERATORS)
        check_int("product", self.product, 1)
        if not 0.0 < self.beta_max <= 2.0:
            raise ValueError(f"beta_max must lie in (0, 2], got {self.beta_max!r}")
        gate_logit(self.beta_init, self.beta_max)  # raises unless 0 < beta_init < beta_max
        check_int("beta_hidden", self.beta_hidden, 0)
        check_choice("value", self.value, VALUE_MAPS)
        check_choice("value_input", self.value_input, VALUE_INPUTS)
        if not math.isfinite(self.value_scale) or self.value_scale <= 0:
            raise ValueError(f"value_scale must be positive, got {self.value_scale!r}")
        if self.generator == "v-map" and (self.value == "constant" or self.value_input != "stream"):
            raise ValueError(
                "v-map reads v from the sublayer output: value = 'constant' and "
                "value_input apply to the k-map layout only"
            )


class DeltaResidual(nn.Module):
    """``update(X, k, v, β)`` with ``k = k̃ / sqrt(‖k̃‖² + ε²)`` and ``k̃``, ``v``, ``β`` as
    `Generators` lays them out; with ``product`` n_h > 1, n_h such updates in turn."""

    def __init__(self, update: Update, width: int, value_channels: int, spec: Generators) -> None:
        super().__init__()
        self.update, self.spec = update, spec
        n = spec.product
        if spec.beta_hidden:
            self.gate = nn.Sequential(
                FloatLinear(width, spec.beta_hidden, bias=False),
                nn.Tanh(),
                FloatLinear(spec.beta_hidden, n),
            )
        else:
            self.gate = nn.Sequential(FloatLinear(width, n))
        with torch.no_grad():
            cast(FloatLinear, self.gate[-1]).bias.fill_(gate_logit(spec.beta_init, spec.beta_max))
        self.value = None if spec.value == "constant" else nn.Linear(width, n * value_channels)
        self.direction = (
            nn.Linear(width, n * width, bias=False) if spec.generator == "v-map" else None
        )
        self.value_channels = value_channels

    def generators(self, x_in: Tensor, c: Tensor, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Direction ``k̃`` ``(B, T, d)``, target ``v`` ``(B, T, d_v)`` and gate ``β``
        ``(B, T)``, the gate in at least float32; with ``product`` n_h > 1, each with an
        update axis after ``(B, T)``: ``(B, T, n_h, d)``, ``(B, T, n_h, d_v)``, ``(B, T, n_h)``."""
        n = self.spec.product
        logits = self.gate(c)
        beta = gate(logits.squeeze(-1) if n == 1 else logits, self.spec.beta_max)
        if self.direction is not None:  # v-map
            if self.value is None:
                raise ValueError("v-map reads v from the sublayer output: not a constant value")
            k_raw, v = self.direction(c), self.value(h)
        elif self.value is None:
            k_raw, v = (
                h,
                c.new_full((*c.shape[:-1], n * self.value_channels), self.spec.value_scale / 2),
            )
        else:
            k_raw, v = h, self.value(x_in if self.spec.value_input == "stream" else c)
        if self.spec.value == "sigmoid":
            v = self.spec.value_scale * torch.sigmoid(v)
        if n == 1:
            return k_raw, v, beta
        return k_raw.unflatten(-1, (n, -1)), v.unflatten(-1, (n, -1)), beta

    def each_update(self, *generated: Tensor) -> list[tuple[Tensor, ...]]:
        """``generated`` (as `generators` returns them, β last) of each update in turn, in
        one update's shapes: with n_h > 1, sliced along the update axis, β's last."""
        if self.spec.product == 1:
            return [generated]
        return list(zip(*(t.unbind(generated[-1].dim() - 1) for t in generated), strict=True))

    def forward(self, X: Tensor, x_in: Tensor, c: Tensor, h: Tensor) -> Tensor:
        k_raw, v, beta = self.generators(x_in, c, h)  # β stays wide: the operator never rounds it
        X = X.mT  # (B, T, d, d_v)
        for k, v_h, beta_h in self.each_update(normalize_direction(k_raw), v, beta):
            X = self.update(X, k, v_h, beta_h)
        return X.mT
