"""The Delta operator of Deep Delta Learning, as pure batched functions.

The model path never builds the d×d matrix ``A = I − β k kᵀ``: one update costs
``O(d·d_v)`` per sample. The update is one autograd Function with a closed-form backward,
a forward-mode rule and a vmap rule (so ``torch.func`` works through it), backed by torch
ops ``torch.ops.ddl_dynamics.rank_one_update[_backward]`` that carry FLOP formulas and
fake-tensor rules (so ``FlopCounterMode`` counts it and ``torch.compile`` keeps it whole).
Its kernels, one per backend (torch ops, a C++ CPU kernel, Triton), are in
`delta_kernels`. A DDL layer calls `generated_update`, which on the C++ kernel
also normalises the direction and applies the gate within the same node. ``shortcut_matrix``
builds ``A`` densely for analysis and tests.
The β regime thresholds live here and nowhere else.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torch._C._functorch import is_functorch_wrapped_tensor
from torch.utils._python_dispatch import _get_current_dispatch_mode
from torch.utils.flop_counter import register_flop_formula

from .delta_kernels import BACKENDS, choose_backend, cpu_generated, reference_jvp
from .delta_layout import like
from .function import PositionalFunction

#: Gate regimes in increasing order of β; the boundaries are `REGIME_BOUNDS`.
REGIMES: tuple[str, ...] = ("identity", "write", "projection", "over-relaxed", "reflection")
#: identity < 0.25 ≤ write < 0.75 ≤ projection ≤ 1.25 < over-relaxed ≤ 1.75 < reflection.
REGIME_BOUNDS: tuple[float, ...] = (0.25, 0.75, 1.25, 1.75)


#: The ``eps`` of `normalize_direction`.
DIRECTION_EPS = 1e-5


def normalize_direction(k_raw: Tensor, eps: float = DIRECTION_EPS) -> Tensor:
    """``k_raw / sqrt(‖k_raw‖² + eps²)`` over the last axis.

    Unlike ``k / ‖k‖`` this stays finite and smooth at ``k_raw = 0``; for
    ``‖k_raw‖ ≫ eps`` it is a unit vector to within ``eps²/‖k_raw‖²``.
    """
    acc = torch.promote_types(k_raw.dtype, torch.float32)
    sq = k_raw.to(acc).square().sum(-1, keepdim=True)
    return k_raw * torch.rsqrt(sq + eps * eps).to(k_raw.dtype)


def _check_shapes(X: Tensor, k: Tensor, v: Tensor, beta: Tensor) -> bool:
    """Validate shapes and devices; return True when ``X`` carries value channels
    ``(..., d, d_v)``."""
    if not X.device == k.device == v.device == beta.device:
        raise ValueError(
            f"delta update: X, k, v and beta must be on one device, got "
            f"{', '.join(str(t.device) for t in (X, k, v, beta))}"
        )
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


# The kernels as torch ops, for what watches ops at the dispatcher: FlopCounterMode counts
# them with the formulas below, fake tensors (torch.compile, meta) get shapes from
# register_fake. Without such a watcher the autograd Function calls the kernels directly,
# which saves two dispatcher round trips per call.
# Y and dX come back in the layout empty_like gives X, as their fake tensors say.
@torch.library.custom_op("ddl_dynamics::rank_one_update", mutates_args=())
def _forward_op(X: Tensor, k: Tensor, v: Tensor, beta: Tensor, erase: bool, backend: str) -> Tensor:
    return like(X, BACKENDS[backend].forward(X, k, v, beta, erase))


@torch.library.custom_op("ddl_dynamics::rank_one_update_backward", mutates_args=())
def _backward_op(
    G: Tensor, X: Tensor, k: Tensor, v: Tensor, beta: Tensor, erase: bool, backend: str
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    dX, dk, dv, dbeta = BACKENDS[backend].backward(G, X, k, v, beta, erase)
    return like(X, dX), dk, dv, dbeta


@_forward_op.register_fake
def _(X: Tensor, k: Tensor, v: Tensor, beta: Tensor, erase: bool, backend: str) -> Tensor:
    return torch.empty_like(X)


@_backward_op.register_fake
def _(
    G: Tensor, X: Tensor, k: Tensor, v: Tensor, beta: Tensor, erase: bool, backend: str
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return torch.empty_like(X), torch.empty_like(k), torch.empty_like(v), torch.empty_like(beta)


def update_flops(n: int, d: int, d_v: int, erase: bool, backward: bool = False) -> int:
    """FLOPs of the update on ``n`` states ``d × d_v`` (forward, or its backward alone).

    Forward: the readout ``kᵀX`` and the rank-one write ``X + k cᵀ``, ``2·d·d_v`` each, so
    ``4·n·d·d_v`` (write-only: no readout, ``2·n·d·d_v``). Backward: ``g = kᵀG``, the
    recomputed readout, ``dX`` and the two contractions of ``dk``: ``10·n·d·d_v`` (write-only:
    ``g`` and ``G c``, ``4·n·d·d_v``). ``O(n·d_v)`` terms are left out.
    """
    per_element = (10 if erase else 4) if backward else (4 if erase else 2)
    return per_element * n * d * d_v


@register_flop_formula(torch.ops.ddl_dynamics.rank_one_update)
def _forward_flops(
    X: torch.Size, k: Any, v: Any, beta: Any, erase: bool, *_: Any, **__: Any
) -> int:
    return update_flops(math.prod(X[:-2]), X[-2], X[-1], erase=erase)


@register_flop_formula(torch.ops.ddl_dynamics.rank_one_update_backward)
def _backward_flops(
    G: Any, X: torch.Size, k: Any, v: Any, beta: Any, erase: bool, *_: Any, **__: Any
) -> int:
    return update_flops(math.prod(X[:-2]), X[-2], X[-1], erase=erase, backward=True)


def _watched() -> bool:
    """Whether something watches ops (FLOP counting, fake tensors, torch.compile): run the ops."""
    return _get_current_dispatch_mode() is not None or torch.compiler.is_compiling()


def _transformed(*tensors: Tensor) -> bool:
    """Whether ``torch.func`` wraps any of ``tensors``: their data is not addressable, and the
    transforms see through the reference's torch ops."""
    return any(is_functorch_wrapped_tensor(t) for t in tensors)


