"""One ensemble's training loop, a step at a time, and what each member of it carries:
divergence, early stops, curve points and FLOP counts. Kept apart from the module `train`,
which samples the data, handles caps and models that do not fold, and makes the rows, so
that the loop reads in one place.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import torch
from torch.utils.flop_counter import FlopCounterMode

from .._task import Task, TaskData
from ..models.base import Model
from ..models.ensemble import Ensemble
from ..models.flops import flop_counter
from .batches import fold_data, minibatches, to_device
from .caps import SolverCap, solver_cap
from .compiling import CompileChoice, expected_gain, signature
from .config import TrainConfig
from .evaluate import member_metrics, own_flops
from .optim import make_optimizer
from .step import can_compile, predictor, training_step

if TYPE_CHECKING:
    from ..models.ode import NeuralODE

#: A training loss above this multiple of the first step's loss (or a non-finite one)
#: means the run diverged: a finite blow-up (lr far too high, no clipping) is not a result.
DIVERGENCE_FACTOR = 1e6


class Unfolded(Exception):
    """The folded ensemble's forward differs from its members' own."""


class Member:
    """One member of an ensemble: its seed, config and data, and how it is doing: its
    status, curve and counters."""

    def __init__(
        self, seed: int, cfg: TrainConfig, data: TaskData, val: TaskData, test: TaskData
    ) -> None:
        self.seed, self.cfg, self.data, self.val, self.test = seed, cfg, data, val, test
        self.status, self.message, self.done, self.training = "ok", "", 0, True
        self.first_loss = math.nan
        self.curve: list[list[float | None]] = []
        self.losses: list[float] = []
        self.nfe: list[tuple[float, float]] = []  # (forward, backward) per step, ODE models
        self.flops = 0.0

    def stop(self, status: str, message: str) -> None:
        """Stop training this member, ending as ``status`` for the reason ``message``."""
        self.status, self.message, self.training = status, message, False

    def point(self, step: int, metric: float) -> None:
        """Add a point to the curve: the step, the mean training loss since the last point,
        the val metric, the FLOPs so far and the mean forward NFE since the last point."""
        recent = [f for f, _ in self.nfe[-len(self.losses) :]]
        self.curve.append(
            [
                step,
                sum(self.losses) / len(self.losses),
                metric,
                self.flops,
                sum(recent) / len(recent) if recent else None,
            ]
        )
        self.losses.clear()


class Loop:
    """One ensemble in training: on its device, with its members' data folded, its
    optimiser, each member's minibatch order, whether its steps run compiled (`CompileChoice`,
    told each step's time) and, counted on step 1, each member's FLOPs per unit of work (per
    function evaluation for an ODE, else per step)."""

    def __init__(self, ensemble: Ensemble, task: Task, members: Sequence[Member]) -> None:
        self.ensemble, self.task, self.members = ensemble, task, members
        self.cfg = cfg = members[0].cfg  # the budget every member shares
        self.cfgs = [m.cfg for m in members]
        self.device = device = torch.device(cfg.device)
        self.module = ensemble.module.to(device).train()
        for model in ensemble.members:
            model.to(device).train()
        self.ode = isinstance(self.module, Model) and self.module.solves_ode
        self.solver = cast("NeuralODE", self.module)  # its ODE counters: read only where ode
        for member in members:
            member.data, member.val = to_device(member.data, device), to_device(member.val, device)
        self.data = fold_data([m.data.for_training() for m in members])
        self.val = fold_data([m.val for m in members])
        self.predict = predictor(task, cfg.bf16 and device.type == "cuda")
        if ensemble.size > 1:
            _check_fold(ensemble, task, members, min(cfg.batch_size, cfg.n_train))
        self.optimizer = make_optimizer(self.module)
        self.orders = [
            minibatches(len(m.data), cfg.batch_size, torch.Generator().manual_seed(m.seed))
            for m in members
        ]
        self.flops_per_unit = [0.0] * ensemble.size
        gain = expected_gain(getattr(self.module, "compile_gain", 1.0), ensemble.size)
        self.compile = CompileChoice(cfg.compile, cfg.steps, gain, "", can_compile)

    def step(self, step: int) -> bool:
        """Training step ``step`` (from 1) of the members still training, then their curve
        points and early stops where it is an evaluation step; whether any still trains."""
        index = torch.cat(
            [next(order) + i * len(self.members[i].data) for i, order in enumerate(self.orders)]
        )
        batch = self.data.subset(index)
        counter = flop_counter() if step == 1 else contextlib.nullcontext()
        if self.ode:
            self.solver.reset_nfe()
        if step == 1:
            self.compile.key = signature(self.module, self.task, batch)
        start = time.perf_counter()
        with solver_cap(), counter:
            losses = training_step(
                self.ensemble,
                self.optimizer,
                self.task,
                batch,
                self.cfgs,
                step - 1,
                keep=lambda values: self._watch(step, values),
                compile=self.compile.on,
            )
        self.compile.timed(step, time.perf_counter() - start)
        if not self.training:
            return False
        # each member's (forward, backward) NFE; an ODE step's FLOPs scale with its NFE
        nfe = (
            list(zip(self.solver.nfe_forward, self.solver.nfe_backward, strict=True))
            if self.ode
            else None
        )
        units = [max(sum(n), 1) for n in nfe] if nfe else [1] * self.ensemble.size
        if step == 1:  # FLOPs are counted on step 1
            self._count_flops(batch, cast(FlopCounterMode, counter), units)
        self._record(step, losses, nfe, units)
        return self.training

    @property
    def training(self) -> bool:
        return any(m.training for m in self.members)

    def _watch(self, step: int, losses: list[float]) -> list[bool]:
        """Stop the members whose ``losses`` diverged (frozen with their weights of now);
        which members still train."""
        for i, member in enumerate(self.members):
            if step == 1:
                member.first_loss = losses[i]
            if member.training and _diverged(losses[i], member.first_loss):
                member.stop(
                    "diverged",
                    f"loss became {losses[i]:.4g} at step {step} "
                    f"(first step: {member.first_loss:.4g}); training "
                    "stopped",
                )
                self.ensemble.export(i)
        return [m.training for m in self.members]

    def _count_flops(self, batch: TaskData, counter: FlopCounterMode, units: list[int]) -> None:
        """Each member's FLOPs per unit of work, from the first step's count (an ODE
        ensemble's members counted alone: see `own_flops`)."""
        size = self.ensemble.size
        with solver_cap():
            flops = (
                own_flops(self.ensemble, self.task, batch, self.predict)
                if self.ode and size > 1
                else [counter.get_total_flops() / size] * size
            )
        self.flops_per_unit = [f / u for f, u in zip(flops, units, strict=True)]

    def _record(
        self,
        step: int,
        losses: list[float],
        nfe: Sequence[tuple[float, float]] | None,
        units: list[int],
    ) -> None:
        """Count step ``step`` for the members still training; on an evaluation step, add
        their curve points and stop those that reached ``target_metric``."""
        cfg = self.cfg
        evaluate = step % cfg.eval_every == 0 or step == cfg.steps
        metrics = (
            member_metrics(self.module, self.task, self.val, self.predict, self.ensemble.size)
            if evaluate
            else []
        )
        for i, member in enumerate(self.members):
            if not member.training:
                continue
            member.done = step
            member.losses.append(losses[i])
            member.flops += self.flops_per_unit[i] * units[i]
            if nfe:
                member.nfe.append(nfe[i])
            if not evaluate:
                continue
            member.point(step, metrics[i])
            if cfg.target_metric is not None and _reached(self.task, metrics[i], cfg.target_metric):
                member.stop(
                    "ok", f"val metric reached target_metric {cfg.target_metric} at step {step}"
                )
                self.ensemble.export(i)


@torch.no_grad()
def _check_fold(ensemble: Ensemble, task: Task, members: Sequence[Member], rows: int) -> None:
    """Raise `Unfolded` unless the folded forward on the members' first ``rows``
    training examples equals each member's own forward on them, to float32 rounding (or
    where a member's ODE solve hits its step cap there, which it must meet alone)."""
    predict = predictor(task, bf16=False)
    parts = [member.data.subset(slice(0, rows)) for member in members]
    try:
        with solver_cap():
            own = torch.cat(
                [predict(model, part) for model, part in zip(ensemble.members, parts, strict=True)]
            )
            folded = predict(ensemble.module, fold_data(parts))
    except SolverCap as cap:
        raise Unfolded from cap
    if not torch.allclose(folded, own, rtol=1e-4, atol=1e-5, equal_nan=True):
        raise Unfolded


def _diverged(loss: float, first: float) -> bool:
    """Non-finite, or above `DIVERGENCE_FACTOR` × the first step's (positive) loss."""
    return not math.isfinite(loss) or (first > 0 and loss > DIVERGENCE_FACTOR * first)


def _reached(task: Task, metric: float, target: float) -> bool:
    return metric >= target if task.higher_is_better else metric <= target
