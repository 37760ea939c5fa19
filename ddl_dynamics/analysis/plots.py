"""Figure builders: plain data in, a matplotlib ``Figure`` out, one house style.

The builders never touch the store or a model (``figures.py`` gathers the data), so
each can be tested on hand-made arrays. Colours are the Okabe–Ito colour-blind-safe set.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from ..models.operator import REGIME_BOUNDS, REGIMES
from .crossover import star_text
from .verdicts import (
    BOTH_SOLVED,
    EQUIVALENT,
    FAILS,
    INCONCLUSIVE,
    LOSS,
    UNEQUAL_BUDGET,
    UNEQUAL_TUNING,
    UNMATCHED_SIZE,
    WIN,
)

#: Okabe–Ito palette (colour-blind safe), then two from Tol's muted set for larger sweeps.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442",
           "#000000", "#882255", "#999999")
#: One colour per gate regime, identity → reflection.
REGIME_COLORS = dict(zip(REGIMES, ("#BBBBBB", "#56B4E9", "#009E73", "#E69F00", "#D55E00"),
                         strict=True))

_STYLE = {
    "figure.dpi": 110,
    "savefig.dpi": 150,
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.25,
    "legend.frameon": False,
}


def styled(build: Callable[..., Figure]) -> Callable[..., Figure]:
    """Build the figure under the house style, without touching global pyplot state."""

    @functools.wraps(build)
    def wrapper(*args, **kwargs) -> Figure:
        with matplotlib.rc_context(_STYLE):
            return build(*args, **kwargs)

    return wrapper


def model_colors(panels: Mapping[str, Mapping[str, object]]) -> dict[str, str]:
    """One colour per model label across all panels of a figure (sorted labels)."""
    models = sorted({m for by_model in panels.values() for m in by_model})
    return {m: PALETTE[i % len(PALETTE)] for i, m in enumerate(models)}


def save_figure(fig: Figure, stem: str | Path) -> list[Path]:
    """Write ``stem.png`` and ``stem.svg``; return both paths. The suffix is appended, never
    put in place of one: a stem may end like one (``regime_atlas_ddl-b0.5``)."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_name(f"{stem.name}.png"), stem.with_name(f"{stem.name}.svg")]
    for path in paths:
        fig.savefig(path, bbox_inches="tight")
    return paths


