"""Figures over depth: predicted trajectories against the truth, and per-depth profiles."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from .style import PALETTE, legend_below, model_colors, model_handles, panel_grid, styled


@styled
def phase_portraits(
    panels: Mapping[str, tuple[np.ndarray, np.ndarray]],
    task: str,
    train_steps: int | None = None,
    state_names: Sequence[str] | None = None,
) -> Figure:
    """Predicted depth trajectories against the ground truth in the first two coordinates.

    Args:
        panels: model → (predictions, truth), each ``(S, steps, ≥2)`` for S samples; a
            model that extrapolates is drawn over its longer split.
        task: the task's label.
        train_steps: where the training horizon ends (marked; later steps extrapolate).
        state_names: the task's names of its state coordinates (default ``x1``, ``x2``).
    """
    names = tuple(state_names or ())[:2]
    if len(names) < 2:
        names = ("x1", "x2")
    fig, axes = panel_grid(len(panels), width=2.8, height=2.8)
    for ax, (model, (pred, truth)) in zip(axes, panels.items(), strict=True):
        for s in range(truth.shape[0]):
            color = PALETTE[s % len(PALETTE)]
            ax.plot(truth[s, :, 0], truth[s, :, 1], color=color, lw=0.8, ls="--", alpha=0.7)
            ax.plot(pred[s, :, 0], pred[s, :, 1], color=color, lw=1.2)
            if train_steps is not None and train_steps < pred.shape[1]:
                ax.plot(*pred[s, train_steps - 1, :2], "o", color=color, ms=3)
        ax.set(title=f"{model} on {task}", xlabel=names[0], ylabel=names[1])
        ax.set_aspect("equal", adjustable="datalim")
    note = "solid: model, dashed: truth, one colour per test sample"
    if train_steps is not None:
        note += "; dot: end of the training horizon"
    fig.suptitle(f"{task}: depth trajectories\n{note}", fontsize=8)
    fig.tight_layout()
    return fig


@styled
def depth_profiles(
    profiles: Mapping[str, Mapping[str, np.ndarray]],
    ylabel: str,
    colors: Mapping[str, str] | None = None,
) -> Figure:
    """One panel per task: a per-depth quantity (mean over samples) for every model."""
    fig, axes = panel_grid(len(profiles))
    colors = colors or model_colors(profiles)
    for ax, (task, by_model) in zip(axes, profiles.items(), strict=True):
        for model, values in by_model.items():
            ax.plot(
                np.arange(len(values)),
                values,
                color=colors[model],
                lw=1.2,
                marker="o" if len(values) < 3 else None,
                ms=4,
            )
        ax.set(title=task, xlabel="depth step", ylabel=ylabel)
    drawn = {m for by_model in profiles.values() for m in by_model}
    legend_below(fig, model_handles(colors, drawn))
    return fig
