"""Figures across a sweep: the crossover of a comparison over a task's knob, a Delta row's
gates on a multi-hop task, and each row's test metric against the model width."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from ...models.operator import REGIME_BOUNDS
from ..judge.crossover import star_text
from ..judge.width import SOLVED, WidthPanel, WidthPoint, smallest_solving
from .style import (
    METRIC_RANGE,
    PALETTE,
    REGIME_COLORS,
    clipped_error,
    panel_grid,
    row_colors,
    styled,
    sublayer_positions,
    sublayer_ticks,
)

#: One knob value's point of a curve: (knob value, mean, 95% CI half-width; 0 for none).
Curve = tuple[Sequence[float], Sequence[float], Sequence[float]]
#: The legend below a sweep's panel.
_LEGEND: dict[str, Any] = {
    "fontsize": 7,
    "loc": "upper center",
    "bbox_to_anchor": (0.5, -0.16),
    "ncol": 2,
}


def _knob_axis(ax, values: Sequence[float], knob: str) -> None:
    """A symlog x-axis that keeps 0 in view, linear below the smallest positive value."""
    positive = [v for v in values if v > 0]
    if positive and min(values) == 0 and max(positive) / min(positive) > 4:
        ax.set_xscale("symlog", linthresh=min(positive), linscale=0.6)
    ax.set_xticks(sorted(set(values)), [f"{v:g}" for v in sorted(set(values))])
    ax.minorticks_off()
    ax.set_xlabel(knob)


@styled
def crossover(
    differences: Mapping[str, Mapping[str, tuple[Curve, float | None]]],
    gates: Mapping[str, Mapping[tuple[str, str], tuple[Curve, Curve]]],
    knob: str,
    metric: str,
    higher_is_better: bool,
    colors: Mapping[str, str] | None = None,
) -> Figure:
    """One row per setting: the paired test-metric difference model − control against the
    knob, with 95% CIs and each curve's crossover in its legend (a dotted line where it
    lies); beside it, where gates were probed, the Delta stacks' gate use against the knob.
    A curve has the colour of its model, and one style per control, in every row; the
    gate shares' intervals are clipped to [0, 1]. The difference axis is linear: a signed
    log axis drew differences of 1e-4 and 1e-2 a tick apart, alike at a glance.

    Args:
        differences: setting → ``"model − control"`` → ((values, means, CI half-widths),
            the crossover value or None).
        gates: setting → (stack, regime) → (the share of gates in the regime at the steps
            of that event, the share at steps without an event), each a curve.
        knob, metric, higher_is_better: axis labels and the sign of a win.
        colors: model → colour (default: one per model of the figure, sorted).
    """
    settings = list(differences)
    columns = 2 if any(gates.get(s) for s in settings) else 1
    fig = Figure(figsize=(6.2 * columns, 5.2 * len(settings)))
    axes = fig.subplots(len(settings), columns, squeeze=False)
    names = list(dict.fromkeys(n for curves in differences.values() for n in curves))
    models = {n: n.split(" − ")[0] for n in names}
    stacks = {m for g in gates.values() for m, _ in g}
    colors = colors or row_colors([*models.values(), *stacks])
    looks = {
        n: (
            colors[models[n]],
            ("o-", "s--", "^:", "D-.")[[k for k in names if models[k] == models[n]].index(n) % 4],
        )
        for n in names
    }
    for row, setting in zip(axes, settings, strict=True):
        _differences(row[0], setting, differences[setting], looks, knob, metric, higher_is_better)
        if columns == 2:
            _gate_use(row[1], setting, gates.get(setting, {}), knob, colors)
    fig.suptitle(
        f"paired over seeds, mean and 95% CI; {knob}*: the smallest {knob} from which "
        "on the model wins (Holm-adjusted p < 0.05) at every larger value",
        fontsize=8,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.985))
    return fig


def _differences(
    ax: Axes,
    setting: str,
    curves: Mapping[str, tuple[Curve, float | None]],
    looks: Mapping[str, tuple[str, str]],
    knob: str,
    metric: str,
    higher_is_better: bool,
) -> None:
    """One setting's paired differences against the knob (``looks``: curve → its colour and
    style), each curve's crossover in its legend and dotted where it lies."""
    for name, ((values, mean, half), star) in curves.items():
        color, style = looks[name]
        ax.errorbar(
            values,
            mean,
            yerr=half,
            fmt=style,
            ms=4,
            lw=1.2,
            capsize=3,
            color=color,
            label=f"{name}: {star_text(star, knob)}",
        )
        if star is not None:
            ax.axvline(star, color=color, lw=0.9, ls=":")
    ax.axhline(0.0, color="black", lw=0.8)
    _knob_axis(ax, [v for (vs, _, _), _ in curves.values() for v in vs], knob)
    better = "above" if higher_is_better else "below"
    ax.set(
        title=f"{setting}: model − control ({better} 0: model better)",
        ylabel=f"Δ test {metric} (mean, 95% CI)",
    )
    ax.legend(**_LEGEND)


