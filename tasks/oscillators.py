"""Depth is time: 2-D phase-space flows whose exact states supervise every depth step.

``oscillator`` probes rotation. The exact step of ``q'' = −ω²q`` rotates the phase plane
(in ``(ωq, p)`` coordinates) and a rotation is the product of two Householder reflections,
so two Delta layers at β ≈ 2 can step it without energy drift, whereas an explicit Euler step
grows the energy by ``1 + ω²h²``. That is a hypothesis about ``ddl`` stacks (a tied one for the
4× horizon), not a proof that they find this solution: they may write and project instead.
``damped-oscillator`` (a contracting spiral) and ``van-der-pol`` (a limit cycle) are
controls: smooth flows where, we expect, additive and ODE models do well. Depth step ``l``
is time ``t_l = l·T/depth``; the ``long`` split runs 4× the steps at the same step length, so
only models that can extrapolate are scored on it.

Example (oscillator, depth 3, horizon 3, so ``t_l = l``)::

    inputs      (q0, p0, ω)   = (1.0, 0.0, 1.0)
    targets     (q, p) at t = 1, 2, 3:  (0.54, -0.84), (-0.42, -0.91), (-0.99, -0.14)
    trajectory  the targets with (q0, p0) at t = 0 prepended
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from scipy.integrate import solve_ivp
from torch import Tensor

from ddl_dynamics import Expectation, Task, TaskData, register_task, split_generator


@dataclass(frozen=True)
class PhaseFlow(Task):
    """Base of the depth-is-time tasks: a 2-D flow with per-sample parameters.

    A subclass names its parameters in ``param_ranges`` (each sampled uniformly) and gives
    the exact solution in `solve`; inputs are ``(q0, p0, *params)``.
    """

    depth: int = 8
    #: Time ``T`` covered by ``depth`` steps.
    horizon: float = 3.0

    supervise: ClassVar = "trajectory"
    ood_splits: ClassVar = ("long",)
    state_names: ClassVar = ("q", "p")
    param_ranges: ClassVar[Mapping[str, tuple[float, float]]] = {}
    #: Initial states: uniform angle, radius ``‖(q0, p0)‖`` uniform in this range.
    radius: ClassVar[tuple[float, float]] = (0.5, 1.0)

    def __post_init__(self) -> None:
        if self.horizon <= 0:
            raise ValueError(f"horizon must be positive, got {self.horizon}")

    @property
    def in_dim(self) -> int:
        return 2 + len(self.param_ranges)

    @property
    def out_dim(self) -> int:
        return 2

    @abstractmethod
    def solve(self, state0: Tensor, params: Tensor, t: Tensor) -> Tensor:
        """States at times ``t`` (float64): ``(n, 2), (n, P), (T,) -> (n, T, 2)``."""

    def sample(self, n: int, seed: int, split: str = "train") -> TaskData:
        steps = self.split_steps(split)
        g = split_generator(seed, split)
        r = torch.empty(n).uniform_(*self.radius, generator=g)
        angle = torch.empty(n).uniform_(0.0, 2 * math.pi, generator=g)
        state0 = torch.stack([r * angle.cos(), r * angle.sin()], dim=-1)  # (n, 2)
        params = torch.stack(
            [torch.empty(n).uniform_(lo, hi, generator=g) for lo, hi in self.param_ranges.values()],
            dim=-1,
        )  # (n, P)
        t = torch.arange(steps + 1, dtype=torch.float64) * (self.horizon / self.depth)
        # Solve from the float32 inputs so the targets are exact for what the model sees.
        trajectory = self.solve(state0.double(), params.double(), t).float()  # (n, steps+1, 2)
        return TaskData(
            inputs=torch.cat([state0, params], dim=-1),
            targets=trajectory[:, 1:],
            steps=steps,
            trajectory=trajectory,
        )


def linear_oscillator(state0: Tensor, omega: Tensor, zeta: Tensor, t: Tensor) -> Tensor:
    """Closed-form flow of ``q'' = −ω²q − 2ζωq'`` for ``ζ < 1``: ``(n, len(t), 2)``."""
    q0, p0, omega, zeta = (a[:, None] for a in (*state0.unbind(-1), omega, zeta))  # (n, 1)
    damping = zeta * omega
    wd = omega * torch.sqrt(1 - zeta**2)  # damped angular frequency
    decay, c, s = torch.exp(-damping * t), torch.cos(wd * t), torch.sin(wd * t)  # (n, T)
    q = decay * (q0 * c + (p0 + damping * q0) / wd * s)
    p = decay * (p0 * c - (omega**2 * q0 + damping * p0) / wd * s)
    return torch.stack([q, p], dim=-1)


