"""Autograd Functions that ``torch.func`` can transform, at the per-call cost of one that
it cannot."""

from __future__ import annotations

from typing import Any

import torch
from torch._functorch.utils import unwrap_dead_wrappers


class PositionalFunction(torch.autograd.Function):
    """A Function with ``setup_context`` (so ``vmap``, ``grad`` and ``jvp`` see through it)
    whose `apply` takes positional arguments only.

    ``Function.apply`` binds a ``setup_context`` Function's arguments through
    ``inspect.signature`` on every call, about 20 µs: more than the kernel of a small layer,
    and a tenth of a folded training step. Outside ``torch.func`` the arguments, all
    positional, need no binding and go straight to autograd, as ``Function.apply`` would hand
    them on.
    """

    @classmethod
    def apply(cls, *args: Any) -> Any:
        if torch._C._are_functorch_transforms_active():
            return super().apply(*args)
        # (torch's stubs leave out _FunctionBase.apply)
        return super(torch.autograd.Function, cls).apply(  # type: ignore[misc]
            *unwrap_dead_wrappers(args)
        )
