"""The memory layouts the fused kernels of the Delta update address (the C++ kernel of
`delta_kernels` and the Triton ones of `_delta_triton`): row-major tensors of one
dtype, and for the C++ kernel states held channels first. A module of its own so that both
backends import it and neither imports the other."""

from __future__ import annotations

import torch
from torch import Tensor


def contiguous(*tensors: Tensor, dtype: torch.dtype | None = None) -> list[Tensor]:
    """``tensors`` in row-major layout (and ``dtype``), as the fused kernels address them."""
    return [(t if dtype in (None, t.dtype) else t.to(dtype)).contiguous() for t in tensors]


def channels_first(X: Tensor) -> bool:
    """Whether the state ``X (..., d, d_v)``, ``d_v > 1``, is held channel by channel: ``X.mT``
    row-major, as the Transformer holds its expanded state."""
    return X.dim() >= 2 and X.shape[-1] > 1 and not X.is_contiguous() and X.mT.is_contiguous()


def like(X: Tensor, Y: Tensor) -> Tensor:
    """``Y``, shaped as ``X``, in the memory layout `torch.empty_like` gives ``X`` (its
    own, where ``X`` is dense): the layout the update's op promises for ``Y`` and ``dX``, which
    ``torch.compile`` holds it to."""
    if Y.stride() == X.stride() or (X.is_contiguous() and Y.is_contiguous()):
        return Y
    out = torch.empty_like(X, dtype=Y.dtype)
    return Y if out.stride() == Y.stride() else out.copy_(Y)
