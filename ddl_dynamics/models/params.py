"""Parameter counts, and sizing ``hidden`` so that families compare at equal parameter counts."""

from __future__ import annotations

from functools import cache
from typing import Any

import torch
from torch import nn

from .base import check_int, make_model


def count_parameters(model: nn.Module) -> int:
    """Number of distinct parameter entries (weights shared across steps count once)."""
    return sum(p.numel() for p in model.parameters())


def match_hidden(name: str, target_params: int, **config: Any) -> int:
    """The ``hidden`` size at which ``make_model(name, hidden=h, **config)`` has the parameter
    count closest to ``target_params``; ``ValueError`` unless it lies within ±10%.

    Models are built on the meta device, so the search allocates no weights.
    """
    if "hidden" in config:
        raise ValueError("match_hidden chooses hidden itself; do not pass it")
    check_int("target_params", target_params, 1)

    @cache
    def count(h: int) -> int:
        with torch.device("meta"):
            return count_parameters(make_model(name, hidden=h, **config))

    lo, hi = 1, 1  # parameter counts grow with hidden: bracket the target, then bisect
    while count(hi) < target_params:
        if count(hi) == count(2 * hi):
            raise ValueError(f"model {name!r}: the parameter count does not depend on hidden")
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if count(mid) < target_params else (lo, mid)
    best = min((lo, hi), key=lambda h: abs(count(h) - target_params))
    got = count(best)
    if abs(got - target_params) > 0.1 * target_params:
        raise ValueError(
            f"model {name!r} cannot match {target_params} parameters within 10% by its hidden "
            f"size with {config}: the closest is {got} at hidden={best}"
        )
    return best
