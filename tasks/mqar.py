"""Multi-query associative recall (MQAR), in the format of Zoology (Arora et al. 2023).

A sequence lists ``N`` key–value pairs, then queries each key once; at a query the model
must output the value that followed that key. Keys come from the lower half of the
vocabulary (never token 0), values from the upper half, each key once per sequence; queries
sit at even offsets of the query region, drawn with a power law that favours short gaps
(Zoology's ``power_a = 0.01``), and every other position holds token 0, never a key or a
value. (Zoology can fill them with random tokens instead; with a vocabulary this small those
would repeat keys and make recall ambiguous.) Only query positions are scored; train, val
and test hold whole sequences out from each other (`held_out`). Layout
(V = 16, N = 2, T = 10)::

    position  0  1   2  3   | 4  5  6   7  8  9
    inputs    3  12  6  9   | 6  0  3   0  0  0       (k1 v1 k2 v2 | queries of 6 and 3)
    targets   ·  ·   ·  ·   | 9  ·  12  ·  ·  ·       (·: not scored)

Over tokens this is the recall a Delta memory performs (DeltaNet); here the memory is the
attention over the context, and the Delta rule acts over depth on each token's state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from ddl_dynamics import (
    IGNORE_INDEX,
    SequenceTask,
    register_task,
)


@register_task("mqar")
@dataclass(frozen=True)
class MQAR(SequenceTask):
    """Multi-query associative recall (Zoology): key–value pairs, then a query of each key.

    Spec: ``vocab`` (even), ``length`` T, ``pairs`` N. Accuracy on query positions only.
    """

    length: int = 32
    vocab: int = 64
    pairs: int = 4

    regime: ClassVar = "associative recall over tokens: attention retrieves, each sublayer rewrites"
    #: Zoology's power law over query gaps: p(gap = i) ∝ i^(power_a − 1).
    power_a: ClassVar[float] = 0.01

    def __post_init__(self) -> None:
        if self.vocab % 2 or self.vocab < 4:
            raise ValueError(f"vocab must be even and at least 4, got {self.vocab}")
        if not 1 <= self.pairs < self.vocab // 2:
            raise ValueError(
                f"pairs must lie in [1, vocab/2 − 1 = {self.vocab // 2 - 1}] "
                f"(distinct keys from the lower half), got {self.pairs}"
            )
        if self.length < 4 * self.pairs:
            raise ValueError(
                f"length must be at least 4 · pairs = {4 * self.pairs} (the pairs, "
                f"then a query slot per key), got {self.length}"
            )

    @property
    def in_dim(self) -> int:
        return self.vocab

    @property
    def out_dim(self) -> int:
        return self.vocab

    @property
    def floor(self) -> float:
        """Answering a query with a random one of the sequence's ``pairs`` values, each
        distinct: right 1 in ``pairs``, without recall."""
        return 1 / self.pairs

    def tokens(self, n: int, T: int, g: torch.Generator) -> Tensor:
        """``n`` sequences: the pairs, then each key once at a power-law-drawn query slot."""
        half, N = self.vocab // 2, self.pairs
        keys = torch.rand(n, half - 1, generator=g).argsort(1)[:, :N] + 1  # distinct, in 1..V/2−1
        values = torch.rand(n, half, generator=g).argsort(1)[:, :N] + half  # distinct, upper half
        slots = (T - 2 * N) // 2  # query slots: even offsets of the query region
        p = torch.arange(1, slots + 1, dtype=torch.float64) ** (self.power_a - 1)
        where = torch.multinomial(p.expand(n, slots), N, replacement=False, generator=g)
        inputs = torch.zeros(n, T, dtype=torch.long)
        inputs[:, 0 : 2 * N : 2], inputs[:, 1 : 2 * N : 2] = keys, values
        return inputs.scatter_(1, 2 * N + 2 * where, keys)

    def answers(self, inputs: Tensor) -> Tensor:
        """At every query, the value paired with its key; IGNORE_INDEX elsewhere."""
        N = self.pairs
        keys, values = inputs[:, 0 : 2 * N : 2], inputs[:, 1 : 2 * N : 2]  # (n, N)
        match = inputs[:, :, None] == keys[:, None, :]  # (n, T, N)
        match[:, : 2 * N] = False  # the pairs themselves are not queries
        answer = (match * values[:, None, :]).sum(-1)
        return torch.where(match.any(-1), answer, IGNORE_INDEX)
