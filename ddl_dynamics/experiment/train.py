"""Training one cell, identically for every model family.

Same optimiser (AdamW, linear warmup then cosine decay, gradient clipping), same fixed
step budget, same data per seed: only the depth dynamics differ between rows. The training
curve and early stopping read the val split; the test split is scored once, at the end.
Besides metrics, a run records what a fair comparison needs: parameters, FLOPs, function
evaluations, time and memory, and how it ended.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
import resource
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode
from tqdm.auto import tqdm

from .._task import MAX_OVERLAP, Task, TaskData, shared_content
from ..models.dopri5 import SolverCapped
from ..models.ensemble import Ensemble, alone, fold
from ..models.params import count_parameters
from .config import TUNABLE, Cell, TrainConfig
from .store import RunResult

if TYPE_CHECKING:
    from ..models.ode import NeuralODE

#: A training loss above this multiple of the first step's loss (or a non-finite one)
#: means the run diverged: a finite blow-up (lr far too high, no clipping) is not a result.
DIVERGENCE_FACTOR = 1e6


class _Capped(Exception):
    """A time or solver-step cap stopped training."""


class _SolverCapped(_Capped):
    """An ODE solve ran out of steps (``ode_max_steps``)."""


def train(
    task: Task, model: nn.Module, cfg: TrainConfig, seed: int, *, progress: bool = False,
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
    that is non-finite or above :data:`DIVERGENCE_FACTOR` × the first step's loss stops the
    run as ``"diverged"``, a time or solver cap (in training or in the final evaluation) as
    ``"capped"``: both are failures, scored where possible.
    Exceptions propagate (:func:`run_cells` records them as failed).
    """
    with torch_threads(threads):
        return train_seeds(task, [model], cfg, [seed], progress=progress)[0]


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run on ``threads`` torch threads (None: leave the setting), restoring it after."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_seeds(
    task: Task, models: Sequence[nn.Module], cfgs: TrainConfig | Sequence[TrainConfig],
    seeds: Sequence[int], *, progress: bool = False,
) -> list[RunResult]:
    """Train ``models[i]``, initialised for ``seeds[i]``, as :func:`train` would on that seed
    with ``cfgs[i]`` (or one config for all), all at once where they fold into one ensemble
    (:func:`~ddl_dynamics.models.ensemble.fold`), else one after another.

    The configs may differ only in tunable fields (:data:`~.config.TUNABLE`: rate, decay,
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
    members = [_Member(seed, cfg, *sample_splits(task, cfg, seed, SPLITS))
               for cfg, seed in zip(cfgs, seeds, strict=True)]
    return _train_members(task, models, members, since, progress)


@dataclass(frozen=True)
class _Since:
    """When a group of cells began (before its data was sampled), for its wall time and
    peak memory."""

    start: float
    memory: str

    @classmethod
    def now(cls, device: str) -> _Since:
        return cls(time.perf_counter(), _reset_peak_memory(torch.device(device)))


def _train_members(task: Task, models: Sequence[nn.Module], members: Sequence[_Member],
                   since: _Since, progress: bool) -> list[RunResult]:
    """:func:`train_seeds` of members whose data is sampled."""
    budgets = {json.dumps(_budget(m.cfg), sort_keys=True) for m in members}
    if len(budgets) > 1:
        raise ValueError("members trained together may differ only in the tunable fields "
                         f"{', '.join(TUNABLE)}")
    ensemble = fold(models)
    if ensemble is not None:
        with contextlib.suppress(_Unfolded):
            return _train(ensemble, task, members, since, progress)
    return [_train(alone(model), task, [member], since, progress)[0]
            for model, member in zip(models, members, strict=True)]


def _budget(cfg: TrainConfig) -> dict[str, Any]:
    """What members trained together must share: the config but its tunable fields."""
    return {k: v for k, v in dataclasses.asdict(cfg).items() if k not in TUNABLE}


class TaskDataError(ValueError):
    """A task's sampler returned data that cannot be trained on: a failure of the task."""


#: The splits a member samples before it trains (test is scored once, at the end).
SPLITS = ("train", "val", "test")