def _grid(n: int, width: float = 3.2, height: float = 2.6, cols: int = 4) -> tuple[Figure, list]:
    cols = max(1, min(cols, n))
    rows = -(-n // cols)
    fig = Figure(figsize=(width * cols, height * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


@styled
def regime_atlas(fractions: Mapping[str, np.ndarray]) -> Figure:
    """Stacked bars per layer of the fraction of gates in each regime, one panel per task.

    Args:
        fractions: panel title → ``(L, len(REGIMES))`` fractions (rows sum to 1).
    """
    fig, axes = _grid(len(fractions))
    for ax, (title, frac) in zip(axes, fractions.items(), strict=True):
        layers = np.arange(1, frac.shape[0] + 1)
        bottom = np.zeros(frac.shape[0])
        for r, name in enumerate(REGIMES):
            ax.bar(layers, frac[:, r], bottom=bottom, color=REGIME_COLORS[name], label=name,
                   width=0.85)
            bottom += frac[:, r]
        ax.set(title=title, xlabel="layer", ylabel="fraction of samples", ylim=(0, 1),
               xticks=layers)
        ax.grid(False)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=len(REGIMES), title="gate regime of β")
    return fig


@styled
def beta_histograms(betas: Mapping[str, np.ndarray], beta_max: float = 2.0) -> Figure:
    """Per panel, a layer × β density map with the regime boundaries drawn in.

    Args:
        betas: panel title → ``(N, L)`` gate values.
    """
    fig, axes = _grid(len(betas))
    edges = np.linspace(0.0, beta_max, 41)
    for ax, (title, beta) in zip(axes, betas.items(), strict=True):
        hist = np.stack([np.histogram(layer, bins=edges)[0] for layer in beta.T])
        hist = hist / max(1, beta.shape[0])
        im = ax.imshow(hist, aspect="auto", origin="lower", cmap="viridis",
                       extent=(0, beta_max, 0.5, beta.shape[1] + 0.5), vmin=0, vmax=1)
        for bound in REGIME_BOUNDS:
            if bound < beta_max:
                ax.axvline(bound, color="white", lw=0.8, ls=":")
        ax.set(title=title, xlabel="gate β", ylabel="layer")
        ax.grid(False)
        fig.colorbar(im, ax=ax, label="fraction of samples")
    fig.tight_layout()
    return fig


@styled
def probe_consistency(points: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> Figure:
    """Measured ``|e_post|/|e_pre|`` against ``|1 − β|``: a check that the probe and the
    operator agree. ``e_post = (1 − β) e_pre`` holds by construction for every Delta
    update, trained or not, so the points sit on the diagonal whatever training did; a point
    off it means the probe misreads the operator, not that training went wrong.

    Args:
        points: panel title → (``|1 − β|`` values, measured ratios), flat arrays.
    """
    fig, axes = _grid(len(points), width=2.8, height=2.8)
    for ax, (title, (expected, measured)) in zip(axes, points.items(), strict=True):
        ok = np.isfinite(measured)
        ax.scatter(expected[ok], measured[ok], s=4, alpha=0.4, color=PALETTE[0],
                   rasterized=True)
        top = max(1.0, float(np.nanmax(expected, initial=0)))
        ax.plot([0, top], [0, top], color="black", lw=0.8, ls="--", label="|1 − β|")
        err = np.nanmax(np.abs(measured[ok] - expected[ok]), initial=0.0)
        ax.set(title=f"{title}\nmax deviation {err:.1e}", xlabel="|1 − β|",
               ylabel="|e_post| / |e_pre|")
        ax.set_aspect("equal", adjustable="box")
    fig.suptitle("probe against operator: on the diagonal by construction (not evidence about "
                 "training)", fontsize=8)
    fig.tight_layout()
    return fig


@styled
def determinant_plot(dets: Mapping[str, np.ndarray]) -> Figure:
    """Distribution of ``log10|Π(1 − β_l)|`` per stack, split by the determinant's sign."""
    fig = Figure(figsize=(max(4.0, 0.9 * len(dets) + 2), 3.2))
    ax = fig.subplots()
    for i, det in enumerate(dets.values()):
        size = np.log10(np.maximum(np.abs(det), 1e-12))
        jitter = np.linspace(-0.25, 0.25, len(det)) if len(det) > 1 else np.zeros(1)
        pos, neg = det >= 0, det < 0
        ax.scatter(i + jitter[pos], size[pos], s=5, color=PALETTE[0], alpha=0.5,
                   label="det > 0" if i == 0 else None, rasterized=True)
        ax.scatter(i + jitter[neg], size[neg], s=5, color=PALETTE[5], alpha=0.5,
                   label="det < 0 (odd number of reflections)" if i == 0 else None,
                   rasterized=True)
    labels = [f"{title}\n{(det < 0).mean():.0%} negative" for title, det in dets.items()]
    ax.set_xticks(range(len(dets)), labels, rotation=30, ha="right")
    ax.set(ylabel="log10 |det Π(I − β k kᵀ)|", title="Depth product of the shortcuts")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


@styled
def phase_portraits(panels: Mapping[str, tuple[np.ndarray, np.ndarray]],
                    train_steps: int | None = None) -> Figure:
    """Predicted depth trajectories against the ground truth in the first two coordinates.

    Args:
        panels: model → (predictions, truth), each ``(S, steps, ≥2)`` for S samples; a
            model that extrapolates is drawn over its longer split.
        train_steps: where the training horizon ends (marked; later steps extrapolate).
    """
    fig, axes = _grid(len(panels), width=2.8, height=2.8)
    for ax, (model, (pred, truth)) in zip(axes, panels.items(), strict=True):
        for s in range(truth.shape[0]):
            color = PALETTE[s % len(PALETTE)]
            ax.plot(truth[s, :, 0], truth[s, :, 1], color=color, lw=0.8, ls="--", alpha=0.7)
            ax.plot(pred[s, :, 0], pred[s, :, 1], color=color, lw=1.2)
            if train_steps is not None and train_steps < pred.shape[1]:
                ax.plot(*pred[s, train_steps - 1, :2], "o", color=color, ms=3)
        ax.set(title=model, xlabel="state 1 (q)", ylabel="state 2 (p)")
        ax.set_aspect("equal", adjustable="datalim")
    note = "solid: model, dashed: truth"
    if train_steps is not None:
        note += "; dot: end of the training horizon"
    fig.suptitle(note, fontsize=8)
    fig.tight_layout()
    return fig


@styled
def depth_profiles(profiles: Mapping[str, Mapping[str, np.ndarray]], ylabel: str) -> Figure:
    """One panel per task: a per-depth quantity (mean over samples) for every model."""
    fig, axes = _grid(len(profiles))
    colors = model_colors(profiles)
    for ax, (task, by_model) in zip(axes, profiles.items(), strict=True):
        for model, values in by_model.items():
            ax.plot(np.arange(len(values)), values, color=colors[model], label=model, lw=1.2)
        ax.set(title=task, xlabel="depth step", ylabel=ylabel)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


@styled
def training_curves(curves: Mapping[str, Mapping[str, list[np.ndarray]]], metric: Mapping[str, str],
                    x: str = "step") -> Figure:
    """Val metric against training step (or cumulative FLOPs), with seed bands.

    Args:
        curves: task → model → per-seed ``(P, 2)`` arrays of (x, val metric).
        metric: task → metric name (axis label).
        x: ``"step"`` or ``"FLOPs"`` (axis label only; the arrays carry the values).
    """
    fig, axes = _grid(len(curves))
    colors = model_colors(curves)
    for ax, (task, by_model) in zip(axes, curves.items(), strict=True):
        for model, seeds in by_model.items():
            n = min(len(c) for c in seeds)
            stacked = np.stack([c[:n] for c in seeds])  # (seeds, P, 2)
            xs, ys = stacked[0, :, 0], stacked[:, :, 1]
            ax.plot(xs, ys.mean(0), color=colors[model], label=model, lw=1.2)
            if len(seeds) > 1:
                ax.fill_between(xs, ys.min(0), ys.max(0), color=colors[model], alpha=0.2)
        ax.set(title=task, xlabel="training step" if x == "step" else "training FLOPs",
               ylabel=f"val {metric[task]}")
        if metric[task] == "mse":
            ax.set_yscale("log")
        if x != "step":
            ax.set_xscale("log")
        ax.legend(fontsize=7)
    fig.suptitle("line: mean over seeds; band: min–max over seeds", fontsize=8)
    fig.tight_layout()
    return fig


@styled
def comparison(tables: Mapping[str, Mapping[str, tuple[float, float, Sequence[float]]]],
               metric: Mapping[str, str]) -> Figure:
    """Per task, every model's test metric: each finished seed, and their mean with its
    95% CI, so that a bimodal result (two seeds solved, one not) shows as such.

    Points, not bars, so that a log axis (MSE) does not exaggerate.

    Args:
        tables: task → model → (mean, CI half-width; 0 for a single seed, per-seed values).
        metric: task → metric name.
    """
    fig, axes = _grid(len(tables))
    colors = model_colors(tables)
    for ax, (task, by_model) in zip(axes, tables.items(), strict=True):
        names = list(by_model)
        for x, name in enumerate(names):
            mean, half, seeds = by_model[name]
            ax.scatter(np.full(len(seeds), x + 0.18), seeds, s=12, facecolors="none",
                       edgecolors=colors[name], linewidths=0.9)
            ax.errorbar(x, mean, yerr=half, fmt="o", ms=6, capsize=3, color=colors[name])
        ax.set_xticks(range(len(names)), names, rotation=35, ha="right")
        ax.set(title=task, ylabel=f"test {metric[task]}")
        values = np.array([v for m in names for v in by_model[m][2]], dtype=float)
        if metric[task] == "mse" and np.all(values[np.isfinite(values)] > 0):
            ax.set_yscale("log")
    fig.suptitle("filled: mean over finished seeds with 95% CI (none for one seed); "
                 "hollow: each seed", fontsize=8)
    fig.tight_layout()
    return fig


#: Cell colour of each verdict label (Okabe–Ito green, vermillion, blue, sky blue and
#: orange); the labels where no test was drawn (unequal tuning or budget, unmatched size)
#: are white and hatched.
MARK_COLORS = {WIN: "#009E73", LOSS: "#D55E00", EQUIVALENT: "#0072B2", INCONCLUSIVE: "#DDDDDD",
               BOTH_SOLVED: "#56B4E9", FAILS: "#E69F00", UNEQUAL_TUNING: "#FFFFFF",
               UNEQUAL_BUDGET: "#FFFFFF", UNMATCHED_SIZE: "#FFFFFF"}
NO_VERDICT = (UNEQUAL_TUNING, UNEQUAL_BUDGET, UNMATCHED_SIZE)


@styled
def verdict_matrix(cells: Mapping[str, Mapping[str, tuple[str, str]]]) -> Figure:
    """Task × model grid of every model's verdict against its baseline.

    Args:
        cells: task → model → (mark, text): the mark (a key of :data:`MARK_COLORS`) colours
            the cell and the text (the paired difference) is written in it; a model with no
            comparison on a task (its baseline, or not run there) leaves the cell blank.
    """
    tasks = list(cells)
    models = sorted({m for row in cells.values() for m in row})
    fig = Figure(figsize=(max(4.0, 1.3 * len(models) + 2.0), 0.75 * len(tasks) + 1.6))
    ax = fig.subplots()
    for i, task in enumerate(tasks):
        for j, model in enumerate(models):
            if model in cells[task]:
                mark, text = cells[task][model]
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor=MARK_COLORS[mark],
                                       edgecolor="0.8", hatch="///" if mark in NO_VERDICT else None,
                                       lw=0.6))
                ax.text(j, i, f"{mark}\n{text}", ha="center", va="center", fontsize=6.5,
                        color="white" if mark in (WIN, LOSS, EQUIVALENT) else "black")
    ax.set(xlim=(-0.5, len(models) - 0.5), ylim=(len(tasks) - 0.5, -0.5))
    ax.set_xticks(range(len(models)), models, rotation=35, ha="right")
    ax.set_yticks(range(len(tasks)), tasks)
    ax.grid(False)
    ax.spines[:].set_visible(False)
    handles = [Patch(facecolor=c, edgecolor="0.6", hatch="///" if m in NO_VERDICT else None,
                     label=m) for m, c in MARK_COLORS.items()]
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=7,
               bbox_to_anchor=(0.5, 1.0))
    fig.suptitle("test metric, model − baseline over paired seeds: mean ± 95% CI; labels on "
                 "Holm-adjusted p < 0.05 (equivalent: TOST at the task's margin)", fontsize=8,
                 y=1.06)
    fig.tight_layout()
    return fig


