"""How a cap stops a run: a time cap (``max_seconds``) or an ODE solve that ran out of
steps (``ode_max_steps``) ends training as ``"capped"``, a failure that keeps what it
scored."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..models.dopri5 import SolverCapped


class Capped(Exception):
    """A time or solver-step cap stopped training."""


class SolverCap(Capped):
    """An ODE solve ran out of steps (``ode_max_steps``)."""


@contextlib.contextmanager
def solver_cap() -> Iterator[None]:
    """Turn an ODE solve that ran out of steps (``ode_max_steps``) into `SolverCap`."""
    try:
        yield
    except SolverCapped as err:
        raise SolverCap(f"solver cap: {err}") from err
