"""Dormand–Prince 5(4) with one step-size control per ensemble member.

torchdiffeq's adaptive solvers take one error norm over everything they integrate, so the
samples of a batch share their step sizes, and the members of a folded ensemble
(`ensemble`) would steer each other's. Here the state is ``(members · n, …)``, member
by member as an ensemble folds it: each member's error is the RMS over its own rows (as
torchdiffeq takes it over a batch alone), and each member accepts, rejects and sizes its
steps on its own; a member that has reached the next output time waits, frozen, while the
others catch up. The scheme is torchdiffeq's ``dopri5`` (its tableau, error norm, step-size
rule and quartic dense output), so a member integrates as it would alone under torchdiffeq,
to float rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

Field = Callable[[Tensor], Tensor]

#: Dormand & Prince's stage weights; the last row is also the 5th-order solution (FSAL:
#: the slope at the step's end is the 7th stage).
_STAGES = (
    (1 / 5,),
    (3 / 40, 9 / 40),
    (44 / 45, -56 / 15, 32 / 9),
    (19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729),
    (9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656),
    (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84),
)
#: The 5th-order solution minus the embedded 4th-order one: the local error estimate.
_ERROR = (
    35 / 384 - 1951 / 21600,
    0.0,
    500 / 1113 - 22642 / 50085,
    125 / 192 - 451 / 720,
    -2187 / 6784 + 12231 / 42400,
    11 / 84 - 649 / 6300,
    -1 / 60,
)
#: Shampine's weights for the state at the step's midpoint.
_MID = (
    6025192743 / 30085553152 / 2,
    0.0,
    51252292925 / 65400821598 / 2,
    -2691868925 / 45128329728 / 2,
    187940372067 / 1594534317056 / 2,
    -1776094331 / 19743644256 / 2,
    11237099 / 235043384 / 2,
)
#: torchdiffeq's step-size rule: safety factor, largest growth, largest shrink, order.
SAFETY, GROWTH, SHRINK, ORDER = 0.9, 10.0, 0.2, 5


def _tableau() -> np.ndarray:
    """``(7, 7)``: row ``i < 6`` weighs the stages into stage ``i + 1``'s state, row 6
    into the error estimate."""
    table = np.zeros((7, 7))
    for i, row in enumerate(_STAGES):
        table[i, : i + 1] = row
    table[6] = _ERROR
    return table


def _dense_powers() -> np.ndarray:
    """Weights ``(4, 7)`` of ``x, x², x³, x⁴`` in the dense output of a step,
    ``y(t0 + x·h) = y0 + h Σᵢ Wᵢ(x) kᵢ``.

    torchdiffeq fits a quartic through ``y0``, ``y1``, the midpoint state and the two end
    slopes; each is ``y0`` plus a combination of the stages, and the ``y0`` terms cancel in
    every coefficient but the constant, so the quartic is one more combination of stages.
    """
    solution, mid = np.array((*_STAGES[-1], 0.0)), np.array(_MID)
    first, last = np.eye(7)[[0, 6]]
    return np.stack(
        [
            first,
            last - 4 * first - 5 * solution + 16 * mid,
            5 * first - 3 * last + 14 * solution - 32 * mid,
            2 * (last - first) - 8 * solution + 16 * mid,
        ]
    )


TABLEAU, DENSE = _tableau(), _dense_powers()


def dopri5_step(
    field: Field, y0: Tensor, f0: Tensor, weights: Tensor, rtol: float, atol: float
) -> tuple[Tensor, Tensor, np.ndarray]:
    """One step of every member: its stages ``(S, 7, N)``, the state at the step's end
    ``(S, N)`` and the error ratio ``(S,)`` (≤ 1: accept).

    ``y0``, ``f0 = field(y0)``: ``(S, N)``; ``weights``: `TABLEAU` times each
    member's step, ``(S, 7, 7)``. The ratio is the RMS over the member's entries of the
    error estimate over ``atol + rtol · max(|y0|, |y1|)``.
    """
    origin, stages = y0.unsqueeze(1), [f0]
    for i in range(6):
        y1 = torch.baddbmm(origin, weights[:, i : i + 1, : i + 1], torch.stack(stages, 1))
        stages.append(field(y1.squeeze(1)))
    k = torch.stack(stages, 1)
    y1 = y1.squeeze(1)
    with torch.no_grad():
        estimate = weights[:, 6:].bmm(k).squeeze(1)
        scale = torch.maximum(y0.abs(), y1.abs()).mul_(rtol).add_(atol)
        ratio = estimate.div_(scale).square_().mean(1).sqrt_()
    return k, y1, ratio.cpu().double().numpy()


def next_step(dt: np.ndarray, ratio: np.ndarray) -> np.ndarray:
    """torchdiffeq's step-size rule: ``dt · min(10, max(0.9 / ratio^(1/5), shrink))``,
    where an accepted step (ratio < 1) never shrinks."""
    with np.errstate(divide="ignore", invalid="ignore"):
        grow = np.minimum(SAFETY / ratio ** (1 / ORDER), GROWTH)
    return dt * np.maximum(grow, np.where(ratio < 1, 1.0, SHRINK))


class SolverCapped(RuntimeError):
    """An ODE solve needed more than its ``max_steps`` steps between two output times: the
    solver's cap, which a trainer records as a capped run rather than a failure."""


