"""Transformers over token sequences: the additive baseline, the Deep Delta Learning block and
its matched controls, in one nanoGPT-style file.

Every variant is the same backbone — token embedding, pre-norm RMSNorm, multi-head causal
attention with RoPE, SwiGLU MLP, final RMSNorm, LM head tied to the embedding — and differs
only in how each sublayer's output ``h`` is written into the residual state of its token:

    transformer              X ← X + h wᵀ                  additive (w = 1 when d_v = 1)
    ddl-transformer          X ← X + β k (vᵀ − kᵀX)         k = h / sqrt(‖h‖² + ε²)
    ddl-write-transformer    X ← X + β k vᵀ                  the same, without the erase term

The state of a token is ``X ∈ R^{d×d_v}``, held channels first, ``(B, T, d_v, d)``: each value
channel a contiguous d-vector, so that the passes over the state (expansion, compression,
residual updates) run along d rather than along the few channels of a coordinate (inductor's
loops on the CPU vectorise along the last axis); the Delta update reads it as ``X.mT``,
``(B, T, d, d_v)``. With ``value_channels`` d_v > 1 the layers follow Compress–Process–Rewrite:
the embedding is expanded into d_v channels (``expansion``), every block compresses X to the
width-d input of its two sublayers (``compressor``), and a last compressor reads X out before
the final norm. ``transformer`` with d_v > 1 is therefore the additive expanded-state
control: the expansion and compression of DDL, with a residual add.

Per sublayer: ``x_in = compress(X)``, ``c = RMSNorm(x_in)``, ``h = sublayer(c)``. The Delta
generators follow the authors' released code (the *k-Map* layout): ``k̃ = h``;
``β = β_max σ(Linear(c))`` in at least float32 (``beta_max`` = 2 by default: reflections
allowed; 1: none), bias initialised so that ``β = beta_init`` for
``c = 0``; ``v = 4σ(Linear(x_in))`` read from the (compressed) residual stream. The *v-Map*
layout swaps the roles: ``v = 4σ(Linear(h))`` from the sublayer output and ``k̃ = Linear(c)``
from a light branch on the context. The update is
`delta_update` (or ``write_update``), whose readout
``kᵀX`` accumulates in float32.

Three options reproduce the released block where this file's defaults differ: ``qk_norm``
(RMSNorm with a learned gain on every head's queries and keys, after RoPE), ``norm_eps =
1e-5`` (every RMSNorm's eps; by default torch's, the dtype's machine epsilon) and
``compressor_init = "random"`` (the compressors' matrices drawn N(0, 0.25/d) instead of
starting as the channel mean).

Every parameter sits in a layer that `ensemble` can fold (``nn.Linear``,
``nn.Embedding``, ``nn.RMSNorm`` and the leaves below: `CausalConv`,
`Scale`, `FloatLinear`, whose twins this file registers), so a row's seeds train
as one ensemble.
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils import flop_counter

from .._checks import check_choice, check_int
from .base import members_first, register_model
from .delta import DeltaProbe
from .ensemble import EnsembleLinear, ensemble_linear, register_twin, stacked_weight
from .operator import delta_update, gate, gate_logit, normalize_direction, write_update

EXPANSIONS = ("conv", "repeat")
COMPRESSORS = ("channel", "token")
COMPRESSOR_INITS = ("mean", "random")
VALUE_MAPS = ("sigmoid", "linear", "constant")
VALUE_INPUTS = ("stream", "context")
GENERATORS = ("k-map", "v-map")

Update = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


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
        return cast(Tensor, sum(padded[:, :, j : j + T, None, :] * taps[:, :, j, None]
                                for j in range(K)))
    windows = padded.unfold(2, K, 1)  # (S, B, T, C, K)
    return torch.einsum("sbtck,skrc->sbtrc", windows, weight)


def at_least_float32(*tensors: Tensor) -> torch.dtype:
    """The widest dtype of ``tensors`` and float32: where gate logits are computed."""
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


# --- the leaves that hold parameters besides nn.Linear, nn.Embedding and nn.RMSNorm


class _Relaid(nn.Module, ABC):
    """A layer that holds one tensor, ``relaid_key`` of its state dict, laid out channels first
    since version 2; on loading a state dict of version 1 (0.1's layout, whose state dicts
    carry no versions) `relay` converts it."""

    _version = 2
    relaid_key: ClassVar[str]

    @abstractmethod
    def relay(self, saved: Tensor) -> Tensor:
        """The tensor ``saved`` under version 1, in today's layout."""

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str,
                              local_metadata: dict[str, Any], *args: Any) -> None:
        key = prefix + self.relaid_key
        if (local_metadata.get("version") or 1) < 2 and key in state_dict:
            state_dict[key] = self.relay(state_dict[key])
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args)


