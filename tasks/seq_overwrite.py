"""Latest-write recall: a stream of "set slot s to c" tokens with interleaved reads.

The erase-and-rewrite the Delta operator is built for, asked over tokens: a slot's value
changes every few tokens, and a read must return the latest write to its slot, not an
earlier one. Tokens: ``w(s, c) = s·C + c`` writes value ``c`` into slot ``s`` (S slots, C
values); ``r(s) = S·C + s`` reads slot ``s``. The stream opens with one write per slot in
random order, so every slot is set before it is read; then each position is a read of a
random slot with probability ``read_prob``, else a random write, and the last position is
always a read. The target of a read is
the token of the latest write to its slot; nothing else is scored. Train, val and test
hold whole streams out from each other (`held_out`). Example (S = 2, C = 4)::

    inputs    w(1,3)  w(0,1)  r(1)    w(1,0)  r(1)    r(0)
    tokens    7       1       9       4       9       8
    targets   ·       ·       7       ·       4       1
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


@register_task("seq-overwrite")
@dataclass(frozen=True)
class SeqOverwrite(SequenceTask):
    """Slot writes with interleaved reads; a read's answer is the latest write to its slot.

    Spec: ``slots`` S, ``values`` C, ``read_prob``. Accuracy on read positions only.
    """

    length: int = 32
    slots: int = 4
    values: int = 8
    read_prob: float = 0.5

    regime: ClassVar = "erase and rewrite over tokens: only the latest write to a slot counts"

    def __post_init__(self) -> None:
        if self.slots < 1 or self.values < 2:
            raise ValueError(f"need slots ≥ 1 and values ≥ 2, got {self.slots}, {self.values}")
        if not 0.0 < self.read_prob < 1.0:
            raise ValueError(f"read_prob must lie in (0, 1), got {self.read_prob}")
        if self.length <= self.slots:
            raise ValueError(
                f"length must exceed slots = {self.slots} (one opening write "
                f"per slot, then reads), got {self.length}"
            )

    @property
    def in_dim(self) -> int:
        return self.slots * self.values + self.slots

    @property
    def out_dim(self) -> int:
        return self.in_dim

    @property
    def floor(self) -> float:
        """Answering a read with a write to its slot (the slot is in the read's token) of a
        random value: right 1 in ``values``, without recalling the latest write."""
        return 1 / self.values

    def tokens(self, n: int, T: int, g: torch.Generator) -> Tensor:
        """``n`` token streams: one opening write per slot, then reads and writes."""
        S, C = self.slots, self.values
        slot = torch.randint(0, S, (n, T), generator=g)
        slot[:, :S] = torch.rand(n, S, generator=g).argsort(1)  # every slot written first
        value = torch.randint(0, C, (n, T), generator=g)
        read = torch.rand(n, T, generator=g) < self.read_prob
        read[:, :S], read[:, -1] = False, True
        return torch.where(read, S * C + slot, slot * C + value)

    def answers(self, inputs: Tensor) -> Tensor:
        """The latest write to the slot of every read; IGNORE_INDEX elsewhere."""
        writes = self.slots * self.values
        targets = torch.full_like(inputs, IGNORE_INDEX)
        latest = torch.zeros(len(inputs), self.slots, dtype=torch.long)  # per slot
        rows = torch.arange(len(inputs))
        for t in range(inputs.shape[1]):
            token = inputs[:, t]
            read = token >= writes
            targets[read, t] = latest[rows[read], token[read] - writes]
            latest[rows[~read], token[~read] // self.values] = token[~read]
        return targets
