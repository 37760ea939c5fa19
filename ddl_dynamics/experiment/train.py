"""Training one cell, identically for every model family.

Same optimiser (AdamW, linear warmup then cosine decay, gradient clipping), same fixed
step budget, same data per seed: only the depth dynamics differ between rows. The training
curve and early stopping read the val split; the test split is scored once, at the end.
Besides metrics, a run records what a fair comparison needs: parameters, FLOPs, function
evaluations, time and memory, and how it ended. This module sets training up and makes
the rows; the loop of one ensemble (`loop`), the step (`step`), the optimiser (`optim`),
the data (`splits`, `batches`), the final scoring (`evaluate`) and the memory measure
(`memory`) live beside it.
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
from typing import Any, TypeVar

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from .._task import Task
from ..models.ensemble import Ensemble, alone, fold
from ..models.params import count_parameters
from .caps import Capped, SolverCap
from .config import Cell, TrainConfig
from .evaluate import final_metrics, forward_flops
from .grid import TUNABLE, row_identity
from .loop import Loop, Member, Unfolded
from .memory import peak_memory, reset_peak_memory
from .result import RunResult
from .splits import SPLITS, sample_splits
from .step import Predict
from .threads import torch_threads
from .trained import Trained


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
    that is non-finite or above `loop.DIVERGENCE_FACTOR` × the first step's loss stops the
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
        Member(seed, cfg, *sample_splits(task, cfg, seed, SPLITS))
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
    members: Sequence[Member],
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
        with contextlib.suppress(Unfolded):
            return _train(ensemble, task, members, since, progress)
    return [
        _train(alone(model), task, [member], since, progress)[0]
        for model, member in zip(models, members, strict=True)
    ]


def _budget(cfg: TrainConfig) -> dict[str, Any]:
    """What members trained together must share: the config but its tunable fields."""
    return {k: v for k, v in dataclasses.asdict(cfg).items() if k not in TUNABLE}


def _train(
    ensemble: Ensemble, task: Task, members: Sequence[Member], since: _Since, progress: bool
) -> list[RunResult]:
    """The training loop of `train_seeds`, over the folded batches of ``ensemble``:
    a step at a time until every member has stopped or the budget is spent; a cap stops
    the members still training (a solver cap in an ensemble raises `Unfolded`, so
    that the members train alone and one's cap stops no other)."""
    loop = Loop(ensemble, task, members)
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
            raise Unfolded from cap
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


def _results(loop: Loop, since: _Since) -> list[RunResult]:
    """Each member's row once training has stopped: the members still training take their
    weights from the ensemble; all share its peak memory, and its time and compile seconds
    per member."""
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
        result.metrics.update(
            peak_mem_measure=measure,
            ensemble=ensemble.size,
            compiled=loop.compile.compiled,
            compile_s=loop.compile.seconds / ensemble.size,
        )
        result.peak_mem, result.wall_time = peak_mem, wall_time
    return results


def _result(model: nn.Module, task: Task, member: Member, predict: Predict, ode: bool) -> RunResult:
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


def _cpu_state(model: nn.Module) -> dict[str, Tensor]:
    """The model's state dict on the CPU, with the layout versions of its layers
    (``_metadata``), by which a later release converts what it has changed."""
    state = model.state_dict()
    for key, value in state.items():
        state[key] = value.cpu()
    return state


def seed_groups(cells: Iterable[Cell], workers: int = 1) -> list[list[Cell]]:
    """The cells grouped by row (`row_identity`: a row's seeds at every grid
    value), in first-seen order, to train together (`run_cells`); the cells
    of a model that cannot fold (see [`fold`][ddl_dynamics.models.ensemble.fold]) stay apart,
    to spread over workers, and the rows of a few large groups are shared out (`spread`)."""
    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        groups.setdefault(row_identity(cell.to_dict()), []).append(cell)
    return spread(
        [
            split
            for group in groups.values()
            for split in ([group] if _folds(group[0]) else [[cell] for cell in group])
        ],
        workers,
    )


T = TypeVar("T")

#: Fewest cells a share of a split group holds: fewer fold too little work to pay.
MIN_SHARE = 8


def spread(groups: list[list[T]], workers: int) -> list[list[T]]:
    """``groups`` with each cut into equal shares where their number would leave workers idle:
    three rows on two workers train two groups one after the other on one worker while the
    other waits, so each is cut in two and the six shares keep both busy. Only a few groups
    are cut (fewer than four per worker: past that the idle tail is short) and only into
    shares of at least `MIN_SHARE` cells."""
    if not groups or len(groups) >= 4 * workers:
        return groups
    parts = workers // math.gcd(len(groups), workers)
    if parts == 1 or min(len(g) for g in groups) < parts * MIN_SHARE:
        return groups
    return [group[i::parts] for group in groups for i in range(parts)]


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
    ready: list[tuple[int, Task, nn.Module, Member]] = []
    for i, cell in enumerate(cells):
        try:
            task, model = cell.build()
            member = Member(
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
