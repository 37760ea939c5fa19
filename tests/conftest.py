"""Numerics set once for the whole test run."""

import torch
from hypothesis import settings

torch.set_num_threads(1)  # small models: threads cost more than they give
torch.use_deterministic_algorithms(True, warn_only=True)
settings.register_profile("ci", deadline=None, derandomize=True)
settings.load_profile("ci")
