"""The gate audit of multi-hop look-ups: at a query token, does the Delta block's gate project
(β ≈ 1, the ``projection`` regime) at the attention sublayer that performs a hop?

A task that answers a query by following references gives, for every token, the positions a
query must read, one per hop (``hop_positions(tokens)``, as ``var-chain`` does). From the
probes of a trained Transformer (its gates per token and sublayer, and the key position each
attention head weighs most from every token), an attention sublayer *hops* at a query token
when one of its heads looks at one of those positions. Per Delta row (with the erase term)
and knob value, over seeds: the share of gates in the projection regime at the sublayers that
hop and at the query token's other sublayers, the share of a query's hops that some head
looked at (does attention follow the chain at all?), and the mean gate of every sublayer at
query tokens.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch

from .._task import Task, make_task
from ..experiment.result import RunResult
from ..models.operator import REGIMES, regime_index
from .judge.stats import Estimate
from .probes import erases, load_probes, updates_per_sublayer
from .run import Run

#: The regime a hop that replaces the referent a token holds should use.
HOP_REGIME = "projection"

#: A curve over the knob: (knob value, estimate over seeds) by increasing knob value.
KnobCurve = tuple[tuple[float, Estimate], ...]


@dataclass(frozen=True)
class HopAudit:
    """One Delta row's gates at the query tokens of one setting of a multi-hop task."""

    model: str
    family: str
    knob: str
    #: The other spec values that tell this setting from the family's others ("" if one).
    setting: str
    at_hops: KnobCurve  # share of the hopping sublayers' gates that project
    elsewhere: KnobCurve  # share of the query token's other sublayers' gates that project
    followed: KnobCurve  # share of a query's hops some attention head looked at
    #: (knob value, mean β of every sublayer at query tokens, pooled over seeds)
    profile: tuple[tuple[float, tuple[float, ...]], ...]
    #: Delta updates per sublayer, one profile entry each (n_h of a product block, else 1).
    updates: int = 1


def seed_audit(hops: np.ndarray, looks: np.ndarray, beta: np.ndarray) -> dict[str, object]:
    """One trained model's shares on its probed test sequences.

    Args:
        hops: ``(n, T, hops)`` the positions each query reads, −1 at other tokens.
        looks: ``(n, T, depth, heads)`` the key position each head weighs most.
        beta: ``(n, T, 2 · depth · n_h)`` gates, sublayers attention, MLP, attention, …,
            each sublayer's n_h updates in turn (n_h = 1 but in a Householder-product block).
    """
    queries = hops[..., 0] >= 0  # (n, T)
    seen = (looks[..., None] == hops[:, :, None, None, :]) & (hops[:, :, None, None, :] >= 0)
    n, length, depth = looks.shape[:3]
    hopping = np.zeros((n, length, depth, 2, beta.shape[-1] // (2 * depth)), dtype=bool)
    hopping[..., 0, :] = seen.any(axis=(-1, -2))[..., None]  # a head looks at a hop
    hopping = hopping.reshape(beta.shape)
    projecting = regime_index(torch.as_tensor(beta)).numpy() == REGIMES.index(HOP_REGIME)
    at, other = hopping[queries], ~hopping[queries]
    return {
        "at_hops": float(projecting[queries][at].mean()) if at.any() else None,
        "elsewhere": float(projecting[queries][other].mean()) if other.any() else None,
        "followed": float(seen.any(axis=(2, 3))[queries].mean()),
        "profile": beta[queries].mean(axis=0),
    }


def auditable(row: RunResult) -> Task | None:
    """The task of a cell the audit reads: a Delta row with the erase term on a sequence
    task with hops (`Task.has_hops`) and a knob; None for any other cell."""
    if not erases(row) or "task" not in row.config:
        return None
    task = make_task(row.config["task"], **row.config.get("spec", {}))
    return task if task.kind == "sequence" and task.knob and task.has_hops else None


def hop_audit(run: Run) -> list[HopAudit]:
    """`HopAudit` of every probed Delta row on a task with hops and a knob (needs the
    run's probes, with their tokens and attention)."""
    probed = []
    for row, arrays in load_probes(run):
        if "test_looks" in arrays and (task := auditable(row)) is not None:
            probed.append((row, task, arrays))
    specs = defaultdict(list)  # family → the specs it ran with
    for row, _, _ in probed:
        specs[row.config["task"]].append(row.config["spec"])
    found: dict[tuple[str, str, str, str, int], dict[float, list[dict]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for row, task, arrays in probed:
        family, spec, knob = row.config["task"], row.config["spec"], task.knob
        if knob is None:  # (an auditable task has one)
            raise ValueError(f"task {family!r} has no knob to audit hops along")
        tokens = torch.as_tensor(arrays["test_tokens"])
        beta = arrays["beta"].reshape(*tokens.shape, -1)
        hops = task.hop_positions(tokens)
        audit = seed_audit(hops.numpy(), arrays["test_looks"], beta)
        shown = [
            f"{k}={v}"
            for k, v in sorted(spec.items())
            if k != knob and any(s.get(k) != v for s in specs[family])
        ]
        key = row.model, family, knob, ",".join(shown), updates_per_sublayer(row)
        found[key][float(spec[knob])].append(audit)
    return [
        HopAudit(
            *key[:4],
            _curve(by_value, "at_hops"),
            _curve(by_value, "elsewhere"),
            _curve(by_value, "followed"),
            tuple(
                (v, tuple(np.mean([a["profile"] for a in by_value[v]], axis=0).tolist()))
                for v in sorted(by_value)
            ),
            key[4],
        )
        for key, by_value in sorted(found.items())
    ]


def _curve(by_value: dict[float, list[dict]], name: str) -> KnobCurve:
    """The seeds' ``name`` at every knob value, as estimates by increasing knob value."""
    return tuple((v, Estimate.of([a[name] for a in by_value[v]])) for v in sorted(by_value))