def dopri5(
    field: Field,
    y0: Tensor,
    times: Tensor,
    *,
    members: int = 1,
    rtol: float,
    atol: float,
    first_step: float,
    max_steps: int,
) -> tuple[Tensor, np.ndarray]:
    """Solve ``dy/dt = field(y)`` from ``y(times[0]) = y0`` to every time in ``times``
    (increasing or decreasing), each member of ``y0`` under its own step-size control.

    Args:
        field: the autonomous vector field on states shaped as ``y0``.
        y0: ``(members · n, …)``, member by member.
        times: 1-D, strictly monotonic; the first is the start.
        first_step: every member's first trial step (torchdiffeq's ``first_step``).
        max_steps: the most steps (accepted or rejected) a member may take between two
            output times; more raise `SolverCapped`.

    Returns:
        The states at ``times``, ``(len(times), *y0.shape)``, and each member's count of
        field evaluations ``(members,)``. A member whose error turns non-finite stops
        there: its states from then on are NaN.
    """
    shape, size = y0.shape, members
    grid = times.tolist()
    sign = 1.0 if grid[-1] > grid[0] else -1.0

    def f(y: Tensor) -> Tensor:
        out = field(y.view(shape)).view(size, -1)
        return out if sign > 0 else -out

    # Per member, on the host: the end of its last accepted step, its next trial step,
    # whether it failed, and its evaluations; then its last accepted step's start and size.
    t, dt = np.full(size, sign * grid[0]), np.full(size, float(first_step))
    failed, evaluations = np.zeros(size, dtype=bool), np.ones(size, dtype=np.int64)
    start, width = t, dt
    y = y0.reshape(size, -1)
    slope, origin, stages = f(y), y, None
    out = [y0]
    for target in (sign * time for time in grid[1:]):
        taken = np.zeros(size, dtype=np.int64)
        while (active := (t < target) & ~failed).any():
            _check_cap(taken[active], max_steps)
            weights = torch.from_numpy(dt[:, None, None] * TABLEAU).to(y)
            k, y1, ratio = dopri5_step(f, y, slope, weights, rtol, atol)
            taken += active
            evaluations += 6 * active
            failed |= active & ~np.isfinite(ratio)
            accept = active & (ratio <= 1)
            y, slope, stages, origin = _accepted(accept, y, y1, k, slope, stages, origin)
            start, width = np.where(accept, t, start), np.where(accept, dt, width)
            t = np.where(accept, t + dt, t)
            dt = np.where(active, next_step(dt, ratio), dt)
        last = _Step(origin, stages, start, width)
        out.append(_state_at(target, y, t, last, failed).view(shape))
    return torch.stack(out), evaluations


def _check_cap(taken: np.ndarray, max_steps: int) -> None:
    """`SolverCapped` where an active member took ``max_steps`` steps since the last output
    time."""
    if (taken >= max_steps).any():
        raise SolverCapped(
            f"max_num_steps exceeded: a member took {max_steps} steps between two output times"
        )


def _accepted(
    accept: np.ndarray,
    y: Tensor,
    y1: Tensor,
    k: Tensor,
    slope: Tensor,
    stages: Tensor | None,
    origin: Tensor,
) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    """The state, slope, stages and step origin after a step: a member that accepted it
    moves to ``y1`` (its stages ``k``), the others keep theirs."""
    if accept.all():
        return y1, k[:, -1], k, y
    if not accept.any():
        return y, slope, stages, origin
    rows = torch.from_numpy(accept).to(y.device)[:, None]
    origin = torch.where(rows, y, origin)
    y, slope = torch.where(rows, y1, y), torch.where(rows, k[:, -1], slope)
    stages = k if stages is None else torch.where(rows[..., None], k, stages)
    return y, slope, stages, origin


class _Step(NamedTuple):
    """Each member's last accepted step: its start state, stages, start time and size."""

    origin: Tensor
    stages: Tensor | None
    start: np.ndarray
    width: np.ndarray


def _state_at(target: float, y: Tensor, t: np.ndarray, last: _Step, failed: np.ndarray) -> Tensor:
    """Each member's state at ``target``: its state where its last step ended there, else
    that step's dense output; NaN from where a member failed."""
    if (t == target).all():
        state = y
    elif last.stages is None:  # a member short of the target, yet none took a step
        raise RuntimeError("every member failed before its first accepted step")
    else:
        state = _dense_output(last.origin, last.stages, last.start, last.width, target)
    if failed.any():
        state = state.masked_fill(torch.from_numpy(failed).to(y.device)[:, None], np.nan)
    return state


def _dense_output(
    origin: Tensor, stages: Tensor, start: np.ndarray, width: np.ndarray, target: float
) -> Tensor:
    """Each member's state at ``target``, from the dense output of its last accepted step
    (the state itself where that step ends at ``target``)."""
    x = (target - start) / width
    weights = width[:, None] * (np.stack([x, x**2, x**3, x**4], 1) @ DENSE)
    return torch.baddbmm(
        origin.unsqueeze(1), torch.from_numpy(weights).to(origin)[:, None], stages
    ).squeeze(1)
