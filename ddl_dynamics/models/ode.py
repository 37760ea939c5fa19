"""Neural ODEs over depth (``node``) and their augmented variant (``anode``).

Depth step ``l`` is the time interval ``[t_l, t_{l+1})``, ``t_l = l·T/depth``, on which the
control ``u_l`` is held constant. The vector field ``f(x, u)`` is autonomous and shared by
every step, so an ODE model is always "tied" and can integrate past ``T``.

``dopri5`` without the adjoint runs on the suite's own solver (`dopri5`), which
controls each ensemble member's steps apart so that seeds fold; everything else on
torchdiffeq, which stays the reference the own solver is tested against.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor
from torchdiffeq import odeint, odeint_adjoint

from .._checks import check_choice, check_int
from .base import DepthModel, join, last, register_model
from .dopri5 import SolverCapped, dopri5

ADAPTIVE_METHODS = ("dopri5", "dopri8", "bosh3", "fehlberg2", "adaptive_heun")
FIXED_GRID_METHODS = (
    "euler",
    "midpoint",
    "heun2",
    "heun3",
    "rk4",
    "explicit_adams",
    "implicit_adams",
)
SOLVERS = ("auto", "torchdiffeq")


@register_model("node")
class NeuralODE(DepthModel):
    """Neural ODE dx/dt = f(x, u(t)) over depth time [0, T]; by default solved by the suite's
    own dopri5, by torchdiffeq for other methods and the adjoint.

    Options:
        method: a torchdiffeq solver. Adaptive ones (``dopri5``, ...) honour ``rtol``,
            ``atol`` and ``max_steps`` (solver steps between two consecutive depth steps);
            fixed-grid ones (``euler``, ``rk4``, ...) take one step of size ``T/depth`` per
            depth step (``euler`` is then a tied ``resnet`` with ``step_size = T/depth``).
        adjoint: backpropagate by solving the adjoint ODE backwards (O(1) memory, costs
            backward NFE); otherwise backpropagate through the solver's operations, which
            evaluates the vector field no further times (``nfe_backward`` stays 0).
        horizon: the time ``T`` that ``depth`` steps span.
        solver: ``"auto"``: ``dopri5`` without the adjoint on the suite's own solver, which
            gives every ensemble member its own step-size control (`dopri5`), so
            seeds fold; everything else on torchdiffeq. ``"torchdiffeq"``: always
            torchdiffeq, whose adaptive solves share one step size over the batch, so
            their seeds train one by one.
        tied: ignored; one vector field serves every depth, so the model is always tied.

    ``nfe_forward`` counts each member's vector-field evaluations made by forward/trajectory
    calls and ``nfe_backward`` every other one (the adjoint solves of backward passes), both
    since `reset_nfe`; a model alone is one member. Controls take piecewise-constant
    values, so with controls each depth step is solved separately; the solver never steps
    across a discontinuity.
    """

    solves_ode = True

    def __init__(
        self,
        *,
        method: str = "dopri5",
        rtol: float = 1e-3,
        atol: float = 1e-3,
        adjoint: bool = False,
        horizon: float = 1.0,
        max_steps: int = 1000,
        solver: str = "auto",
        tied: bool = True,
        **common: Any,
    ) -> None:
        super().__init__(tied=True, **common)
        self.method = check_choice("ODE method", method, ADAPTIVE_METHODS + FIXED_GRID_METHODS)
        for name, value in (("rtol", rtol), ("atol", atol), ("horizon", horizon)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        self.rtol, self.atol, self.horizon = float(rtol), float(atol), float(horizon)
        self.max_steps = check_int("max_steps", max_steps, 1)
        self.adjoint = bool(adjoint)
        self.solver = check_choice("solver", solver, SOLVERS)
        context = self.state_dim + self.control_dim
        self.layers = self.per_layer(lambda: self.branch(context, self.state_dim))
        # Per kind, a count or an array of per-member counts (a Counter: 0 when unseen).
        self._nfe = cast("dict[str, np.ndarray | int]", Counter())
        self._counting: str | None = "backward"

    @property
    def per_member(self) -> bool:
        """Whether the own solver runs, with a step-size control per member."""
        return self.solver == "auto" and self.method == "dopri5" and not self.adjoint

    @property
    def samples_independent(self) -> bool:
        """Only for explicit fixed-grid methods: an adaptive solve picks its step sizes for
        the whole batch, and ``implicit_adams`` iterates until the whole batch converges."""
        return self.method in FIXED_GRID_METHODS and self.method != "implicit_adams"

    @property
    def members_independent(self) -> bool:
        """Whether each member's rows of a folded batch depend on that member's alone."""
        return self.samples_independent or self.per_member

    @property
    def nfe_forward(self) -> list[int]:
        return self._nfe_of("forward")

    @property
    def nfe_backward(self) -> list[int]:
        return self._nfe_of("backward")

    def _nfe_of(self, kind: str) -> list[int]:
        """Each member's evaluations of ``kind`` (torchdiffeq's count every member alike)."""
        return np.broadcast_to(self._nfe[kind], self.members).tolist()

    def reset_nfe(self) -> None:
        self._nfe.clear()

    @contextmanager
    def _count_as(self, kind: str | None) -> Iterator[None]:
        previous, self._counting = self._counting, kind
        try:
            yield
        finally:
            self._counting = previous

    def _count(self, evaluations: np.ndarray | int) -> None:
        if self._counting:
            self._nfe[self._counting] += evaluations

    def _solve(self, z0: Tensor, times: Tensor, u_l: Tensor | None) -> Tensor:
        """One solve with the control held at ``u_l``; ``(len(times), B, D)``."""
        field = self.layer(0)

        def f(z: Tensor) -> Tensor:
            return field(join(z, u_l))

        # One depth step as the first try spares the initial-step search of every solve.
        first = self.horizon / self.depth
        try:
            if self.per_member:
                states, evaluations = dopri5(
                    f,
                    z0,
                    times,
                    members=self.members,
                    rtol=self.rtol,
                    atol=self.atol,
                    first_step=first,
                    max_steps=self.max_steps,
                )
                self._count(evaluations)
                return states
            return self._torchdiffeq(f, z0, times, first)
        except (AssertionError, SolverCapped) as err:  # torchdiffeq's failures are asserts,
            capped = isinstance(err, SolverCapped) or "max_num_steps" in str(err)  # its cap too
            raise (SolverCapped if capped else RuntimeError)(
                f"{type(self).__name__}: the {self.method} solve failed ({err}); the vector "
                f"field may be stiff or diverging (max_steps={self.max_steps}, rtol={self.rtol})"
            ) from err

    def _torchdiffeq(
        self, field: Callable[[Tensor], Tensor], z0: Tensor, times: Tensor, first: float
    ) -> Tensor:
        def f(t: Tensor, z: Tensor) -> Tensor:
            self._count(1)
            return field(z)

        kwargs: dict[str, Any] = {"rtol": self.rtol, "atol": self.atol, "method": self.method}
        if self.method in ADAPTIVE_METHODS:
            kwargs["options"] = {"max_num_steps": self.max_steps, "first_step": first}
        if self.adjoint and torch.is_grad_enabled():
            params = tuple(self.layer(0).parameters())
            return odeint_adjoint(f, z0, times, adjoint_params=params, **kwargs)
        return odeint(f, z0, times, **kwargs)

    def _integrate(self, z0: Tensor, times: Tensor, u: Tensor | None) -> Iterator[Tensor]:
        """The states at ``times`` (increasing or decreasing), ``(B, D)`` each, one at a time;
        interval ``i`` uses control ``u[:, i]``."""
        if u is None:
            yield from self._solve(z0, times, None).unbind(0)
            return
        z = z0
        yield z
        for i in range(len(times) - 1):
            z = self._solve(z, times[i : i + 2], u[:, i])[-1]
            yield z

    def _times(self, steps: int, like: Tensor) -> Tensor:
        end = steps * self.horizon / self.depth
        return torch.linspace(0.0, end, steps + 1, dtype=like.dtype, device=like.device)

    def states(
        self, x: Tensor, u: Tensor | None = None, steps: int | None = None
    ) -> Iterator[Tensor]:
        """The states at ``steps + 1`` evenly spaced times on ``[0, steps·T/depth]``."""
        steps = self.resolve_steps(x, u, steps)
        z0 = self.encode(x)
        with self._count_as("forward"):
            yield from self._integrate(z0, self._times(steps, z0), u)

    @property
    def reconstruction_tolerance(self) -> float:
        """The largest `reconstruction_error` of a solve that can be trusted,
        ``2·depth·(rtol + atol)``.

        An accepted adaptive step keeps its local error below ``atol + rtol·|z|``, about
        ``rtol + atol`` relative to an O(1) state. A round trip crosses ``2·depth`` depth
        intervals; were each to add one such error, the total would stay below this bound.
        A larger error means the solve amplified or under-resolved its errors, so the
        solver, not the vector field alone, shaped the result. Fixed-grid methods ignore
        ``rtol``/``atol`` but are held to the accuracy they state.
        """
        return 2 * self.depth * (self.rtol + self.atol)

    @torch.no_grad()
    def reconstruction_error(self, x: Tensor, u: Tensor | None = None) -> float:
        """``‖z0 − ẑ0‖ / ‖z0‖`` after integrating ``0 → T → 0`` (not counted in NFE).

        A flow is invertible, so a large value means the solver, not the model, shaped the
        result at this tolerance (a replication of Dupont et al. 2019 found many dopri5
        results at rtol = atol = 1e-3 fail this check).
        """
        steps = self.resolve_steps(x, u, self.depth)
        z0 = self.encode(x)
        times = self._times(steps, z0)
        with self._count_as(None):
            z_end = last(self._integrate(z0, times, u))
            back = last(self._integrate(z_end, times.flip(0), None if u is None else u.flip(1)))
        return ((z0 - back).norm() / z0.norm().clamp_min(torch.finfo(z0.dtype).tiny)).item()


@register_model("anode")
class AugmentedNeuralODE(NeuralODE):
    """Augmented neural ODE: the node on the state padded with augment_dim zeros (Dupont et al.)."""

    def __init__(self, *, augment_dim: int = 1, **options: Any) -> None:
        check_int("augment_dim", augment_dim, 1)
        super().__init__(augment_dim=augment_dim, **options)
