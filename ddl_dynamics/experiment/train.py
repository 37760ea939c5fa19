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
import math
import os
import re
import resource
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode
from tqdm.auto import tqdm

from .._task import Task, TaskData
from ..models.params import count_parameters
from .config import Cell, TrainConfig
from .store import RunResult, model_path

#: A training loss above this multiple of the first step's loss (or a non-finite one)
#: means the run diverged: a finite blow-up (lr far too high, no clipping) is not a result.
DIVERGENCE_FACTOR = 1e6


class _Capped(Exception):
    """A time or solver-step cap stopped training."""


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
    Exceptions propagate (:func:`run_cell` records them as failed).
    """
    start = time.perf_counter()
    device = torch.device(cfg.device)
    memory = _reset_peak_memory(device)
    model = model.to(device).train()
    ode = hasattr(model, "reset_nfe")
    data = _to(task.sample(cfg.n_train, seed, "train"), device)
    val = _to(task.sample(cfg.n_val, seed, "val"), device)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16)
                if cfg.bf16 and device.type == "cuda" else contextlib.nullcontext())

    def predict(batch: TaskData) -> Tensor:
        with autocast:
            out = model(batch.inputs, u=batch.controls, steps=batch.steps,
                        per_step=task.supervise == "trajectory")
        return out.float()

    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                                  fused=True)  # one kernel for all tensors: ~6x faster on CPU
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_factor(cfg))
    order = _batches(len(data), cfg.batch_size, torch.Generator().manual_seed(seed))
    status, message, done, first_loss = "ok", "", 0, math.nan
    curve: list[list[float]] = []
    losses: list[float] = []
    nfe: list[tuple[float, float]] = []  # (forward, backward) per step, for ODE models
    flops_done, flops_per_unit = 0.0, 0.0
    bar = tqdm(total=cfg.steps, disable=not progress, leave=False, unit="step")
    try:
        for step in range(1, cfg.steps + 1):
            batch = data.subset(next(order))
            counter = FlopCounterMode(display=False) if step == 1 else contextlib.nullcontext()
            if ode:
                model.reset_nfe()
            with _solver_cap(), counter:
                loss = task.loss(predict(batch), batch.targets)
                value = loss.item()
                if step == 1:
                    first_loss = value
                if _diverged(value, first_loss):
                    status = "diverged"
                    message = (f"loss became {value:.4g} at step {step} (first step: "
                               f"{first_loss:.4g}); training stopped")
                    break
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
            if ode:
                nfe.append((float(model.nfe_forward), float(model.nfe_backward)))
            # FLOPs are counted on step 1; an ODE step's FLOPs scale with its NFE
            units = max(sum(nfe[-1]), 1.0) if ode else 1.0
            if step == 1:
                flops_per_unit = counter.get_total_flops() / units
            flops_done += flops_per_unit * units
            if cfg.grad_clip:
                nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip, foreach=True)
            optimizer.step()
            scheduler.step()
            done = step
            losses.append(value)
            bar.update()
            if step % cfg.eval_every == 0 or step == cfg.steps:
                metric = _evaluate(model, task, val, predict)
                recent = [f for f, _ in nfe[-len(losses):]]
                curve.append([step, sum(losses) / len(losses), metric, flops_done,
                              sum(recent) / len(recent) if recent else None])
                losses.clear()
                if cfg.target_metric is not None and _reached(task, metric, cfg.target_metric):
                    message = f"val metric reached target_metric {cfg.target_metric} at step {step}"
                    break
            elapsed = time.perf_counter() - start
            if cfg.max_seconds is not None and elapsed > cfg.max_seconds and step < cfg.steps:
                raise _Capped(f"time cap: stopped at step {step}/{cfg.steps} after "
                              f"{elapsed:.1f} s (max_seconds={cfg.max_seconds})")
    except _Capped as cap:
        status, message = "capped", str(cap)
    finally:
        bar.close()
    metrics, cap_note = _final_metrics(model, task, cfg, seed, data, val, predict, ode)
    metrics["steps"] = done
    if cap_note and status == "ok":
        status, message = "capped", f"cap during the final evaluation: {cap_note}"
    mean_nfe = [sum(column) / len(column) for column in zip(*nfe, strict=True)] if nfe else []
    peak_mem, metrics["peak_mem_measure"] = _peak_memory(device, memory)
    return RunResult(
        status=status,
        message=message,
        metrics=metrics,
        curve=curve,
        params=count_parameters(model),
        flops=_forward_flops(model, val.subset(slice(0, cfg.batch_size)), predict),
        nfe_forward=mean_nfe[0] if mean_nfe else None,
        nfe_backward=mean_nfe[1] if mean_nfe else None,
        wall_time=time.perf_counter() - start,
        peak_mem=peak_mem,
    )


def run_cell(cell: Cell, run_dir: str | Path | None = None, progress: bool = False) -> RunResult:
    """Build and train one cell, saving its weights into ``run_dir``; never raises
    for a problem of the cell itself (that becomes a ``"failed"`` result)."""
    start = time.perf_counter()
    try:
        task, model = cell.build()
        result = train(task, model, cell.train, cell.seed, progress=progress)
        if run_dir is not None:
            _save(model, model_path(run_dir, cell.key))
    except Exception as err:  # one failing cell must not stop the suite
        result = RunResult(status="failed", message=describe_error(err),
                           wall_time=time.perf_counter() - start)
    return stamp(result, cell)


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
        raise _Capped(f"solver cap: {err}") from err


def _to(data: TaskData, device: torch.device) -> TaskData:
    def move(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.to(device)

    return dataclasses.replace(data, inputs=move(data.inputs), targets=move(data.targets),
                               controls=move(data.controls), trajectory=move(data.trajectory))


@torch.no_grad()
def _evaluate(model: nn.Module, task: Task, data: TaskData,
              predict: Callable[[TaskData], Tensor]) -> float:
    model.eval()
    try:
        return task.metric(predict(data), data.targets)
    finally:
        model.train()


def _reached(task: Task, metric: float, target: float) -> bool:
    return metric >= target if task.higher_is_better else metric <= target


def _final_metrics(
    model: nn.Module, task: Task, cfg: TrainConfig, seed: int, data: TaskData, val: TaskData,
    predict: Callable[[TaskData], Tensor], ode: bool,
) -> tuple[dict[str, Any], str]:
    """Train/val/test/OOD metrics, task extras and ODE checks: the only time the test
    split is sampled and scored. A solver cap hit here leaves the affected figures
    ``None`` and is returned as a note."""
    metrics: dict[str, Any] = {"metric": task.metric_name,
                               "higher_is_better": task.higher_is_better, "train": None,
                               "val": None, "test": None, "ood": {}, "skipped": {}, "extra": {}}
    notes = []
    test = _to(task.sample(cfg.n_test, seed, "test"), val.inputs.device)

    @torch.no_grad()
    def score(split: str, split_data: TaskData, extras: bool = True) -> float | None:
        model.eval()
        try:
            with _solver_cap():
                pred = predict(split_data)
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
        metrics["nfe_test"] = float(model.nfe_forward)
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
        split_data = _to(task.sample(cfg.n_test, seed, split), test.inputs.device)
        if model.can_extrapolate or split_data.steps == depth:
            metrics["ood"][split] = score(split, split_data)
        else:
            metrics["ood"][split] = None
            metrics["skipped"][split] = (f"an untied model of depth {depth} cannot run "
                                         f"{split_data.steps} steps")
    return metrics, "; ".join(notes)


@torch.no_grad()
def _forward_flops(model: nn.Module, batch: TaskData,
                   predict: Callable[[TaskData], Tensor]) -> float | None:
    """Forward FLOPs per sample, counted on one test batch of the trained model."""
    model.eval()
    counter = FlopCounterMode(display=False)
    try:
        with _solver_cap(), counter:
            predict(batch)
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


def _save(model: nn.Module, path: Path) -> None:
    """Write the weights atomically: a stored row never points at half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    torch.save(model.state_dict(), tmp)
    tmp.replace(path)