def _gate_use(
    ax: Axes,
    setting: str,
    gates: Mapping[tuple[str, str], tuple[Curve, Curve]],
    knob: str,
    colors: Mapping[str, str],
) -> None:
    """One setting's gate use against the knob, at each event and elsewhere, the shares'
    intervals clipped to [0, 1]; the panel hidden where no gates were probed."""
    if not gates:
        ax.set_visible(False)
        return
    for (model, regime), pair in gates.items():
        for (values, mean, half), style, where in zip(
            pair, ("o-", "s--"), ("at its events", "elsewhere"), strict=True
        ):
            if len(values):
                ax.errorbar(
                    values,
                    mean,
                    yerr=clipped_error(mean, half, 0.0, 1.0),
                    fmt=style,
                    ms=3.5,
                    lw=1.1,
                    capsize=2,
                    color=colors[model],
                    label=f"{model}: {regime} {where}",
                )
    _knob_axis(ax, [v for pair in gates.values() for c in pair for v in c[0]], knob)
    ax.set(
        title=f"{setting}: do the gates follow the events?",
        ylim=(-0.02, 1.02),
        ylabel="share of gates in the event's regime",
    )
    ax.legend(**_LEGEND)


def _gate_profile(
    right: Axes, title: str, profile: Mapping[float, Sequence[float]], knob: str, updates: int
) -> None:
    """The right panel of `hop_gates`: the mean gate of every sublayer at query tokens (of
    each of its ``updates`` delta updates), one line per knob value, the projection band
    shaded."""
    low, high = REGIME_BOUNDS[1], REGIME_BOUNDS[2]
    right.axhspan(low, high, color=REGIME_COLORS["projection"], alpha=0.15, label="projection")
    for i, (value, betas) in enumerate(sorted(profile.items())):
        layers = sublayer_positions(len(betas), updates)
        right.plot(
            layers,
            betas,
            "o-",
            ms=3.5,
            lw=1.1,
            color=PALETTE[i % len(PALETTE)],
            label=f"{knob} = {value:g}",
        )
        sublayer_ticks(right, layers)
    right.set(
        title=f"{title}: mean gate of every sublayer at query tokens",
        ylabel="β",
        ylim=(0, 2),
    )
    right.legend(**_LEGEND)


@styled
def hop_gates(
    settings: Mapping[str, tuple[Mapping[str, Curve], Mapping[float, Sequence[float]]]],
    model: str,
    knob: str,
    updates: int = 1,
) -> Figure:
    """One Delta row on a multi-hop task: per setting, the share of its gates that project at
    the query tokens' sublayers that hop, at their other sublayers, and the share of hops
    its attention looked at, against the knob (mean, 95% CI over seeds); beside it, the mean
    gate of every sublayer at query tokens, one line per knob value, the projection band
    shaded.

    Args:
        settings: task and setting → (curve name → (values, means, CI half-widths), knob
            value → the mean β of every sublayer, attention and MLP alternating); shares'
            intervals are clipped to [0, 1].
        model, knob: the row's label and the knob's name.
        updates: the row's delta updates per sublayer (a point each in the profile).
    """
    fig = Figure(figsize=(11.0, 4.2 * len(settings)))
    axes = fig.subplots(len(settings), 2, squeeze=False)
    styles = {
        "projecting where it hops": ("o-", PALETTE[2]),
        "projecting elsewhere": ("s--", PALETTE[7]),
        "hops its attention looked at": ("^:", PALETTE[0]),
    }
    for (left, right), (setting, (curves, profile)) in zip(axes, settings.items(), strict=True):
        for name, (values, mean, half) in curves.items():
            if len(values):
                fmt, color = styles[name]
                left.errorbar(
                    values,
                    mean,
                    yerr=clipped_error(mean, half, 0.0, 1.0),
                    fmt=fmt,
                    ms=4,
                    lw=1.2,
                    capsize=3,
                    color=color,
                    label=name,
                )
        _knob_axis(left, [v for values, _, _ in curves.values() for v in values], knob)
        left.set(
            title=f"{model} on {setting}: query tokens",
            ylabel="share (mean, 95% CI over seeds)",
            ylim=(-0.02, 1.02),
        )
        left.legend(**_LEGEND)
        _gate_profile(right, f"{model} on {setting}", profile, knob, updates)
    fig.tight_layout()
    return fig


