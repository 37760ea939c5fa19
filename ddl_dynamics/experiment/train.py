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
import os
import re
import resource
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode
from tqdm.auto import tqdm

from .._task import Task, TaskData
from ..models.ensemble import Ensemble, alone, fold
from ..models.params import count_parameters
from .config import Cell, TrainConfig
from .store import ResultStore, RunResult, model_path, store_path

#: A training loss above this multiple of the first step's loss (or a non-finite one)
#: means the run diverged: a finite blow-up (lr far too high, no clipping) is not a result.
DIVERGENCE_FACTOR = 1e6


class _Capped(Exception):
    """A time or solver-step cap stopped training."""


class _SolverCapped(_Capped):
    """An ODE solve ran out of steps (``ode_max_steps``)."""


def train(
    task: Task, model: nn.Module, cfg: TrainConfig, seed: int, *, progress: bool = False
) -> RunResult:
    """Train ``model`` on ``task`` for ``cfg.steps`` steps and evaluate it.

    The train, val and test sets (``cfg.n_train``, ``n_val``, ``n_test`` samples) come from
    the task's own seeded sampler, minibatch order from a generator seeded with ``seed``;
    with the model initialised under ``torch.manual_seed(seed)`` a CPU run is reproducible.
    The curve and ``target_metric`` read val; test is scored once, after training. A loss
    that is non-finite or above :data:`DIVERGENCE_FACTOR` × the first step's loss stops the
    run as ``"diverged"``, a time or solver cap (in training or in the final evaluation) as
    ``"capped"``: both are failures, scored where possible.
    Exceptions propagate (:func:`run_cells` records them as failed).
    """
    return _train(alone(model), task, cfg, [seed], progress)[0]


def train_seeds(
    task: Task, models: Sequence[nn.Module], cfg: TrainConfig, seeds: Sequence[int], *,
    progress: bool = False,
) -> list[RunResult]:
    """Train ``models[i]``, initialised for ``seeds[i]``, as :func:`train` would on that seed,
    all at once where they fold into one ensemble (:func:`~ddl_dynamics.models.ensemble.fold`),
    else one after another.

    In an ensemble each member sees its own seed's data, batches and minibatch order, has
    its own optimiser state (AdamW acts per element), gradient clipping, early stop and
    divergence check: a member that diverges or reaches ``target_metric`` is frozen with its
    weights of that moment while the others go on. So each result is the one its seed gets
    alone, to float rounding (for an adaptive ODE, unless rounding flips one of its step
    decisions, after which the two runs drift apart by about the solver's tolerance).
    ``wall_time`` is the ensemble's divided among its members, ``peak_mem`` the ensemble's,
    and ``metrics["ensemble"]`` the number of seeds trained together. Members that fold but
    whose folded forward differs from their own (a model whose ops mix the batch), or of
    which one hits the ODE solver's step cap, are trained one after another.
    """
    ensemble = fold(models)
    if ensemble is not None:
        with contextlib.suppress(_Unfolded):
            return _train(ensemble, task, cfg, seeds, progress)
    return [_train(alone(m), task, cfg, [seed], progress)[0] for m, seed in zip(models, seeds,
                                                                                  strict=True)]


class _Unfolded(Exception):
    """The folded ensemble's forward differs from its members' own."""


class _Member:
    """How one member of an ensemble is doing: its status, curve and counters."""

    def __init__(self, seed: int, data: TaskData, val: TaskData) -> None:
        self.seed, self.data, self.val = seed, data, val
        self.status, self.message, self.done, self.training = "ok", "", 0, True
        self.first_loss = math.nan
        self.curve: list[list[float]] = []
        self.losses: list[float] = []
        self.nfe: list[tuple[float, float]] = []  # (forward, backward) per step, ODE models
        self.flops = 0.0

    def stop(self, status: str, message: str) -> None:
        self.status, self.message, self.training = status, message, False


