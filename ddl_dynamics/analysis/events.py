"""Do the gates follow the events? The gate audit of a task swept over its knob.

A task family that marks its events (``step_regimes``: the regime of each step's exact
update, as ``switched`` does for its overwrites and reflections) lets the probes of a trained
Delta stack say whether its gates follow them: per knob value, the share of gates in each
event's regime (projection for an overwrite, reflection for a reflection) at the steps where
that event happens, against the share in that regime at the steps without an event. It reads
the run's probes, so it sits beside the other audits rather than with the crossover it is
drawn beside (`judge.crossover`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch

from ..models.operator import REGIMES, regime_index
from .judge.crossover import Setting, knob_settings
from .judge.stats import Estimate
from .probes import erases, load_probes
from .run import Run


@dataclass(frozen=True)
class GateUse:
    """How one Delta stack's gates follow one kind of event, across a knob.

    ``at_events``: per knob value, the share of gates in ``regime`` at the steps whose exact
    update is in that regime; ``elsewhere``: the share in ``regime`` at the steps without an
    event. Both are over seeds (mean, 95% CI of the per-seed shares).
    """

    setting: Setting
    model: str
    regime: str
    at_events: tuple[tuple[float, Estimate], ...]
    elsewhere: tuple[tuple[float, Estimate], ...]


def gate_use(run: Run) -> list[GateUse]:
    """For every probed Delta stack on a swept knob family whose task marks its events
    (``step_regimes``), the share of gates in each event's regime at those events and
    elsewhere, per knob value (needs the run's probes)."""
    probed = [
        (row, arrays)
        for row, arrays in load_probes(run)
        if erases(row) and "test_step_regimes" in arrays
    ]
    settings = knob_settings([row for row, _ in probed])
    probed = [(row, arrays) for row, arrays in probed if row.task in settings]
    regimes: dict[Setting, set[int]] = defaultdict(set)  # the events' regimes, at any value
    for row, arrays in probed:
        events = arrays["test_step_regimes"]
        regimes[settings[row.task][0]].update(int(i) for i in np.unique(events[events >= 0]))
    shares: dict[tuple[Setting, str, int], dict[str, dict[float, list[float]]]] = defaultdict(
        lambda: {"at_events": defaultdict(list), "elsewhere": defaultdict(list)}
    )
    for row, arrays in probed:
        setting, value = settings[row.task]
        used = regime_index(torch.as_tensor(arrays["beta"])).numpy()  # (N, L)
        events = arrays["test_step_regimes"]  # (N, L): the exact step's regime, −1 for none
        # a stack of several updates per layer (ddl-product) has that many gates per step
        events = np.repeat(events, used.shape[1] // events.shape[1], axis=1)
        for index in regimes[setting]:
            found = shares[setting, row.model, index]
            for where, steps in (("at_events", events == index), ("elsewhere", events < 0)):
                if steps.any():
                    found[where][value].append(float((used[steps] == index).mean()))
    return [
        GateUse(
            setting,
            model,
            REGIMES[index],
            *(
                tuple((v, Estimate.of(found[where][v])) for v in sorted(found[where]))
                for where in ("at_events", "elsewhere")
            ),
        )
        for (setting, model, index), found in sorted(
            shares.items(), key=lambda kv: (kv[0][0].family, kv[0][0].label, *kv[0][1:])
        )
    ]