class CausalConv(_Relaid):
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


@functools.lru_cache(maxsize=64)
@torch.compiler.assume_constant_result
def rope_tables(length: int, head_dim: int, base: float, device: torch.device,
                dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """RoPE's ``cos`` and signed ``sin`` per token and coordinate, ``(T, head_dim)`` each, such
    that `rotary` is ``x · cos + swap(x) · sin``; built once per length and kept, since a
    training step would otherwise rebuild them in every attention layer. Never inference
    tensors, which a later training step could not save for its backward. Under
    ``torch.compile`` they are the graph's constants, which its kernels read, where traced
    they would be recomputed from ``cos``/``sin`` in every kernel that reads them."""
    with torch.inference_mode(False):
        freq = base ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32)
                        / head_dim)
        angle = torch.arange(length, device=device, dtype=torch.float32)[:, None] * freq
        cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)  # (T, hd/2)
        return torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)


def _swap_halves(x: Tensor) -> Tensor:
    """``(x_{hd/2…}, x_{…hd/2})``: each coordinate's partner under RoPE, in its place. As two
    halves side by side rather than a roll, whose modular index inductor's loops gather
    element by element; the halves are contiguous reads."""
    half = x.shape[-1] // 2
    return torch.cat([x[..., half:], x[..., :half]], dim=-1)


def rotary(x: Tensor, base: float) -> Tensor:
    """RoPE on ``(B, H, T, head_dim)``: rotate the pairs ``(x_i, x_{i + hd/2})`` of token ``t``
    by the angle ``t · base^(−2i/hd)``, so that ``qᵀk`` depends on relative positions only."""
    cos, sin = rope_tables(x.shape[-2], x.shape[-1], base, x.device, x.dtype)
    return x * cos + _swap_halves(x) * sin


def _count_cpu_attention_flops() -> None:
    """``FlopCounterMode`` counts the CUDA attention kernels but not the CPU one, which would
    leave attention out of the FLOPs of a CPU run: count it with the same formulas."""
    aten = torch.ops.aten
    forward = aten._scaled_dot_product_flash_attention_for_cpu
    backward = aten._scaled_dot_product_flash_attention_for_cpu_backward
    if forward in flop_counter.flop_registry:
        return

    def forward_flops(q: Any, k: Any, v: Any, *args: Any, **kwargs: Any) -> int:
        return flop_counter.sdpa_flop_count(q, k, v)

    def backward_flops(grad: Any, q: Any, k: Any, v: Any, *args: Any, **kwargs: Any) -> int:
        return flop_counter.sdpa_backward_flop_count(grad, q, k, v)

    flop_counter.register_flop_formula(forward)(forward_flops)
    flop_counter.register_flop_formula(backward)(backward_flops)


_count_cpu_attention_flops()


