"""How many torch threads a piece of work runs on, restored after: training and probing run
on one, as the suite's small models run fastest so (and far faster than on several threads of
a busy machine), and ``jobs`` then scales over cores."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def torch_threads(threads: int | None = 1) -> Iterator[None]:
    """Run on ``threads`` torch threads (None: leave the setting), restoring it after."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
