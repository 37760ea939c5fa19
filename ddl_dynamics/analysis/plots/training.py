"""Figures of training: the val metric against steps or FLOPs, and an ODE's function
evaluations, each a mean over seeds with its min–max band."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from .style import legend_below, log_axis, model_colors, model_handles, panel_grid, styled


def _finite_curve(seeds: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray] | None:
    """The x values and the per-seed y values ``(seeds, P)`` of the points every seed has,
    those with a finite y in some seed kept; None when no point is left."""
    n = min(len(c) for c in seeds)
    stacked = np.stack([np.asarray(c[:n], float) for c in seeds])  # (seeds, P, 2)
    keep = np.isfinite(stacked[:, :, 1]).any(0) & np.isfinite(stacked[0, :, 0])
    if not keep.any():
        return None
    return stacked[0, keep, 0], stacked[:, keep, 1]


def _series(ax: Axes, xs: np.ndarray, ys: np.ndarray, color: str) -> None:
    """A mean line over seeds with its min–max band; a series of one or two points is drawn
    as markers with whiskers, so that it shows."""
    with np.errstate(all="ignore"):
        mean, low, high = np.nanmean(ys, 0), np.nanmin(ys, 0), np.nanmax(ys, 0)
    if len(xs) < 3:
        ax.errorbar(
            xs,
            mean,
            yerr=np.stack([mean - low, high - mean]),
            fmt="o-",
            ms=4,
            lw=1.2,
            capsize=2,
            color=color,
        )
        return
    ax.plot(xs, mean, color=color, lw=1.2)
    if len(ys) > 1:
        ax.fill_between(xs, low, high, color=color, alpha=0.2, lw=0)


def _step_axis(ax: Axes, xs: Iterable[float]) -> None:
    """A training-step axis from 0 to the last step drawn, whatever the points' spread (one
    point at step 50 would otherwise span 48–52)."""
    last = max((float(x) for x in xs if np.isfinite(x)), default=1.0)
    ax.set_xlim(0, last * 1.05 if last > 0 else 1.0)


@styled
def training_curves(
    curves: Mapping[str, Mapping[str, list[np.ndarray]]],
    metric: Mapping[str, str],
    x: str = "step",
    colors: Mapping[str, str] | None = None,
) -> Figure:
    """Val metric against training step (or cumulative FLOPs), with seed bands, one legend
    for all panels below them; a model with no finite val metric is named under it.

    Args:
        curves: task → model → per-seed ``(P, 2)`` arrays of (x, val metric).
        metric: task → metric name (axis label).
        x: ``"step"`` or ``"FLOPs"`` (axis label only; the arrays carry the values).
        colors: model → colour (default: `model_colors`).
    """
    fig, axes = panel_grid(len(curves))
    colors = colors or model_colors(curves)
    drawn: set[str] = set()
    missing: set[str] = set()
    for ax, (task, by_model) in zip(axes, curves.items(), strict=True):
        xs_all: list[float] = []
        ys_all: list[float] = []
        for model, seeds in by_model.items():
            found = _finite_curve(seeds)
            if found is None:
                missing.add(f"{model} on {task}")
                continue
            xs, ys = found
            _series(ax, xs, ys, colors[model])
            drawn.add(model)
            xs_all += xs.tolist()
            ys_all += ys[np.isfinite(ys)].tolist()
        ax.set(
            title=task,
            xlabel="training step" if x == "step" else "training FLOPs",
            ylabel=f"val {metric[task]}",
        )
        if metric[task] == "mse" and any(v > 0 for v in ys_all):
            log_axis(ax, "y", ys_all)
        if x == "step":
            _step_axis(ax, xs_all)
        elif any(v > 0 for v in xs_all):
            log_axis(ax, "x", xs_all)
    note = "line: mean over seeds; band: min–max over seeds"
    if missing:
        note += "; no finite val metric, not drawn: " + ", ".join(sorted(missing))
    legend_below(fig, model_handles(colors, drawn), note)
    return fig


@styled
def nfe_curves(
    curves: Mapping[str, Mapping[str, list[np.ndarray]]], colors: Mapping[str, str] | None = None
) -> Figure:
    """ODE function evaluations per forward pass over training, one panel per task; a row
    evaluated once (its curve one point) shows as a marker, the axis from step 0."""
    fig, axes = panel_grid(len(curves))
    colors = colors or model_colors(curves)
    drawn: set[str] = set()
    for ax, (task, by_model) in zip(axes, curves.items(), strict=True):
        steps: list[float] = []
        for model, seeds in by_model.items():
            found = _finite_curve(seeds)
            if found is not None:
                _series(ax, *found, colors[model])
                drawn.add(model)
                steps += found[0].tolist()
        ax.set(title=task, xlabel="training step", ylabel="NFE per forward pass")
        _step_axis(ax, steps)
        ax.set_ylim(bottom=0)
    legend_below(
        fig, model_handles(colors, drawn), "mean over seeds; band or whiskers: min–max over seeds"
    )
    return fig
