"""Pure functions that turn probed gates and states into the figures' numbers.

Everything here takes numpy arrays and returns numpy arrays, so the figures, the report
and the tests share one definition of each quantity.
"""

from __future__ import annotations

import numpy as np
import torch

from ...models.operator import REGIMES, regime_index


def regime_fractions(beta: np.ndarray) -> np.ndarray:
    """Fraction of samples in each gate regime, per layer: ``(N, L) → (L, len(REGIMES))``."""
    index = regime_index(torch.as_tensor(beta)).numpy()  # (N, L)
    counts = np.stack([(index == r).sum(0) for r in range(len(REGIMES))], axis=-1)
    return counts / max(1, beta.shape[0])


def contraction(e_pre: np.ndarray, e_post: np.ndarray, floor: float = 1e-6) -> np.ndarray:
    """``|e_post| / |e_pre|`` per sample and layer (norm over value channels).

    For the Delta update this equals ``|1 − β|`` exactly; entries whose ``|e_pre|`` is
    below ``floor`` are NaN (the ratio is rounding noise there).
    """
    pre = np.linalg.norm(e_pre, axis=-1)
    post = np.linalg.norm(e_post, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(pre > floor, post / pre, np.nan)


def depth_determinant(beta: np.ndarray) -> np.ndarray:
    """``det Π_l (I − β_l k_l k_lᵀ) = Π_l (1 − β_l)`` per sample: ``(N, L) → (N,)``.

    Its sign is ``(−1)^(number of layers with β > 1)``; its size says how much volume the
    stack of shortcuts keeps (0 when one layer projects exactly).
    """
    return np.prod(1.0 - beta, axis=-1)


def reflecting_layers(beta: np.ndarray) -> np.ndarray:
    """How many layers of each sample have a negative shortcut eigenvalue (``β > 1``)."""
    return (beta > 1.0).sum(-1)