def _width_legend(
    label: str, points: Sequence[WidthPoint], star: int | None, solvable: bool
) -> str:
    """A row's legend entry: where it reaches `SOLVED` and how many of its seeds failed."""
    notes = [label]
    if solvable:
        notes.append(
            f"reaches {SOLVED:g} from width {star}"
            if star is not None
            else f"reaches {SOLVED:g} at no width"
        )
    failed, run = sum(p.failed for p in points), sum(p.run for p in points)
    if failed:
        notes.append(f"{failed} of {run} seeds failed")
    return "; ".join(notes)


def _width_row(
    ax: Axes,
    label: str,
    points: Sequence[WidthPoint],
    offset: float,
    color: str,
    solvable: bool,
    bounds: tuple[float, float],
) -> None:
    """One row of `width_sweep`: its means with their CI against the width (each shifted by
    ``offset`` so that rows do not hide each other), a star where it first reaches
    `SOLVED`."""
    drawn = [p for p in points if p.test.mean is not None]
    means = [float(p.test.mean) for p in drawn if p.test.mean is not None]
    halves = [p.test.ci or 0.0 for p in drawn]
    xs = [p.width * offset for p in drawn]
    star = smallest_solving(points, solvable)
    ax.errorbar(
        xs,
        means,
        yerr=clipped_error(means, halves, *bounds),
        fmt="o-",
        ms=4,
        lw=1.2,
        capsize=3,
        color=color,
        label=_width_legend(label, points, star, solvable),
    )
    if star is not None:
        at = next(j for j, p in enumerate(drawn) if p.width == star)
        ax.plot(
            xs[at],
            means[at],
            "*",
            ms=13,
            color=color,
            mec="black",
            mew=0.6,
            zorder=5,
        )


@styled
def width_sweep(panels: Sequence[WidthPanel], colors: Mapping[str, str] | None = None) -> Figure:
    """One panel per task setting: every row's test metric against the model width (log
    axis, a tick at every width), each point at the row's chosen grid value, the mean over
    its finished seeds with the 95% CI clipped to the metric's range; a star marks the
    smallest width whose mean reaches `SOLVED` (dashed line), and each
    row's legend entry says where that is and how many of its seeds failed.

    Args:
        panels: the width sweeps (`width_panels`).
        colors: row label → colour (default: one per row of the figure, sorted).
    """
    fig, axes = panel_grid(len(panels), width=4.6, height=4.4, cols=3)
    colors = colors or row_colors(label for p in panels for label in p.rows)
    for ax, panel in zip(axes, panels, strict=True):
        low, high = METRIC_RANGE.get(panel.metric, (-np.inf, np.inf))
        solvable = panel.higher_is_better and high == 1.0  # a share, such as accuracy
        widths = sorted({p.width for points in panel.rows.values() for p in points})
        for i, (label, points) in enumerate(panel.rows.items()):
            offset = 1 + 0.02 * (i - (len(panel.rows) - 1) / 2)
            _width_row(ax, label, points, offset, colors[label], solvable, (low, high))
        if solvable:
            ax.axhline(SOLVED, color="black", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xticks(widths, [str(w) for w in widths])
        ax.minorticks_off()
        if np.isfinite(high):
            ax.set_ylim(low - 0.02 * (high - low), high + 0.02 * (high - low))
        ax.set(
            title=panel.title, xlabel="model width", ylabel=f"test {panel.metric} (mean, 95% CI)"
        )
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1)
    fig.suptitle(
        "each row at its chosen grid value; mean over its finished seeds, 95% CI; "
        f"star: the smallest width whose mean reaches {SOLVED:g}",
        fontsize=8,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return fig