def _train(ensemble: Ensemble, task: Task, cfg: TrainConfig, seeds: Sequence[int],
           progress: bool) -> list[RunResult]:
    """The training loop of :func:`train_seeds`, over the folded batches of ``ensemble``."""
    start = time.perf_counter()
    device = torch.device(cfg.device)
    memory = _reset_peak_memory(device)
    size = ensemble.size
    module = ensemble.module.to(device).train()
    for model in ensemble.members:
        model.to(device).train()
    ode = hasattr(module, "reset_nfe")
    members = [_Member(seed, to_device(task.sample(cfg.n_train, seed, "train"), device),
                       to_device(task.sample(cfg.n_val, seed, "val"), device)) for seed in seeds]
    data, val = fold_data([m.data for m in members]), fold_data([m.val for m in members])
    predict = predictor(task, cfg.bf16 and device.type == "cuda")
    if size > 1:
        _check_fold(ensemble, task, members, min(cfg.batch_size, cfg.n_train))

    optimizer = make_optimizer(module, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_factor(cfg))
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
                module.reset_nfe()
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
                        cfg.grad_clip)
            # each member's (forward, backward) NFE; an ODE step's FLOPs scale with its NFE
            nfe = list(zip(module.nfe_forward, module.nfe_backward, strict=True)) if ode else None
            units = [max(sum(n), 1) for n in nfe] if nfe else [1] * size
            if step == 1:  # FLOPs are counted on step 1
                with _solver_cap():
                    flops = (_own_flops(ensemble, task, batch, predict) if ode and size > 1
                             else [counter.get_total_flops() / size] * size)
                flops_per_unit = [f / u for f, u in zip(flops, units, strict=True)]
            scheduler.step()
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
    results = [_result(model, task, cfg, member, predict, ode)
               for model, member in zip(models, members, strict=True)]
    peak_mem, measure = _peak_memory(device, memory)
    wall_time = (time.perf_counter() - start) / size
    for result in results:
        result.metrics.update(peak_mem_measure=measure, ensemble=size)
        result.peak_mem, result.wall_time = peak_mem, wall_time
    return results


def _result(model: nn.Module, task: Task, cfg: TrainConfig, member: _Member,
            predict: Callable[[nn.Module, TaskData], Tensor], ode: bool) -> RunResult:
    """One trained member's row: its final metrics, counts and curve."""
    metrics, cap_note = _final_metrics(model, task, cfg, member, predict, ode)
    metrics["steps"] = member.done
    status, message = member.status, member.message
    if cap_note and status == "ok":
        status, message = "capped", f"cap during the final evaluation: {cap_note}"
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


