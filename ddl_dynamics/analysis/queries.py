"""The gate audit at query tokens: where a sequence task states the regime its rewrites
need (``swap-track``: a swap is a reflection, β > 1.75), how often does each trained Delta
block's gate sit in it, sublayer by sublayer, at the tokens that are scored?

The queries are where the state must hold the answer, so a block that tracks by reflecting
should reflect there. The write-only control's β only scales its write, so its share is the
level a gate reaches without an erase term to reflect with: the audit draws both, per setting
of the task, each share the mean over seeds with its 95% CI.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from .._task import IGNORE_INDEX, Task, make_task
from ..models.operator import REGIMES
from .judge.regimes import regime_fractions
from .judge.stats import Estimate
from .probes import load_probes, updates_per_sublayer
from .run import Run


@dataclass(frozen=True)
class QueryGates:
    """One Delta row's gates at the scored tokens of one task setting."""

    task: str
    model: str
    #: The regime the task states, whose share is counted.
    regime: str
    #: Per sublayer (attention, MLP, attention, …), each sublayer's delta updates in turn:
    #: the share of scored tokens whose gate is in ``regime``, over seeds.
    shares: tuple[Estimate, ...]
    #: Delta updates per sublayer (n_h of a product block, else 1).
    updates: int = 1


def scored(task: Task, seed: int, tokens: np.ndarray) -> np.ndarray:
    """``(n, T)``: which of the probed test tokens are scored, from the task's own test split
    sampled again as the probe did (the tokens must match)."""
    data = task.sample(tokens.shape[0], seed, "test")
    if not np.array_equal(data.inputs.numpy(), tokens):
        raise ValueError(
            f"{type(task).__name__}: the probed tokens are not the test split of "
            f"seed {seed}; probe the run again"
        )
    return data.targets.numpy() != IGNORE_INDEX


def seed_shares(beta: np.ndarray, queries: np.ndarray, regime: str) -> np.ndarray:
    """Per sublayer, the share of the query tokens whose gate is in ``regime``.

    Args:
        beta: ``(n · T, sublayers)`` a probe's gates, token by token.
        queries: ``(n, T)`` the scored tokens.
    """
    return regime_fractions(beta[queries.reshape(-1)])[:, REGIMES.index(regime)]


def query_gates(run: Run) -> list[QueryGates]:
    """`QueryGates` of every probed Delta row (with the erase term or not) on a sequence task
    that states regimes, pooled per setting and row."""
    found: dict[tuple[str, str, str, int], list[np.ndarray]] = defaultdict(list)
    for row, arrays in load_probes(run):
        if "test_tokens" not in arrays or "beta" not in arrays:
            continue
        task = make_task(row.config["task"], **row.config.get("spec", {}))
        queries = scored(task, row.seed, arrays["test_tokens"])
        for regime in task.regimes:
            key = row.task, row.model, regime, updates_per_sublayer(row)
            found[key].append(seed_shares(arrays["beta"], queries, regime))
    return [
        QueryGates(
            task,
            model,
            regime,
            tuple(Estimate.of(list(column)) for column in np.stack(seeds).T),
            updates,
        )
        for (task, model, regime, updates), seeds in sorted(found.items())
    ]
