"""Where a neural ODE's training step goes: the vector field's evaluations against the
solver's own work, on the suite's solver (alone and folded) and on torchdiffeq."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

import torch

from .._task import Task, TaskData, make_task
from ..experiment.config import TrainConfig
from ..experiment.step import training_step
from ..models.base import join
from .steps import STEP_TASK, TrainingStep, family_step
from .timing import median_times, timing

if TYPE_CHECKING:
    from ..models.ode import NeuralODE


def bench_ode(
    members: Iterable[int] = (1, 8),
    width: int = 32,
    depth: int = 8,
    batch_size: int = 128,
    repeats: int = 20,
    threads: int | None = 1,
    device: str = "cpu",
    family: str = "node",
) -> list[dict[str, Any]]:
    """Where a neural ODE's training step goes, on the own solver and on torchdiffeq.

    For each solver (torchdiffeq's only alone: its adaptive solves do not fold) and number
    of members folded, the step (as in `bench_steps`) is split into its
    forward (to the members' losses, read back) and the rest (backward, clipping, AdamW:
    ``backward_ms``), each timed in every repeat (medians);
    beside it, one evaluation of the vector field on the same folded batch, forward and
    forward + backward, timed alone. ``field_ms`` = NFE × that evaluation is the field's
    arithmetic and call overhead; ``solver_ms``, the rest of forward and backward, is the
    solver's own work (stage combinations, error norms, step control, dense output)
    together with the encoder, decoder and loss. NFE are per member and per step.
    """
    cfg = TrainConfig(batch_size=batch_size, device=device)
    task = make_task(STEP_TASK, depth=depth)
    rows = []
    with timing(threads, device) as (clock, sync):
        for solver, size in [("torchdiffeq", 1), *(("auto", m) for m in members)]:
            step = family_step(family, task, cfg, size, width, depth, solver=solver)
            (ensemble,), (batch,) = step.groups, step.batches
            module = cast("NeuralODE", ensemble.module)  # an ODE family: its counters
            parts = _step_parts(step, task, cfg, repeats, clock, sync)
            nfe = (module.nfe_forward[0], module.nfe_backward[0])
            field = _field_evaluation(module, batch, repeats, clock, sync)
            ms = {name: 1e3 * sorted(t)[len(t) // 2] for name, t in parts.items()}
            field_ms = (nfe[0] * field["forward_backward"] + nfe[1] * field["forward"]) * 1e3
            rows.append(
                {
                    "solver": solver,
                    "members": size,
                    "width": width,
                    "depth": depth,
                    "nfe_forward": nfe[0],
                    "nfe_backward": nfe[1],
                    "forward_ms": ms["forward"],
                    "backward_ms": ms["backward"],
                    "step_ms": ms["forward"] + ms["backward"],
                    "eval_forward_us": 1e6 * field["forward"],
                    "eval_forward_backward_us": 1e6 * field["forward_backward"],
                    "field_ms": field_ms,
                    "solver_ms": ms["forward"] + ms["backward"] - field_ms,
                }
            )
    return rows


def _step_parts(
    step: TrainingStep,
    task: Task,
    cfg: TrainConfig,
    repeats: int,
    clock: Callable[[], float],
    sync: Callable[[], None],
) -> dict[str, list[float]]:
    """The seconds of each repeat's forward (to the members' losses, read back) and of the
    rest of the step, after 3 warm-up steps; the ODE's counters hold the last step's NFE."""
    (ensemble,), (batch,), (optimizer,) = step.groups, step.batches, step.optimizers
    module = cast("NeuralODE", ensemble.module)
    size = ensemble.size
    parts: dict[str, list[float]] = {"forward": [], "backward": []}
    for repeat in range(repeats + 3):
        module.reset_nfe()
        marks: list[float] = []

        def forward_done(
            losses: list[float], marks: list[float] = marks, size: int = size
        ) -> list[bool]:
            marks.append(clock())  # the losses are read back: the forward is done
            return [True] * size

        sync()
        marks.append(clock())
        training_step(ensemble, optimizer, task, batch, cfg, keep=forward_done)
        sync()
        if repeat >= 3:  # warm-up
            parts["forward"].append(marks[1] - marks[0])
            parts["backward"].append(clock() - marks[1])
    return parts


def _field_evaluation(
    module: NeuralODE,
    batch: TaskData,
    repeats: int,
    clock: Callable[[], float],
    sync: Callable[[], None],
) -> dict[str, float]:
    """Seconds of one evaluation of ``module``'s vector field on its folded batch, forward
    and forward + backward (medians)."""
    field = module.layer(0)
    z = torch.randn(len(batch), module.state_dim, device=batch.inputs.device, requires_grad=True)
    u = None if batch.controls is None else batch.controls[:, 0]
    calls = {
        "forward": lambda: field(join(z, u)),
        "forward_backward": lambda: field(join(z, u)).sum().backward(),
    }
    return median_times(calls, repeats, clock, sync)


def format_ode_table(rows: list[dict[str, Any]]) -> str:
    """The rows of `bench_ode` as a plain-text table."""
    lines = [
        f"{'solver':>11} {'members':>7} {'NFE f/b':>8} {'step ms':>8} {'forward':>8} "
        f"{'backward':>8} {'eval µs f/f+b':>13} {'field ms':>8} {'solver ms':>9}"
    ]
    for r in rows:
        lines.append(
            f"{r['solver']:>11} {r['members']:>7} "
            f"{r['nfe_forward']:>4}/{r['nfe_backward']:<3} {r['step_ms']:>8.2f} "
            f"{r['forward_ms']:>8.2f} {r['backward_ms']:>8.2f} "
            f"{r['eval_forward_us']:>6.0f}/{r['eval_forward_backward_us']:<6.0f} "
            f"{r['field_ms']:>8.2f} {r['solver_ms']:>9.2f}"
        )
    return "\n".join(lines)