def make_optimizer(module: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW over every parameter; it acts per element, so it serves an ensemble's members
    as it would each alone."""
    return torch.optim.AdamW(module.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                             fused=True)  # one kernel for all tensors: ~6x faster on CPU


def member_losses(module: nn.Module, task: Task, batch: TaskData,
                  predict: Callable[[nn.Module, TaskData], Tensor], size: int) -> Tensor:
    """Each member's training loss on its rows of the folded ``batch``, ``(size,)``."""
    preds, targets = _unfold(predict(module, batch), size), _unfold(batch.targets, size)
    return torch.stack([task.loss(p, t) for p, t in zip(preds, targets, strict=True)])


def descend(ensemble: Ensemble, optimizer: torch.optim.Optimizer, losses: Tensor,
            training: Tensor, grad_clip: float) -> None:
    """One optimiser step of the members still ``training`` (a bool mask), each on its
    own loss, its gradient clipped to ``grad_clip`` (0: unclipped)."""
    optimizer.zero_grad(set_to_none=True)
    torch.where(training, losses, 0.0).sum().backward()
    if grad_clip:
        _clip_per_member(ensemble, grad_clip)
    optimizer.step()


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
    return dataclasses.replace(
        parts[0], **{n: torch.cat([getattr(p, n) for p in parts]) for n in _tensors(parts[0])})


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
    flops, rows = [], len(batch) // ensemble.size
    for i, model in enumerate(ensemble.members):
        counter = FlopCounterMode(display=False)
        with counter:
            member_losses(model, task, batch.subset(slice(i * rows, (i + 1) * rows)), predict,
                          1).sum().backward()
        model.zero_grad(set_to_none=True)
        flops.append(counter.get_total_flops())
    return flops


def _clip_per_member(ensemble: Ensemble, max_norm: float) -> None:
    """Clip each member's gradient to total norm ``max_norm``, as ``clip_grad_norm_`` does."""
    params = [p for p in ensemble.module.parameters() if p.grad is not None]
    if ensemble.size == 1:
        nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
        return
    grads = [p.grad for p in params]  # the member axis first
    norms = torch.cat([g.reshape(ensemble.size, -1) for g in grads], dim=1).norm(dim=1)
    scale = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    torch._foreach_mul_(grads, [scale.view(-1, *(1,) * (g.dim() - 1)) for g in grads])


@dataclass
class Trained:
    """What training a cell produced: its row and, unless it failed, its weights (CPU)."""

    result: RunResult
    weights: dict[str, Tensor] | None = None

    def save(self, run_dir: str | Path) -> None:
        """Write the weights (atomically: a stored row never points at half a file), then
        the row."""
        if self.weights is not None:
            path = model_path(run_dir, self.result.key)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            torch.save(self.weights, tmp)
            tmp.replace(path)
        ResultStore(store_path(run_dir)).put(self.result)


def seed_groups(cells: Iterable[Cell]) -> list[list[Cell]]:
    """The cells grouped by all but their seed, in first-seen order, to train together
    (:func:`run_cells`); the cells of a model that cannot fold (see
    :func:`~ddl_dynamics.models.ensemble.fold`) stay apart, to spread over workers."""
    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        rest = json.dumps({**cell.to_dict(), "seed": None}, sort_keys=True)
        groups.setdefault(rest, []).append(cell)
    return [split for group in groups.values()
            for split in ([group] if _folds(group[0]) else [[cell] for cell in group])]


def _folds(cell: Cell) -> bool:
    model = cell.build()[1]
    return fold([model, model]) is not None


def run_cells(cells: Sequence[Cell], progress: bool = False) -> list[Trained]:
    """Build and train cells that differ only in their seed, together where they fold
    (:func:`train_seeds`); never raises for a problem of the cells themselves (that makes
    each of them a ``"failed"`` result)."""
    start = time.perf_counter()
    try:
        built = [cell.build() for cell in cells]
        models = [model for _, model in built]
        results = train_seeds(built[0][0], models, cells[0].train, [c.seed for c in cells],
                              progress=progress)
        trained = [Trained(result, {k: v.detach().cpu() for k, v in model.state_dict().items()})
                   for result, model in zip(results, models, strict=True)]
    except Exception as err:  # failing cells must not stop the suite
        failed = RunResult(status="failed", message=describe_error(err),
                           wall_time=(time.perf_counter() - start) / len(cells))
        trained = [Trained(failed) for _ in cells]
    return [dataclasses.replace(t, result=stamp(t.result, cell))
            for t, cell in zip(trained, cells, strict=True)]


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
    except (AssertionError, RuntimeError) as err:
        if "max_num_steps" not in str(err):
            raise
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
    ``None`` and is returned as a note."""
    metrics: dict[str, Any] = {"metric": task.metric_name,
                               "higher_is_better": task.higher_is_better, "train": None,
                               "val": None, "test": None, "ood": {}, "skipped": {}, "extra": {}}
    notes = []
    seed, data, val = member.seed, member.data, member.val
    test = to_device(task.sample(cfg.n_test, seed, "test"), val.inputs.device)

    @torch.no_grad()
    def score(split: str, split_data: TaskData, extras: bool = True) -> float | None:
        model.eval()
        try:
            with _solver_cap():
                pred = predict(model, split_data)
        except _Capped as cap:
            notes.append(f"{split}: {cap}")
            return None
        finally:
            model.train()
        prefix = "" if split == "test" else f"{split}/"
        for name, value in (task.extra_metrics(pred, split_data) if extras else {}).items():
            metrics["extra"][prefix + name] = value
        return task.metric(pred, split_data.targets)

    metrics["train"] = score("train", data.subset(slice(0, cfg.n_val)), extras=False)
    metrics["val"] = score("val", val, extras=False)
    if ode:
        model.reset_nfe()
    metrics["test"] = score("test", test)
    if ode:
        metrics["nfe_test"] = float(model.nfe_forward[0])  # the model alone: one member
        metrics["reconstruction_tolerance"] = model.reconstruction_tolerance
        try:
            with _solver_cap(), torch.no_grad():
                error = float(model.reconstruction_error(test.inputs, test.controls))
        except _Capped as cap:
            error = None
            notes.append(f"reconstruction: {cap}")
        metrics["reconstruction_error"] = error
        metrics["reconstruction_flag"] = (None if error is None
                                          else not error <= model.reconstruction_tolerance)
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
        peak = int(re.search(r"VmHWM:\s*(\d+) kB", _STATUS.read_text())[1]) * 1024
    else:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak = int(rss if sys.platform == "darwin" else rss * 1024)  # bytes on macOS, else KiB
    return peak, PEAK_MEMORY_MEASURES[measure]