def sample_splits(task: Task, cfg: TrainConfig, seed: int,
                  splits: Sequence[str] = SPLITS) -> list[TaskData]:
    """The task's ``splits`` for one seed, at the sizes ``cfg`` asks for, each checked
    (:func:`check_sample`), val and test also for content they share with train (which
    comes first)."""
    sizes = {"train": cfg.n_train, "val": cast(int, cfg.n_val)}  # (n_test where not given)
    found: dict[str, TaskData] = {}
    for split in splits:
        n = sizes.get(split, cfg.n_test)
        found[split] = check_sample(task.sample(n, seed, split), n, seed, split)
        if split in ("val", "test") and "train" in found:
            check_held_out(found["train"], found[split], seed, split)
    return list(found.values())


def check_held_out(train: TaskData, data: TaskData, seed: int, split: str) -> None:
    """:class:`TaskDataError` unless at most :data:`~ddl_dynamics._task.MAX_OVERLAP` of the
    examples of ``split`` also occur in ``train``, at the run's own sizes and seed (a small
    sample can miss an overlap that a large training set makes)."""
    shared = shared_content(train, data)
    if shared > MAX_OVERLAP:
        raise TaskDataError(f"{shared:.1%} of the {split} examples for seed {seed} also occur "
                            f"among its {len(train)} training examples (at most "
                            f"{MAX_OVERLAP:.0%} allowed): hold whole inputs out, e.g. with "
                            "held_out()")


def check_sample(data: TaskData, n: int, seed: int, split: str) -> TaskData:
    """``data`` if it holds ``n`` examples with finite inputs and targets, else
    :class:`TaskDataError` naming what is wrong (a bad sample would otherwise read as the
    model diverging, or train on less than asked for without a word)."""
    where = f"the task's {split} split for seed {seed}"
    if len(data) != n or len(data.targets) != n:
        raise TaskDataError(f"{where} has {len(data)} inputs and {len(data.targets)} targets; "
                            f"{n} were asked for")
    for name in ("inputs", "targets", "controls"):
        value = getattr(data, name)
        if value is not None and value.is_floating_point() and not value.isfinite().all():
            raise TaskDataError(f"{where}: the task returned non-finite {name} (NaN or ±inf)")
    return data


class _Unfolded(Exception):
    """The folded ensemble's forward differs from its members' own."""


class _Member:
    """One member of an ensemble: its seed, config and data, and how it is doing: its
    status, curve and counters."""

    def __init__(self, seed: int, cfg: TrainConfig, data: TaskData, val: TaskData,
                 test: TaskData) -> None:
        self.seed, self.cfg, self.data, self.val, self.test = seed, cfg, data, val, test
        self.status, self.message, self.done, self.training = "ok", "", 0, True
        self.first_loss = math.nan
        self.curve: list[list[float | None]] = []
        self.losses: list[float] = []
        self.nfe: list[tuple[float, float]] = []  # (forward, backward) per step, ODE models
        self.flops = 0.0

    def stop(self, status: str, message: str) -> None:
        self.status, self.message, self.training = status, message, False


