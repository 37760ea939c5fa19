"""A rerun checked against a study's published reference, comparison by comparison.

A comparison *reproduced* when the rerun gives it the reference's label and the rerun's mean
difference lies inside the reference's 95% CI (a comparison with no test on either side
reproduces on its label alone). A comparison one side lacks did not reproduce.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .publish import load_study
from .render import render_json
from .report import build_report
from .wording import difference

Key = tuple[str, str, str, str]


@dataclass(frozen=True)
class Check:
    """One comparison of the reference beside the rerun's (None: missing on that side)."""

    key: Key
    reference: Mapping[str, Any] | None
    rerun: Mapping[str, Any] | None

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
    raise ValueError(f"{path}: neither a run folder (results.sqlite) nor a published study "
                     "(report.json)")


def check(rerun: str | Path, reference: str | Path) -> list[Check]:
    """Every comparison of either side, the reference's order first; a rerun of another
    experiment, or two sides without a comparison, raise ValueError."""
    ref_report, new_report = report_of(reference), report_of(rerun)
    ran, published = experiment_name(new_report), experiment_name(ref_report)
    if ran != published:
        raise ValueError(f"{rerun} ran experiment {ran!r}, {reference} is of {published!r}: "
                         "not a rerun of it")
    ref = {_key(c): c for c in ref_report["comparisons"]}
    new = {_key(c): c for c in new_report["comparisons"]}
    keys = list(dict.fromkeys([*ref, *new]))
    if not keys:
        raise ValueError(f"neither {rerun} nor {reference} holds a comparison: nothing to check")
    return [Check(k, ref.get(k), new.get(k)) for k in keys]


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


def lines(checks: list[Check]) -> list[str]:
    """One line per comparison, then the summary line."""
    out = []
    for c in checks:
        task, model, control, split = c.key
        at = task if split == "test" else f"{task} ({split})"
        verdict = "reproduced" if c.reproduced else f"DIFFERS ({c.why})"
        out.append(f"{at}: {model} − {control}: reference {_side(c.reference)}; "
                   f"rerun {_side(c.rerun)}: {verdict}")
    same = sum(c.reproduced for c in checks)
    differ = [f"{c.key[1]} − {c.key[2]} on {c.key[0]}" for c in checks if not c.reproduced]
    out.append(f"{same} of {len(checks)} comparisons reproduced"
               + (f"; differ: {', '.join(differ)}" if differ else ""))
    return out
