"""Training one cell, identically for every model family.

Same optimiser (AdamW, linear warmup then cosine decay, gradient clipping), same fixed
step budget, same data per seed: only the depth dynamics differ between rows. The training
curve and early stopping read the val split; the test split is scored once, at the end.
Besides metrics, a run records what a fair comparison needs: parameters, FLOPs, function
evaluations, time and memory, and how it ended. This module holds the loop; the step
(`step`), the optimiser (`optim`), the data (`splits`, `batches`),
the final scoring (`evaluate`) and the memory measure (`memory`) live beside it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode
from tqdm.auto import tqdm

from .._task import Task, TaskData
from ..models.base import Model
from ..models.ensemble import Ensemble, alone, fold
from ..models.flops import flop_counter
from ..models.params import count_parameters
from .batches import fold_data, minibatches, to_device
from .caps import Capped, SolverCap, solver_cap
from .config import Cell, TrainConfig
from .evaluate import final_metrics, forward_flops, member_metrics, own_flops
from .grid import TUNABLE, row_identity
from .memory import peak_memory, reset_peak_memory
from .optim import make_optimizer
from .result import RunResult
from .splits import SPLITS, sample_splits
from .step import Predict, predictor, training_step
from .threads import torch_threads
from .trained import Trained

if TYPE_CHECKING:
    from ..models.ode import NeuralODE

#: A training loss above this multiple of the first step's loss (or a non-finite one)
#: means the run diverged: a finite blow-up (lr far too high, no clipping) is not a result.
DIVERGENCE_FACTOR = 1e6


def train(
    task: Task,
    model: nn.Module,
    cfg: TrainConfig,
    seed: int,
    *,
    progress: bool = False,
    threads: int | None = 1,
) -> RunResult:
    """Train ``model`` on ``task`` for ``cfg.steps`` steps and evaluate it.

    The train, val and test sets (``cfg.n_train``, ``n_val``, ``n_test`` samples) come from
    the task's own seeded sampler, minibatch order from a generator seeded with ``seed``;
    with the model initialised for a seed (``make_model(..., seed=seed)``) a CPU run is
    reproducible. It runs on ``threads`` torch threads (None: the process's setting), one by
    default as ``ddl-dyn run`` does: the suite's small models train several times faster so,
    above all on a busy machine; the caller's thread count is restored after.
    The curve and ``target_metric`` read val; test is scored once, after training. A loss
    that is non-finite or above `DIVERGENCE_FACTOR` × the first step's loss stops the
    run as ``"diverged"``, a time or solver cap (in training or in the final evaluation) as
    ``"capped"``: both are failures, scored where possible.
    Exceptions propagate (`run_cells` records them as failed).
    """
    with torch_threads(threads):
        return train_seeds(task, [model], cfg, [seed], progress=progress)[0]


def train_seeds(
    task: Task,
    models: Sequence[nn.Module],
    cfgs: TrainConfig | Sequence[TrainConfig],
    seeds: Sequence[int],
    *,
    progress: bool = False,
) -> list[RunResult]:
    """Train ``models[i]``, initialised for ``seeds[i]``, as `train` would on that seed
    with ``cfgs[i]`` (or one config for all), all at once where they fold into one ensemble
    ([`fold`][ddl_dynamics.models.ensemble.fold]), else one after another.

    The configs may differ only in tunable fields (`TUNABLE`: rate, decay,
    warmup, clipping), so that one ensemble trains a row's seeds at every grid value. In an
    ensemble each member sees its own seed's data, batches and minibatch order, has its own
    optimiser state (AdamW acts per element), learning rate and schedule, weight decay,
    gradient clipping, early stop and divergence check: a member that diverges or reaches
    ``target_metric`` is frozen with its weights of that moment while the others go on. So
    each result is the one its seed and config get alone, to float rounding (for an
    adaptive ODE, unless rounding flips one of its step decisions, after which the two runs
    drift apart by about the solver's tolerance). ``wall_time`` is the ensemble's divided
    among its members, ``peak_mem`` the ensemble's, and ``metrics["ensemble"]`` the number
    of members trained together. Members that fold but whose folded forward differs from
    their own (a model whose ops mix the batch), or of which one hits the ODE solver's step
    cap, are trained one after another.
    """
    cfgs = [cfgs] * len(models) if isinstance(cfgs, TrainConfig) else list(cfgs)
    since = _Since.now(cfgs[0].device)
    members = [
        _Member(seed, cfg, *sample_splits(task, cfg, seed, SPLITS))
        for cfg, seed in zip(cfgs, seeds, strict=True)
    ]
    return _train_members(task, models, members, since, progress)


@dataclass(frozen=True)
class _Since:
    """When a group of cells began (before its data was sampled), for its wall time and
    peak memory."""

    start: float
    memory: str

    @classmethod
    def now(cls, device: str) -> _Since:
        return cls(time.perf_counter(), reset_peak_memory(torch.device(device)))


def _train_members(
    task: Task,
    models: Sequence[nn.Module],
    members: Sequence[_Member],
    since: _Since,
    progress: bool,
) -> list[RunResult]:
    """`train_seeds` of members whose data is sampled."""
    budgets = {json.dumps(_budget(m.cfg), sort_keys=True) for m in members}
    if len(budgets) > 1:
        raise ValueError(
            f"members trained together may differ only in the tunable fields {', '.join(TUNABLE)}"
        )
    ensemble = fold(models)
    if ensemble is not None:
        with contextlib.suppress(_Unfolded):
            return _train(ensemble, task, members, since, progress)
    return [
        _train(alone(model), task, [member], since, progress)[0]
        for model, member in zip(models, members, strict=True)
    ]


def _budget(cfg: TrainConfig) -> dict[str, Any]:
    """What members trained together must share: the config but its tunable fields."""
    return {k: v for k, v in dataclasses.asdict(cfg).items() if k not in TUNABLE}


class _Unfolded(Exception):
    """The folded ensemble's forward differs from its members' own."""


class _Member:
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


def _train(
    ensemble: Ensemble, task: Task, members: Sequence[_Member], since: _Since, progress: bool
) -> list[RunResult]:
    """The training loop of `train_seeds`, over the folded batches of ``ensemble``:
    a step at a time until every member has stopped or the budget is spent; a cap stops
    the members still training (a solver cap in an ensemble raises `_Unfolded`, so
    that the members train alone and one's cap stops no other)."""
    loop = _Loop(ensemble, task, members)
    cfg = loop.cfg
    bar = tqdm(total=cfg.steps, disable=not progress, leave=False, unit="step")
    try:
        for step in range(1, cfg.steps + 1):
            if not loop.step(step):
                break
            bar.update()
            _check_time(cfg, (time.perf_counter() - since.start) / ensemble.size, step)
    except Capped as cap:
        if ensemble.size > 1 and isinstance(cap, SolverCap):  # one member's cap must not stop all
            raise _Unfolded from cap
        for member in members:
            if member.training:
                member.stop("capped", str(cap))
    finally:
        bar.close()
    return _results(loop, since)


def _check_time(cfg: TrainConfig, elapsed: float, step: int) -> None:
    """Raise `Capped` where each member's share of the time, ``elapsed``, is past
    ``cfg.max_seconds`` before the last step."""
    if cfg.max_seconds is not None and elapsed > cfg.max_seconds and step < cfg.steps:
        raise Capped(
            f"time cap: stopped at step {step}/{cfg.steps} after {elapsed:.1f} s "
            f"(max_seconds={cfg.max_seconds})"
        )


class _Loop:
    """One ensemble in training: on its device, with its members' data folded, its
    optimiser, each member's minibatch order and, counted on step 1, each member's FLOPs
    per unit of work (per function evaluation for an ODE, else per step)."""

    def __init__(self, ensemble: Ensemble, task: Task, members: Sequence[_Member]) -> None:
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
        self.data = fold_data([m.data for m in members])
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
        with solver_cap(), counter:
            losses = training_step(
                self.ensemble,
                self.optimizer,
                self.task,
                batch,
                self.cfgs,
                step - 1,
                keep=lambda values: self._watch(step, values),
            )
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


def _results(loop: _Loop, since: _Since) -> list[RunResult]:
    """Each member's row once training has stopped: the members still training take their
    weights from the ensemble; all share its peak memory and its time per member."""
    ensemble = loop.ensemble
    models = [
        ensemble.export(i) if m.training else ensemble.members[i]
        for i, m in enumerate(loop.members)
    ]
    results = [
        _result(model, loop.task, member, loop.predict, loop.ode)
        for model, member in zip(models, loop.members, strict=True)
    ]
    peak_mem, measure = peak_memory(loop.device, since.memory)
    wall_time = (time.perf_counter() - since.start) / ensemble.size
    for result in results:
        result.metrics.update(peak_mem_measure=measure, ensemble=ensemble.size)
        result.peak_mem, result.wall_time = peak_mem, wall_time
    return results


def _result(
    model: nn.Module, task: Task, member: _Member, predict: Predict, ode: bool
) -> RunResult:
    """One trained member's row: its final metrics, counts and curve."""
    cfg = member.cfg
    metrics, cap_note = final_metrics(
        model, task, cfg, member.seed, (member.data, member.val, member.test), predict, ode
    )
    metrics["steps"] = member.done
    status, message = member.status, member.message
    if cap_note and status == "ok":
        status, message = "capped", f"cap during the final evaluation: {cap_note}"
    elif metrics["capped"] and status == "ok":  # test or OOD data: that split's failure only
        message = "cap during the final evaluation: " + "; ".join(
            f"{split}: {note}" for split, note in metrics["capped"].items()
        )
    nfe = [sum(column) / len(column) for column in zip(*member.nfe, strict=True)]
    return RunResult(
        status=status,
        message=message,
        metrics=metrics,
        curve=member.curve,
        params=count_parameters(model),
        flops=forward_flops(model, member.val.subset(slice(0, cfg.batch_size)), predict),
        nfe_forward=nfe[0] if nfe else None,
        nfe_backward=nfe[1] if nfe else None,
    )


@torch.no_grad()
def _check_fold(ensemble: Ensemble, task: Task, members: Sequence[_Member], rows: int) -> None:
    """Raise `_Unfolded` unless the folded forward on the members' first ``rows``
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
        raise _Unfolded from cap
    if not torch.allclose(folded, own, rtol=1e-4, atol=1e-5, equal_nan=True):
        raise _Unfolded


def _cpu_state(model: nn.Module) -> dict[str, Tensor]:
    """The model's state dict on the CPU, with the layout versions of its layers
    (``_metadata``), by which a later release converts what it has changed."""
    state = model.state_dict()
    for key, value in state.items():
        state[key] = value.cpu()
    return state


def seed_groups(cells: Iterable[Cell]) -> list[list[Cell]]:
    """The cells grouped by row (`row_identity`: a row's seeds at every grid
    value), in first-seen order, to train together (`run_cells`); the cells
    of a model that cannot fold (see [`fold`][ddl_dynamics.models.ensemble.fold]) stay apart,
    to spread over workers."""
    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        groups.setdefault(row_identity(cell.to_dict()), []).append(cell)
    return [
        split
        for group in groups.values()
        for split in ([group] if _folds(group[0]) else [[cell] for cell in group])
    ]


def _folds(cell: Cell) -> bool:
    model = cell.build()[1]
    return fold([model, model]) is not None


def run_cells(cells: Sequence[Cell]) -> list[Trained]:
    """Build and train cells that differ only in their seed and tunable fields, together
    where they fold (`train_seeds`); never raises for a problem of the cells
    themselves. A cell whose model or data cannot be made (say, the task fails for its
    seed) is ``"failed"`` alone, and the others train; an error in training fails them all.
    """
    since = _Since.now(cells[0].train.device)
    failed: dict[int, BaseException] = {}
    ready: list[tuple[int, Task, nn.Module, _Member]] = []
    for i, cell in enumerate(cells):
        try:
            task, model = cell.build()
            member = _Member(
                cell.seed, cell.train, *sample_splits(task, cell.train, cell.seed, SPLITS)
            )
            ready.append((i, task, model, member))
        except Exception as err:  # failing cells must not stop the suite
            failed[i] = err
    trained: dict[int, Trained] = {}
    if ready:
        models = [model for _, _, model, _ in ready]
        try:
            results = _train_members(ready[0][1], models, [m for *_, m in ready], since, False)
            trained = {
                i: Trained(result, _cpu_state(model))
                for (i, _, model, _), result in zip(ready, results, strict=True)
            }
        except Exception as err:  # failing cells must not stop the suite
            failed |= {i: err for i, *_ in ready}
    wall_time = (time.perf_counter() - since.start) / len(cells)
    trained |= {
        i: Trained(RunResult(status="failed", message=describe_error(err), wall_time=wall_time))
        for i, err in failed.items()
    }
    return [
        dataclasses.replace(trained[i], result=stamp(trained[i].result, cell))
        for i, cell in enumerate(cells)
    ]


def stamp(result: RunResult, cell: Cell) -> RunResult:
    """``result`` carrying the identity and resolved config of ``cell``."""
    return dataclasses.replace(
        result,
        key=cell.key,
        task=cell.task_label,
        model=cell.label,
        seed=cell.seed,
        config=cell.to_dict(),
    )


def describe_error(err: BaseException) -> str:
    """``Type: message (at file:line)`` of the innermost frame, for a result row."""
    where = traceback.extract_tb(err.__traceback__)[-1:] if err.__traceback__ else []
    at = f" (at {Path(where[0].filename).name}:{where[0].lineno})" if where else ""
    return f"{type(err).__name__}: {err}{at}"


def _diverged(loss: float, first: float) -> bool:
    """Non-finite, or above `DIVERGENCE_FACTOR` × the first step's (positive) loss."""
    return not math.isfinite(loss) or (first > 0 and loss > DIVERGENCE_FACTOR * first)


def _reached(task: Task, metric: float, target: float) -> bool:
    return metric >= target if task.higher_is_better else metric <= target
