"""The kernels of the Delta update, one per backend, and the choice between them.

Every backend implements the same two functions on states ``X (..., d, d_v)`` with
``k (..., d)``, ``v (..., d_v)``, ``beta (...)``:

- ``forward(X, k, v, beta, erase) → Y = X + k cᵀ``, ``c = β (v − kᵀX)`` (``erase``) or ``β v``;
- ``backward(G, X, k, v, beta, erase) → (dX, dk, dv, dβ)``: with ``g = kᵀG`` and
  ``e = v − kᵀX`` (or ``v``), ``dX = G − β k gᵀ``, ``dk = G (βe) − β X g``, ``dv = β g``,
  ``dβ = eᵀg``, where the ``β k gᵀ`` and ``β X g`` terms come from the erasure.

All compute in at least float32 and return each result in its input's dtype. Backends:

- ``reference``: torch ops, any device and dtype; its backward is differentiable (double
  backward, ``torch.func``) and is the one checked against the dense ``d × d`` operator.
- ``cpu``: the C++ kernel built with the package (``_delta_cpu.cpp``): one pass over each
  state, row-major or channels first, float32/float64 on the CPU, split across
  ``torch.get_num_threads()`` threads.
  `cpu_generated` runs it on a DDL layer's packed generators, normalising the
  direction and applying the gate in the same pass.
- ``triton``: Triton kernels (`_delta_triton`), CUDA tensors; CPU tensors only under
  ``TRITON_INTERPRET=1``.

``auto`` (the default) picks ``triton`` on CUDA when Triton is installed, ``cpu`` on the CPU
when the kernel was built and supports the state, and ``reference`` otherwise. The
environment variable `BACKEND_ENV` (or a ``backend=`` argument) forces a backend, e.g.
``DDL_DYNAMICS_DELTA_BACKEND=reference``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from .._checks import check_choice
from .delta_layout import channels_first, contiguous

_delta_cpu: ModuleType | None
try:
    from . import _delta_cpu
except ImportError:  # built without a compiler: the reference path serves
    _delta_cpu = None

_NOT_BUILT = "the C++ kernel was not built when the package was installed"

#: The environment variable that forces a backend (``auto`` when unset).
BACKEND_ENV = "DDL_DYNAMICS_DELTA_BACKEND"
_HAS_TRITON = importlib.util.find_spec("triton") is not None

Grads = tuple[Tensor, Tensor, Tensor, Tensor]


def _acc(X: Tensor) -> torch.dtype:
    return torch.promote_types(X.dtype, torch.float32)


def _readout(k: Tensor, X: Tensor) -> Tensor:
    """``kᵀX`` for ``k (..., d)``, ``X (..., d, d_v)``: ``(..., d_v)``."""
    if X.shape[-1] == 1:  # one dot per row: multiply-and-sum beats a batch of 1×d matmuls
        return (k * X.squeeze(-1)).sum(-1, keepdim=True)
    return (k.unsqueeze(-2) @ X).squeeze(-2)


def _contract(X: Tensor, c: Tensor) -> Tensor:
    """``X c`` over the value channels, ``(..., d)``."""
    if X.shape[-1] == 1:
        return X.squeeze(-1) * c
    # Against Xᵀ the matmul runs along rows of length d rather than d_v: several times faster.
    return (c.unsqueeze(-2) @ X.mT).squeeze(-2)


def _rank_one(X: Tensor, k: Tensor, c: Tensor) -> Tensor:
    """``X + k cᵀ``."""
    return torch.addcmul(X, k.unsqueeze(-1), c.unsqueeze(-2))


def _autocast_off(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``kernel`` with autocast off on the device of its first tensor, so that its torch
    ops keep the dtypes they are given (autocast would run the readout matmul in bfloat16)."""

    @functools.wraps(kernel)
    def run(*args: Any) -> Any:
        device = args[0].device.type
        if not torch.is_autocast_enabled(device):
            return kernel(*args)
        with torch.autocast(device, enabled=False):
            return kernel(*args)

    return run


@_autocast_off
def reference_forward(X: Tensor, k: Tensor, v: Tensor, beta: Tensor, erase: bool) -> Tensor:
    acc = _acc(X)
    Xa, ka, va, ba = (t.to(acc) for t in (X, k, v, beta))
    e = va - _readout(ka, Xa) if erase else va
    return _rank_one(Xa, ka, ba.unsqueeze(-1) * e).to(X.dtype)