#: The longest sequence that attends, under ``torch.compile`` on the CPU, by broadcast
#: products (`causal_attention`).
SHORT_ATTENTION = 16


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal softmax attention over ``(B, H, T, hd)`` queries, keys and values.

    Under ``torch.compile`` on the CPU, a sequence of at most `SHORT_ATTENTION` tokens
    attends by `broadcast_attention`, which inductor fuses into a few loops: for
    thousands of 10-token sequences the flash kernel's per-tile work costs more than the
    arithmetic (forward and backward about 1.5x slower at T = 10, faster from T = 32).
    Eagerly, where the broadcast would be materialised, and on CUDA, the fused kernel."""
    if (torch.compiler.is_compiling() and q.device.type == "cpu"
            and q.shape[-2] <= SHORT_ATTENTION):
        return broadcast_attention(q, k, v)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def broadcast_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """`causal_attention` written as products and sums over broadcast axes, with no
    matmul: the form inductor fuses for short sequences."""
    scores = (q.unsqueeze(-2) * k.unsqueeze(-3)).sum(-1) / math.sqrt(q.shape[-1])
    return (causal_softmax(scores).unsqueeze(-1) * v.unsqueeze(-3)).sum(-2)


def causal_softmax(scores: Tensor) -> Tensor:
    """Attention probabilities from ``(…, T, T)`` scores, query × key: each query's softmax
    over the keys at or before it."""
    T = scores.shape[-1]
    future = torch.ones(T, T, dtype=torch.bool, device=scores.device).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(-1)


class _Attention(nn.Module):
    """Multi-head causal self-attention with RoPE: ``(B, T, d) → (B, T, d)``. With
    ``qk_norm``, each head's queries and keys pass an RMSNorm with a learned gain (shared by
    the heads) after RoPE, as in the authors' released attention."""

    def __init__(self, width: int, heads: int, head_dim: int, rope_base: float,
                 qk_norm: bool, eps: float | None) -> None:
        super().__init__()
        self.heads, self.head_dim, self.rope_base = heads, head_dim, rope_base
        self.qkv = nn.Linear(width, 3 * heads * head_dim, bias=False)
        self.out = nn.Linear(heads * head_dim, width, bias=False)
        self.q_norm = nn.RMSNorm(head_dim, eps=eps) if qk_norm else None
        self.k_norm = nn.RMSNorm(head_dim, eps=eps) if qk_norm else None

    def heads_of(self, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries and keys (rotated, normalised with ``qk_norm``) and values of ``c``, each
        ``(B, H, T, hd)``.

        Queries and keys are rotated together, in the projection's own layout, and with
        ``qk_norm`` normalised before the rotation (which keeps norms) and their gains folded
        into RoPE's tables: a handful of passes over them where one per head tensor and op
        would take several times as many."""
        B, T, _ = c.shape
        qkv = self.qkv(c).view(B, T, 3, self.heads, self.head_dim)
        cos, sin = rope_tables(T, self.head_dim, self.rope_base, c.device, qkv.dtype)
        cos, sin = cos[:, None, None], sin[:, None, None]  # (T, 1, 1, hd): against (B, T, 2, H, hd)
        qk = qkv[:, :, :2]
        if self.q_norm is None or self.k_norm is None:  # (both or neither: qk_norm)
            qk = qk * cos + _swap_halves(qk) * sin
        else:
            qk = F.rms_norm(qk, (self.head_dim,), eps=self.q_norm.eps)
            gains = torch.stack([self.q_norm.weight, self.k_norm.weight], dim=-2).unsqueeze(-2)
            if gains.dim() == 4:  # a folded ensemble: one (2, 1, hd) pair of gains per member
                qk, gains = members_first(gains, qk)
            qk = (qk * (gains * cos) + _swap_halves(qk) * (gains * sin)).flatten(0, -5)
        q, k = qk.unbind(2)
        return q.transpose(1, 2), k.transpose(1, 2), qkv[:, :, 2].transpose(1, 2)

    def forward(self, c: Tensor) -> Tensor:
        B, T, _ = c.shape
        y = causal_attention(*self.heads_of(c))  # (B, H, T, hd)
        return self.out(y.transpose(1, 2).reshape(B, T, self.heads * self.head_dim))

    def weights(self, c: Tensor) -> Tensor:
        """The attention probabilities ``(B, H, T, T)``: query token × key token."""
        q, k, _ = self.heads_of(c)
        return causal_softmax(q @ k.mT / math.sqrt(self.head_dim))


class _SwiGLU(nn.Module):
    """``W_out (silu(W_gate c) ⊙ W_up c)``: ``(B, T, d) → (B, T, d)`` through ``hidden``."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(width, hidden, bias=False)
        self.up = nn.Linear(width, hidden, bias=False)
        self.out = nn.Linear(hidden, width, bias=False)

    def forward(self, c: Tensor) -> Tensor:
        return self.out(F.silu(self.gate(c)) * self.up(c))


# --- the residual state: expansion (embedding → X) and compression (X → width-d input)


class _Unsqueeze(nn.Module):
    """d_v = 1: the state is the embedding with one value channel, ``(B, T, 1, d)``."""

    def forward(self, x: Tensor) -> Tensor:
        return x.unsqueeze(-2)


class _Squeeze(nn.Module):
    """d_v = 1: the sublayer input is the state itself."""

    def forward(self, X: Tensor) -> Tensor:
        return X.squeeze(-2)


class _Repeat(nn.Module):
    """Expansion "repeat" (the paper's "w/o EC"): ``X_0 = x_emb 1ᵀ``, ``(B, T, d_v, d)``."""

    def __init__(self, value_channels: int) -> None:
        super().__init__()
        self.value_channels = value_channels

    def forward(self, x: Tensor) -> Tensor:
        return x.unsqueeze(-2).expand(*x.shape[:-1], self.value_channels, x.shape[-1])


class _ConvExpansion(nn.Module):
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


class _ChannelCompressor(_Relaid):
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


class _TokenCompressor(nn.Module):
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


# --- residual updates: how a sublayer's output h enters the state


class _AddResidual(_Relaid):
    """``X + h wᵀ``: the additive residual. With d_v > 1, ``w`` is a learned write vector over
    the value channels (initialised to 1, so the channels can diverge), held ``(d_v, 1)`` as
    the state is, channels first (version 1: ``(d_v,)``); with d_v = 1, ``x + h``."""

    relaid_key = "write.weight"

    def __init__(self, value_channels: int) -> None:
        super().__init__()
        self.write = Scale(torch.ones(value_channels, 1)) if value_channels > 1 else None

    def forward(self, X: Tensor, x_in: Tensor, c: Tensor, h: Tensor) -> Tensor:
        h = h.unsqueeze(-2)  # (B, T, 1, d)
        return X + (h if self.write is None else self.write(h))

    def relay(self, saved: Tensor) -> Tensor:
        return saved.unsqueeze(-1)


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
    """

    generator: str = "k-map"
    beta_init: float = 1.0
    beta_hidden: int = 0
    value: str = "sigmoid"
    value_scale: float = 4.0
    value_input: str = "stream"
    beta_max: float = 2.0

    def __post_init__(self) -> None:
        check_choice("generator", self.generator, GENERATORS)
        if not 0.0 < self.beta_max <= 2.0:
            raise ValueError(f"beta_max must lie in (0, 2], got {self.beta_max!r}")
        gate_logit(self.beta_init, self.beta_max)  # raises unless 0 < beta_init < beta_max
        check_int("beta_hidden", self.beta_hidden, 0)
        check_choice("value", self.value, VALUE_MAPS)
        check_choice("value_input", self.value_input, VALUE_INPUTS)
        if not math.isfinite(self.value_scale) or self.value_scale <= 0:
            raise ValueError(f"value_scale must be positive, got {self.value_scale!r}")
        if self.generator == "v-map" and (self.value == "constant"
                                          or self.value_input != "stream"):
            raise ValueError("v-map reads v from the sublayer output: value = 'constant' and "
                             "value_input apply to the k-map layout only")


class _DeltaResidual(nn.Module):
    """``update(X, k, v, β)`` with ``k = k̃ / sqrt(‖k̃‖² + ε²)`` and ``k̃``, ``v``, ``β`` as
    `Generators` lays them out."""

    def __init__(self, update: Update, width: int, value_channels: int, spec: Generators) -> None:
        super().__init__()
        self.update, self.spec = update, spec
        if spec.beta_hidden:
            self.gate = nn.Sequential(FloatLinear(width, spec.beta_hidden, bias=False),
                                      nn.Tanh(), FloatLinear(spec.beta_hidden, 1))
        else:
            self.gate = nn.Sequential(FloatLinear(width, 1))
        with torch.no_grad():
            cast(FloatLinear, self.gate[-1]).bias.fill_(gate_logit(spec.beta_init, spec.beta_max))
        self.value = None if spec.value == "constant" else nn.Linear(width, value_channels)
        self.direction = nn.Linear(width, width, bias=False) if spec.generator == "v-map" else None
        self.value_channels = value_channels

    def generators(self, x_in: Tensor, c: Tensor, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Direction ``k̃`` ``(B, T, d)``, target ``v`` ``(B, T, d_v)`` and gate ``β``
        ``(B, T)``, the gate in at least float32."""
        beta = gate(self.gate(c).squeeze(-1), self.spec.beta_max)
        if self.direction is not None:  # v-map
            if self.value is None:
                raise ValueError("v-map reads v from the sublayer output: not a constant value")
            k_raw, v = self.direction(c), self.value(h)
        elif self.value is None:
            k_raw, v = h, c.new_full((*c.shape[:-1], self.value_channels),
                                     self.spec.value_scale / 2)
        else:
            k_raw, v = h, self.value(x_in if self.spec.value_input == "stream" else c)
        if self.spec.value == "sigmoid":
            v = self.spec.value_scale * torch.sigmoid(v)
        return k_raw, v, beta

    def forward(self, X: Tensor, x_in: Tensor, c: Tensor, h: Tensor) -> Tensor:
        k_raw, v, beta = self.generators(x_in, c, h)  # β stays wide: the operator never rounds it
        return self.update(X.mT, normalize_direction(k_raw), v, beta).mT  # on (B, T, d, d_v)


class Sublayer(NamedTuple):
    """One sublayer's pass over the state: the sublayer and its residual update, the state
    before (``(B, T, d_v, d)``, channels first), the sublayer's input ``x_in``, context ``c`` and
    output ``h``, the state after."""

    sublayer: nn.Module
    residual: nn.Module
    before: Tensor
    x_in: Tensor
    c: Tensor
    h: Tensor
    after: Tensor


class _Block(nn.Module):
    """Attention, then MLP; each: compress → RMSNorm → sublayer → residual update."""

    def __init__(self, compress: nn.Module, sublayers: tuple[nn.Module, nn.Module],
                 residuals: tuple[nn.Module, nn.Module], width: int, eps: float | None) -> None:
        super().__init__()
        self.compress = compress  # one compressor serves both sublayers of the block
        self.norms = nn.ModuleList([nn.RMSNorm(width, eps=eps), nn.RMSNorm(width, eps=eps)])
        self.sublayers = nn.ModuleList(sublayers)
        self.residuals = nn.ModuleList(residuals)

    def process(self, i: int, X: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Sublayer ``i`` on the state ``X``: its input ``x_in``, context ``c`` and output ``h``,
        each ``(B, T, d)``."""
        x_in = self.compress(X)
        c = self.norms[i](x_in)
        return x_in, c, self.sublayers[i](c)

    def forward(self, X: Tensor) -> Tensor:  # (B, T, d_v, d) → (B, T, d_v, d)
        for i, residual in enumerate(self.residuals):
            X = residual(X, *self.process(i, X))
        return X


@register_model("transformer")
class Transformer(nn.Module):
    """Pre-norm Transformer (RoPE attention, SwiGLU), additive residual x + F(x); with
    value_channels > 1, the additive expanded-state control.

    Built as ``make_model(name, in_dim=vocabulary, out_dim=classes, **options)`` and called as
    ``model(tokens (B, T), per_step=True)`` → logits ``(B, T, out_dim)`` (``per_step=False``:
    the last token's, ``(B, out_dim)``). RoPE lets it run sequences of any length. The LM head
    is tied to the embedding when ``out_dim == in_dim``.

    Args:
        width: model width d. depth: number of blocks (each attention + MLP).
        heads: attention heads. head_dim: size of a head (default ``width // heads``).
        hidden: SwiGLU hidden size (default ``⌊8·width/3⌋``); parameter matching sizes it.
        value_channels: d_v, value channels of the residual state.
        expansion: ``"conv"`` (EC, an identity-initialised causal convolution of the
            embedding over tokens) or ``"repeat"`` (none); default ``"conv"`` for d_v > 1 and
            ``"repeat"`` for d_v = 1, where ``"conv"`` is EC without the expanded state.
        compressor: d_v > 1: ``"channel"`` (CC) or ``"token"`` (TC).
        compressor_init: d_v > 1: ``"mean"`` or ``"random"`` (the released code's).
        kernel_size: token-axis kernel of the EC expansion and the TC compressor.
        rope_base: RoPE frequency base.
        qk_norm: RMSNorm on each head's queries and keys (the released attention).
        norm_eps: eps of every RMSNorm (None: torch's default; the released code's: 1e-5).
    """

    kind: ClassVar[str] = "sequence"
    can_extrapolate: ClassVar[bool] = True  # RoPE: any sequence length

    def __init__(
        self,
        *,
        in_dim: int,
        out_dim: int,
        control_dim: int = 0,
        width: int = 64,
        depth: int = 2,
        heads: int = 4,
        head_dim: int | None = None,
        hidden: int | None = None,
        value_channels: int = 1,
        expansion: str | None = None,
        compressor: str = "channel",
        compressor_init: str = "mean",
        kernel_size: int = 4,
        rope_base: float = 10000.0,
        qk_norm: bool = False,
        norm_eps: float | None = None,
    ) -> None:
        super().__init__()
        self.in_dim = check_int("in_dim (vocabulary size)", in_dim, 1)
        self.out_dim = check_int("out_dim", out_dim, 1)
        if control_dim:
            raise ValueError(f"{type(self).__name__} takes no per-step controls (control_dim "
                             f"must be 0, got {control_dim!r})")
        self.width = check_int("width", width, 1)
        self.depth = check_int("depth", depth, 1)
        heads = check_int("heads", heads, 1)
        if head_dim is None and width % heads:
            raise ValueError(f"width {width} is not divisible by heads={heads}; set head_dim")
        head_dim = check_int("head_dim", width // heads if head_dim is None else head_dim, 2)
        if head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {head_dim}")
        self.hidden = check_int("hidden", 8 * width // 3 if hidden is None else hidden, 1)
        self.value_channels = d_v = check_int("value_channels", value_channels, 1)
        if expansion is None:
            expansion = "conv" if d_v > 1 else "repeat"
        check_choice("expansion", expansion, EXPANSIONS)
        check_choice("compressor", compressor, COMPRESSORS)
        check_choice("compressor_init", compressor_init, COMPRESSOR_INITS)
        kernel_size = check_int("kernel_size", kernel_size, 1)
        if not rope_base > 1:
            raise ValueError(f"rope_base must be > 1, got {rope_base!r}")
        if norm_eps is not None and not (math.isfinite(norm_eps) and norm_eps > 0):
            raise ValueError(f"norm_eps must be positive, got {norm_eps!r}")

        def compress() -> nn.Module:
            if d_v == 1:
                return _Squeeze()
            if compressor == "channel":
                return _ChannelCompressor(width, d_v, compressor_init)
            return _TokenCompressor(width, d_v, kernel_size, compressor_init)

        self.embed = nn.Embedding(in_dim, width)
        if expansion == "conv":
            self.expand: nn.Module = _ConvExpansion(width, d_v, kernel_size)
        else:
            self.expand = _Repeat(d_v) if d_v > 1 else _Unsqueeze()
        self.blocks = nn.ModuleList(
            _Block(compress(),
                   (_Attention(width, heads, head_dim, rope_base, qk_norm, norm_eps),
                    _SwiGLU(width, self.hidden)),
                   (self.residual(), self.residual()), width, norm_eps)
            for _ in range(depth)
        )
        self.readout = compress()
        self.norm = nn.RMSNorm(width, eps=norm_eps)
        self.head = nn.Linear(width, out_dim, bias=False)
        self._init_weights()
        if out_dim == in_dim:
            self.head.weight = self.embed.weight

    def residual(self) -> nn.Module:
        """A fresh residual update for one sublayer; the Delta families override it."""
        return _AddResidual(self.value_channels)

    def _init_weights(self) -> None:
        """As the authors' code: embedding and head N(0, 0.02²); other matrices N(0, 0.25/d),
        the sublayers' output projections further scaled by 1/√depth."""
        std = 0.5 / math.sqrt(self.width)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    module.weight.normal_(0.0, std)
            for block in cast("Iterable[_Block]", self.blocks):
                for sublayer in block.sublayers:
                    cast(nn.Linear, sublayer.out).weight.normal_(0.0, std / math.sqrt(self.depth))
            self.embed.weight.normal_(0.0, 0.02)
            self.head.weight.normal_(0.0, 0.02)

    def forward(self, tokens: Tensor, u: Tensor | None = None, steps: int | None = None,
                per_step: bool = True) -> Tensor:
        """Logits at every position ``(B, T, out_dim)``, or at the last one (``per_step=False``)."""
        X = self.state(tokens, u, steps)
        for block in cast("Iterable[_Block]", self.blocks):
            X = block(X)
        logits = self.head(self.norm(self.readout(X)))  # (B, T, out_dim)
        return logits if per_step else logits[:, -1]

    def passes(self, tokens: Tensor) -> Iterator[Sublayer]:
        """Every sublayer's pass over the state of ``tokens``, in order (attention, MLP,
        attention, …): what the probes read."""
        X = self.state(tokens)
        for block in cast("Iterable[_Block]", self.blocks):
            for i, residual in enumerate(block.residuals):
                x_in, c, h = block.process(i, X)
                after = residual(X, x_in, c, h)
                yield Sublayer(block.sublayers[i], residual, X, x_in, c, h, after)
                X = after

    @torch.no_grad()
    def looks(self, tokens: Tensor) -> Tensor:
        """Where every head of every block's attention looks from each token: the key
        position it weighs most, ``(B, T, depth, heads)``."""
        return torch.stack([p.sublayer.weights(p.c).argmax(-1).transpose(1, 2)
                            for p in self.passes(tokens) if isinstance(p.sublayer, _Attention)],
                           dim=2)

    def state(self, tokens: Tensor, u: Tensor | None = None, steps: int | None = None) -> Tensor:
        """The initial residual state ``(B, T, d_v, d)`` of ``tokens`` (checked), channels first."""
        name = type(self).__name__
        if tokens.dim() != 2 or tokens.is_floating_point():
            raise ValueError(f"{name}: tokens must be integer ids of shape (batch, length), got "
                             f"{tuple(tokens.shape)} {tokens.dtype}")
        if u is not None:
            raise ValueError(f"{name} takes no per-step controls u")
        if steps is not None and steps != tokens.shape[1]:
            raise ValueError(f"{name}: steps={steps} differs from the sequence length "
                             f"{tokens.shape[1]}")
        return self.expand(self.embed(tokens))


class _DeltaTransformer(Transformer):
    """Shared body of ``ddl-transformer`` and ``ddl-write-transformer``: they differ only in
    `update`. Options are those of `Transformer` and `Generators`."""

    update: ClassVar[staticmethod[[Tensor, Tensor, Tensor, Tensor], Tensor]]

    def __init__(self, *, generator: str = "k-map", beta_init: float = 1.0, beta_hidden: int = 0,
                 value: str = "sigmoid", value_scale: float = 4.0, value_input: str = "stream",
                 beta_max: float = 2.0, **common: object) -> None:
        # set before the base builds the blocks: residual() reads it
        self.spec = Generators(generator, float(beta_init), beta_hidden, value,
                               float(value_scale), value_input, float(beta_max))
        super().__init__(**common)  # type: ignore[arg-type]

    def residual(self) -> nn.Module:
        return _DeltaResidual(type(self).update, self.width, self.value_channels, self.spec)

    @torch.no_grad()
    def probe(self, tokens: Tensor) -> DeltaProbe:
        """What every Delta sublayer did to every token, as a `DeltaProbe` whose
        arrays are ``(B, T, S, ·)`` for ``S = 2 · depth`` sublayers (attention, MLP, attention,
        …): gate β, ‖k̃‖, direction k, target v, and the readout ``kᵀX`` before the update with
        the discrepancies ``e = kᵀX − v`` before and after it."""
        layers = []
        for p in self.passes(tokens):
            k_raw, v, beta = cast(_DeltaResidual, p.residual).generators(p.x_in, p.c, p.h)
            k = normalize_direction(k_raw).to(p.before.dtype)
            layers.append((beta, k_raw, k, v, p.before.mT, p.after.mT))
        return DeltaProbe.of_layers(layers, dim=2)


@register_model("ddl-transformer")
class DeltaTransformer(_DeltaTransformer):
    """Deep Delta Learning Transformer: each residual add replaced by X + βk(vᵀ − kᵀX)."""

    update = staticmethod(delta_update)


@register_model("ddl-write-transformer")
class DeltaWriteTransformer(_DeltaTransformer):
    """Write-only control of ddl-transformer: the same generators and state, X + βkvᵀ."""

    update = staticmethod(write_update)
