"""Each vector family's folded training step, eager against compiled, at a study's size: the
measurement behind each family's `Model.compile_gain`, which ``train.compile = "auto"``
reads (the Transformer rows': `folded`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .._task import make_task
from ..experiment.config import TrainConfig
from ..models.base import family
from .steps import STEP_TASK, family_step, vector_families
from .timing import achieved_rates, eager_against_compiled, first_call_seconds, timing


def bench_compiled(
    families: Sequence[str] | None = None,
    members: int = 24,
    width: int = 32,
    depth: int = 8,
    batch_size: int = 128,
    repeats: int = 10,
    threads: int | None = 1,
    device: str = "cpu",
) -> list[dict[str, Any]]:
    """Each family's training step (default: every vector family) with ``members`` seeds
    folded, on `STEP_TASK` at ``width`` and ``depth``: eager and compiled, interleaved
    (`achieved_rates`). The compiled step's first call, which compiles (or loads
    inductor's cached kernels), is timed apart by wall clock: ``compile_s``.

    Returns one row per family: ``eager_ms`` and ``compiled_ms`` per step, ``x_compiled``
    (eager over compiled), ``compile_s``, the family's stored ``compile_gain``, and each
    step's GFLOP/s beside ``matmul_gflop_per_s``.
    """
    task = make_task(STEP_TASK, depth=depth)
    calls: dict[tuple[str, bool], Callable[[], None]] = {}
    compile_s: dict[str, float] = {}
    names = list(families or vector_families())
    with timing(threads, device) as (clock, sync):
        for name in names:
            for compile in (False, True):
                cfg = TrainConfig(batch_size=batch_size, device=device, compile=compile)
                step = family_step(name, task, cfg, members, width, depth)
                if compile:
                    compile_s[name] = first_call_seconds(step.run, sync)
                calls[name, compile] = step.run
        measured = achieved_rates(calls, repeats, clock, sync, device)
    return [
        {
            "family": name,
            "members": members,
            "compile_gain": family(name).compile_gain,
            **eager_against_compiled(measured[name, False], measured[name, True], compile_s[name]),
        }
        for name in names
    ]


def format_compiled_table(rows: list[dict[str, Any]]) -> str:
    """The rows of `bench_compiled` as a plain-text table."""
    lines = [
        f"{'family':>17} {'members':>7} {'eager ms':>8} {'compiled ms':>11} {'×compiled':>9} "
        f"{'compile s':>9} {'stored gain':>11} {'GFLOP/s eager':>13} {'compiled':>8} "
        f"{'matmul 256³':>11}"
    ]
    for r in rows:
        lines.append(
            f"{r['family']:>17} {r['members']:>7} {r['eager_ms']:>8.1f} "
            f"{r['compiled_ms']:>11.1f} {r['x_compiled']:>9.2f} {r['compile_s']:>9.1f} "
            f"{r['compile_gain']:>11.2f} {r['eager_gflop_per_s']:>13.1f} "
            f"{r['compiled_gflop_per_s']:>8.1f} {r['matmul_gflop_per_s']:>11.1f}"
        )
    return "\n".join(lines)
