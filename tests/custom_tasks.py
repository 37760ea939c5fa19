"""A user task file (``--task-file``) for the CLI and Ray tests: a tiny honest task, one
whose sampler kills the worker process training it (and behaves anywhere else), and three
that ``check_task`` must stop before anything trains.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
import signal
from dataclasses import dataclass

import torch

from ddl_dynamics import Task, TaskData, register_task, split_generator


@register_task("tiny-sum")
@dataclass(frozen=True)
class TinySum(Task):
    """The sum of a few inputs: the smallest honest task."""

    depth: int = 3
    dim: int = 2

    @property
    def in_dim(self) -> int:
        return self.dim

    @property
    def out_dim(self) -> int:
        return 1

    def sample(self, n: int, seed: int, split: str = "train") -> TaskData:
        self.check_split(split)
        x = torch.randn(n, self.dim, generator=split_generator(seed, split))
        return TaskData(x, x.sum(-1, keepdim=True), self.depth)


@register_task("worker-crash")
@dataclass(frozen=True)
class WorkerCrash(TinySum):
    """Tiny-sum whose sampler kills the worker process training it (a pool's or Ray's)."""

    def sample(self, n: int, seed: int, split: str = "train") -> TaskData:
        worker = multiprocessing.parent_process() is not None or "RAY_RAYLET_PID" in os.environ
        if split == "train" and worker:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().sample(n, seed, split)


@register_task("wrong-shape")
@dataclass(frozen=True)
class WrongShape(TinySum):
    """Tiny-sum whose targets have a column too many."""

    def sample(self, n: int, seed: int, split: str = "train") -> TaskData:
        data = super().sample(n, seed, split)
        return dataclasses.replace(data, targets=data.targets.repeat(1, 2))


@register_task("nan-targets")
@dataclass(frozen=True)
class NanTargets(TinySum):
    """Tiny-sum whose targets are NaN."""

    def sample(self, n: int, seed: int, split: str = "train") -> TaskData:
        data = super().sample(n, seed, split)
        return dataclasses.replace(data, targets=torch.full_like(data.targets, math.nan))


@register_task("float64-inputs")
@dataclass(frozen=True)
class Float64Inputs(TinySum):
    """Tiny-sum whose data are float64, which the float32 models cannot take."""

    def sample(self, n: int, seed: int, split: str = "train") -> TaskData:
        data = super().sample(n, seed, split)
        return dataclasses.replace(data, inputs=data.inputs.double(), targets=data.targets.double())