@styled
def nfe_curves(curves: Mapping[str, Mapping[str, list[np.ndarray]]]) -> Figure:
    """ODE function evaluations per forward pass over training, one panel per task."""
    fig, axes = _grid(len(curves))
    colors = model_colors(curves)
    for ax, (task, by_model) in zip(axes, curves.items(), strict=True):
        for model, seeds in by_model.items():
            for i, c in enumerate(seeds):
                ax.plot(c[:, 0], c[:, 1], color=colors[model], lw=1.0,
                        label=model if i == 0 else None)
        ax.set(title=task, xlabel="training step", ylabel="NFE per forward pass")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


#: One knob value's point of a curve: (knob value, mean, 95% CI half-width; 0 for none).
Curve = tuple[Sequence[float], Sequence[float], Sequence[float]]


def _knob_axis(ax, values: Sequence[float], knob: str) -> None:
    """A symlog x-axis that keeps 0 in view, linear below the smallest positive value."""
    positive = [v for v in values if v > 0]
    if positive and min(values) == 0 and max(positive) / min(positive) > 4:
        ax.set_xscale("symlog", linthresh=min(positive), linscale=0.6)
    ax.set_xticks(sorted(set(values)), [f"{v:g}" for v in sorted(set(values))])
    ax.minorticks_off()
    ax.set_xlabel(knob)


