"""Numerics set once for the whole test run."""

import torch
from hypothesis import settings

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
torch.use_deterministic_algorithms(True, warn_only=True)
settings.register_profile("ci", deadline=None, derandomize=True)
settings.load_profile("ci")
