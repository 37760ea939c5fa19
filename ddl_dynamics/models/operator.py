"""The Delta operator of Deep Delta Learning, as pure batched functions.

The model path never builds the d×d matrix ``A = I − β k kᵀ``: one update costs
``O(d·d_v)`` per sample. ``shortcut_matrix`` builds ``A`` densely for analysis and tests.
The β regime thresholds live here and nowhere else.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

#: Gate regimes in increasing order of β; the boundaries are :data:`REGIME_BOUNDS`.
REGIMES: tuple[str, ...] = ("identity", "write", "projection", "over-relaxed", "reflection")
#: identity < 0.25 ≤ write < 0.75 ≤ projection ≤ 1.25 < over-relaxed ≤ 1.75 < reflection.
REGIME_BOUNDS: tuple[float, ...] = (0.25, 0.75, 1.25, 1.75)


def normalize_direction(k_raw: Tensor, eps: float = 1e-5) -> Tensor:
    """``k_raw / sqrt(‖k_raw‖² + eps²)`` over the last axis.

    Unlike ``k / ‖k‖`` this stays finite and smooth at ``k_raw = 0``; for
    ``‖k_raw‖ ≫ eps`` it is a unit vector to within ``eps²/‖k_raw‖²``.
    """
    acc = torch.promote_types(k_raw.dtype, torch.float32)
    sq = k_raw.to(acc).square().sum(-1, keepdim=True)
    return k_raw * torch.rsqrt(sq + eps * eps).to(k_raw.dtype)


def _check_shapes(X: Tensor, k: Tensor, v: Tensor, beta: Tensor) -> bool:
    """Validate shapes; return True when ``X`` carries value channels ``(..., d, d_v)``."""
    batch, d = tuple(k.shape[:-1]), k.shape[-1]
    if X.shape == k.shape:
        expected_v, matrix = batch, False
    elif X.dim() == k.dim() + 1 and tuple(X.shape[:-2]) == batch and X.shape[-2] == d:
        expected_v, matrix = (*batch, X.shape[-1]), True
    else:
        raise ValueError(
            f"delta update: state X {tuple(X.shape)} does not match direction k "
            f"{tuple(k.shape)}; X must be (..., d) or (..., d, d_v) with k (..., d)"
        )
    if tuple(v.shape) != expected_v:
        raise ValueError(
            f"delta update: value v has shape {tuple(v.shape)}, expected {expected_v} "
            f"for X {tuple(X.shape)}"
        )
    if tuple(beta.shape) != batch:
        raise ValueError(
            f"delta update: gate beta has shape {tuple(beta.shape)}, expected {batch} "
            f"for k {tuple(k.shape)}"
        )
    return matrix


def _readout(k: Tensor, X: Tensor) -> Tensor:
    """``kᵀX`` for ``X (..., d, d_v)``, ``(..., d_v)``, accumulated in at least float32."""
    acc = torch.promote_types(X.dtype, torch.float32)
    k, X = k.to(acc), X.to(acc)
    if X.shape[-1] == 1:  # one dot per sample: multiply-and-sum beats a batch of 1×d matmuls
        return (k * X.squeeze(-1)).sum(-1, keepdim=True)
    return (k.unsqueeze(-2) @ X).squeeze(-2)


def _contract(X: Tensor, c: Tensor, into: Tensor | None = None) -> Tensor:
    """``X c`` over the value channels, ``(..., d)``, in ≥ float32; or ``into − X c`` in place."""
    acc = torch.promote_types(X.dtype, torch.float32)
    X, c = X.to(acc), c.to(acc)
    if X.shape[-1] == 1:
        X = X.squeeze(-1)
        return X * c if into is None else into.addcmul_(X, c, value=-1)
    # Against Xᵀ the matmul runs along rows of length d rather than d_v: several times faster.
    Xc = (c.unsqueeze(-2) @ X.mT).squeeze(-2)
    return Xc if into is None else into.sub_(Xc)


def _rank_one(X: Tensor, k: Tensor, c: Tensor) -> Tensor:
    """``X + k cᵀ`` in the dtype of ``X``."""
    return torch.addcmul(X, k.unsqueeze(-1), c.to(X.dtype).unsqueeze(-2))


def _residual(X: Tensor, k: Tensor, v: Tensor, erase: bool) -> Tensor:
    """``v − kᵀX`` (delta rule) or ``v`` (write only), in at least float32."""
    v = v.to(torch.promote_types(X.dtype, torch.float32))
    return v - _readout(k, X) if erase else v


class _RankOneUpdate(torch.autograd.Function):
    """``Y = X + k cᵀ``, ``c = β e``, ``e = v − kᵀX`` (delta rule) or ``e = v`` (write only).

    Autograd through the composite makes a pass over the state for every op it records;
    the closed form needs about half as many. With upstream gradient ``G`` and ``g = kᵀG``:
    ``dX = G − β k gᵀ``, ``dk = G c − β X g``, ``dv = β g``, ``dβ = eᵀg``, where the
    ``β k gᵀ`` and ``β X g`` terms come from the erasure. The backward is made of
    differentiable ops, so it can itself be differentiated.
    """

    @staticmethod
    def forward(ctx: Any, X: Tensor, k: Tensor, v: Tensor, beta: Tensor, erase: bool) -> Tensor:
        e = _residual(X, k, v, erase)
        ctx.erase = erase
        ctx.save_for_backward(X, k, v, beta, e)
        return _rank_one(X, k, beta.to(e.dtype).unsqueeze(-1) * e)

    @staticmethod
    def backward(ctx: Any, G: Tensor) -> tuple[Tensor | None, ...]:
        X, k, v, beta, e = ctx.saved_tensors
        if torch.is_grad_enabled():  # double backward: e must be differentiable in X, k and v
            e = _residual(X, k, v, ctx.erase)
        g = _readout(k, G)
        beta = beta.to(g.dtype).unsqueeze(-1)
        dX = dk = None
        if ctx.needs_input_grad[0]:
            dX = _rank_one(G, k, -beta * g) if ctx.erase else G
        if ctx.needs_input_grad[1]:
            dk = _contract(G, beta * e)
            if ctx.erase:
                dk = _contract(X, beta * g, into=dk)
        return dX, dk, beta * g, (e * g).sum(-1), None


def _update(X: Tensor, k: Tensor, v: Tensor, beta: Tensor, erase: bool) -> Tensor:
    """Validate, view a vector state as one value channel, and apply :class:`_RankOneUpdate`."""
    if _check_shapes(X, k, v, beta):
        return _RankOneUpdate.apply(X, k, v, beta, erase)
    return _RankOneUpdate.apply(X.unsqueeze(-1), k, v.unsqueeze(-1), beta, erase).squeeze(-1)


def delta_update(X: Tensor, k: Tensor, v: Tensor, beta: Tensor) -> Tensor:
    """``X + β k (vᵀ − kᵀX)``: erase the readout along ``k``, then write ``v`` there.

    Args:
        X: state, ``(..., d)`` or ``(..., d, d_v)``.
        k: unit direction, ``(..., d)`` (see :func:`normalize_direction`).
        v: target readout, ``(...,)`` or ``(..., d_v)`` to match ``X``.
        beta: gate, ``(...,)``.

    The readout ``kᵀX`` is accumulated in at least float32, so bfloat16 states keep
    the identity ``e_post = (1 − β) e_pre`` to float32 rounding of the reduction.
    """
    return _update(X, k, v, beta, erase=True)


def write_update(X: Tensor, k: Tensor, v: Tensor, beta: Tensor) -> Tensor:
    """``X + β k vᵀ``: the write-only control, the delta rule without its erase term."""
    return _update(X, k, v, beta, erase=False)


def shortcut_matrix(k: Tensor, beta: Tensor) -> Tensor:
    """Dense ``A = I − β k kᵀ``, ``(..., d, d)``. For analysis and tests only."""
    eye = torch.eye(k.shape[-1], dtype=k.dtype, device=k.device)
    return eye - beta[..., None, None] * k.unsqueeze(-1) * k.unsqueeze(-2)


def gate(logits: Tensor, beta_max: float = 2.0) -> Tensor:
    """``β = beta_max · σ(logits)``, computed in float32 or wider."""
    acc = torch.promote_types(logits.dtype, torch.float32)
    return beta_max * torch.sigmoid(logits.to(acc))


def gate_logit(beta0: float, beta_max: float = 2.0) -> float:
    """The logit at which :func:`gate` equals ``beta0`` (to initialise a gate bias)."""
    if not 0.0 < beta0 < beta_max:
        raise ValueError(f"initial gate {beta0} must lie strictly inside (0, beta_max={beta_max})")
    p = beta0 / beta_max
    return math.log(p / (1.0 - p))


def regime(beta: Tensor | float) -> list[str] | str:
    """Regime label(s) of gate value(s): identity, write, projection, over-relaxed, reflection.

    Thresholds: identity β < 0.25; write 0.25 ≤ β < 0.75; projection
    0.75 ≤ β ≤ 1.25; over-relaxed 1.25 < β ≤ 1.75; reflection β > 1.75.
    """
    if isinstance(beta, (int, float)):
        return REGIMES[int(regime_index(torch.tensor(float(beta))))]
    return [REGIMES[i] for i in regime_index(beta).flatten().tolist()]


def regime_index(beta: Tensor) -> Tensor:
    """Integer regime index (into :data:`REGIMES`) of every gate value, same shape."""
    b = beta.detach().double()
    lo_id, lo_proj, hi_proj, hi_over = REGIME_BOUNDS
    return (
        (b >= lo_id).long()
        + (b >= lo_proj).long()
        + (b > hi_proj).long()
        + (b > hi_over).long()
    )
