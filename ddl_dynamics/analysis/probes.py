"""Probes: run each trained model once over its test and OOD splits and cache what it did.

Per layer and sample of a Delta stack: β, ‖k̃‖, the readout kᵀX, the target v, and the
discrepancy before and after the update; for every family, the hidden depth trajectory
and the decoded per-step predictions beside the ground truth. The run's
`RunFolder` keeps them (``probes/<key>.npz``, each
read once and then held in memory), so figures and reports never retrain or rerun a model;
a file that cannot be read counts as missing, so a probe killed midway is done again.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from tqdm.auto import tqdm

from .._task import Task
from ..experiment.config import COUNTED
from ..experiment.folder import RunFolder
from ..experiment.result import RunResult
from ..experiment.threads import torch_threads
from ..models.base import MODELS, DepthModel, Model, family
from ..models.delta import DeltaProbe
from ..models.transformer import Transformer
from .run import Run, load_run

PROBE_SAMPLES = 256


def _folder(run: Run) -> RunFolder:
    if run.folder is None:
        raise ValueError(f"{run.run_dir}: a run made of rows alone has no trained models to probe")
    return run.folder


def usable_rows(run: Run) -> list[RunResult]:
    """The cells the report shows (each row at its chosen grid value) whose metrics count
    and whose trained weights are stored (none, in a run made of rows alone)."""
    folder = run.folder
    return [
        r
        for r in run.selected()
        if r.status in COUNTED and folder is not None and folder.has_weights(r.key)
    ]


def updates_per_sublayer(row: RunResult) -> int:
    """How many delta updates each sublayer of a row's Transformer makes, one probe row each
    (``product`` n_h; 1 for any other block)."""
    return int(row.config.get("config", {}).get("product", 1))


@torch.no_grad()
def probe_model(
    task: Task, model: Model, seed: int, n: int = PROBE_SAMPLES
) -> dict[str, np.ndarray]:
    """Arrays of one trained model on ``n`` samples of each split it can run.

    Per split ``s``: ``s_states`` (hidden trajectory), ``s_pred`` (decoded per step),
    ``s_truth`` (ground-truth trajectory) and ``s_step_regimes`` (the regime of each exact
    step, see `TaskData`), where the task has them. For a model that `probes` (a Delta
    stack), on the test split: ``beta``, ``k_raw_norm``, ``readout``, ``v``, ``e_pre``,
    ``e_post``; for a sequence model, these gate arrays, the test tokens and where its
    attention looks (`_probe_sequence`).
    """
    if task.kind == "sequence":
        return _probe_sequence(task, cast(Transformer, model), seed, n)
    model = cast(DepthModel, model)  # a vector task's
    arrays: dict[str, np.ndarray] = {}
    for split in task.splits[1:]:  # test and the OOD splits
        data = task.sample(n, seed, split)
        if data.steps > model.depth and not model.can_extrapolate:
            continue
        states = model.trajectory(data.inputs, data.controls, data.steps)
        arrays[f"{split}_states"] = states.numpy()
        arrays[f"{split}_pred"] = model.decode(states[:, 1:]).numpy()
        if data.trajectory is not None:
            arrays[f"{split}_truth"] = data.trajectory.numpy()
        if data.step_regimes is not None:
            arrays[f"{split}_step_regimes"] = data.step_regimes.numpy()
        if split == "test" and model.probes:
            probe = cast(Any, model).probe(data.inputs, data.controls, data.steps)
            arrays.update(_gate_arrays(probe))
    return arrays


def _probe_sequence(task: Task, model: Transformer, seed: int, n: int) -> dict[str, np.ndarray]:
    """A Transformer on ``n`` test sequences: ``test_tokens`` ``(n, T)``; ``test_looks``, the
    key position every head of every block's attention weighs most from each token
    ``(n, T, depth, heads)``; and a Delta model's gates, every token counted as a sample and
    every sublayer as a layer, ``(n · T, 2 · depth, ·)``."""
    tokens = task.sample(n, seed, "test").inputs
    arrays = {"test_tokens": tokens.numpy(), "test_looks": model.looks(tokens).numpy()}
    if model.probes:
        probe = cast(Any, model).probe(tokens)  # a Delta Transformer: (n, T, sublayers, ·)
        arrays.update(
            {name: a.reshape(-1, *a.shape[2:]) for name, a in _gate_arrays(probe).items()}
        )
    return arrays


def _gate_arrays(probe: DeltaProbe) -> dict[str, np.ndarray]:
    names = ("beta", "k_raw_norm", "readout", "v", "e_pre", "e_post", "beta_write", "update")
    return {
        name: getattr(probe, name).float().numpy()
        for name in names
        if getattr(probe, name) is not None
    }


def probe_run(
    run: Run | str | Path,
    n: int = PROBE_SAMPLES,
    progress: bool = True,
    rows: Sequence[RunResult] | None = None,
) -> int:
    """Probe the cells ``rows`` (default: every cell the report shows, warning of those with
    no stored weights) whose probe is not kept yet; returns how many were probed. With
    ``progress``, a bar says what it does, with its time and the time left, and a last line
    how long it took."""
    run = run if isinstance(run, Run) else load_run(run)
    folder = _folder(run)
    missing = [r for r in run.selected() if r.status in COUNTED and not folder.has_weights(r.key)]
    if missing and rows is None:  # figures are drawn without them: say so, naming them
        named = ", ".join(f"{r.task} × {r.model} seed {r.seed} ({r.key})" for r in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        warnings.warn(
            f"{run.run_dir}: {len(missing)} of {len(run.selected())} shown cells have "
            f"no stored weights (models/<key>.pt) and are left out of the figures: "
            f"{named}{more}",
            UserWarning,
            stacklevel=2,
        )
    todo = [r for r in (usable_rows(run) if rows is None else rows) if folder.probe(r.key) is None]
    shown = progress and bool(todo)
    what = (
        f"probing {len(todo)} trained models on {n} test samples each (gates, states, "
        f"predictions; once, cached in {folder.probe_path('').parent})"
    )
    start = time.perf_counter()
    with torch_threads(1):  # as in training: several threads on a busy machine are 10× slower
        for row in tqdm(
            todo,
            desc=what,
            disable=not shown,
            leave=False,
            unit="model",
            bar_format="{desc}: {n}/{total} [{elapsed}<{remaining}]",
        ):
            task, model = folder.load_model(row.key)
            folder.put_probe(row.key, probe_model(task, model, row.seed, n))
    if shown:
        print(
            f"probed {len(todo)} trained models in {time.perf_counter() - start:.1f} s",
            file=sys.stderr,
        )
    return len(todo)


def load_probes(run: Run) -> Iterator[tuple[RunResult, dict[str, np.ndarray]]]:
    """The kept probes of the cells the report shows (those not yet probed are left out),
    by row and seed."""
    for row in usable_rows(run):
        arrays = _folder(run).probe(row.key)
        if arrays is not None:
            yield row, arrays


def erases(row: RunResult) -> bool:
    """Whether the cell's model family declares that it `erases` (a Delta stack with the
    erase term: ``ddl``, ``ddl-transformer``, ``ddl-product`` with one probe row per update,
    ``ddl-decoupled`` whose β is its erase gate, or a family of the user's): only there does β
    set the shortcut's eigenvalue 1 − β, so only there do gate regimes apply (the write-only
    controls' β merely scales their write)."""
    return declares(row, "erases")


def declares(row: RunResult, trait: str) -> bool:
    """Whether the cell's model family declares ``trait`` (one of `Model`'s: ``erases``,
    ``mixes_streams``, …); a family no longer registered declares nothing."""
    name = row.config.get("model")
    return isinstance(name, str) and name in MODELS and bool(getattr(family(name), trait))