def _train(ensemble: Ensemble, task: Task, members: Sequence[_Member], since: _Since,
           progress: bool) -> list[RunResult]:
    """The training loop of :func:`train_seeds`, over the folded batches of ``ensemble``."""
    start = since.start
    cfg = members[0].cfg  # the budget every member shares
    cfgs = [m.cfg for m in members]
    device = torch.device(cfg.device)
    size = ensemble.size
    module = ensemble.module.to(device).train()
    for model in ensemble.members:
        model.to(device).train()
    ode = hasattr(module, "reset_nfe")
    solver = cast("NeuralODE", module)  # its ODE counters: read only where ode
    for member in members:
        member.data, member.val = to_device(member.data, device), to_device(member.val, device)
    data, val = fold_data([m.data for m in members]), fold_data([m.val for m in members])
    predict = predictor(task, cfg.bf16 and device.type == "cuda")
    if size > 1:
        _check_fold(ensemble, task, members, min(cfg.batch_size, cfg.n_train))

    optimizer = make_optimizer(module)
    orders = [_batches(len(m.data), cfg.batch_size, torch.Generator().manual_seed(m.seed))
              for m in members]
    flops_per_unit = [0.0] * size
    bar = tqdm(total=cfg.steps, disable=not progress, leave=False, unit="step")
    try:
        for step in range(1, cfg.steps + 1):
            index = torch.cat([next(order) + i * len(members[i].data)
                               for i, order in enumerate(orders)])
            batch = data.subset(index)
            counter = FlopCounterMode(display=False) if step == 1 else contextlib.nullcontext()
            if ode:
                solver.reset_nfe()
            with _solver_cap(), counter:
                losses = member_losses(module, task, batch, predict, size)
                values = losses.tolist()
                for i, member in enumerate(members):
                    if step == 1:
                        member.first_loss = values[i]
                    if member.training and _diverged(values[i], member.first_loss):
                        member.stop("diverged", f"loss became {values[i]:.4g} at step {step} "
                                    f"(first step: {member.first_loss:.4g}); training stopped")
                        ensemble.export(i)
                training = [m.training for m in members]
                if not any(training):
                    break
                descend(ensemble, optimizer, losses, torch.tensor(training, device=device),
                        cfgs, step - 1)
            # each member's (forward, backward) NFE; an ODE step's FLOPs scale with its NFE
            nfe = list(zip(solver.nfe_forward, solver.nfe_backward, strict=True)) if ode else None
            units = [max(sum(n), 1) for n in nfe] if nfe else [1] * size
            if step == 1:  # FLOPs are counted on step 1
                with _solver_cap():
                    flops = (_own_flops(ensemble, task, batch, predict) if ode and size > 1
                             else [cast(FlopCounterMode, counter).get_total_flops() / size]
                             * size)
                flops_per_unit = [f / u for f, u in zip(flops, units, strict=True)]
            bar.update()
            evaluate = step % cfg.eval_every == 0 or step == cfg.steps
            metrics = _evaluate(module, task, val, predict, size) if evaluate else []
            for i, member in enumerate(members):
                if not member.training:
                    continue
                member.done = step
                member.losses.append(values[i])
                member.flops += flops_per_unit[i] * units[i]
                if nfe:
                    member.nfe.append(nfe[i])
                if evaluate:
                    recent = [f for f, _ in member.nfe[-len(member.losses):]]
                    member.curve.append([step, sum(member.losses) / len(member.losses),
                                         metrics[i], member.flops,
                                         sum(recent) / len(recent) if recent else None])
                    member.losses.clear()
                    if cfg.target_metric is not None and _reached(task, metrics[i],
                                                                 cfg.target_metric):
                        member.stop("ok", f"val metric reached target_metric "
                                          f"{cfg.target_metric} at step {step}")
                        ensemble.export(i)
            if not any(m.training for m in members):
                break
            elapsed = (time.perf_counter() - start) / size  # each member's share
            if cfg.max_seconds is not None and elapsed > cfg.max_seconds and step < cfg.steps:
                raise _Capped(f"time cap: stopped at step {step}/{cfg.steps} after "
                              f"{elapsed:.1f} s (max_seconds={cfg.max_seconds})")
    except _Capped as cap:
        if size > 1 and isinstance(cap, _SolverCapped):  # one member's cap must not stop all
            raise _Unfolded from cap
        for member in members:
            if member.training:
                member.stop("capped", str(cap))
    finally:
        bar.close()
    models = [ensemble.export(i) if m.training else ensemble.members[i]
              for i, m in enumerate(members)]
    results = [_result(model, task, member, predict, ode)
               for model, member in zip(models, members, strict=True)]
    peak_mem, measure = _peak_memory(device, since.memory)
    wall_time = (time.perf_counter() - start) / size
    for result in results:
        result.metrics.update(peak_mem_measure=measure, ensemble=size)
        result.peak_mem, result.wall_time = peak_mem, wall_time
    return results


def _result(model: nn.Module, task: Task, member: _Member,
            predict: Callable[[nn.Module, TaskData], Tensor], ode: bool) -> RunResult:
    """One trained member's row: its final metrics, counts and curve."""
    cfg = member.cfg
    metrics, cap_note = _final_metrics(model, task, cfg, member, predict, ode)
    metrics["steps"] = member.done
    status, message = member.status, member.message
    if cap_note and status == "ok":
        status, message = "capped", f"cap during the final evaluation: {cap_note}"
    elif metrics["capped"] and status == "ok":  # test or OOD data: that split's failure only
        message = "cap during the final evaluation: " + "; ".join(
            f"{split}: {note}" for split, note in metrics["capped"].items())
    nfe = [sum(column) / len(column) for column in zip(*member.nfe, strict=True)]
    return RunResult(
        status=status,
        message=message,
        metrics=metrics,
        curve=member.curve,
        params=count_parameters(model),
        flops=_forward_flops(model, member.val.subset(slice(0, cfg.batch_size)), predict),
        nfe_forward=nfe[0] if nfe else None,
        nfe_backward=nfe[1] if nfe else None,
    )


