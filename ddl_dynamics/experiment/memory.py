"""A cell's peak memory: CUDA's allocator statistics, else the process's resident-set
high-water mark, reset per cell through ``/proc`` where Linux allows it."""

from __future__ import annotations

import re
import resource
import sys
from pathlib import Path

import torch

#: Linux: writing "5" here resets the process's resident-set high-water mark, ``VmHWM``.
_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")
#: What ``peak_mem`` measured, by how the peak could be reset.
PEAK_MEMORY_MEASURES = {
    "cuda": "CUDA memory allocated, peak during this cell",
    "cell": "resident set size, peak during this cell (VmHWM reset at its start)",
    "process": "resident set size, peak of the worker process since it started "
    "(not reset per cell: includes earlier cells in the same process)",
}


def reset_peak_memory(device: torch.device) -> str:
    """Start measuring this cell's peak memory; returns the key of what will be measured."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return "cuda"
    try:
        _CLEAR_REFS.write_text("5")
        return "cell" if "VmHWM" in _STATUS.read_text() else "process"
    except OSError:
        return "process"


def peak_memory(device: torch.device, measure: str) -> tuple[int, str]:
    """Peak memory in bytes since `reset_peak_memory`, and what it measured."""
    if measure == "cuda":
        peak = int(torch.cuda.max_memory_allocated(device))
    elif measure == "cell":
        found = re.search(r"VmHWM:\s*(\d+) kB", _STATUS.read_text())
        if found is None:  # (the measure is "cell" only where the status has it)
            raise RuntimeError(f"no VmHWM in {_STATUS}")
        peak = int(found[1]) * 1024
    else:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak = int(rss if sys.platform == "darwin" else rss * 1024)  # bytes on macOS, else KiB
    return peak, PEAK_MEMORY_MEASURES[measure]