@_autocast_off
def reference_backward(
    G: Tensor, X: Tensor, k: Tensor, v: Tensor, beta: Tensor, erase: bool
) -> Grads:
    acc = _acc(X)
    Ga, Xa, ka, va, ba = (t.to(acc) for t in (G, X, k, v, beta))
    g = _readout(ka, Ga)
    e = va - _readout(ka, Xa) if erase else va
    bg = ba.unsqueeze(-1) * g
    dk = _contract(Ga, ba.unsqueeze(-1) * e)
    if erase:
        dX, dk = _rank_one(Ga, ka, -bg), dk - _contract(Xa, bg)
    else:
        dX = Ga.clone()  # an op's gradient may not alias its upstream gradient
    db = (e * g).sum(-1)
    return dX.to(X.dtype), dk.to(k.dtype), bg.to(v.dtype), db.to(beta.dtype)


@_autocast_off
def reference_jvp(
    X: Tensor, k: Tensor, v: Tensor, beta: Tensor, tangents: tuple[Tensor, ...], erase: bool
) -> Tensor:
    """Forward-mode derivative: ``dY = dX + dk cᵀ + k dcᵀ`` with ``dc = dβ e + β de``,
    ``de = dv − dkᵀX − kᵀdX`` (write-only: ``de = dv``)."""
    acc = _acc(X)
    Xa, ka, va, ba = (t.to(acc) for t in (X, k, v, beta))
    dX, dk, dv, db = (t.to(acc) for t in tangents)
    e, de = (va - _readout(ka, Xa), dv - _readout(dk, Xa) - _readout(ka, dX)) if erase else (va, dv)
    c, dc = ba.unsqueeze(-1) * e, db.unsqueeze(-1) * e + ba.unsqueeze(-1) * de
    return _rank_one(_rank_one(dX, dk, c), ka, dc).to(X.dtype)


def _cpu_kernel(
    X: Tensor, k: Tensor, v: Tensor, beta: Tensor, erase: bool, G: Tensor | None = None
) -> list[Tensor]:
    """Run the C++ kernel forward (``G`` None: ``[Y]``) or backward (``[dX, dk, dv, dβ]``),
    results in the dtype of ``X``, ``Y`` and ``dX`` in its layout (row-major or channels
    first)."""
    first = channels_first(X)
    states = [X] if G is None else [X, G]
    if first:  # the kernel addresses each state's rows channel by channel
        states = [t.to(X.dtype).mT.contiguous().mT for t in states]
    else:
        states = contiguous(*states, dtype=X.dtype)
    inputs = [states[0], *contiguous(k, v, beta, dtype=X.dtype), *states[1:]]
    outs = [torch.empty_like(t) for t in inputs[: 1 if G is None else 4]]  # as the inputs
    if X.numel():
        if _delta_cpu is None:
            raise RuntimeError(_NOT_BUILT)
        d, dv = X.shape[-2:]
        pointers = [t.data_ptr() for t in inputs] + [0] * (5 - len(inputs))
        pointers += [t.data_ptr() for t in outs] + [0] * (4 - len(outs))
        _delta_cpu.update(
            *pointers,
            X.numel() // (d * dv),
            d,
            dv,
            erase,
            G is not None,
            X.dtype == torch.float64,
            torch.get_num_threads(),
            False,
            0.0,
            0.0,
            first,
        )
    return outs


def cpu_forward(X: Tensor, k: Tensor, v: Tensor, beta: Tensor, erase: bool) -> Tensor:
    return _cpu_kernel(X, k, v, beta, erase)[0]


def cpu_backward(G: Tensor, X: Tensor, k: Tensor, v: Tensor, beta: Tensor, erase: bool) -> Grads:
    dX, dk, dv, db = _cpu_kernel(X, k, v, beta, erase, G)
    return dX, dk.to(k.dtype), dv.to(v.dtype), db.to(beta.dtype)