@styled
def crossover(differences: Mapping[str, Mapping[str, tuple[Curve, float | None]]],
              gates: Mapping[str, Mapping[tuple[str, str], tuple[Curve, Curve]]], knob: str,
              metric: str, higher_is_better: bool) -> Figure:
    """One row per setting: the paired test-metric difference model − control against the
    knob, with 95% CIs and each curve's crossover in its legend (a dotted line where it
    lies); beside it, where gates were probed, the Delta stacks' gate use against the knob.
    A curve, and a stack, has one colour in every row.

    Args:
        differences: setting → ``"model − control"`` → ((values, means, CI half-widths),
            the crossover value or None).
        gates: setting → (stack, regime) → (the share of gates in the regime at the steps
            of that event, the share at steps without an event), each a curve.
        knob, metric, higher_is_better: axis labels and the sign of a win.
    """
    settings = list(differences)
    columns = 2 if any(gates.get(s) for s in settings) else 1
    fig = Figure(figsize=(6.2 * columns, 5.2 * len(settings)))
    axes = fig.subplots(len(settings), columns, squeeze=False)
    colors = model_colors(differences)
    gate_colors = model_colors({s: {m: None for m, _ in g} for s, g in gates.items()})
    better = "above" if higher_is_better else "below"
    legend = {"fontsize": 7, "loc": "upper center", "bbox_to_anchor": (0.5, -0.16), "ncol": 2}
    for row, setting in zip(axes, settings, strict=True):
        left, curves = row[0], differences[setting]
        means = np.array([m for (_, ms, _), _ in curves.values() for m in ms], dtype=float)
        scale = np.abs(means[np.isfinite(means) & (means != 0)])
        for name, ((values, mean, half), star) in curves.items():
            left.errorbar(values, mean, yerr=half, fmt="o-", ms=4, lw=1.2, capsize=3,
                          color=colors[name], label=f"{name}: {star_text(star, knob)}")
            if star is not None:
                left.axvline(star, color=colors[name], lw=0.9, ls=":")
        left.axhline(0.0, color="black", lw=0.8)
        if scale.size:  # linear within a decade of 0, its ticks a decade's height apart
            decade = 10.0 ** np.floor(np.log10(np.percentile(scale, 10)))
            left.set_yscale("symlog", linthresh=decade, linscale=1.0)
        _knob_axis(left, [v for (vs, _, _), _ in curves.values() for v in vs], knob)
        left.set(title=f"{setting}: model − control ({better} 0: model better)",
                 ylabel=f"Δ test {metric} (mean, 95% CI)")
        left.legend(**legend)
        if columns == 1:
            continue
        right = row[1]
        if not gates.get(setting):
            right.set_visible(False)
            continue
        for (model, regime), pair in gates[setting].items():
            for (values, mean, half), style, where in zip(
                    pair, ("o-", "s--"), ("at its events", "elsewhere"), strict=True):
                if len(values):
                    right.errorbar(values, mean, yerr=half, fmt=style, ms=3.5, lw=1.1,
                                   capsize=2, color=gate_colors[model],
                                   label=f"{model}: {regime} {where}")
        _knob_axis(right, [v for pair in gates[setting].values() for c in pair for v in c[0]],
                   knob)
        right.set(title=f"{setting}: do the gates follow the events?", ylim=(-0.02, 1.02),
                  ylabel="share of gates in the event's regime")
        right.legend(**legend)
    fig.suptitle(f"paired over seeds, mean and 95% CI; {knob}*: the smallest {knob} from which "
                 "on the model wins (Holm-adjusted p < 0.05) at every larger value", fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.985))
    return fig


