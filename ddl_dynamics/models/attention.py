"""Multi-head causal self-attention with rotary position embeddings (RoPE), and the form
in which short sequences attend under ``torch.compile`` on the CPU.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import check_int
from .base import members_first


@functools.lru_cache(maxsize=64)
@torch.compiler.assume_constant_result
def rope_tables(
    length: int, head_dim: int, base: float, device: torch.device, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """RoPE's ``cos`` and signed ``sin`` per token and coordinate, ``(T, head_dim)`` each, such
    that `rotary` is ``x · cos + swap(x) · sin``; built once per length and kept, since a
    training step would otherwise rebuild them in every attention layer. Never inference
    tensors, which a later training step could not save for its backward. Under
    ``torch.compile`` they are the graph's constants, which its kernels read, where traced
    they would be recomputed from ``cos``/``sin`` in every kernel that reads them."""
    with torch.inference_mode(False):
        freq = base ** (
            -torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim
        )
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
    if torch.compiler.is_compiling() and q.device.type == "cpu" and q.shape[-2] <= SHORT_ATTENTION:
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


def head_size(width: int, heads: int, head_dim: int | None) -> int:
    """The size of a head, ``head_dim`` or else ``width // heads`` (which must then divide
    evenly), checked to be even: RoPE turns pairs of coordinates."""
    if head_dim is None and width % heads:
        raise ValueError(f"width {width} is not divisible by heads={heads}; set head_dim")
    head_dim = check_int("head_dim", width // heads if head_dim is None else head_dim, 2)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for RoPE, got {head_dim}")
    return head_dim


class Attention(nn.Module):
    """Multi-head causal self-attention with RoPE: ``(B, T, d) → (B, T, outputs)`` (default
    ``outputs = d``; a Householder-product block reads one direction per update from a wider
    output projection). With ``qk_norm``, each head's queries and keys pass an RMSNorm with a
    learned gain (shared by the heads) after RoPE, as in the authors' released attention."""

    def __init__(
        self,
        width: int,
        heads: int,
        head_dim: int,
        rope_base: float,
        qk_norm: bool,
        eps: float | None,
        outputs: int | None = None,
    ) -> None:
        super().__init__()
        self.heads, self.head_dim, self.rope_base = heads, head_dim, rope_base
        self.qkv = nn.Linear(width, 3 * heads * head_dim, bias=False)
        self.out = nn.Linear(heads * head_dim, width if outputs is None else outputs, bias=False)
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