def smooth_flow_expectations() -> tuple[Expectation, ...]:
    """The controls' claims: on a smooth flow the Delta stack should not win."""
    return (
        Expectation(
            "ddl",
            "worse",
            "resnet",
            "a control: a smooth flow is what an explicit Euler step x + h·f(x) discretises; "
            "nothing in it needs an erase or a reflection, so the delta rule brings no "
            "structure the flow uses, only a normalised direction and a gate on the step",
        ),
        Expectation(
            "ddl",
            "worse",
            "node",
            "a control: the task is an ODE flow, which a NODE represents directly (Chen et "
            "al., NeurIPS 2018)",
        ),
    )


def oscillator_energy(state: Tensor, omega: Tensor) -> Tensor:
    """``E = ½(p² + ω²q²)`` of states ``(..., 2)``."""
    q, p = state.unbind(-1)
    return 0.5 * (p**2 + (omega * q) ** 2)


@register_task("oscillator")
@dataclass(frozen=True)
class Oscillator(PhaseFlow):
    """Harmonic oscillator q'' = −ω²q, per-sample ω; depth is time; 4× longer OOD split.

    ``extra_metrics`` reports the energy drift of the predicted final state.
    """

    regime: ClassVar = (
        "hypothesis: ddl steps a rotation as two reflections (β ≈ 2) without the "
        "energy drift of an Euler resnet"
    )
    regimes: ClassVar = ("reflection",)
    param_ranges: ClassVar = {"omega": (0.5, 1.5)}
    expectations: ClassVar = (
        Expectation(
            "ddl",
            "worse",
            "resnet",
            "where DDL should not win: every depth step is supervised, so each layer must be "
            "one small rotation of the phase plane. One delta step is near the identity, a "
            "projection or a reflection (determinant −1); a rotation is two reflections, two "
            "layers per time step, which this stack does not have. What remains is a small "
            "write of the increment: an additive step with a normalised direction and a gate",
        ),
    )

    def solve(self, state0: Tensor, params: Tensor, t: Tensor) -> Tensor:
        omega = params[:, 0]
        return linear_oscillator(state0, omega, torch.zeros_like(omega), t)

    def extra_metrics(self, pred: Tensor, data: TaskData) -> dict[str, float]:
        """``energy_drift``: mean ``|E(last predicted state) − E0| / E0`` (exact flow: 0)."""
        omega = data.inputs[:, 2]
        e0 = oscillator_energy(data.inputs[:, :2], omega)
        e_last = oscillator_energy(pred[:, -1], omega)
        return {"energy_drift": ((e_last - e0).abs() / e0).mean().item()}


@register_task("damped-oscillator")
@dataclass(frozen=True)
class DampedOscillator(PhaseFlow):
    """Damped oscillator q'' = −ω²q − 2ζωq', per-sample (ω, ζ): a contracting spiral."""

    regime: ClassVar = "control; hypothesis: resnet and node fit a smooth contracting flow well"
    param_ranges: ClassVar = {"omega": (0.5, 1.5), "zeta": (0.05, 0.3)}
    expectations: ClassVar = smooth_flow_expectations()

    def solve(self, state0: Tensor, params: Tensor, t: Tensor) -> Tensor:
        return linear_oscillator(state0, params[:, 0], params[:, 1], t)


@register_task("van-der-pol")
@dataclass(frozen=True)
class VanDerPol(PhaseFlow):
    """Van der Pol oscillator q'' = μ(1 − q²)q' − q, per-sample μ: a limit cycle.

    Initial states lie inside and outside the cycle (amplitude ≈ 2); ground truth by
    ``solve_ivp`` (DOP853, rtol = atol = 1e-10).
    """

    regime: ClassVar = "control; hypothesis: resnet and node fit a limit cycle, a smooth flow"
    param_ranges: ClassVar = {"mu": (0.5, 1.5)}
    radius: ClassVar = (0.5, 2.5)
    expectations: ClassVar = smooth_flow_expectations()

    def solve(self, state0: Tensor, params: Tensor, t: Tensor) -> Tensor:
        mu, n = params[:, 0].numpy(), len(params)

        def field(_: float, y: np.ndarray) -> np.ndarray:  # y = (q_1..q_n, p_1..p_n)
            q, p = y[:n], y[n:]
            return np.concatenate([p, mu * (1 - q**2) * p - q])

        y0, times = state0.T.reshape(-1).numpy(), t.numpy()
        sol = solve_ivp(
            field, (0.0, times[-1]), y0, method="DOP853", t_eval=times, rtol=1e-10, atol=1e-10
        )
        if not sol.success:
            raise RuntimeError(f"van-der-pol ground truth failed: {sol.message}")
        return torch.from_numpy(sol.y).reshape(2, n, -1).permute(1, 2, 0)
