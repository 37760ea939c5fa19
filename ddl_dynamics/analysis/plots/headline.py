"""The headline figure: every finding of the tuned studies at a glance, one panel per question.

Each difference is drawn in units of its task's equivalence margin, so that differences on
tasks whose metrics differ by orders of magnitude share one axis and the margin is the same
band everywhere; signed so that right is better for the first (Delta) row. The figure's
height is capped, so that it stays one page whatever the number of findings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from .style import styled
from .summary import MARK_COLORS

#: The most inches the figure may be tall (1,590 px at the 100 dpi it is written at).
MOST_HEIGHT = 15.9
#: Where the axis stops: a difference beyond is drawn at the edge.
FARTHEST = 1e3


def _question_panel(
    ax: Axes, asked: str, rows: Mapping[str, Sequence[tuple[float, str]]], colors: Mapping[str, str]
) -> set[str]:
    """One question's panel: a line per pair of rows, a dot per task; the labels drawn."""
    drawn: set[str] = set()
    ax.axvspan(-1, 1, color="#0072B2", alpha=0.12, lw=0)
    ax.axvline(0, color="#888888", lw=0.8)
    for y, points in enumerate(rows.values()):
        for x, label in points:
            ax.plot(
                max(-FARTHEST, min(FARTHEST, x)),
                len(rows) - 1 - y,
                "o",
                ms=4.5,
                color=colors.get(label, "#999999"),
                mec="#555555",
                mew=0.3,
            )
            drawn.add(label)
    ax.set_yticks(range(len(rows)), list(rows)[::-1], fontsize=7)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlim(-FARTHEST * 1.2, FARTHEST * 1.2)
    ax.set_title(asked, fontsize=8, loc="left", pad=2)
    ax.tick_params(axis="x", labelsize=7)
    ax.grid(axis="y", visible=False)
    return drawn


@styled
def headline(
    panels: Mapping[str, Mapping[str, Sequence[tuple[float, str]]]],
    colors: Mapping[str, str] | None = None,
) -> Figure:
    """One panel per question, one line per pair of rows, a dot per task (or knob value).

    Args:
        panels: question → ``"first − second"`` → (difference in margins, signed so that
            positive favours the first row; label) per task.
        colors: label → colour (default: `MARK_COLORS`; grey otherwise).
    """
    colors = {**MARK_COLORS, **(colors or {})}
    heights = [0.2 * max(len(rows), 1) + 0.55 for rows in panels.values()] or [1.0]
    scale = min(1.0, (MOST_HEIGHT - 0.9) / sum(heights))
    fig = Figure(figsize=(8.0, sum(heights) * scale + 0.9))
    axes = fig.subplots(len(heights), 1, squeeze=False, gridspec_kw={"height_ratios": heights})[
        :, 0
    ]
    drawn: set[str] = set()
    for ax, (asked, rows) in zip(axes, panels.items(), strict=False):
        drawn |= _question_panel(ax, asked, rows, colors)
    axes[-1].set_xlabel(
        "paired difference in units of the task's margin (shaded: ±1 margin); "
        "right: the first row is better",
        fontsize=7,
    )
    handles = [
        Line2D(
            [],
            [],
            ls="",
            marker="o",
            color=colors.get(label, "#999999"),
            mec="#555555",
            mew=0.3,
            label=label,
        )
        for label in colors
        if label in drawn
    ]
    fig.legend(
        handles=handles,
        loc="upper center",
        ncol=min(len(handles), 6) or 1,
        fontsize=7,
        bbox_to_anchor=(0.5, 1.0),
    )
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.45 / fig.get_figheight()))
    return fig