class _RankOneUpdate(PositionalFunction):
    """``Y = X + k cᵀ``, ``c = β (v − kᵀX)`` (``erase``) or ``c = β v``, with the closed-form
    backward of `delta_kernels` and a vmap rule, so ``torch.func`` works through it.

    A backward that must itself be differentiated (``create_graph``, ``torch.func.grad``)
    runs the reference's torch ops, which autograd and the transforms see through.
    """

    @staticmethod
    def forward(X: Tensor, k: Tensor, v: Tensor, beta: Tensor, erase: bool, backend: str) -> Tensor:
        if _watched():
            return _forward_op(X, k, v, beta, erase, backend)
        return BACKENDS[backend].forward(X, k, v, beta, erase)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        X, k, v, beta, ctx.erase, ctx.backend = inputs
        ctx.save_for_backward(X, k, v, beta)
        ctx.save_for_forward(X, k, v, beta)

    @staticmethod
    def backward(ctx: Any, G: Tensor) -> tuple[Tensor | None, ...]:
        X, k, v, beta = ctx.saved_tensors
        if torch.is_grad_enabled() or _transformed(G, X, k, v, beta):
            grads = BACKENDS["reference"].backward(G, X, k, v, beta, ctx.erase)
        elif _watched():
            grads = _backward_op(G, X, k, v, beta, ctx.erase, ctx.backend)
        else:
            grads = BACKENDS[ctx.backend].backward(G, X, k, v, beta, ctx.erase)
        return (*grads, None, None)

    @staticmethod
    def jvp(ctx: Any, *tangents: Tensor | None) -> Tensor:
        """Forward mode (``torch.func.jvp``, ``jacfwd``, ``hessian``), by the reference's ops."""
        primals = ctx.saved_tensors
        tangents = tuple(
            torch.zeros_like(p) if t is None else t
            for p, t in zip(primals, tangents[:4], strict=True)
        )
        return reference_jvp(*primals, tangents, ctx.erase)

    @staticmethod
    def vmap(
        info: Any,
        in_dims: tuple[int | None, ...],
        X: Tensor,
        k: Tensor,
        v: Tensor,
        beta: Tensor,
        erase: bool,
        backend: str,
    ) -> tuple[Tensor, int]:
        """The vmapped axis becomes one more leading batch axis of the same update."""
        tensors = (
            t.movedim(dim, 0) if dim is not None else t.expand(info.batch_size, *t.shape)
            for t, dim in zip((X, k, v, beta), in_dims, strict=False)
        )
        return _RankOneUpdate.apply(*tensors, erase, backend), 0