def make_optimizer(module: nn.Module) -> torch.optim.Optimizer:
    """AdamW over every parameter at learning rate 1 and no weight decay: :func:`descend`
    scales each member's step by its own rate and applies its own decay. AdamW acts per
    element, so it serves an ensemble's members as it would each alone."""
    return torch.optim.AdamW(module.parameters(), lr=1.0, weight_decay=0.0,
                             fused=True)  # one kernel for all tensors: ~6x faster on CPU


def member_losses(module: nn.Module, task: Task, batch: TaskData,
                  predict: Callable[[nn.Module, TaskData], Tensor], size: int) -> Tensor:
    """Each member's training loss on its rows of the folded ``batch``, ``(size,)``."""
    preds, targets = _unfold(predict(module, batch), size), _unfold(batch.targets, size)
    return torch.stack([task.loss(p, t) for p, t in zip(preds, targets, strict=True)])


def descend(ensemble: Ensemble, optimizer: torch.optim.Optimizer, losses: Tensor,
            training: Tensor, cfgs: Sequence[TrainConfig], index: int) -> None:
    """Optimiser step ``index`` (from 0) of the members still ``training`` (a bool mask),
    each on its own loss with its own config: gradient clipped to its ``grad_clip`` (0:
    unclipped), then AdamW at its rate on its schedule (:func:`_lr_factor`) and decay.

    AdamW's step is linear in the rate, and its decay a separate shrink: the optimiser
    (:func:`make_optimizer`) steps at rate 1, and each member's parameters then move that
    step times its rate, ``p ← p + lr·(p₁ − p) − lr·wd·p``; a frozen member gets rate 0.
    """
    optimizer.zero_grad(set_to_none=True)
    torch.where(training, losses, 0.0).sum().backward()
    params: list[Tensor] = [p for p in ensemble.module.parameters() if p.grad is not None]
    device = losses.device
    clips = torch.tensor([cfg.grad_clip for cfg in cfgs], device=device)
    if clips.any():
        _clip_per_member(ensemble, params, clips)
    rates = torch.tensor([cfg.lr * _lr_factor(cfg)(index) for cfg in cfgs], device=device)
    rates = torch.where(training, rates, 0.0)
    decays = rates * torch.tensor([cfg.weight_decay for cfg in cfgs], device=device)
    with torch.no_grad():
        before = torch._foreach_mul(params, 1.0)
        optimizer.step()
        torch._foreach_lerp_(params, before, [1 - _per_member(rates, p, ensemble.size)
                                              for p in params])
        if decays.any():
            torch._foreach_sub_(params, torch._foreach_mul(
                before, [_per_member(decays, p, ensemble.size) for p in params]))


def _per_member(values: Tensor, like: Tensor, size: int) -> Tensor:
    """Per-member ``values`` shaped to scale ``like``, a parameter of an ensemble of
    ``size`` (member axis first), or of a model alone."""
    return values.view(-1, *(1,) * (like.dim() - 1)) if size > 1 else values[0]


def predictor(task: Task, bf16: bool) -> Callable[[nn.Module, TaskData], Tensor]:
    """``predict(model, batch)``: the model's output for the task in float32, computed under
    bfloat16 autocast on CUDA if ``bf16``."""

    def predict(model: nn.Module, batch: TaskData) -> Tensor:
        autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if bf16
                    else contextlib.nullcontext())
        with autocast:
            out = model(batch.inputs, u=batch.controls, steps=batch.steps,
                        per_step=task.supervise == "trajectory")
        return out.float()

    return predict


def fold_data(parts: Sequence[TaskData]) -> TaskData:
    """The members' data as one batch, member by member."""
    folded: dict[str, Any] = {n: torch.cat([getattr(p, n) for p in parts])
                              for n in _tensors(parts[0])}
    return dataclasses.replace(parts[0], **folded)


def _unfold(folded: Tensor, size: int) -> Tensor:
    """``(size · n, …)`` → ``(size, n, …)``: each member's rows."""
    return folded.unflatten(0, (size, -1))


