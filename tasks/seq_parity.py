"""Running parity of a bit string, trained at one length and tested at 2× and 4×.

The sequence version of ``parity``: the bits arrive as tokens and the target at every
position is the parity of the bits so far. A recurrence over tokens with negative
eigenvalues solves it at any length (Grazzi et al. 2025); a Transformer must count 1-bits
through attention, and length generalisation is the known hard part. The Delta rule acts
over depth here, on each token's state, so reflections of the shortcut do not carry parity
from token to token. Example::

    inputs    1  0  1  1  0
    targets   1  1  0  1  1

The headline metric is the accuracy over all positions in distribution; on the longer
splits it scores only the positions beyond the trained length (the first ``length`` of them
were trained on, so counting them would credit a model at chance beyond it with a quarter of
``long-4x``), and ``within_length_accuracy`` scores those first positions apart.
``final_accuracy`` scores the last position alone (on the OOD splits, the most extrapolated
one). Train, val and test hold whole bit strings out from each other
(`held_out`): at length 16 there are only 2¹⁶ of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from ddl_dynamics import IGNORE_INDEX, SequenceTask, TaskData, register_task


@register_task("seq-parity")
@dataclass(frozen=True)
class SeqParity(SequenceTask):
    """Running parity of a bit string; OOD splits at 2× and 4× the training length.

    Metric: accuracy over all positions, on a longer split over those beyond ``length``
    (``within_length_accuracy``: the others); ``final_accuracy`` at the last position.
    """

    length: int = 32

    regime: ClassVar = "counting over tokens; length extrapolation at 2× and 4×"
    length_factors: ClassVar = {"long-2x": 2, "long-4x": 4}
    ood_splits: ClassVar = tuple(length_factors)

    def __post_init__(self) -> None:
        if self.length < 1:
            raise ValueError(f"length must be at least 1, got {self.length}")

    @property
    def in_dim(self) -> int:
        return 2

    @property
    def out_dim(self) -> int:
        return 2

    @property
    def floor(self) -> float:
        """A coin: each running parity is 0 or 1 with probability 1/2."""
        return 0.5

    def tokens(self, n: int, T: int, g: torch.Generator) -> Tensor:
        return torch.randint(0, 2, (n, T), generator=g)

    def answers(self, tokens: Tensor) -> Tensor:
        """The running parity; on a sequence longer than ``length``, only beyond it."""
        parity = self.parity(tokens)
        if tokens.shape[1] > self.length:
            parity[:, : self.length] = IGNORE_INDEX
        return parity

    @staticmethod
    def parity(tokens: Tensor) -> Tensor:
        """The running parity at every position."""
        return tokens.cumsum(dim=1) % 2

    def extra_metrics(self, pred: Tensor, data: TaskData) -> dict[str, float]:
        extras = {"final_accuracy": self.metric(pred[:, -1:], data.targets[:, -1:])}
        if data.steps > self.length:
            within = self.parity(data.inputs[:, : self.length])
            extras["within_length_accuracy"] = self.metric(pred[:, : self.length], within)
        return extras
