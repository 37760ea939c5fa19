"""Whether an ensemble's training steps run through ``torch.compile``, and where the
compiled kernels are kept.

``train.compile = "auto"`` (the default) compiles a group only where it pays: compiling
costs tens of seconds per architecture and shape on a cold cache (a few seconds once
inductor's cache holds its kernels), about what a few hundred steps of a small model save.
So `CompileChoice` times a few eager steps of the group, then compiles when the saving
expected over the steps left, ``steps left × eager step × (1 − 1/gain)``, exceeds the
compile's expected cost. ``gain`` is the family's measured eager-over-compiled step time
(`Model.compile_gain`; 1 where compiling does not pay, so ``auto`` never compiles it),
measured on ensembles of 16–24 members: a smaller one gives inductor's fused loops less to
save (3 Delta Transformers on swap-track gained 1.07×), so below `FULL_GAIN_MEMBERS` the
gain is taken in proportion (`expected_gain`). The
cost is nothing for a shape already compiled in this process (its graph is reused), the
seconds its last compile took on this machine where one is recorded in the cache folder,
else `COLD_COMPILE_S`.

Every process of a run, its ``--jobs`` workers and Ray's alike, keeps inductor's cache in one
stated folder (`cache_folder`), so a rerun finds it warm.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from torch import nn

from .._task import Task, TaskData

#: ``train.compile``: force compiling on or off, or leave it to `CompileChoice`.
CompileMode = bool | Literal["auto"]

#: Where inductor keeps its compiled kernels, as torch reads it.
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"

#: Eager steps timed before ``auto`` decides (after step 1, which counts FLOPs).
PROBE_STEPS = 5

#: The expected seconds of compiling a shape never compiled on this machine: cold compiles
#: of the Transformer's folded step measured 30–60 s on one core.
COLD_COMPILE_S = 45.0


#: The fewest members at which a family's `Model.compile_gain` is expected in full.
FULL_GAIN_MEMBERS = 16


def expected_gain(gain: float, members: int) -> float:
    """The step speed-up compiling an ensemble of ``members`` is expected to give: the
    family's ``gain`` from `FULL_GAIN_MEMBERS` members on, in proportion below."""
    return 1 + (gain - 1) * min(1.0, members / FULL_GAIN_MEMBERS)


#: ``$TORCHINDUCTOR_CACHE_DIR`` as given, before inductor sets it to its own default.
_GIVEN = os.environ.get(CACHE_ENV)


def cache_folder() -> Path:
    """Inductor's cache folder: ``$TORCHINDUCTOR_CACHE_DIR`` where the user set it, else
    ``ddl_dynamics/inductor`` under the user's cache folder (``$XDG_CACHE_HOME``, else
    ``~/.cache``)."""
    if _GIVEN:
        return Path(_GIVEN)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ddl_dynamics" / "inductor"


def use_cache_folder() -> Path:
    """Point inductor at `cache_folder` for this process and the workers it starts."""
    folder = cache_folder()
    os.environ[CACHE_ENV] = str(folder)
    return folder


def signature(module: nn.Module, task: Task, batch: TaskData) -> str:
    """What a compiled graph is traced for: the module's class and parameter shapes, the
    task's class and the batch's shapes (an estimate of dynamo's guards, for the cost)."""
    shapes = [tuple(p.shape) for p in module.parameters()]
    tensors = (batch.inputs, batch.targets, batch.controls)
    data = [None if t is None else tuple(t.shape) for t in tensors]
    text = repr((type(module).__qualname__, type(task).__qualname__, shapes, data, batch.steps))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


#: The signatures compiled in this process: their graphs are reused at no cost.
_compiled_here: set[str] = set()


def expected_cost(key: str) -> float:
    """The seconds compiling ``key`` is expected to take here (see the module)."""
    if key in _compiled_here:
        return 0.0
    try:
        return float(json.loads(_record(key).read_text())["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return COLD_COMPILE_S


def _record(key: str) -> Path:
    return cache_folder() / "ddl_dynamics" / f"{key}.json"


def _remember(key: str, seconds: float) -> None:
    """Record what compiling ``key`` took, for the next process's estimate."""
    _compiled_here.add(key)
    path = _record(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"seconds": round(seconds, 2)}))
        tmp.replace(path)
    except OSError:  # a read-only cache: the estimate stays the cold one
        pass


class CompileChoice:
    """Whether one ensemble's steps run compiled (`on`), and the seconds its compile took.

    ``mode`` is ``train.compile``: True or False force it; ``"auto"`` decides after
    `PROBE_STEPS` timed eager steps (see the module), where ``gain`` > 1, and compiles only
    if then ``available()`` (a compiler is found and compiling has not failed here: asked
    last, as looking for one imports inductor, a second a process). `timed` is told each
    step's seconds (the training step alone, not its evaluation)."""

    def __init__(
        self, mode: CompileMode, steps: int, gain: float, key: str, available: Callable[[], bool]
    ):
        self.on = mode is True
        self.steps, self.gain, self.key, self.available = steps, gain, key, available
        self.pending = mode == "auto" and gain > 1
        self.probe: list[float] = []
        self.compiled = False  # whether a compiled step ran
        self.first: float | None = None  # the first compiled step's seconds, until the next
        self.measured = 0.0

    @property
    def seconds(self) -> float:
        """What compiling took: the first compiled step's excess over the next (all of it
        where no step followed)."""
        return self.measured if self.first is None else self.first

    def timed(self, step: int, seconds: float) -> None:
        """Count step ``step`` (from 1), which took ``seconds``; step 1 ran eagerly whatever
        the mode (its FLOPs are counted), so compiling starts at step 2."""
        if step == 1:
            return
        if self.on:
            if not self.compiled:
                self.compiled, self.first = True, seconds
            elif self.first is not None:
                self.measured, self.first = max(self.first - seconds, 0.0), None
                _remember(self.key, self.measured)
            return
        if self.pending:
            self.probe.append(seconds)
            if len(self.probe) == PROBE_STEPS:
                self.pending = False
                saving = (self.steps - step) * statistics.median(self.probe) * (1 - 1 / self.gain)
                self.on = saving > expected_cost(self.key) and self.available()