@torch.no_grad()
def _check_fold(ensemble: Ensemble, task: Task, members: Sequence[_Member], rows: int) -> None:
    """Raise :class:`_Unfolded` unless the folded forward on the members' first ``rows``
    training examples equals each member's own forward on them, to float32 rounding (or
    where a member's ODE solve hits its step cap there, which it must meet alone)."""
    predict = predictor(task, bf16=False)
    parts = [member.data.subset(slice(0, rows)) for member in members]
    try:
        with _solver_cap():
            own = torch.cat([predict(model, part)
                             for model, part in zip(ensemble.members, parts, strict=True)])
            folded = predict(ensemble.module, fold_data(parts))
    except _SolverCapped as cap:
        raise _Unfolded from cap
    if not torch.allclose(folded, own, rtol=1e-4, atol=1e-5, equal_nan=True):
        raise _Unfolded


def _own_flops(ensemble: Ensemble, task: Task, batch: TaskData,
               predict: Callable[[nn.Module, TaskData], Tensor]) -> list[float]:
    """Each member's FLOPs in a forward and backward of its own on its rows of ``batch``.

    An ODE member's evaluations in an ensemble are its own, but the ensemble evaluates every
    member's rows until the slowest is done, so its FLOPs do not split by NFE."""
    flops: list[float] = []
    rows = len(batch) // ensemble.size
    for i, model in enumerate(ensemble.members):
        counter = FlopCounterMode(display=False)
        with counter:
            member_losses(model, task, batch.subset(slice(i * rows, (i + 1) * rows)), predict,
                          1).sum().backward()
        model.zero_grad(set_to_none=True)
        flops.append(counter.get_total_flops())
    return flops


def _clip_per_member(ensemble: Ensemble, params: Sequence[Tensor], max_norms: Tensor) -> None:
    """Clip each member's gradient to total norm ``max_norms[member]`` (0: unclipped), as
    ``clip_grad_norm_`` does."""
    grads = [cast(Tensor, p.grad) for p in params]  # the member axis first; all set
    norms = torch.cat([g.reshape(ensemble.size, -1) for g in grads], dim=1).norm(dim=1)
    scale = torch.where(max_norms > 0, (max_norms / (norms + 1e-6)).clamp(max=1.0), 1.0)
    torch._foreach_mul_(grads, [_per_member(scale, g, ensemble.size) for g in grads])


@dataclass
class Trained:
    """What training a cell produced: its row and, unless it failed, its weights (CPU); a
    plain value, which the run's process saves (:meth:`~.folder.RunFolder.save`)."""

    result: RunResult
    weights: dict[str, Tensor] | None = None


def seed_groups(cells: Iterable[Cell]) -> list[list[Cell]]:
    """The cells grouped by all but their seed and tunable train fields (a row's seeds at
    every grid value), in first-seen order, to train together (:func:`run_cells`); the cells
    of a model that cannot fold (see :func:`~ddl_dynamics.models.ensemble.fold`) stay apart,
    to spread over workers."""
    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        rest = json.dumps({**cell.to_dict(), "seed": None, "train": _budget(cell.train)},
                          sort_keys=True)
        groups.setdefault(rest, []).append(cell)
    return [split for group in groups.values()
            for split in ([group] if _folds(group[0]) else [[cell] for cell in group])]


def _folds(cell: Cell) -> bool:
    model = cell.build()[1]
    return fold([model, model]) is not None


def run_cells(cells: Sequence[Cell], progress: bool = False) -> list[Trained]:
    """Build and train cells that differ only in their seed and tunable fields, together
    where they fold (:func:`train_seeds`); never raises for a problem of the cells
    themselves. A cell whose model or data cannot be made (say, the task fails for its
    seed) is ``"failed"`` alone, and the others train; an error in training fails them all.
    """
    since = _Since.now(cells[0].train.device)
    failed: dict[int, BaseException] = {}
    ready: list[tuple[int, Task, nn.Module, _Member]] = []
    for i, cell in enumerate(cells):
        try:
            task, model = cell.build()
            member = _Member(cell.seed, cell.train,
                             *sample_splits(task, cell.train, cell.seed, SPLITS))
            ready.append((i, task, model, member))
        except Exception as err:  # failing cells must not stop the suite
            failed[i] = err
    trained: dict[int, Trained] = {}
    if ready:
        models = [model for _, _, model, _ in ready]
        try:
            results = _train_members(ready[0][1], models, [m for *_, m in ready], since,
                                     progress)
            trained = {i: Trained(result, {k: v.detach().cpu()
                                           for k, v in model.state_dict().items()})
                       for (i, _, model, _), result in zip(ready, results, strict=True)}
        except Exception as err:  # failing cells must not stop the suite
            failed |= {i: err for i, *_ in ready}
    wall_time = (time.perf_counter() - since.start) / len(cells)
    trained |= {i: Trained(RunResult(status="failed", message=describe_error(err),
                                     wall_time=wall_time)) for i, err in failed.items()}
    return [dataclasses.replace(trained[i], result=stamp(trained[i].result, cell))
            for i, cell in enumerate(cells)]