@styled
def hop_gates(settings: Mapping[str, tuple[Mapping[str, Curve], Mapping[float, Sequence[float]]]],
              model: str, knob: str) -> Figure:
    """One Delta row on a multi-hop task: per setting, the share of its gates that project at
    the query tokens' sublayers that hop, at their other sublayers, and the share of hops
    its attention looked at, against the knob (mean, 95% CI over seeds); beside it, the mean
    gate of every sublayer at query tokens, one line per knob value, the projection band
    shaded.

    Args:
        settings: setting → (curve name → (values, means, CI half-widths), knob value → the
            mean β of every sublayer, attention and MLP alternating).
        model, knob: the row's label and the knob's name.
    """
    fig = Figure(figsize=(11.0, 4.2 * len(settings)))
    axes = fig.subplots(len(settings), 2, squeeze=False)
    styles = {"projecting where it hops": ("o-", PALETTE[2]),
              "projecting elsewhere": ("s--", PALETTE[7]),
              "hops its attention looked at": ("^:", PALETTE[0])}
    legend = {"fontsize": 7, "loc": "upper center", "bbox_to_anchor": (0.5, -0.16), "ncol": 2}
    for (left, right), (setting, (curves, profile)) in zip(axes, settings.items(), strict=True):
        for name, (values, mean, half) in curves.items():
            if len(values):
                fmt, color = styles[name]
                left.errorbar(values, mean, yerr=half, fmt=fmt, ms=4, lw=1.2, capsize=3,
                              color=color, label=name)
        _knob_axis(left, [v for values, _, _ in curves.values() for v in values], knob)
        left.set(title=f"{model}{f' ({setting})' if setting else ''}: query tokens",
                 ylabel="share (mean, 95% CI over seeds)", ylim=(-0.02, 1.02))
        left.legend(**legend)
        low, high = REGIME_BOUNDS[1], REGIME_BOUNDS[2]
        right.axhspan(low, high, color=REGIME_COLORS["projection"], alpha=0.15,
                      label="projection")
        for i, (value, betas) in enumerate(sorted(profile.items())):
            layers = np.arange(1, len(betas) + 1)
            right.plot(layers, betas, "o-", ms=3.5, lw=1.1, color=PALETTE[i % len(PALETTE)],
                       label=f"{knob} = {value:g}")
            right.set_xticks(layers, [f"{'attn' if j % 2 else 'mlp'} {(j + 1) // 2}"
                                      for j in layers], fontsize=7)
        right.set(title="mean gate of every sublayer at query tokens", ylabel="β",
                  ylim=(0, 2))
        right.legend(**legend)
    fig.tight_layout()
    return fig
