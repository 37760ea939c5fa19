"""An experiment's wall time trained from scratch, with seeds together or one by one, on one
or more workers."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..experiment.config import ExperimentConfig
from ..experiment.reader import load_experiment
from ..experiment.runner import run_experiment
from .timing import machine_load

#: (vectorize, jobs) of the suite benchmark's runs, the first being the reference.
SUITE_RUNS = ((False, 1), (True, 1), (False, 2), (True, 2))


def bench_suite(
    experiment: str | Path | ExperimentConfig,
    only: Mapping[str, Sequence[str]] | None = None,
    seeds: Sequence[int] | None = None,
    runs: Iterable[tuple[bool, int]] = SUITE_RUNS,
    device: str | None = None,
    bf16: bool = False,
) -> list[dict[str, Any]]:
    """Wall time of an experiment (or its ``only`` subset) trained from scratch, once per
    ``(vectorize, jobs)`` in ``runs``, each into a fresh temporary run folder.

    Wall time counts every core a run uses, so other processes on the machine inflate it:
    each row carries the load averages before and after. ``device`` overrides the cells'
    device; ``bf16`` turns on bfloat16 autocast for them (CUDA only).

    Returns one row per run: ``vectorize``, ``jobs``, ``cells``, ``counts`` (statuses),
    ``wall_s`` and ``x_first`` (over the first run's wall time).
    """
    config = experiment if isinstance(experiment, ExperimentConfig) else load_experiment(experiment)
    if bf16:
        config = dataclasses.replace(config, train_defaults={**config.train_defaults, "bf16": True})
    rows: list[dict[str, Any]] = []
    for vectorize, jobs in runs:
        load = machine_load()
        with tempfile.TemporaryDirectory() as run_dir:
            summary = run_experiment(
                config,
                run_dir,
                jobs=jobs,
                device=device,
                seeds=seeds,
                only=only,
                vectorize=vectorize,
                progress=False,
            )
        rows.append(
            {
                "vectorize": vectorize,
                "jobs": jobs,
                "cells": sum(summary.counts.values()),
                "counts": summary.counts,
                "wall_s": summary.wall_time,
                "x_first": summary.wall_time / (rows[0]["wall_s"] if rows else summary.wall_time),
                "load_before": load,
                "load_after": machine_load(),
            }
        )
    return rows


def format_suite_table(rows: list[dict[str, Any]]) -> str:
    """The rows of `bench_suite` as a plain-text table."""
    lines = [f"{'seeds':>12} {'jobs':>4} {'cells':>5} {'wall s':>8} {'×first':>6}  load"]
    for r in rows:
        seeds = "together" if r["vectorize"] else "one by one"
        lines.append(
            f"{seeds:>12} {r['jobs']:>4} {r['cells']:>5} {r['wall_s']:>8.1f} "
            f"{r['x_first']:>6.2f}  {r['load_before']} → {r['load_after']}"
        )
    return "\n".join(lines)
