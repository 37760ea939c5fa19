"""Numerics set once for the whole test run."""

import math
import os

import pytest
import torch
from hypothesis import settings

if not torch.cuda.is_available():  # Triton kernels run in Triton's interpreter, on the CPU;
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when triton is first imported
torch.set_num_threads(1)  # small models: threads cost more than they give
torch.use_deterministic_algorithms(True, warn_only=True)
settings.register_profile("ci", deadline=None, derandomize=True)
settings.load_profile("ci")


@pytest.fixture
def infinite_loss(monkeypatch):
    """``infinite_loss(task)`` makes the task's training loss infinite (evaluation stays
    finite), to exercise the diverged path."""

    def apply(task):
        loss = type(task).loss
        monkeypatch.setattr(type(task), "loss", lambda self, pred, target: loss(
            self, pred, target) * (math.inf if pred.requires_grad else 1.0))

    return apply