def stamp(result: RunResult, cell: Cell) -> RunResult:
    """``result`` carrying the identity and resolved config of ``cell``."""
    return dataclasses.replace(result, key=cell.key, task=cell.task_label, model=cell.label,
                               seed=cell.seed, config=cell.to_dict())


def describe_error(err: BaseException) -> str:
    """``Type: message (at file:line)`` of the innermost frame, for a result row."""
    where = traceback.extract_tb(err.__traceback__)[-1:] if err.__traceback__ else []
    at = f" (at {Path(where[0].filename).name}:{where[0].lineno})" if where else ""
    return f"{type(err).__name__}: {err}{at}"


def _diverged(loss: float, first: float) -> bool:
    """Non-finite, or above :data:`DIVERGENCE_FACTOR` × the first step's (positive) loss."""
    return not math.isfinite(loss) or (first > 0 and loss > DIVERGENCE_FACTOR * first)


def _lr_factor(cfg: TrainConfig) -> Callable[[int], float]:
    """Linear warmup to the base rate, then cosine decay to zero at ``cfg.steps``."""
    warmup = min(cfg.warmup_steps, cfg.steps - 1)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, cfg.steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

    return factor


def _batches(n: int, batch_size: int, generator: torch.Generator) -> Iterator[Tensor]:
    """Endless minibatch indices: a fresh permutation of the training set each epoch."""
    batch_size = min(batch_size, n)
    while True:
        perm = torch.randperm(n, generator=generator)
        for i in range(0, n - batch_size + 1, batch_size):
            yield perm[i:i + batch_size]


@contextlib.contextmanager
def _solver_cap() -> Iterator[None]:
    """Turn an ODE solve that ran out of steps (``ode_max_steps``) into :class:`_Capped`."""
    try:
        yield
    except SolverCapped as err:
        raise _SolverCapped(f"solver cap: {err}") from err


def to_device(data: TaskData, device: torch.device | str) -> TaskData:
    """``data`` with every tensor on ``device``."""
    return dataclasses.replace(data, **{n: getattr(data, n).to(device) for n in _tensors(data)})


def _tensors(data: TaskData) -> list[str]:
    """The names of the fields of ``data`` that hold tensors."""
    return [f.name for f in dataclasses.fields(data) if isinstance(getattr(data, f.name), Tensor)]


@torch.no_grad()
def _evaluate(model: nn.Module, task: Task, data: TaskData,
              predict: Callable[[nn.Module, TaskData], Tensor], size: int) -> list[float]:
    """Each member's metric on its rows of the folded ``data``."""
    model.eval()
    try:
        preds, targets = _unfold(predict(model, data), size), _unfold(data.targets, size)
        return [task.metric(p, t) for p, t in zip(preds, targets, strict=True)]
    finally:
        model.train()


def _reached(task: Task, metric: float, target: float) -> bool:
    return metric >= target if task.higher_is_better else metric <= target


