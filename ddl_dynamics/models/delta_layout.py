"""The memory layout the fused kernels of the Delta update address (the C++ kernel of
:mod:`.delta_kernels` and the Triton ones of :mod:`.delta_triton`): row-major tensors of one
dtype. A module of its own so that both backends import it and neither imports the other."""

from __future__ import annotations

import torch
from torch import Tensor


def contiguous(*tensors: Tensor, dtype: torch.dtype | None = None) -> list[Tensor]:
    """``tensors`` in row-major layout (and ``dtype``), as the fused kernels address them."""
    return [(t if dtype in (None, t.dtype) else t.to(dtype)).contiguous() for t in tensors]
