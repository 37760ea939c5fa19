"""The record of one trained cell (`RunResult`), as the store keeps it and the
analysis reads it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Statuses a cell can end with.
STATUSES = ("ok", "capped", "diverged", "failed")


@dataclass
class RunResult:
    """The record of one trained cell, as stored.

    Attributes:
        status: ``"ok"``; or a failure of the model on this seed, which never enters a
            mean (``config.COUNTED``): ``"capped"`` (a time or solver cap stopped training or
            the final evaluation; what was reached is kept), ``"diverged"`` (a loss non-finite
            or above ``loop.DIVERGENCE_FACTOR`` × the first step's; scored as it stands)
            or ``"failed"`` (an exception; no metrics).
        metrics: ``metric``/``higher_is_better`` (how to read the numbers), ``train``,
            ``val``, ``test`` (scored once, after training; None only where the model could
            not be scored), ``ood`` (split → value, None when the model cannot run it) with
            ``skipped`` (split → reason), ``extra`` (task extras; ``"split/name"`` for OOD
            splits), ``steps`` trained, ``peak_mem_measure`` (what ``peak_mem`` measured),
            ``ensemble`` (how many seeds of the cell trained together, this one included),
            ``ensemble_id`` (the same for every cell trained in one call), ``vectorize``,
            ``compiled`` (whether its steps ran through ``torch.compile``) with ``compile_s``
            (the seconds compiling took, divided among the seeds trained together),
            and for ODE models ``nfe_test``, ``reconstruction_error``,
            ``reconstruction_tolerance`` and ``reconstruction_flag`` (True when the error
            exceeds the tolerance: the solver, not the vector field alone, shaped the result).
        curve: ``[step, mean train loss since last point, val metric, cumulative FLOPs,
            mean forward NFE since last point (None for discrete models)]``.
        flops: forward FLOPs per sample of one val batch, of the matmul-class ops torch's
            FLOP counter counts (matmuls, convolutions, attention; no elementwise work).
        nfe_forward, nfe_backward: ODE function evaluations per training batch, averaged.
        wall_time: seconds; of seeds trained together, the ensemble's time divided by
            their number.
        peak_mem: bytes, the peak during this cell, or during the ensemble it trained in
            (CUDA: memory allocated; CPU: resident set size, where the platform can reset
            its high-water mark, else the worker process's peak so far;
            ``metrics["peak_mem_measure"]`` says which).
        config: the fully resolved cell (`Cell.to_dict`), every model option with
            its default filled in: the gate's ``beta_init``/``value_source``, an ODE's
            ``method``, ``rtol``, ``atol`` and ``max_steps``; and the row's ``baseline``,
            ``match_params`` and ``params_target``.
    """

    status: str
    message: str = ""
    key: str = ""
    task: str = ""
    model: str = ""
    seed: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)
    curve: list[list[float | None]] = field(default_factory=list)
    params: int | None = None
    flops: float | None = None
    nfe_forward: float | None = None
    nfe_backward: float | None = None
    wall_time: float | None = None
    peak_mem: int | None = None
    config: dict[str, Any] = field(default_factory=dict)
    created_at: str = ""