def _final_metrics(
    model: nn.Module, task: Task, cfg: TrainConfig, member: _Member,
    predict: Callable[[nn.Module, TaskData], Tensor], ode: bool,
) -> tuple[dict[str, Any], str]:
    """Train/val/test/OOD metrics, task extras and ODE checks: the only time the test
    split is sampled and scored. A solver cap hit here leaves the affected figures
    ``None``. On train or val it is returned as a note (the cell is capped); on test, OOD
    data or the reconstruction check it is kept per split in ``metrics["capped"]``, a
    failure of that split alone, so that test data never steers the choice of a grid value
    or fails the trained split."""
    metrics: dict[str, Any] = {"metric": task.metric_name,
                               "higher_is_better": task.higher_is_better, "train": None,
                               "val": None, "test": None, "ood": {}, "skipped": {}, "extra": {},
                               "capped": {}}
    notes = []
    seed, data, val = member.seed, member.data, member.val
    test = to_device(member.test, val.inputs.device)

    @torch.no_grad()
    def score(split: str, split_data: TaskData, extras: bool = True) -> float | None:
        model.eval()
        try:
            with _solver_cap():
                pred = predict(model, split_data)
        except _Capped as cap:
            if split in ("train", "val"):
                notes.append(f"{split}: {cap}")
            else:
                metrics["capped"][split] = str(cap)
            return None
        finally:
            model.train()
        prefix = "" if split == "test" else f"{split}/"
        for name, value in (task.extra_metrics(pred, split_data) if extras else {}).items():
            metrics["extra"][prefix + name] = value
        return task.metric(pred, split_data.targets)

    metrics["train"] = score("train", data.subset(slice(0, cfg.n_val)), extras=False)
    metrics["val"] = score("val", val, extras=False)
    solver = cast("NeuralODE", model)  # its ODE counters and checks: read only where ode
    if ode:
        solver.reset_nfe()
    metrics["test"] = score("test", test)
    if ode:
        metrics["nfe_test"] = float(solver.nfe_forward[0])  # the model alone: one member
        metrics["reconstruction_tolerance"] = solver.reconstruction_tolerance
        try:
            with _solver_cap(), torch.no_grad():
                error = float(solver.reconstruction_error(test.inputs, test.controls))
        except _Capped as cap:
            error = None
            metrics["capped"]["reconstruction"] = str(cap)
        metrics["reconstruction_error"] = error
        metrics["reconstruction_flag"] = (None if error is None
                                          else not error <= solver.reconstruction_tolerance)
    depth = getattr(model, "depth", None)
    for split in task.ood_splits:
        split_data = to_device(task.sample(cfg.n_test, seed, split), test.inputs.device)
        if model.can_extrapolate or split_data.steps == depth:
            metrics["ood"][split] = score(split, split_data)
        else:
            metrics["ood"][split] = None
            metrics["skipped"][split] = (f"an untied model of depth {depth} cannot run "
                                         f"{split_data.steps} steps")
    return metrics, "; ".join(notes)


@torch.no_grad()
def _forward_flops(model: nn.Module, batch: TaskData,
                   predict: Callable[[nn.Module, TaskData], Tensor]) -> float | None:
    """Forward FLOPs per sample, counted on one test batch of the trained model."""
    model.eval()
    counter = FlopCounterMode(display=False)
    try:
        with _solver_cap(), counter:
            predict(model, batch)
    except _Capped:
        return None
    finally:
        model.train()
    return counter.get_total_flops() / len(batch)


#: Linux: writing "5" here resets the process's resident-set high-water mark, ``VmHWM``.
_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")
#: What ``peak_mem`` measured, by how the peak could be reset.
PEAK_MEMORY_MEASURES = {
    "cuda": "CUDA memory allocated, peak during this cell",
    "cell": "resident set size, peak during this cell (VmHWM reset at its start)",
    "process": "resident set size, peak of the worker process since it started "
               "(not reset per cell: includes earlier cells in the same process)",
}


def _reset_peak_memory(device: torch.device) -> str:
    """Start measuring this cell's peak memory; returns the key of what will be measured."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return "cuda"
    try:
        _CLEAR_REFS.write_text("5")
        return "cell" if "VmHWM" in _STATUS.read_text() else "process"
    except OSError:
        return "process"


def _peak_memory(device: torch.device, measure: str) -> tuple[int, str]:
    """Peak memory in bytes since :func:`_reset_peak_memory`, and what it measured."""
    if measure == "cuda":
        peak = int(torch.cuda.max_memory_allocated(device))
    elif measure == "cell":
        found = re.search(r"VmHWM:\s*(\d+) kB", _STATUS.read_text())
        if found is None:  # (the measure is "cell" only where the status has it)
            raise RuntimeError(f"no VmHWM in {_STATUS}")
        peak = int(found[1]) * 1024
    else:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak = int(rss if sys.platform == "darwin" else rss * 1024)  # bytes on macOS, else KiB
    return peak, PEAK_MEMORY_MEASURES[measure]
