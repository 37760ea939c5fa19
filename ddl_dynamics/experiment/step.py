"""One training step, the trainer's and every benchmark's: forward on a folded batch, each
member's loss read back, then backward and the per-member AdamW step
(`descend`) of the members still training; compiled, the forward and the losses through
``torch.compile`` (`compiled_losses`)."""

from __future__ import annotations

import contextlib
import multiprocessing
import warnings
from collections.abc import Callable, Sequence
from typing import cast

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .._task import Task, TaskData
from ..models.ensemble import Ensemble
from .batches import unfold
from .compiling import use_cache_folder
from .config import TrainConfig
from .optim import descend

#: ``predict(model, batch)``: the model's float32 output for a task (`predictor`).
Predict = Callable[[nn.Module, TaskData], Tensor]


def predictor(task: Task, bf16: bool) -> Predict:
    """``predict(model, batch)``: the model's output for the task in float32, computed under
    bfloat16 autocast on CUDA if ``bf16``."""

    def predict(model: nn.Module, batch: TaskData) -> Tensor:
        autocast = (
            torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        )
        with autocast:
            out = model(
                batch.inputs,
                u=batch.controls,
                steps=batch.steps,
                per_step=task.supervise == "trajectory",
            )
        return out.float()

    return predict


def member_losses(
    module: nn.Module, task: Task, batch: TaskData, predict: Predict, size: int
) -> Tensor:
    """Each member's training loss on its rows of the folded ``batch``, ``(size,)``."""
    return task.member_losses(unfold(predict(module, batch), size), unfold(batch.targets, size))


Losses = Callable[[nn.Module, Task, TaskData, Predict, int], Tensor]


#: The most graphs (architectures × shapes) one process compiles; the rest run eagerly.
GRAPHS = 64


class CompileWarning(UserWarning):
    """``torch.compile`` is unavailable here: the steps run eagerly."""


class _Compiled:
    """`member_losses` through ``torch.compile`` (inductor, static shapes; AOTAutograd
    compiles its backward), built on first use and shared by every module: a graph is
    traced once per architecture and shape, its parameters inputs, so the next ensemble of
    the same shapes reuses it, and up to `GRAPHS` graphs are kept (dynamo's default,
    8, would leave a study's later rows eager). Inductor's FX graph cache, in the folder
    `compiling.cache_folder` names, keeps the compiled kernels for later processes. Where
    no C++ compiler (CPU) or backend is found, or compiling fails, it warns once and runs
    eagerly from then on."""

    def __init__(self) -> None:
        self.losses: Losses | None = None
        self.failed = False

    def __call__(
        self, module: nn.Module, task: Task, batch: TaskData, predict: Predict, size: int
    ) -> Tensor:
        args = (module, task, batch, predict, size)
        if self.failed or _get_current_dispatch_mode() is not None:
            return member_losses(*args)  # a mode watching ops (a FLOP count) sees them eager
        if self.losses is None:
            reason = compile_unavailable()
            if reason:  # a run's worker stays quiet: its run's check said so once
                return self.fall_back(reason, args, say=multiprocessing.parent_process() is None)
            self.losses = cast(Losses, torch.compile(member_losses, dynamic=False))
        try:
            with warnings.catch_warnings(), torch._dynamo.config.patch(recompile_limit=GRAPHS):
                # RoPE's tables, cached per length, enter the graph as constants
                warnings.filterwarnings("ignore", "Dynamo detected a call to a `functools")
                return self.losses(*args)
        except torch._dynamo.exc.BackendCompilerFailed as err:
            return self.fall_back(f"compiling failed ({type(err.inner_exception).__name__})", args)

    def fall_back(
        self, reason: str, args: tuple[nn.Module, Task, TaskData, Predict, int], say: bool = True
    ) -> Tensor:
        self.failed = True
        if say:
            warnings.warn(
                f"torch.compile is unavailable: {reason}; the training steps run eagerly",
                CompileWarning,
                stacklevel=3,
            )
        return member_losses(*args)

    def check(self, where: str) -> None:
        """Warn once, before anything trains, where ``torch.compile`` is unavailable (the
        steps then run eagerly here without another word): an experiment's check, in the
        run's process, for every worker on this machine."""
        reason = compile_unavailable()
        if reason and not self.failed:
            self.failed = True
            warnings.warn(
                f"{where}: train.compile = true, but torch.compile is unavailable "
                f"here: {reason}; the training steps run eagerly",
                CompileWarning,
                stacklevel=3,
            )


def compile_unavailable() -> str:
    """Why inductor cannot compile for the CPU here (no C++ compiler found), else ''."""
    use_cache_folder()  # before inductor sets its own default
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except Exception as err:  # what it raises differs between torch versions
        return f"no C++ compiler ({err})".splitlines()[0]
    return ""


#: The one compiled `member_losses` of this process.
compiled_losses = _Compiled()


def can_compile() -> bool:
    """Whether compiled steps can run here: a compiler is found and compiling has not failed."""
    return not compiled_losses.failed and not compile_unavailable()


def training_step(
    ensemble: Ensemble,
    optimizer: torch.optim.Optimizer,
    task: Task,
    batch: TaskData,
    cfgs: TrainConfig | Sequence[TrainConfig],
    index: int = 0,
    *,
    keep: Callable[[list[float]], Sequence[bool]] | None = None,
    compile: bool | None = None,
) -> list[float]:
    """Step ``index`` (from 0) of the ensemble's members on their rows of the folded
    ``batch``, each with its config (``cfgs``: one per member, or one for all); returns
    their losses. Where ``compile`` (default: the config's ``compile`` is True), the forward
    and the losses run through `compiled_losses` (eagerly while a mode watches ops, as a FLOP
    count does).

    The losses are read back after the forward, as the trainer must to watch them; then
    ``keep(losses)`` (default: every member) says which members still train, and those
    take the backward, clipping and AdamW step (`descend`; none where no
    member is kept). The forward runs under bfloat16 autocast where the config asks and
    the batch is on CUDA.
    """
    size = ensemble.size
    cfgs = [cfgs] * size if isinstance(cfgs, TrainConfig) else list(cfgs)
    predict = predictor(task, cfgs[0].bf16 and batch.inputs.device.type == "cuda")
    compile = cfgs[0].compile is True if compile is None else compile
    losses_of = compiled_losses if compile else member_losses
    losses = losses_of(ensemble.module, task, batch, predict, size)
    values = losses.tolist()
    training = [True] * size if keep is None else list(keep(values))
    if any(training):
        descend(
            ensemble, optimizer, losses, torch.tensor(training, device=losses.device), cfgs, index
        )
    return values
