"""What a run records of itself: what ran it (software, machine) and how far it got."""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import torch


@dataclass(frozen=True)
class Progress:
    """How far a run got: ``finished`` of the ``selected`` cells have a row (a failure is a
    result too), and whether the run ``ended`` (one killed, or still going, has not)."""

    finished: int
    selected: int
    ended: bool

    def __str__(self) -> str:
        return f"{self.finished} of {self.selected} cells" + (
            "" if self.ended else "; run unfinished"
        )


def versions() -> dict[str, str]:
    """The versions of Python and of the packages a result depends on."""
    found = {"python": sys.version.split()[0]}
    for package in ("torch", "torchdiffeq", "numpy", "scipy", "ddl-dynamics"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "absent"
    return found


def machine() -> dict[str, Any]:
    """The platform, processor, core count and GPU, if any."""
    machine = {
        "platform": platform.platform(),
        "processor": platform.machine(),
        "cpu_count": os.cpu_count(),
    }
    if torch.cuda.is_available():
        machine["cuda"] = torch.cuda.get_device_name()
    return machine
