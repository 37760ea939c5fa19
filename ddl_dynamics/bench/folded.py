"""The folded training step of the Transformer depth study (``experiments/
transformer-depth.toml``), eager against compiled (``TrainConfig.compile``), in one run: its
rows at its sizes, every seed and grid rate of a row folded into one ensemble, as the trainer
steps them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..experiment.cells import expand_cells
from ..experiment.config import Cell
from ..experiment.reader import load_experiment
from .steps import TrainingStep
from .timing import achieved_rates, eager_against_compiled, first_call_seconds, timing

#: The study whose cells are timed, and the rows of it timed by default.
DEPTH_STUDY = Path(__file__).resolve().parents[2] / "experiments" / "transformer-depth.toml"
FOLDED_VARIANTS = ("transformer", "ddl-dv1", "ddl-dv4")


def study_step(cells: Sequence[Cell], compile: bool) -> TrainingStep:
    """One training step of ``cells`` (one row's seeds and grid values on one task) folded,
    each member on its seed's first training batch, eager or compiled."""
    models, parts = [], []
    for cell in cells:
        task, model = cell.build()
        models.append(model)
        parts.append(task.sample(cell.train.batch_size, cell.seed, "train"))
    cfg = dataclasses.replace(cells[0].train, compile=compile)
    return TrainingStep.of(models, task, cfg, parts)


def study_cells(study: str | Path, task_label: str, row: str) -> list[Cell]:
    """The cells of ``row`` on ``task_label`` (an expanded label, e.g.
    ``var-chain-w32[hops=4]``): what the trainer folds into one ensemble."""
    cells = [
        c
        for c in expand_cells(load_experiment(study))
        if c.task_label == task_label and c.label == row
    ]
    if not cells:
        raise ValueError(f"{study}: no cells of row {row!r} on task {task_label!r}")
    return cells


def bench_folded(
    widths: Sequence[int] = (32,),
    hops: int = 4,
    variants: Sequence[str] = FOLDED_VARIANTS,
    study: str | Path = DEPTH_STUDY,
    repeats: int = 10,
    threads: int | None = 1,
    device: str = "cpu",
) -> list[dict[str, Any]]:
    """Each row in ``variants`` of ``study`` on ``var-chain-w{width}[hops={hops}]``: its
    folded training step (all its seeds × grid rates, the study's batch per member), eager
    and compiled, timed interleaved in one run (`achieved_rates`, beside
    the matmul rate of the same run).

    The compiled step's first call, which compiles (or loads inductor's cached kernels) and
    runs one step, is timed apart by wall clock: ``compile_s``. Returns one row per variant
    and width: members, ``eager_ms`` and ``compiled_ms`` per step, ``x_compiled`` (eager
    over compiled), each one's GFLOP/s and ``matmul_gflop_per_s``.
    """
    calls: dict[tuple[str, int, bool], Callable[[], None]] = {}
    compile_s: dict[tuple[str, int], float] = {}
    members: dict[tuple[str, int], int] = {}
    with timing(threads, device) as (clock, sync):
        for width in widths:
            for row in variants:
                cells = [
                    dataclasses.replace(c, train=dataclasses.replace(c.train, device=device))
                    for c in study_cells(study, f"var-chain-w{width}[hops={hops}]", row)
                ]
                members[row, width] = len(cells)
                for compile in (False, True):
                    step = study_step(cells, compile)
                    if compile:
                        compile_s[row, width] = first_call_seconds(step.run, sync)
                    calls[row, width, compile] = step.run
        measured = achieved_rates(calls, repeats, clock, sync, device)
    rows = []
    for (row, width), size in members.items():
        figures = eager_against_compiled(
            measured[row, width, False], measured[row, width, True], compile_s[row, width]
        )
        rows.append({"variant": row, "width": width, "hops": hops, "members": size, **figures})
    return rows


def format_folded_table(rows: list[dict[str, Any]]) -> str:
    """The rows of `bench_folded` as a plain-text table."""
    lines = [
        f"{'variant':<12} {'width':>5} {'members':>7} {'eager ms':>8} {'compiled ms':>11} "
        f"{'×compiled':>9} {'compile s':>9} {'GFLOP/s eager':>13} {'compiled':>8} "
        f"{'matmul 256³':>11}"
    ]
    for r in rows:
        lines.append(
            f"{r['variant']:<12} {r['width']:>5} {r['members']:>7} "
            f"{r['eager_ms']:>8.1f} {r['compiled_ms']:>11.1f} {r['x_compiled']:>9.2f} "
            f"{r['compile_s']:>9.1f} {r['eager_gflop_per_s']:>13.1f} "
            f"{r['compiled_gflop_per_s']:>8.1f} {r['matmul_gflop_per_s']:>11.1f}"
        )
    return "\n".join(lines)
