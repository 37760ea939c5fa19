"""Figure: a training step's time and memory against members folded, width and depth.

Draws the ``scaling`` rows of a ``ddl-dyn bench`` JSON (``--parts scaling``): one column
per axis, time per step (top) and memory (bottom) of each vector family, the additive
baseline in black, both axes logarithmic.

    ddl-dyn bench --parts scaling --output runs/bench/bench.json
    python experiments/plot_scaling.py runs/bench/bench.json docs/scaling.png
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from ddl_dynamics.bench.steps import STEP_BASELINE

LABELS = {"members": "members folded (seeds)", "width": "width", "depth": "depth"}


def scaling_figure(rows: list[dict[str, Any]], title: str = "") -> Figure:
    """Time and memory of a step against each axis of ``rows``, one line per family."""
    axes_names = list(dict.fromkeys(r["axis"] for r in rows))
    fig = Figure(figsize=(4.2 * len(axes_names), 7), layout="tight")
    grid = fig.subplots(2, len(axes_names), squeeze=False)
    for col, axis in enumerate(axes_names):
        lines: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
        for r in rows:
            if r["axis"] == axis:
                lines[r["family"]].append((r["value"], r["ms"], r["bytes"] / 2**20))
        for family, points in lines.items():
            values, ms, mib = zip(*sorted(points), strict=True)
            style = (
                {"color": "black", "linewidth": 2.5, "zorder": 3} if family == STEP_BASELINE else {}
            )
            grid[0, col].plot(values, ms, marker="o", label=family, **style)
            grid[1, col].plot(values, mib, marker="o", label=family, **style)
        values = sorted({r["value"] for r in rows if r["axis"] == axis})
        for row, ylabel in enumerate(("ms per training step", "MiB at the backward's start")):
            ax = grid[row, col]
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(values, [str(v) for v in values])
            ax.minorticks_off()
            ax.set_xlabel(LABELS.get(axis, axis))
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
    grid[0, 0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", help="a ddl-dyn bench JSON with a 'scaling' part")
    parser.add_argument("output", help="the image to write (PNG, SVG, ...)")
    args = parser.parse_args()
    results = json.loads(Path(args.bench).read_text())
    rows = results["scaling"]
    base = ", ".join(
        f"{key} {Counter(r[key] for r in rows).most_common(1)[0][0]}" for key in LABELS
    )
    title = (
        f"One training step, {STEP_BASELINE} in black; along each axis the others at "
        f"{base}\n(torch {results['torch']}, 1 thread, load {results['load']})"
    )
    scaling_figure(rows, title).savefig(args.output, dpi=120)
    print(args.output)


if __name__ == "__main__":
    main()