# Under torch.compile the update enters the graph as the op, with the Function's backward:
# dynamo does not trace a Function that defines jvp.
_forward_op.register_autograd(_RankOneUpdate.backward, setup_context=_RankOneUpdate.setup_context)


def _update(
    X: Tensor, k: Tensor, v: Tensor, beta: Tensor, erase: bool, backend: str | None
) -> Tensor:
    """Validate, view a vector state as one value channel, and apply `_RankOneUpdate`."""
    if not _check_shapes(X, k, v, beta):
        return _update(X.unsqueeze(-1), k, v.unsqueeze(-1), beta, erase, backend).squeeze(-1)
    update = _forward_op if torch.compiler.is_compiling() else _RankOneUpdate.apply
    return update(X, k, v, beta, erase, choose_backend(X, backend))


def delta_update(
    X: Tensor, k: Tensor, v: Tensor, beta: Tensor, *, backend: str | None = None
) -> Tensor:
    """``X + β k (vᵀ − kᵀX)``: erase the readout along ``k``, then write ``v`` there.

    Args:
        X: state, ``(..., d)`` or ``(..., d, d_v)``.
        k: unit direction, ``(..., d)`` (see `normalize_direction`).
        v: target readout, ``(...,)`` or ``(..., d_v)`` to match ``X``.
        beta: gate, ``(...,)``.
        backend: ``"auto"``, ``"reference"``, ``"cpu"`` or ``"triton"`` (see
            `ddl_dynamics.models.delta_kernels`); default: the environment variable
            ``DDL_DYNAMICS_DELTA_BACKEND``, else ``"auto"``.

    The readout, gate and residual are computed in at least float32, autocast or not, and
    the result is cast back to the dtype of ``X``: a bfloat16 state keeps the identity
    ``e_post = (1 − β) e_pre`` to float32 rounding before that final cast, and a float32
    ``beta`` is never rounded to the state's dtype. Costs ``O(d·d_v)`` per sample
    (`update_flops`, counted by ``FlopCounterMode``); works under ``torch.func``
    (``vmap``, ``grad``, ``jacrev``) and differentiates twice.
    """
    return _update(X, k, v, beta, erase=True, backend=backend)


def write_update(
    X: Tensor, k: Tensor, v: Tensor, beta: Tensor, *, backend: str | None = None
) -> Tensor:
    """``X + β k vᵀ``: the write-only control, the delta rule without its erase term."""
    return _update(X, k, v, beta, erase=False, backend=backend)


def split_generators(raw: Tensor, d_v: int, beta_max: float) -> tuple[Tensor, Tensor, Tensor]:
    """A DDL layer's generators packed as ``raw = [k̃ (d) | gate logit | v (d_v)]``, as
    ``(k̃, v, β)`` with ``β = gate(logit, beta_max)``."""
    k_raw, logit, v = raw.split((raw.shape[-1] - 1 - d_v, 1, d_v), dim=-1)
    return k_raw, v, gate(logit.squeeze(-1), beta_max)


def _composed_update(
    X: Tensor, raw: Tensor, d_v: int, beta_max: float, erase: bool, backend: str | None = None
) -> Tensor:
    k_raw, v, beta = split_generators(raw, d_v, beta_max)
    matrix = X.unflatten(-1, (-1, d_v))
    return _update(matrix, normalize_direction(k_raw), v, beta, erase, backend).flatten(-2)


