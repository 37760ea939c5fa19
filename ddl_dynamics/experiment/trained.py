"""What training a cell hands to the run folder: its row and its weights, a plain value that
a worker returns and the run's own process saves, so that saving needs no trainer."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from .result import RunResult


@dataclass
class Trained:
    """What training a cell produced: its row and, unless it failed, its weights (CPU); a
    plain value, which the run's process saves (`save`)."""

    result: RunResult
    weights: dict[str, Tensor] | None = None
