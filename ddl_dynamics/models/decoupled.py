"""Decoupled erase and write gates: ``X ← X − β_e k kᵀX + β_w k vᵀ``.

Gated DeltaNet-2 (2026) separates the delta rule's erase and write gates; the DDL paper's §2
calls that form "more general" and keeps one β for its target-matching reading
``e_post = (1 − β) e_pre``. Here each gate is ``β_max · σ(·)`` of its own logit from the same
branch. With ``β_w = β_e`` the update is ``ddl``'s; otherwise it is still a delta update with
gate ``β_e`` toward the scaled target ``(β_w / β_e) v``, which is how its probe reads it.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from .base import register_model
from .delta import DeltaProbe, _DeltaStack
from .operator import delta_update, gate, normalize_direction, write_update


def decoupled_update(
    X: Tensor, k: Tensor, v: Tensor, beta_erase: Tensor, beta_write: Tensor
) -> Tensor:
    """``X − β_e k kᵀX + β_w k vᵀ`` at ``O(d·d_v)`` per sample: the erase (a delta update
    toward ``v = 0``), then the write. Shapes as `delta_update`."""
    erased = delta_update(X, k, torch.zeros_like(v), beta_erase)
    return write_update(erased, k, v, beta_write)


@register_model("ddl-decoupled")
class DecoupledDeltaModel(_DeltaStack):
    """Delta rule with separate erase and write gates: X − β_e kkᵀX + β_w kvᵀ.

    Options are those of ``ddl``; both gates are ``beta_max · σ(·)`` and start at
    ``beta_init``, so at initialisation, and whenever the two gate rows of a layer are equal,
    the stack is ``ddl``. A layer's generators are packed ``[k̃ | erase logit | write logit
    | v]``.
    """

    compile_gain = 1.2

    erases = True
    gates = 2

    def generators(
        self, i: int, state: Tensor, u_i: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Layer ``i``'s raw direction ``k̃ (B, d)``, target ``v (B, d_v)``, erase gate
        ``β_e (B,)`` and write gate ``β_w (B,)``."""
        raw = self.packed_generators(i, state, u_i)
        k_raw, logits, v = raw.split((self.d, 2, self.value_channels), dim=-1)
        beta_erase, beta_write = gate(logits, self.beta_max).unbind(-1)
        return k_raw, v, beta_erase, beta_write

    def step(self, i: int, state: Tensor, u_i: Tensor | None) -> Tensor:
        k_raw, v, beta_erase, beta_write = self.generators(i, state, u_i)
        X = self.matrix(state)
        return decoupled_update(X, normalize_direction(k_raw), v, beta_erase, beta_write).flatten(
            -2
        )

    @torch.no_grad()
    def probe(self, x: Tensor, u: Tensor | None = None, steps: int | None = None) -> DeltaProbe:
        """As ``ddl``'s probe, with ``beta`` the erase gate, ``v`` the effective target
        ``(β_w / β_e) v`` (so ``e_post = (1 − β_e) e_pre`` holds) and ``beta_write``."""
        states = self.trajectory(x, u, steps)
        rows, writes = [], []
        for i in range(states.shape[1] - 1):
            k_raw, v, beta_erase, beta_write = self.generators(
                i, states[:, i], None if u is None else u[:, i]
            )
            target = (beta_write / beta_erase).unsqueeze(-1).to(v.dtype) * v
            rows.append(
                (
                    beta_erase,
                    k_raw,
                    normalize_direction(k_raw),
                    target,
                    self.matrix(states[:, i]),
                    self.matrix(states[:, i + 1]),
                )
            )
            writes.append(beta_write)
        return replace(DeltaProbe.of_layers(rows, dim=1), beta_write=torch.stack(writes, 1))
