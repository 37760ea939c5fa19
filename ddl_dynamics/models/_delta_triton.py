"""The Delta update as Triton kernels: one program per state row ``(d, d_v)``.

Used on CUDA tensors; with ``TRITON_INTERPRET=1`` (set before this module is imported)
Triton interprets the same kernels on CPU tensors, which is how the tests check them.
Each row is read in chunks of ``BLOCK_D × BLOCK_V``: a first sweep accumulates the
readouts, a second writes the outputs. Accumulation is in float32 (float64 for float64
states) whatever the storage dtype of each input; outputs are stored in their own dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .delta_layout import contiguous

#: Elements of one chunk of a row held at once by a program.
CHUNK = 4096


@triton.jit
def _chunk(r, start, d, dv, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr):
    """Rows ``start …`` of state ``r``: their indices, the mask of the ``(BLOCK_D, BLOCK_V)``
    tile, and its element offsets into ``(n, d, d_v)``."""
    rows = start + tl.arange(0, BLOCK_D)
    cols = tl.arange(0, BLOCK_V)
    mask = (rows < d)[:, None] & (cols < dv)[None, :]
    return rows, mask, r * d * dv + rows[:, None] * dv + cols[None, :]


@triton.jit
def _forward_kernel(
    X,
    K,
    V,
    B,
    Y,
    d,
    dv,
    ERASE: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """``Y = X + k cᵀ``, ``c = β (v − kᵀX)`` (``c = β v`` write-only), for row ``program_id``."""
    r = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_V)
    readout = tl.zeros([BLOCK_V], dtype=ACC)
    if ERASE:
        for start in range(0, d, BLOCK_D):
            rows, mask, offsets = _chunk(r, start, d, dv, BLOCK_D, BLOCK_V)
            k = tl.load(K + r * d + rows, mask=rows < d, other=0).to(ACC)
            x = tl.load(X + offsets, mask=mask, other=0).to(ACC)
            readout += tl.sum(k[:, None] * x, axis=0)
    v = tl.load(V + r * dv + cols, mask=cols < dv, other=0).to(ACC)
    c = tl.load(B + r).to(ACC) * (v - readout)
    for start in range(0, d, BLOCK_D):
        rows, mask, offsets = _chunk(r, start, d, dv, BLOCK_D, BLOCK_V)
        k = tl.load(K + r * d + rows, mask=rows < d, other=0).to(ACC)
        x = tl.load(X + offsets, mask=mask, other=0).to(ACC)
        y = x + k[:, None] * c[None, :]
        tl.store(Y + offsets, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _backward_kernel(
    G,
    X,
    K,
    V,
    B,
    DX,
    DK,
    DV,
    DB,
    d,
    dv,
    ERASE: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """With ``g = kᵀG``, ``e = v − kᵀX``, ``c = β e``: ``dX = G − β k gᵀ``,
    ``dk = G c − β X g``, ``dv = β g``, ``dβ = eᵀg`` (the β-terms of dX, dk: erase only)."""
    r = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_V)
    g = tl.zeros([BLOCK_V], dtype=ACC)
    readout = tl.zeros([BLOCK_V], dtype=ACC)
    for start in range(0, d, BLOCK_D):
        rows, mask, offsets = _chunk(r, start, d, dv, BLOCK_D, BLOCK_V)
        k = tl.load(K + r * d + rows, mask=rows < d, other=0).to(ACC)
        g += tl.sum(k[:, None] * tl.load(G + offsets, mask=mask, other=0).to(ACC), axis=0)
        if ERASE:
            readout += tl.sum(k[:, None] * tl.load(X + offsets, mask=mask, other=0).to(ACC), 0)
    beta = tl.load(B + r).to(ACC)
    e = tl.load(V + r * dv + cols, mask=cols < dv, other=0).to(ACC) - readout
    c = beta * e
    bg = beta * g
    tl.store(DV + r * dv + cols, bg.to(DV.dtype.element_ty), mask=cols < dv)
    tl.store(DB + r, tl.sum(e * g, axis=0).to(DB.dtype.element_ty))
    for start in range(0, d, BLOCK_D):
        rows, mask, offsets = _chunk(r, start, d, dv, BLOCK_D, BLOCK_V)
        k = tl.load(K + r * d + rows, mask=rows < d, other=0).to(ACC)
        grad = tl.load(G + offsets, mask=mask, other=0).to(ACC)
        dk = grad * c[None, :]
        dx = grad
        if ERASE:
            x = tl.load(X + offsets, mask=mask, other=0).to(ACC)
            dk -= x * bg[None, :]
            dx -= k[:, None] * bg[None, :]
        tl.store(DX + offsets, dx.to(DX.dtype.element_ty), mask=mask)
        tl.store(DK + r * d + rows, tl.sum(dk, axis=1).to(DK.dtype.element_ty), mask=rows < d)


def _launch(kernel: triton.JITFunction, X: Tensor, erase: bool, *tensors: Tensor) -> None:
    """Launch ``kernel`` over the rows ``(d, d_v)`` of ``X`` with chunk sizes for its shape."""
    d, dv = X.shape[-2:]
    n = X.numel() // (d * dv) if X.numel() else 0
    if n == 0:
        return
    block_v = triton.next_power_of_2(dv)
    block_d = min(triton.next_power_of_2(d), max(1, CHUNK // block_v))
    acc = tl.float64 if X.dtype == torch.float64 else tl.float32
    kernel[(n,)](*tensors, d, dv, ERASE=erase, ACC=acc, BLOCK_D=block_d, BLOCK_V=block_v)


def forward(X: Tensor, k: Tensor, v: Tensor, beta: Tensor, erase: bool) -> Tensor:
    """The update of states ``X (..., d, d_v)``, in the dtype of ``X``."""
    X, k, v, beta = contiguous(X, k, v, beta)
    Y = torch.empty_like(X)
    _launch(_forward_kernel, X, erase, X, k, v, beta, Y)
    return Y


def backward(
    G: Tensor, X: Tensor, k: Tensor, v: Tensor, beta: Tensor, erase: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients of the update with respect to ``X, k, v, β``, each in its input's dtype."""
    G, X, k, v, beta = contiguous(G, X, k, v, beta)
    grads = torch.empty_like(X), torch.empty_like(k), torch.empty_like(v), torch.empty_like(beta)
    _launch(_backward_kernel, X, erase, G, X, k, v, beta, *grads)
    return grads
