"""Member-major folded batches: the members' data as one batch and each member's rows back,
on a device, in an endless shuffled order.

An ensemble runs on a batch concatenated member by member (rows ``[s·n, (s+1)·n)`` are
member ``s``'s); its outputs split back the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from .._task import TaskData


def fold_data(parts: Sequence[TaskData]) -> TaskData:
    """The members' data as one batch, member by member."""
    folded: dict[str, Any] = {
        n: torch.cat([getattr(p, n) for p in parts]) for n in _tensors(parts[0])
    }
    return dataclasses.replace(parts[0], **folded)


def unfold(folded: Tensor, size: int) -> Tensor:
    """``(size · n, …)`` → ``(size, n, …)``: each member's rows."""
    return folded.unflatten(0, (size, -1))


def to_device(data: TaskData, device: torch.device | str) -> TaskData:
    """``data`` with every tensor on ``device``."""
    return dataclasses.replace(data, **{n: getattr(data, n).to(device) for n in _tensors(data)})


def _tensors(data: TaskData) -> list[str]:
    """The names of the fields of ``data`` that hold tensors."""
    return [f.name for f in dataclasses.fields(data) if isinstance(getattr(data, f.name), Tensor)]


def minibatches(n: int, batch_size: int, generator: torch.Generator) -> Iterator[Tensor]:
    """Endless minibatch indices: a fresh permutation of the training set each epoch."""
    batch_size = min(batch_size, n)
    while True:
        perm = torch.randperm(n, generator=generator)
        for i in range(0, n - batch_size + 1, batch_size):
            yield perm[i : i + batch_size]
