"""DeltaProduct over depth: several delta updates per layer, each with its own ``k, v, β``.

DeltaProduct (Siems et al., NeurIPS 2025) takes ``n_h`` delta-rule steps per token, so each
transition is the identity plus a rank-``n_h`` change, and state tracking improves with
``n_h``. Run over depth, a layer reads its context once and takes ``n_h`` updates
``X ← X + β_h k_h (v_hᵀ − k_hᵀX)`` in turn. A rotation is the product of two reflections, so
with ``n_h = 2`` one layer can step a rotation exactly; ``n_h = 1`` is ``ddl``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from .._checks import check_int
from .base import register_model
from .delta import DeltaProbe, _DeltaStack
from .operator import generated_update, normalize_direction, split_generators


@register_model("ddl-product")
class DeltaProductModel(_DeltaStack):
    """DeltaProduct over depth: `product` delta updates per layer, each its own k, v, β.

    Options (besides those of ``ddl``):
        product: ``n_h ≥ 1``, the delta updates per layer. All ``n_h`` generators come from
            one branch reading the layer's context (``[x; u_l]`` at the layer's start, or
            ``u_l``), so a layer costs one branch evaluation and ``n_h`` updates; each
            update's gate starts at ``beta_init``. ``product = 1`` is ``ddl``, weight for
            weight.

    Its probe has one row per update (``depth · n_h`` rows, layer-major), each an exact
    delta update with its own gate, so ``e_post = (1 − β) e_pre`` holds row by row.
    """

    erases = True

    def __init__(self, *, product: int = 2, **options: Any) -> None:
        self.heads = check_int("product", product, 1)  # read by _DeltaStack's layer builder
        super().__init__(**options)

    @property
    def product(self) -> int:
        return self.heads

    def packed_heads(self, i: int, state: Tensor, u_i: Tensor | None) -> tuple[Tensor, ...]:
        """Layer ``i``'s generators, one ``[k̃ | gate logit | v]`` ``(B, d + 1 + d_v)`` per
        update, all read from the same context."""
        raw = self.packed_generators(i, state, u_i)
        return raw.split(raw.shape[-1] // self.heads, dim=-1)

    def generators(
        self, i: int, state: Tensor, u_i: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Layer ``i``'s raw directions ``k̃ (B, n_h, d)``, targets ``v (B, n_h, d_v)`` and
        gates ``β (B, n_h)``."""
        raw = self.packed_generators(i, state, u_i).unflatten(-1, (self.heads, -1))
        return split_generators(raw, self.value_channels, self.beta_max)

    def step(self, i: int, state: Tensor, u_i: Tensor | None) -> Tensor:
        for raw in self.packed_heads(i, state, u_i):
            state = self.update(state, raw)
        return state

    def update(self, state: Tensor, raw: Tensor) -> Tensor:
        """One of a layer's updates, from its generators ``raw``."""
        return generated_update(
            state,
            raw,
            value_channels=self.value_channels,
            beta_max=self.beta_max,
            erase=self.erases,
        )

    @torch.no_grad()
    def probe(self, x: Tensor, u: Tensor | None = None, steps: int | None = None) -> DeltaProbe:
        """Every update of every layer, as its own probe row: ``(B, steps · n_h, ·)``, with
        which update of its layer each row is (``update``), so the regimes of the first and
        the second update can be read apart."""
        states = self.trajectory(x, u, steps)
        rows = []
        for i in range(states.shape[1] - 1):
            X = states[:, i]
            for raw in self.packed_heads(i, X, None if u is None else u[:, i]):
                k_raw, v, beta = split_generators(raw, self.value_channels, self.beta_max)
                after = self.update(X, raw)
                rows.append(
                    (beta, k_raw, normalize_direction(k_raw), v, self.matrix(X), self.matrix(after))
                )
                X = after
        layers = states.shape[1] - 1
        return dataclasses.replace(
            DeltaProbe.of_layers(rows, dim=1), update=torch.arange(self.heads).repeat(layers)
        )


@register_model("ddl-write-product")
class DeltaWriteProductModel(DeltaProductModel):
    """Two-write control: ``ddl-product``'s updates without the erase term, X + β_h k_h v_hᵀ.

    Against ``ddl-product`` it isolates the second update's erase: two writes per layer from
    the same generators, so a gain of ``ddl-product`` over it is owed to erasing, not to a
    second write. ``product = 1`` is ``ddl-write``, weight for weight.
    """

    erases = False
