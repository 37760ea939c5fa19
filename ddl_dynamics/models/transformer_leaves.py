"""The leaf layers of the Transformer that hold parameters besides ``nn.Linear``,
``nn.Embedding`` and ``nn.RMSNorm`` — `CausalConv`, `Scale` and `FloatLinear` — each beside
its ensemble twin, registered here so that a model built of them folds whatever was imported
first; and `Relaid`, by which a layer whose state-dict layout changed still loads the
state dicts saved under the old one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import members_first
from .ensemble import EnsembleLinear, ensemble_linear, register_twin, stacked_weight


def causal_conv(x: Tensor, weight: Tensor) -> Tensor:
    """Depthwise causal convolution over tokens, ``R`` outputs per channel: ``(B, T, C) →
    (B, T, R, C)``.

    ``weight`` is ``(K, R, C)``: output ``(r, c)`` at token ``t`` is ``Σ_j weight[j, r, c] ·
    x[t − K + 1 + j, c]`` (tap ``K − 1`` is ``t``). With a leading member axis, ``x (S, B, T, C)``
    and ``weight (S, K, R, C)``, member ``s``'s kernel convolves its rows. Computed as products
    of shifted tokens, each along the C contiguous channels: a ``conv1d`` with one group per
    channel ran 2–6× slower on the CPU at these sizes; eagerly, several outputs per channel
    as one einsum over windows, which ``torch.compile``'s loops run slower than the products.
    """
    if weight.dim() == 3:
        return causal_conv(x[None], weight[None])[0]
    T, K = x.shape[-2], weight.shape[-3]
    padded = F.pad(x, (0, 0, K - 1, 0))  # (S, B, K − 1 + T, C): zeros before token 0
    taps = weight.unsqueeze(1)  # (S, 1, K, R, C)
    if taps.shape[-2] == 1 or torch.compiler.is_compiling():  # K shifted products
        return cast(
            Tensor, sum(padded[:, :, j : j + T, None, :] * taps[:, :, j, None] for j in range(K))
        )
    windows = padded.unfold(2, K, 1)  # (S, B, T, C, K)
    return torch.einsum("sbtck,skrc->sbtrc", windows, weight)


def at_least_float32(*tensors: Tensor) -> torch.dtype:
    """The widest dtype of ``tensors`` and float32: where gate logits are computed."""
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


class Relaid(nn.Module, ABC):
    """A layer that holds one tensor, ``relaid_key`` of its state dict, laid out channels first
    since version 2; on loading a state dict of version 1 (0.1's layout, whose state dicts
    carry no versions) `relay` converts it."""

    _version = 2
    relaid_key: ClassVar[str]

    @abstractmethod
    def relay(self, saved: Tensor) -> Tensor:
        """The tensor ``saved`` under version 1, in today's layout."""

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, local_metadata: dict[str, Any], *args: Any
    ) -> None:
        key = prefix + self.relaid_key
        if (local_metadata.get("version") or 1) < 2 and key in state_dict:
            state_dict[key] = self.relay(state_dict[key])
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args)


class CausalConv(Relaid):
    """`causal_conv` with its own ``(K, R, C)`` kernel (version 1: conv1d's
    ``(C·R, 1, K)``), identity-initialised: the current-token tap is 1 and the history taps 0,
    so it starts by passing each input channel through (to each of its ``R`` outputs)."""

    relaid_key = "weight"

    def __init__(self, channels: int, kernel_size: int, outputs: int = 1) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(kernel_size, outputs, channels))
        with torch.no_grad():
            self.weight[-1] = 1.0

    def forward(self, x: Tensor) -> Tensor:
        return causal_conv(x, self.weight)

    def relay(self, saved: Tensor) -> Tensor:
        K, R, C = self.weight.shape
        return saved.reshape(C, R, K).permute(2, 1, 0)


class Scale(nn.Module):
    """``x * weight``, a learned factor of the trailing axes of ``x`` (broadcast)."""

    def __init__(self, weight: Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)

    def forward(self, x: Tensor) -> Tensor:
        return x * self.weight


class FloatLinear(nn.Linear):
    """A linear layer computed in at least float32 whatever the dtypes of its weights and
    input (bfloat16 weights are widened, float64 kept), with autocast off: the gates' logits,
    so that no gate is rounded to a low-precision dtype before the sigmoid."""

    def forward(self, x: Tensor) -> Tensor:
        dtype = at_least_float32(x, self.weight)
        bias = None if self.bias is None else self.bias.to(dtype)
        with torch.autocast(x.device.type, enabled=False):
            return F.linear(x.to(dtype), self.weight.to(dtype), bias)


class EnsembleFloatLinear(EnsembleLinear):
    """The ensemble twin of `FloatLinear`: computed in at least float32."""

    def forward(self, x: Tensor) -> Tensor:
        dtype = at_least_float32(x, self.weight)
        bias = None if self.bias is None else self.bias.to(dtype)
        with torch.autocast(x.device.type, enabled=False):
            return ensemble_linear(x.to(dtype), self.weight.to(dtype), bias)


class EnsembleScale(nn.Module):
    """The ensemble twin of `Scale`: ``S`` factors, each on its member's rows."""

    def __init__(self, layers: Sequence[Scale]) -> None:
        super().__init__()
        self.weight = stacked_weight(layers)

    def forward(self, x: Tensor) -> Tensor:
        rows, weight = members_first(self.weight, x)
        return (rows * weight).flatten(0, 1)


class EnsembleCausalConv(nn.Module):
    """The ensemble twin of `CausalConv`: ``S`` kernels, each over its member's rows."""

    def __init__(self, layers: Sequence[CausalConv]) -> None:
        super().__init__()
        self.weight = stacked_weight(layers)  # (S, K, R, C)

    def forward(self, x: Tensor) -> Tensor:
        return causal_conv(x.unflatten(0, (self.weight.shape[0], -1)), self.weight).flatten(0, 1)


register_twin(FloatLinear, EnsembleFloatLinear)
register_twin(Scale, EnsembleScale)
register_twin(CausalConv, EnsembleCausalConv)
