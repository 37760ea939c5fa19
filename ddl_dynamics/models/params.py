"""Parameter counts, and sizing ``hidden`` so that families compare at equal parameter counts."""

from __future__ import annotations

from functools import cache
from typing import Any

import torch
from torch import nn

from .._checks import check_int
from .base import make_model


def count_parameters(model: nn.Module) -> int:
    """Number of distinct parameter entries (weights shared across steps count once)."""
    return sum(p.numel() for p in model.parameters())


def parameter_count(name: str, **config: Any) -> int:
    """Parameters of ``make_model(name, **config)``, built on the meta device (no weights)."""
    return _count(name, _frozen(config))


def match_hidden(name: str, target_params: int, **config: Any) -> int:
    """The ``hidden`` size at which ``make_model(name, hidden=h, **config)`` has the parameter
    count closest to ``target_params``; ``ValueError`` unless it lies within ±10%.

    Models are built on the meta device, so the search allocates no weights; its results
    are remembered, as an experiment file asks for the same sizes again and again.
    """
    if "hidden" in config:
        raise ValueError("match_hidden chooses hidden itself; do not pass it")
    check_int("target_params", target_params, 1)
    return _match_hidden(name, target_params, _frozen(config))


def _frozen(config: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(config.items()))


@cache
def _count(name: str, config: tuple[tuple[str, Any], ...]) -> int:
    with torch.device("meta"):
        return count_parameters(make_model(name, **dict(config)))


@cache
def _match_hidden(name: str, target: int, config: tuple[tuple[str, Any], ...]) -> int:
    def count(h: int) -> int:
        return _count(name, _frozen({**dict(config), "hidden": h}))

    lo, hi = 1, 1  # parameter counts grow with hidden: bracket the target, then search
    while count(hi) < target:
        if count(hi) == count(2 * hi):
            raise ValueError(f"model {name!r}: the parameter count does not depend on hidden")
        lo, hi = hi, 2 * hi
    while hi - lo > 1:  # interpolate (exact at once where counts are affine in hidden)
        mid = lo + (target - count(lo)) * (hi - lo) // max(count(hi) - count(lo), 1)
        mid = min(max(mid, lo + 1), hi - 1)
        lo, hi = (mid, hi) if count(mid) < target else (lo, mid)
    best = min((lo, hi), key=lambda h: abs(count(h) - target))
    got = count(best)
    if abs(got - target) > 0.1 * target:
        raise ValueError(
            f"model {name!r} cannot match {target} parameters within 10% by its hidden "
            f"size with {dict(config)}: the closest is {got} at hidden={best}"
        )
    return best
