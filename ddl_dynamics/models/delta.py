"""Deep Delta Learning stacks over depth, and the write-only control.

Each step reads its direction ``k̃``, target ``v`` and gate logit from the context
``[x; u_l]`` and updates the state, viewed as ``X ∈ R^{d×d_v}``, with the operator of
`ddl_dynamics.models.operator` at ``O(d·d_v)`` cost per sample. With
``context = "control"`` the generators read the control ``u_l`` alone, which makes the stack
a recurrence linear in its state (DeltaNet's, run over depth).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import check_choice, check_int
from .base import Branch, DepthModel, join, register_model
from .operator import gate_logit, generated_update, normalize_direction, split_generators

VALUE_SOURCES = ("branch", "input")
#: What the generators read: ``[x; u_l]``, or the step's control ``u_l`` alone.
CONTEXTS = ("state", "control")


@dataclass(frozen=True)
class DeltaProbe:
    """What every layer of a DDL stack did, per sample ``B`` and layer ``L``.

    Attributes:
        beta: gate ``(B, L)``. k_raw_norm: ``‖k̃‖`` before normalisation ``(B, L)``.
        k: unit direction ``(B, L, d)``. v: target readout ``(B, L, d_v)``.
        readout: ``kᵀX`` before the update ``(B, L, d_v)``.
        e_pre: ``readout − v``. e_post: ``kᵀX_after − v``; for ``ddl``,
            ``e_post = (1 − β) e_pre``.
        beta_write: where a stack gates its write apart from its erase
            (``ddl-decoupled``), the write gate ``(B, L)``; ``beta`` is then the erase gate,
            which sets the shortcut's eigenvalue ``1 − β``.
        update: where a layer takes several updates (``ddl-product``), which update of its
            layer each row is, ``(L,)`` from 0.
    """

    beta: Tensor
    k_raw_norm: Tensor
    k: Tensor
    v: Tensor
    readout: Tensor
    e_pre: Tensor
    e_post: Tensor
    beta_write: Tensor | None = None
    update: Tensor | None = None

    @classmethod
    def of_layers(cls, layers: Iterable[tuple[Tensor, ...]], dim: int) -> DeltaProbe:
        """Stack each layer's ``(β, k̃, k, v, X before, X after)`` along the layer axis ``dim``;
        ``X`` is the state as ``(..., d, d_v)``, read along ``k`` before and after the update."""
        rows = []
        for beta, k_raw, k, v, before, after in layers:
            read, read_after = (torch.einsum("...d,...dv->...v", k, X) for X in (before, after))
            rows.append((beta, k_raw.norm(dim=-1), k, v, read, read - v, read_after - v))
        return cls(*(torch.stack(column, dim=dim) for column in zip(*rows, strict=True)))


class _Generators(nn.Module):
    """One layer's generators from the context ``z`` (``[x; u_l]`` or ``u_l``): per head,
    ``[k̃ | gate logits | v]``, the layout `generated_update` reads (one
    head, one gate), heads side by side.

    Every gate row of the branch starts at zero weight and bias ``gate_logit(beta_init)``, so
    every sample starts at ``β = beta_init`` exactly.
    """

    def __init__(
        self,
        branch: Callable[[int, int], Branch],
        context: int,
        d: int,
        d_v: int,
        value_source: str,
        logit0: float,
        heads: int = 1,
        gates: int = 1,
    ) -> None:
        super().__init__()
        from_branch = value_source == "branch"
        width = d + gates + (d_v if from_branch else 0)
        self.heads = heads
        self.branch = branch(context, heads * width)
        # v = W_v RMSNorm(z): the paper's c_l = RMSNorm(x_in); a norm gain would be
        # redundant with W_v.
        self.value = None if from_branch else nn.Linear(context, heads * d_v, bias=False)
        with torch.no_grad():
            for row in range(d, d + gates):
                self.branch.out.weight[row::width].zero_()
                self.branch.out.bias[row::width] = logit0

    def forward(self, z: Tensor) -> Tensor:
        out = self.branch(z)
        if self.value is None:
            return out
        value = self.value(F.rms_norm(z, z.shape[-1:]))
        heads = (t.unflatten(-1, (self.heads, -1)) for t in (out, value))
        return torch.cat(list(heads), dim=-1).flatten(-2)


class _DeltaStack(DepthModel):
    """Shared body of ``ddl`` and ``ddl-write``; they differ only in `erases` (whether the
    update erases the readout along k before writing, or only writes).

    Options:
        value_channels: ``d_v ≥ 1``; the state is viewed as ``(state_dim // d_v, d_v)``.
        beta_max: gate ceiling in ``(0, 2]`` (2 allows reflections, 1 does not).
        beta_init: initial gate, in ``(0, beta_max)``.
        value_source: ``"branch"`` (v from the branch) or ``"input"`` (``v = W_v RMSNorm(z)``).
        context: what the generators read, ``z``. ``"state"``: ``[x; u_l]``. ``"control"``:
            ``u_l`` only (and the branch's learned biases), so a step is
            ``X ← (I − βkkᵀ)X + βkvᵀ`` with a transition independent of the state: the
            recurrence, linear in the state, for which β > 1 (negative eigenvalues) is
            provably needed to track parity (Grazzi et al., ICLR 2025). Tied, it is a
            delta-rule RNN over the control sequence.
    """

    probes = True
    #: Delta updates per layer, each with its own generators (``ddl-product``'s ``n_h``).
    heads: int = 1
    #: Gate logits per head: one β, or separate erase and write gates (``ddl-decoupled``).
    gates: ClassVar[int] = 1

    def __init__(
        self,
        *,
        value_channels: int = 1,
        beta_max: float = 2.0,
        beta_init: float = 0.5,
        value_source: str = "branch",
        context: str = "state",
        **common: Any,
    ) -> None:
        super().__init__(**common)
        self.value_channels = check_int("value_channels", value_channels, 1)
        if self.state_dim % value_channels:
            raise ValueError(
                f"state size {self.state_dim} is not divisible by value_channels={value_channels}"
            )
        if not 0.0 < beta_max <= 2.0:
            raise ValueError(f"beta_max must lie in (0, 2], got {beta_max!r}")
        self.beta_max = float(beta_max)
        self.beta_init = float(beta_init)
        self.value_source = check_choice("value_source", value_source, VALUE_SOURCES)
        self.context = check_choice("context", context, CONTEXTS)
        if context == "control" and not self.control_dim:
            raise ValueError(
                "context='control' reads only the per-step controls u_l, and "
                "this model has none (control_dim=0)"
            )
        self.d = self.state_dim // value_channels
        logit0 = gate_logit(self.beta_init, self.beta_max)
        reads = self.control_dim + (self.state_dim if context == "state" else 0)
        self.layers = self.per_layer(
            lambda: _Generators(
                self.branch,
                reads,
                self.d,
                value_channels,
                value_source,
                logit0,
                self.heads,
                self.gates,
            )
        )

    def packed_generators(self, i: int, state: Tensor, u_i: Tensor | None) -> Tensor:
        """Layer ``i``'s generators ``[k̃ | gate logits | v]`` per head,
        ``(B, heads · (d + gates + d_v))``."""
        return self.layer(i)(join(state, u_i) if self.context == "state" else u_i)

    def generators(self, i: int, state: Tensor, u_i: Tensor | None) -> tuple[Tensor, ...]:
        """Layer ``i``'s raw direction ``k̃ (B, d)``, target ``v (B, d_v)`` and gate ``β (B,)``
        (a family with more gates returns each after ``v``)."""
        raw = self.packed_generators(i, state, u_i)
        return split_generators(raw, self.value_channels, self.beta_max)

    def matrix(self, state: Tensor) -> Tensor:
        """The state as ``X``, ``(B, d, d_v)`` (a view)."""
        return state.unflatten(-1, (self.d, self.value_channels))

    def step(self, i: int, state: Tensor, u_i: Tensor | None) -> Tensor:
        return generated_update(
            state,
            self.packed_generators(i, state, u_i),
            value_channels=self.value_channels,
            beta_max=self.beta_max,
            erase=self.erases,
        )

    @torch.no_grad()
    def probe(self, x: Tensor, u: Tensor | None = None, steps: int | None = None) -> DeltaProbe:
        """Gates, directions, targets and readout errors of every layer (no gradients)."""
        states = self.trajectory(x, u, steps)  # (B, steps + 1, state_dim)
        layers = []
        for i in range(states.shape[1] - 1):
            k_raw, v, beta = self.generators(i, states[:, i], None if u is None else u[:, i])
            layers.append(
                (
                    beta,
                    k_raw,
                    normalize_direction(k_raw),
                    v,
                    self.matrix(states[:, i]),
                    self.matrix(states[:, i + 1]),
                )
            )
        return DeltaProbe.of_layers(layers, dim=1)


@register_model("ddl")
class DeltaModel(_DeltaStack):
    """Deep Delta Learning: erase the readout kᵀX along k, write v there: X + βk(vᵀ − kᵀX)."""

    erases = True


@register_model("ddl-write")
class DeltaWriteModel(_DeltaStack):
    """Write-only control: the DDL generators without the erase term, X + βkvᵀ."""

    erases = False