class _GeneratedUpdate(torch.autograd.Function):
    """`generated_update` on the C++ kernel: normalisation, gate and update in one node.

    Never reached under ``torch.func``, so it has the older one-call ``forward(ctx, …)``
    (no ``setup_context``, no vmap rule), which costs less per call. A backward that must
    itself be differentiated (``create_graph``) differentiates the composition it equals.
    """

    @staticmethod
    def forward(ctx: Any, X: Tensor, raw: Tensor, d_v: int, beta_max: float, erase: bool) -> Tensor:
        ctx.d_v, ctx.beta_max, ctx.erase = d_v, beta_max, erase
        ctx.save_for_backward(X, raw)
        return cpu_generated(X, raw, d_v, beta_max, DIRECTION_EPS, erase)[0]

    @staticmethod
    def backward(ctx: Any, G: Tensor) -> tuple[Tensor | None, ...]:
        X, raw = ctx.saved_tensors
        if not torch.is_grad_enabled():
            dX, draw = cpu_generated(X, raw, ctx.d_v, ctx.beta_max, DIRECTION_EPS, ctx.erase, G)
            return dX, draw, None, None, None
        wanted = [t for t in (X, raw) if t.requires_grad]
        Y = _composed_update(X, raw, ctx.d_v, ctx.beta_max, ctx.erase, "reference")
        grads = iter(torch.autograd.grad(Y, wanted, G, create_graph=True))
        return *(next(grads) if t.requires_grad else None for t in (X, raw)), None, None, None


def generated_update(
    X: Tensor,
    raw: Tensor,
    *,
    value_channels: int = 1,
    beta_max: float = 2.0,
    erase: bool = True,
    backend: str | None = None,
) -> Tensor:
    """A DDL layer's update from its generators, ``raw = [k̃ | gate logit | v]``
    ``(..., d + 1 + d_v)`` as one branch emits them, on the flat state ``X (..., d·d_v)``:
    `delta_update` (``erase``; else `write_update`) of ``X`` viewed as
    ``(..., d, d_v)``, with ``k = normalize_direction(k̃)`` and ``β = gate(logit, beta_max)``.

    A small layer pays per op, not per FLOP: on the C++ kernel (``backend`` ``cpu``, which
    ``auto`` picks on the CPU) this is one autograd node and one pass over each row, forward
    and backward. Elsewhere, and under ``torch.func``, FLOP counting or ``torch.compile``, it
    runs the composition `split_generators` → `normalize_direction` →
    [`delta_update`][ddl_dynamics.models.operator.delta_update], to which it is equal.
    """
    d, rest = divmod(X.shape[-1], value_channels)
    if rest or raw.shape[:-1] != X.shape[:-1] or raw.shape[-1] != d + 1 + value_channels:
        raise ValueError(
            f"generated update: state {tuple(X.shape)} and generators {tuple(raw.shape)} do not "
            f"fit value_channels={value_channels}; want (..., d·{value_channels}) and "
            f"(..., d + 1 + {value_channels})"
        )
    if (
        raw.dtype == X.dtype
        and not torch._C._are_functorch_transforms_active()
        and not _watched()
        and choose_backend(X, backend, value_channels) == "cpu"
    ):
        # Function.apply would bind the arguments by signature: they go straight to autograd.
        return super(torch.autograd.Function, _GeneratedUpdate).apply(
            X, raw, value_channels, float(beta_max), erase
        )
    return _composed_update(X, raw, value_channels, beta_max, erase, backend)


def shortcut_matrix(k: Tensor, beta: Tensor) -> Tensor:
    """Dense ``A = I − β k kᵀ``, ``(..., d, d)``. For analysis and tests only."""
    eye = torch.eye(k.shape[-1], dtype=k.dtype, device=k.device)
    return eye - beta[..., None, None] * k.unsqueeze(-1) * k.unsqueeze(-2)


def gate(logits: Tensor, beta_max: float = 2.0) -> Tensor:
    """``β = beta_max · σ(logits)``, computed in float32 or wider."""
    acc = torch.promote_types(logits.dtype, torch.float32)
    return beta_max * torch.sigmoid(logits.to(acc))


def gate_logit(beta0: float, beta_max: float = 2.0) -> float:
    """The logit at which `gate` equals ``beta0`` (to initialise a gate bias)."""
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
    """Integer regime index (into `REGIMES`) of every gate value, same shape."""
    b = beta.detach().double()
    lo_id, lo_proj, hi_proj, hi_over = REGIME_BOUNDS
    return (b >= lo_id).long() + (b >= lo_proj).long() + (b > hi_proj).long() + (b > hi_over).long()