def cpu_generated(
    X: Tensor,
    raw: Tensor,
    d_v: int,
    beta_max: float,
    eps: float,
    erase: bool,
    G: Tensor | None = None,
) -> list[Tensor]:
    """The C++ kernel on a layer's packed generators ``raw = [k̃ | gate logit | v]``
    ``(..., d + 1 + d_v)`` and the flat state ``X (..., d·d_v)``, both of one dtype: forward
    (``G`` None: ``[Y]``), or backward (``[dX, d raw]``)."""
    X, raw = X.contiguous(), raw.contiguous()
    G = None if G is None else G.contiguous()  # held: the kernel reads its memory
    outs = [torch.empty_like(X)] if G is None else [torch.empty_like(X), torch.empty_like(raw)]
    if X.numel():
        if _delta_cpu is None:
            raise RuntimeError(_NOT_BUILT)
        G_ptr, draw_ptr = (0, 0) if G is None else (G.data_ptr(), outs[1].data_ptr())
        _delta_cpu.update(
            X.data_ptr(),
            raw.data_ptr(),
            0,
            0,
            G_ptr,
            outs[0].data_ptr(),
            draw_ptr,
            0,
            0,
            X.numel() // X.shape[-1],
            X.shape[-1] // d_v,
            d_v,
            erase,
            G is not None,
            X.dtype == torch.float64,
            torch.get_num_threads(),
            True,
            beta_max,
            eps,
            False,
        )
    return outs


def _cpu_unsupported(X: Tensor, channels: int) -> str | None:
    if _delta_cpu is None:
        return _NOT_BUILT
    if X.device.type != "cpu" or X.dtype not in (torch.float32, torch.float64):
        return f"it runs float32/float64 states on the CPU, not {X.dtype} on {X.device}"
    if channels > _delta_cpu.MAX_CHANNELS:
        return f"it runs at most {_delta_cpu.MAX_CHANNELS} value channels, not {channels}"
    return None


def _triton() -> ModuleType:
    return importlib.import_module("._delta_triton", __package__)


def triton_forward(X: Tensor, k: Tensor, v: Tensor, beta: Tensor, erase: bool) -> Tensor:
    return _triton().forward(X, k, v, beta, erase)


def triton_backward(G: Tensor, X: Tensor, k: Tensor, v: Tensor, beta: Tensor, erase: bool) -> Grads:
    return _triton().backward(G, X, k, v, beta, erase)


def _triton_unsupported(X: Tensor, channels: int) -> str | None:
    if not _HAS_TRITON:
        return "triton is not installed"
    if X.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return f"it runs CUDA tensors (CPU ones only under TRITON_INTERPRET=1), not {X.device}"
    return None


@dataclass(frozen=True)
class Backend:
    """One implementation of the update: its kernels, and why it cannot run a state ``X``
    of ``channels`` value channels (None: it can)."""

    forward: Callable[[Tensor, Tensor, Tensor, Tensor, bool], Tensor]
    backward: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, bool], Grads]
    unsupported: Callable[[Tensor, int], str | None] = lambda X, channels: None


BACKENDS: dict[str, Backend] = {
    "reference": Backend(reference_forward, reference_backward),
    "cpu": Backend(cpu_forward, cpu_backward, _cpu_unsupported),
    "triton": Backend(triton_forward, triton_backward, _triton_unsupported),
}
#: Tried in order by ``auto`` on each device type before ``reference``.
AUTO: dict[str, tuple[str, ...]] = {"cuda": ("triton",), "cpu": ("cpu",)}


def choose_backend(X: Tensor, requested: str | None = None, channels: int | None = None) -> str:
    """The backend that runs the update of state ``X``: ``requested``, else the value of
    `BACKEND_ENV`, else ``auto``. A forced backend that cannot run ``X`` is an error.
    ``channels``: the value channels of ``X`` (default ``X.shape[-1]``, as for ``(..., d, d_v)``
    states; give it for a flat state)."""
    name = requested or os.environ.get(BACKEND_ENV) or "auto"
    channels = X.shape[-1] if channels is None else channels
    if name == "auto":
        for candidate in AUTO.get(X.device.type, ()):
            if BACKENDS[candidate].unsupported(X, channels) is None:
                return candidate
        return "reference"
    check_choice("delta update backend", name, ["auto", *BACKENDS])
    reason = BACKENDS[name].unsupported(X, channels)
    if reason is not None:
        raise ValueError(f"delta update backend {name!r} cannot run this state: {reason}")
    return name
