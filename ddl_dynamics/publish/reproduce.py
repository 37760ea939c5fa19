"""A rerun checked against a study's published reference, comparison by comparison.

A comparison *reproduced* when the rerun gives it the reference's label and the rerun's mean
difference lies inside the reference's 95% CI (a comparison with no test on either side
reproduces on its label alone). A rerun may shrink its study (``--set``, ``--seeds``,
``--only``): its config's differences from the reference's are said first, and a comparison
one side lacks then was not run there, not a failure; under the same config, it did not
reproduce. Labels at a smaller budget may differ by design, so a shrunk rerun's differences
are a reading, not a verdict on the reference.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..analysis.render.formats import render_json
from ..analysis.report.build import build_report
from ..analysis.report.wording import difference
from ..experiment.options import RunOptions, changes, effective_config
from .publish import load_study

Key = tuple[str, str, str, str]


@dataclass(frozen=True)
class Check:
    """One comparison of the reference beside the rerun's (None: missing on that side);
    ``same_config`` where both ran the same config (a side lacking it is then a difference)."""

    key: Key
    reference: Mapping[str, Any] | None
    rerun: Mapping[str, Any] | None
    same_config: bool = True

    @property
    def compared(self) -> bool:
        """Whether it counts: both sides have it, or their configs are the same."""
        return self.same_config or (self.reference is not None and self.rerun is not None)

    @property
    def verdict(self) -> str:
        """``reproduced``, ``not run`` (left out by the rerun's config), ``not in the
        reference`` (left out by its config) or ``DIFFERS (why)``."""
        if not self.compared:
            return "not run" if self.rerun is None else "not in the reference"
        return "reproduced" if self.reproduced else f"DIFFERS ({self.why})"

    @property
    def reproduced(self) -> bool:
        ref, new = self.reference, self.rerun
        if ref is None or new is None or ref["label"] != new["label"]:
            return False
        ref_p, new_p = ref.get("paired") or {}, new.get("paired") or {}
        mean, ci = ref_p.get("mean"), ref_p.get("ci")
        if mean is None or new_p.get("mean") is None:
            return mean is None and new_p.get("mean") is None
        return abs(new_p["mean"] - mean) <= (ci or 0.0)

    @property
    def why(self) -> str:
        """Why it did not reproduce ("" where it did)."""
        if self.reproduced:
            return ""
        if self.reference is None:
            return "not in the reference"
        if self.rerun is None:
            return "not in the rerun"
        if self.reference["label"] != self.rerun["label"]:
            return "label differs"
        for side, c in (("reference", self.reference), ("rerun", self.rerun)):
            if (c.get("paired") or {}).get("mean") is None:
                return f"no paired mean in the {side}"
        return "mean outside the reference's CI"


def _key(c: Mapping[str, Any]) -> Key:
    """Task, model, control and the split asked for (a comparison moved to the trained split
    stays apart from the one drawn there)."""
    return c["task"], c["model"], str(c["control"]), c.get("asked_split") or c.get("split", "test")


def report_of(path: str | Path) -> dict[str, Any]:
    """The report of a published study folder, or of a run folder (built now)."""
    path = Path(path)
    if (path / "report.json").is_file():
        return load_study(path)
    if (path / "results.sqlite").is_file():
        return json.loads(render_json(build_report(path)))
    raise ValueError(
        f"{path}: neither a run folder (results.sqlite) nor a published study (report.json)"
    )


@dataclass(frozen=True)
class Comparison:
    """A rerun checked against a reference: how its config differs (``key old → new``,
    reference first), and every comparison of either side, the reference's order first."""

    config: list[str]
    checks: list[Check]

    @property
    def passed(self) -> bool:
        """Whether some comparison was compared, and every one compared reproduced."""
        compared = [c for c in self.checks if c.compared]
        return bool(compared) and all(c.reproduced for c in compared)

    def lines(self) -> list[str]:
        """How the configs differ, one line per comparison, then the summary line."""
        out = []
        if self.config:
            out += [
                f"config: the rerun differs from the reference in {len(self.config)} "
                f"key{'s' * (len(self.config) > 1)}:",
                *(f"  {c}" for c in self.config),
                "labels at a smaller budget may differ by design: where the configs "
                "differ, a label that differs need not be a failure to reproduce",
            ]
        for c in self.checks:
            task, model, control, split = c.key
            at = task if split == "test" else f"{task} ({split})"
            out.append(
                f"{at}: {model} − {control}: reference {_side(c.reference)}; "
                f"rerun {_side(c.rerun)}: {c.verdict}"
            )
        compared = [c for c in self.checks if c.compared]
        same = sum(c.reproduced for c in compared)
        apart = Counter(c.verdict for c in self.checks if not c.compared)
        differ = [f"{c.key[1]} − {c.key[2]} on {c.key[0]}" for c in compared if not c.reproduced]
        out.append(
            f"{same} of {len(compared)} comparisons reproduced"
            + "".join(f"; {n} {verdict}" for verdict, n in sorted(apart.items()))
            + (f"; differ: {', '.join(differ)}" if differ else "")
        )
        return out


def check(rerun: str | Path, reference: str | Path) -> Comparison:
    """The rerun checked against the reference; a rerun of another experiment, or two sides
    without a comparison, raise ValueError."""
    ref_report, new_report = report_of(reference), report_of(rerun)
    ran, published = experiment_name(new_report), experiment_name(ref_report)
    if ran != published:
        raise ValueError(
            f"{rerun} ran experiment {ran!r}, {reference} is of {published!r}: not a rerun of it"
        )
    ref = {_key(c): c for c in ref_report["comparisons"]}
    new = {_key(c): c for c in new_report["comparisons"]}
    keys = list(dict.fromkeys([*ref, *new]))
    if not keys:
        raise ValueError(f"neither {rerun} nor {reference} holds a comparison: nothing to check")
    config = config_changes(ref_report, new_report)
    return Comparison(config, [Check(k, ref.get(k), new.get(k), not config) for k in keys])


@dataclass(frozen=True)
class _Only:
    """A run's ``only`` restriction, shown as ``--only`` spells it (``task=parity``)."""

    spelled: str

    def __repr__(self) -> str:
        return self.spelled


def _as_ran(text: str) -> dict[str, Any]:
    """A record's config as it ran (`effective_config`), its ``only`` as the option spells
    it."""
    config = effective_config(text)
    if "only" in config:
        (option,) = RunOptions(only=config["only"]).lines()
        config["only"] = _Only(option.removeprefix("--only "))
    return config


def config_changes(reference: Mapping[str, Any], rerun: Mapping[str, Any]) -> list[str]:
    """How the rerun's config (as it ran: `effective_config`) differs from the reference's;
    none where either report keeps no experiment text."""
    ref, new = ((r.get("experiment") or {}).get("config") for r in (reference, rerun))
    if not (isinstance(ref, str) and ref and isinstance(new, str) and new):
        return []
    return list(changes(_as_ran(ref), _as_ran(new)))


def experiment_name(report: Mapping[str, Any]) -> str:
    """The name of the experiment a report's run ran (a study published under another name
    keeps it in its experiment record)."""
    name = (report.get("experiment") or {}).get("name")
    return name if isinstance(name, str) and name else str(report["name"])


def _side(c: Mapping[str, Any] | None) -> str:
    if c is None:
        return "—"
    paired = c.get("paired") or {}
    return f"{c['label']} {difference(paired.get('mean'), paired.get('ci'))}"
