"""The expanded residual state of the Transformer, ``X ∈ R^{d×d_v}`` per token held channels
first, ``(B, T, d_v, d)``: the expansion of the embedding into X and the compressors of X
to the width-d input of a sublayer (Compress–Process–Rewrite). At d_v = 1 both are a
reshape.
"""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import Tensor, nn

from .base import members_first
from .transformer_leaves import CausalConv, Relaid, Scale

EXPANSIONS = ("conv", "repeat")
COMPRESSORS = ("channel", "token")
COMPRESSOR_INITS = ("mean", "random")


class Unsqueeze(nn.Module):
    """d_v = 1: the state is the embedding with one value channel, ``(B, T, 1, d)``."""

    def forward(self, x: Tensor) -> Tensor:
        return x.unsqueeze(-2)


class Squeeze(nn.Module):
    """d_v = 1: the sublayer input is the state itself."""

    def forward(self, X: Tensor) -> Tensor:
        return X.squeeze(-2)


class Repeat(nn.Module):
    """Expansion "repeat" (the paper's "w/o EC"): ``X_0 = x_emb 1ᵀ``, ``(B, T, d_v, d)``."""

    def __init__(self, value_channels: int) -> None:
        super().__init__()
        self.value_channels = value_channels

    def forward(self, x: Tensor) -> Tensor:
        return x.unsqueeze(-2).expand(*x.shape[:-1], self.value_channels, x.shape[-1])


class ConvExpansion(nn.Module):
    """Expansion "conv" (EC): a causal depthwise convolution over tokens maps each embedding
    coordinate to d_v channels (to itself at d_v = 1: EC without the expanded state),
    ``(B, T, d) → (B, T, d_v, d)``. Identity-initialised, so it starts as repetition."""

    def __init__(self, width: int, value_channels: int, kernel_size: int) -> None:
        super().__init__()
        self.value_channels = value_channels
        self.conv = CausalConv(width, kernel_size, outputs=value_channels)

    def forward(self, x: Tensor) -> Tensor:
        return cast(Tensor, self.conv(x))


def _compressor_weight(shape: tuple[int, ...], width: int, init: str) -> Tensor:
    """A compressor's matrix: the mean of the d_v channels (``"mean"``: every d_v > 1 variant
    whose expansion repeats the embedding then starts from the function of its d_v = 1
    counterpart) or, as the authors' code draws it, N(0, 0.25/d) (``"random"``)."""
    if init == "mean":
        return torch.full(shape, 1.0 / shape[-1])
    return torch.randn(shape) * (0.5 / math.sqrt(width))


class ChannelCompressor(Relaid):
    """Compressor "channel" (CC): ``x_in_i = Σ_j c_ij X_ij``, per-coordinate mixing of the d_v
    channels of the current token only. The mixing weights are held as the state is, channels
    first: ``mix`` is ``(d_v, d)`` (version 1: ``(d, d_v)``), drawn as ``(d, d_v)`` and
    transposed."""

    relaid_key = "mix.weight"

    def __init__(self, width: int, value_channels: int, init: str) -> None:
        super().__init__()
        self.mix = Scale(_compressor_weight((width, value_channels), width, init).mT.contiguous())

    def forward(self, X: Tensor) -> Tensor:
        """``(B, T, d_v, d) → (B, T, d)``: a product and a sum over the d_v channels, each
        along d (in a folded ensemble, whose ``mix`` holds one ``(d_v, d)`` per member, on
        each member's rows), which inductor fuses into one loop over d. In the state's dtype
        (promoted with the weights'), autocast or not."""
        mix: Tensor = self.mix.weight
        dtype = torch.promote_types(X.dtype, mix.dtype)
        folded = mix.dim() == 3
        rows, mix = members_first(mix, X) if folded else (X, mix)
        rows, mix = rows.to(dtype), mix.to(dtype)
        x_in = rows[..., 0, :] * mix[..., 0, :]
        for j in range(1, rows.shape[-2]):
            x_in = x_in + rows[..., j, :] * mix[..., j, :]
        return x_in.flatten(0, 1) if folded else x_in

    def relay(self, saved: Tensor) -> Tensor:
        return saved.mT


class TokenCompressor(nn.Module):
    """Compressor "token" (TC): a causal depthwise convolution over tokens on each of the
    d·d_v state entries, then a learned read vector (initialised to the mean) pools the d_v
    channels. The convolution starts at the current token alone (``"mean"``) or drawn
    N(0, 0.25/d) over its taps (``"random"``)."""

    def __init__(self, width: int, value_channels: int, kernel_size: int, init: str) -> None:
        super().__init__()
        self.conv = CausalConv(width * value_channels, kernel_size)  # entries (i, j) as i·d_v + j
        if init == "random":  # drawn in conv1d's (d·d_v, 1, K) order
            with torch.no_grad():
                drawn = _compressor_weight((width * value_channels, 1, kernel_size), width, init)
                self.conv.weight.copy_(drawn.permute(2, 1, 0))
        self.read = Scale(torch.full((value_channels,), 1.0 / value_channels))

    def forward(self, X: Tensor) -> Tensor:
        entries = X.mT.flatten(-2)  # (B, T, d·d_v), entry (i, j) at i·d_v + j
        mixed = self.conv(entries).view(*X.shape[:-2], X.shape[-1], X.shape[-2])  # (B, T, d, d_v)
        return self.read(mixed).sum(-1)


def expansion_layer(kind: str, width: int, value_channels: int, kernel_size: int) -> nn.Module:
    """The expansion ``kind`` (`EXPANSIONS`) of the embedding into the state."""
    if kind == "conv":
        return ConvExpansion(width, value_channels, kernel_size)
    return Repeat(value_channels) if value_channels > 1 else Unsqueeze()


def compressor_layer(
    kind: str, width: int, value_channels: int, kernel_size: int, init: str
) -> nn.Module:
    """A compressor ``kind`` (`COMPRESSORS`) of the state to a sublayer's input, started as
    ``init`` says (`COMPRESSOR_INITS`); at d_v = 1 the input is the state itself."""
    if value_channels == 1:
        return Squeeze()
    if kind == "channel":
        return ChannelCompressor(width, value_channels, init)
    return TokenCompressor(width, value_channels, kernel_size, init)
