"""The stream-mixing audit of the trained stacks that mix residual streams (``hc``, ``mhc``):
did training move each layer's static mixing matrix H away from the identity, and from where
it started?

A stream-mixing row read as "no difference detected" against ``resnet`` may never have mixed
its streams: ``hc`` starts at H = I, no stream mixed into another (and, with its starting
read and write weights, exactly ``resnet``). The audit reads the stored weights of every
cell the report shows (`usable_rows`) and the same cell built afresh, so nothing here
assumes what the family starts at: ``mhc``'s Sinkhorn makes its start a mixing, not I.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor

from ..experiment.config import Cell
from .probes import declares, usable_rows
from .run import Run


@dataclass(frozen=True)
class MixingRow:
    """How far one stream-mixing row's static mixing matrices H moved on one task, over the
    layers of every shown seed: ‖H − I‖_F (``from_identity``) and ‖H − H_init‖_F
    (``from_start``; H_init: the same cell built afresh), mean and max; ``start`` is the mean
    ‖H_init − I‖_F, where the family starts."""

    task: str
    model: str
    seeds: int
    streams: int
    from_identity: float
    from_identity_max: float
    from_start: float
    from_start_max: float
    start: float


def mixing_rows(run: Run) -> list[MixingRow]:
    """One row per task × shown row whose family `mixes_streams`, pooled over the seeds with
    stored weights (none, in a run made of rows alone)."""
    pairs: dict[tuple[str, str], list[tuple[Tensor, Tensor]]] = defaultdict(list)
    for row in usable_rows(run):
        if run.folder is not None and declares(row, "mixes_streams"):
            _, trained = run.folder.load_model(row.key)
            _, fresh = Cell.from_dict(row.config).build()
            pairs[row.task, row.model].append((_mixing(trained), _mixing(fresh)))
    return [_pooled(task, model, found) for (task, model), found in sorted(pairs.items())]


def _mixing(model: Any) -> Tensor:
    return cast(Tensor, model.stream_mixing()).float()


def _pooled(task: str, model: str, found: list[tuple[Tensor, Tensor]]) -> MixingRow:
    """The Frobenius distances of every layer of every seed, pooled."""
    trained = torch.cat([h for h, _ in found])
    start = torch.cat([h for _, h in found])
    eye = torch.eye(trained.shape[-1])
    moved = torch.linalg.matrix_norm(trained - eye)
    left = torch.linalg.matrix_norm(trained - start)
    return MixingRow(
        task,
        model,
        len(found),
        trained.shape[-1],
        moved.mean().item(),
        moved.max().item(),
        left.mean().item(),
        left.max().item(),
        torch.linalg.matrix_norm(start - eye).mean().item(),
    )
