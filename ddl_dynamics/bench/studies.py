"""Whether the default ``train.compile`` pays on the work the shipped studies do: each study's
representative cell, the group its run spent longest on, trained eagerly and then at the
default, compiling included, with inductor's cache cold."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import multiprocessing
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from ..experiment.cells import expand_cells
from ..experiment.compiling import CACHE_ENV
from ..experiment.config import TrainConfig
from ..experiment.reader import load_experiment
from ..experiment.threads import torch_threads
from ..experiment.train import run_cells, seed_groups
from .timing import machine_load, matmul_rate, timing

#: What a study folder of results holds that this benchmark reads.
STUDY_FILES = ("experiment.toml", "cells.csv")

#: The two ways each study's group is trained.
MODES = ("eager", "default")


def bench_studies(
    results: str | Path = "results",
    seeds: Sequence[int] | None = None,
    studies: Sequence[str] | None = None,
    runs: int = 3,
) -> list[dict[str, Any]]:
    """Each study in ``results`` (or those named in ``studies``): its longest group
    (`longest_row`), cut to ``seeds`` where given, trained eagerly and at the default
    ``train.compile``, on one torch thread, ``runs`` times each way, the order alternating
    (eager first, then default first), each run in a process of its own started for it whose
    inductor cache is a new empty folder (the first compile of every shape is cold).

    Returns one row per study: the ``task`` and ``model`` labels, ``members`` and ``steps``,
    ``eager_s`` and ``default_s`` (the fastest run's wall seconds of training, evaluation and
    compiling included; every run's in ``eager_runs_s`` and ``default_runs_s``),
    ``x_default`` (eager over default), whether the default ``compiled`` in any run and its
    longest ``compile_s``, the fastest runs' training GFLOP/s (three times the counted forward
    FLOPs per sample, times batch, steps and members) beside ``matmul_gflop_per_s``, and the
    load before the first run and after the last.
    """
    if runs < 1:
        raise ValueError(f"runs: expected at least 1 run each way, got {runs}")
    folders = [
        folder
        for folder in sorted(Path(results).iterdir())
        if all((folder / name).is_file() for name in STUDY_FILES)
        and (not studies or folder.name in studies)
    ]
    missing = sorted(set(studies or ()) - {f.name for f in folders})
    if missing:
        raise ValueError(f"no study {missing[0]!r} in {results}")
    rows = []
    for folder in folders:
        measured = []
        for run in range(runs):
            order = MODES if run % 2 == 0 else MODES[::-1]
            with tempfile.TemporaryDirectory() as cache, _cold_process(cache) as pool:
                measured.append(pool.submit(_measure, str(folder), seeds, order).result())
        rows.append(_fastest(measured))
    return rows


def longest_row(cells_csv: Path) -> tuple[str, str]:
    """The ``(task, model)`` labels of the row whose cells took longest in the shipped run."""
    seconds: dict[tuple[str, str], float] = defaultdict(float)
    with cells_csv.open(newline="") as f:
        for row in csv.DictReader(f):
            seconds[row["task"], row["model"]] += float(row["wall_time"] or 0)
    return max(seconds, key=lambda k: seconds[k])


@contextlib.contextmanager
def _cold_process(cache: str) -> Iterator[ProcessPoolExecutor]:
    """A pool of one new process whose inductor cache is the folder ``cache``: spawned, not
    forked from a server started earlier, so that nothing compiled or cached before is in it."""
    before = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = cache  # the process reads it as it starts
    try:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            yield pool
    finally:
        if before is None:
            del os.environ[CACHE_ENV]
        else:
            os.environ[CACHE_ENV] = before


def _measure(folder: str, seeds: Sequence[int] | None, order: Sequence[str]) -> dict[str, Any]:
    """One run of `bench_studies` for the study in ``folder``, measured in this process:
    its longest group trained in each mode of ``order`` in turn."""
    task, model = longest_row(Path(folder) / "cells.csv")
    config = load_experiment(Path(folder) / "experiment.toml")
    cells = expand_cells(config, seeds=seeds, only={"task": [task], "model": [model]})
    group = max(seed_groups(cells), key=len)  # one, unless the model cannot fold
    row: dict[str, Any] = {
        "study": Path(folder).name,
        "task": task,
        "model": model,
        "members": len(group),
        "steps": group[0].train.steps,
        "load_before": machine_load(),
    }
    with torch_threads(1):
        for name in order:
            mode = TrainConfig().compile if name == "default" else False
            trained = [
                dataclasses.replace(c, train=dataclasses.replace(c.train, compile=mode))
                for c in group
            ]
            start = time.perf_counter()
            results = [t.result for t in run_cells(trained)]
            seconds = time.perf_counter() - start
            flops = sum(
                3 * (r.flops or 0) * c.train.batch_size * c.train.steps
                for r, c in zip(results, group, strict=True)
            )
            row[f"{name}_s"] = seconds
            row[f"{name}_gflop_per_s"] = flops / seconds / 1e9
            row[f"{name}_status"] = sorted({r.status for r in results})
            if name == "default":
                row["compiled"] = any(r.metrics.get("compiled") for r in results)
                row["compile_s"] = max(
                    (r.metrics.get("compile_s", 0.0) for r in results), default=0.0
                )
        with timing(1, "cpu") as (clock, sync):
            row["matmul_gflop_per_s"] = matmul_rate(clock, sync)
    row["load_after"] = machine_load()
    return row


def _fastest(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs of one study as one row: each mode's fastest run, every run's seconds kept."""
    row = dict(runs[0])
    for name in MODES:
        best = min(runs, key=lambda r: r[f"{name}_s"])
        for key in ("s", "gflop_per_s"):
            row[f"{name}_{key}"] = best[f"{name}_{key}"]
        row[f"{name}_runs_s"] = [r[f"{name}_s"] for r in runs]
        row[f"{name}_status"] = sorted({s for r in runs for s in r[f"{name}_status"]})
    row["compiled"] = any(r["compiled"] for r in runs)
    row["compile_s"] = max(r["compile_s"] for r in runs)
    row["matmul_gflop_per_s"] = max(r["matmul_gflop_per_s"] for r in runs)
    row["load_after"] = runs[-1]["load_after"]
    row["x_default"] = row["eager_s"] / row["default_s"]
    return row


def format_studies_table(rows: list[dict[str, Any]]) -> str:
    """The rows of `bench_studies` as a plain-text table: each mode's fastest run, then
    every run's seconds."""
    lines = [
        f"{'study':>22} {'row':>40} {'members':>7} {'steps':>5} {'eager s':>8} "
        f"{'default s':>9} {'×default':>8} {'compile s':>9} {'GFLOP/s eager':>13} "
        f"{'default':>7} {'matmul 256³':>11}  runs eager | default  load"
    ]
    for r in rows:
        compile_s = f"{r['compile_s']:.1f}" if r["compiled"] else "eager"
        runs = " | ".join(" ".join(f"{s:.1f}" for s in r[f"{name}_runs_s"]) for name in MODES)
        lines.append(
            f"{r['study']:>22} {r['task'] + ' × ' + r['model']:>40} {r['members']:>7} "
            f"{r['steps']:>5} {r['eager_s']:>8.1f} {r['default_s']:>9.1f} "
            f"{r['x_default']:>8.2f} {compile_s:>9} {r['eager_gflop_per_s']:>13.2f} "
            f"{r['default_gflop_per_s']:>7.2f} {r['matmul_gflop_per_s']:>11.1f}  "
            f"{runs}  {r['load_before']} → {r['load_after']}"
        )
    return "\n".join(lines)
