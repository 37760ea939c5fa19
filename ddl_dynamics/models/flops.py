"""Counting FLOPs: torch's ``FlopCounterMode``, with the formulas it lacks registered into
torch's global registry when a counter is made, never on import.

``FlopCounterMode`` counts the CUDA attention kernels but not the CPU one, which would leave
attention out of the FLOPs of a CPU run; `flop_counter` counts it with the same formulas. (The
Delta operator's own op carries its formula where it is defined,
`ddl_dynamics.models.operator`.)
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import flop_counter as torch_flops
from torch.utils.flop_counter import FlopCounterMode


def flop_counter() -> FlopCounterMode:
    """A silent ``FlopCounterMode`` that counts attention on the CPU too."""
    count_cpu_attention()
    return FlopCounterMode(display=False)


def count_cpu_attention() -> None:
    """Register the FLOPs of the CPU attention kernel, forward and backward, as torch's
    formulas for scaled dot-product attention count them (once per process)."""
    aten = torch.ops.aten
    forward = aten._scaled_dot_product_flash_attention_for_cpu
    backward = aten._scaled_dot_product_flash_attention_for_cpu_backward
    if forward in torch_flops.flop_registry:
        return

    def forward_flops(q: Any, k: Any, v: Any, *args: Any, **kwargs: Any) -> int:
        return torch_flops.sdpa_flop_count(q, k, v)

    def backward_flops(grad: Any, q: Any, k: Any, v: Any, *args: Any, **kwargs: Any) -> int:
        return torch_flops.sdpa_backward_flop_count(grad, q, k, v)

    torch_flops.register_flop_formula(forward)(forward_flops)
    torch_flops.register_flop_formula(backward)(backward_flops)
