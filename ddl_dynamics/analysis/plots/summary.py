"""Figures of the results: every model's test metric per task, and the verdict matrix."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from ..judge.labels import MARK_COLORS as MARK_COLORS  # the verdict colours, for the headline
from ..judge.labels import TABLE, entry
from .style import METRIC_RANGE, clipped_error, log_axis, model_colors, panel_grid, styled


def _metric_panel(
    ax: Axes,
    task: str,
    by_model: Mapping[str, tuple[float, float, Sequence[float]]],
    metric: str,
    colors: Mapping[str, str],
) -> None:
    """One task's panel of `comparison`: each model's seeds (hollow) and mean (filled)."""
    names = list(by_model)
    values = np.array([v for m in names for v in (*by_model[m][2], by_model[m][0])], float)
    finite = values[np.isfinite(values)]
    low, high = METRIC_RANGE.get(metric, (-np.inf, np.inf))
    log = metric == "mse" and finite.size > 0 and bool(np.all(finite > 0))
    if log:
        low = max(low, float(finite.min()) / 2)
    for y, name in enumerate(names):
        mean, half, seeds = by_model[name]
        ax.scatter(
            seeds,
            np.full(len(seeds), y + 0.22),
            s=12,
            facecolors="none",
            edgecolors=colors[name],
            linewidths=0.9,
        )
        ax.errorbar(
            mean,
            y,
            xerr=clipped_error(mean, half, low, high),
            fmt="o",
            ms=6,
            capsize=3,
            color=colors[name],
        )
    ax.set_yticks(range(len(names)), names)
    ax.set_ylim(len(names) - 0.5, -0.6)
    ax.set(title=task, xlabel=f"test {metric}")
    if log:
        log_axis(ax, "x", finite)


@styled
def comparison(
    tables: Mapping[str, Mapping[str, tuple[float, float, Sequence[float]]]],
    metric: Mapping[str, str],
    colors: Mapping[str, str] | None = None,
) -> Figure:
    """Per task, every model's test metric: each finished seed, and their mean with its
    95% CI, so that a bimodal result (two seeds solved, one not) shows as such.

    Points, not bars, so that a log axis (MSE) does not exaggerate; the models down the
    side, so that their names never overlap; each interval clipped to the metric's range
    (`METRIC_RANGE`; on a log axis, to the lowest point drawn).

    Args:
        tables: task → model → (mean, CI half-width; 0 for a single seed, per-seed values).
        metric: task → metric name.
        colors: model → colour (default: `model_colors`).
    """
    most = max((len(by_model) for by_model in tables.values()), default=1)
    # At least a page's width in all (a lone panel drew a page image a third wide), and the
    # caption wrapped to it: it set the image's width before.
    cols = min(3, len(tables))
    fig, axes = panel_grid(
        len(tables), width=max(3.6, 8.0 / cols), height=1.2 + 0.3 * most, cols=cols
    )
    colors = colors or model_colors(tables)
    for ax, (task, by_model) in zip(axes, tables.items(), strict=True):
        _metric_panel(ax, task, by_model, metric[task], colors)
    caption = (
        "filled: mean over finished seeds with 95% CI (none for one seed), cut at the "
        "metric's range (on a log axis, at half the lowest point); hollow: each seed"
    )
    fig.suptitle(textwrap.fill(caption, int(13 * fig.get_figwidth())), fontsize=8)
    fig.tight_layout()
    return fig


def _verdict_cell(ax: Axes, i: int, j: int, mark: str, text: str) -> None:
    """The cell of `verdict_matrix` at row ``i``, column ``j``: coloured by its label."""
    label = entry(mark)
    ax.add_patch(
        Rectangle(
            (j - 0.5, i - 0.5),
            1,
            1,
            facecolor=label.colour,
            edgecolor="0.8",
            hatch="///" if label.gate else None,
            lw=0.6,
        )
    )
    ax.text(j, i, f"{mark}\n{text}", ha="center", va="center", fontsize=6.5, color=label.text)


@styled
def verdict_matrix(cells: Mapping[str, Mapping[str, tuple[str, str]]]) -> Figure:
    """Task × model grid of every model's verdict against its baseline.

    Args:
        cells: task → model → (mark, text): the mark (a verdict label, `labels.TABLE`)
            colours the cell and the text (the paired difference) is written in it; a model with no
            comparison on a task (its baseline, or not run there) leaves the cell blank.
    """
    tasks = list(cells)
    models = sorted({m for row in cells.values() for m in row})
    fig = Figure(figsize=(max(4.0, 1.3 * len(models) + 2.0), 0.75 * len(tasks) + 1.6))
    ax = fig.subplots()
    for i, task in enumerate(tasks):
        for j, model in enumerate(models):
            if model in cells[task]:
                _verdict_cell(ax, i, j, *cells[task][model])
    ax.set(xlim=(-0.5, len(models) - 0.5), ylim=(len(tasks) - 0.5, -0.5))
    ax.set_xticks(range(len(models)), models, rotation=35, ha="right")
    ax.set_yticks(range(len(tasks)), tasks)
    ax.grid(False)
    ax.spines[:].set_visible(False)
    handles = [
        Patch(
            facecolor=label.colour,
            edgecolor="0.6",
            hatch="///" if label.gate else None,
            label=label.name,
        )
        for label in TABLE.values()
    ]
    fig.legend(
        handles=handles,
        loc="upper center",
        ncol=len(handles),
        fontsize=7,
        bbox_to_anchor=(0.5, 1.0),
    )
    fig.suptitle(
        "test metric, model − baseline over paired seeds: mean ± 95% CI; labels on "
        "Holm-adjusted p < 0.05 (equivalent: TOST at the task's margin)",
        fontsize=8,
        y=1.06,
    )
    fig.tight_layout()
    return fig
