"""Figures of a Delta stack's gates: the regimes per layer, the β density, the probe's
consistency with the operator, the depth product of the shortcuts, and a Transformer's
gates at its query tokens."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib
import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from ...models.operator import DIRECTION_EPS, REGIME_BOUNDS, REGIMES
from .style import (
    PALETTE,
    REGIME_COLORS,
    clipped_error,
    panel_grid,
    styled,
    sublayer_positions,
    sublayer_ticks,
)


@styled
def regime_atlas(fractions: Mapping[str, np.ndarray], model: str) -> Figure:
    """Stacked bars per layer of the fraction of gates in each regime, one panel per task.

    Args:
        fractions: task → ``(L, len(REGIMES))`` fractions (rows sum to 1).
        model: the Delta row's label.
    """
    fig, axes = panel_grid(len(fractions))
    for ax, (title, frac) in zip(axes, fractions.items(), strict=True):
        layers = np.arange(1, frac.shape[0] + 1)
        bottom = np.zeros(frac.shape[0])
        for r, name in enumerate(REGIMES):
            ax.bar(
                layers, frac[:, r], bottom=bottom, color=REGIME_COLORS[name], label=name, width=0.85
            )
            bottom += frac[:, r]
        ax.set(
            title=f"{model} on {title}",
            xlabel="layer",
            ylabel="fraction of samples",
            ylim=(0, 1),
            xticks=layers,
        )
        ax.grid(False)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0.1, 1, 0.95))
    fig.suptitle(f"gate regimes of {model} per layer (test samples, pooled over seeds)", fontsize=9)
    fig.legend(handles, labels, loc="lower center", ncol=len(REGIMES), title="gate regime of β")
    return fig


@styled
def beta_histograms(betas: Mapping[str, np.ndarray], model: str, beta_max: float = 2.0) -> Figure:
    """Per panel, a layer × β density map with the regime boundaries drawn in, on a log
    colour scale: gates pile up in a few bins, and a linear scale leaves the rest dark.

    Args:
        betas: task → ``(N, L)`` gate values.
        model: the Delta row's label.
    """
    fig, axes = panel_grid(len(betas))
    edges = np.linspace(0.0, beta_max, 41)
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#f4f4f4", under="#f4f4f4")
    for ax, (title, beta) in zip(axes, betas.items(), strict=True):
        hist = np.stack([np.histogram(layer, bins=edges)[0] for layer in beta.T])
        hist = hist / max(1, beta.shape[0])
        floor = 1.0 / max(2, beta.shape[0])  # one sample
        im = ax.imshow(
            np.ma.masked_equal(hist, 0),
            aspect="auto",
            origin="lower",
            cmap=cmap,
            extent=(0, beta_max, 0.5, beta.shape[1] + 0.5),
            norm=LogNorm(vmin=floor, vmax=1.0),
        )
        for bound in REGIME_BOUNDS:
            if bound < beta_max:
                ax.axvline(bound, color="black", lw=0.8, ls=":")
        ax.set(title=f"{model} on {title}", xlabel="gate β", ylabel="layer")
        ax.grid(False)
        fig.colorbar(im, ax=ax, label="fraction of samples")
    fig.suptitle(
        f"gates β of {model} per layer (colour: fraction of samples, log scale; "
        "blank: none; dotted: regime bounds)",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.94))  # the suptitle above the colour bars' labels
    return fig


#: Where ``|e_pre|`` is below this fraction of the readout's and the target's size, the
#: float32 rounding of ``e_post`` is a visible part of the ratio (see `probe_consistency`).
ROUNDING_SCALE = 1e-4
#: Where the raw key is shorter than this many ``DIRECTION_EPS``, its direction ``k`` falls
#: short of a unit vector by more than 1e-4 of its squared length.
SHORT_KEY = 100


def _largest(values: np.ndarray, keep: np.ndarray) -> str:
    return f"{values[keep].max():.1e}" if keep.any() else "none"


@styled
def probe_consistency(points: Mapping[str, tuple[np.ndarray, ...]]) -> Figure:
    """Measured ``|e_post|/|e_pre|`` against ``|1 − β|``: a check that the probe and the
    operator agree, not evidence about training. ``e_post = (1 − β‖k‖²) e_pre`` holds for
    every Delta update, trained or not, and ``‖k‖ = 1`` to within ``eps²/‖k̃‖²``, so the
    points are expected on the diagonal. A task's points leave it in two known places,
    drawn in grey, each panel giving the largest deviation with and without them: where
    ``e_pre`` is tiny beside the readout ``kᵀX`` and the target ``v`` it is the
    difference of (little left to erase; float32 rounding of both errors is then a
    sizeable part of their ratio), and where the raw key ``k̃`` is so short that ``k``
    is not a unit vector (the gate then acts as ``β‖k‖²``).

    Args:
        points: task → (``|1 − β|``, measured ratios, ``|e_pre|`` relative to
            ``|kᵀX| + |v|``, ``‖k̃‖``), flat arrays.
    """
    fig, axes = panel_grid(len(points), width=3.0, height=3.3)
    for ax, (title, (expected, measured, relative, key)) in zip(axes, points.items(), strict=True):
        ok = np.isfinite(measured)
        apart = ok & ((relative < ROUNDING_SCALE) | (key < SHORT_KEY * DIRECTION_EPS))
        clear = ok & ~apart
        for keep, color in ((apart, PALETTE[8]), (clear, PALETTE[0])):
            ax.scatter(expected[keep], measured[keep], s=4, alpha=0.4, color=color, rasterized=True)
        top = max(1.0, float(np.nanmax(expected, initial=0)))
        ax.plot([0, top], [0, top], color="black", lw=0.8, ls="--", label="|1 − β|")
        off = np.abs(measured - expected)
        ax.set_title(
            f"{title}\nmax deviation {_largest(off, clear)}\n"
            f"grey ({apart.sum()} of {ok.sum()}): {_largest(off, apart)}",
            fontsize=8,
        )
        top = max(top, float(np.nanmax(measured[ok], initial=0))) * 1.03
        ax.set(
            xlabel="|1 − β|", ylabel="|e_post| / |e_pre|", xlim=(-0.03, top), ylim=(-0.03, top)
        )  # the panel near square: the diagonal at 45°
    fig.suptitle(
        "probe against operator (not evidence about training): expected on the "
        "diagonal, e_post = (1 − β) e_pre for a unit direction k.\nGrey, where it "
        f"may leave it: |e_pre| < {ROUNDING_SCALE:g} (|kᵀX| + |v|), little left to "
        "erase, float32 rounding moving the ratio;\nor a raw key ‖k̃‖ < "
        f"{SHORT_KEY * DIRECTION_EPS:g}, too short for k to be a unit vector (the "
        "gate then acts as β‖k‖²)",
        fontsize=8,
    )
    fig.tight_layout()
    return fig


#: The smallest ``|det|`` drawn: a gate at β ≈ 1 erases its direction (a factor 1 − β ≈ 0),
#: so a stack that overwrites has a determinant at float rounding; such points sit on this
#: floor, marked, rather than at an arbitrary depth below it.
DET_FLOOR = 1e-12


@styled
def determinant_plot(dets: Mapping[str, np.ndarray], model: str) -> Figure:
    """Distribution of ``log10|Π(1 − β_l)|`` of one Delta row per task, split by the
    determinant's sign; ``|det|`` below `DET_FLOOR` is drawn on the floor (dashed) and each
    task's share there is given under its name. The legend lies below the axes, clear of
    the points."""
    fig = Figure(figsize=(max(4.0, 0.9 * len(dets) + 2), 3.6))
    ax = fig.subplots()
    for i, det in enumerate(dets.values()):
        size = np.log10(np.maximum(np.abs(det), DET_FLOOR))
        jitter = np.linspace(-0.25, 0.25, len(det)) if len(det) > 1 else np.zeros(1)
        pos, neg = det >= 0, det < 0
        ax.scatter(
            i + jitter[pos],
            size[pos],
            s=5,
            color=PALETTE[0],
            alpha=0.5,
            label="det > 0" if i == 0 else None,
            rasterized=True,
        )
        ax.scatter(
            i + jitter[neg],
            size[neg],
            s=5,
            color=PALETTE[5],
            alpha=0.5,
            label="det < 0 (odd number of reflections)" if i == 0 else None,
            rasterized=True,
        )
    floor = np.log10(DET_FLOOR)
    ax.axhline(
        floor,
        color=PALETTE[8],
        lw=0.8,
        ls="--",
        label=f"floor: |det| ≤ {DET_FLOOR:g} (a gate at β ≈ 1 erases its direction)",
    )
    labels = [
        f"{title}\n{(det < 0).mean():.0%} negative\n"
        f"{(np.abs(det) <= DET_FLOOR).mean():.0%} on the floor"
        for title, det in dets.items()
    ]
    ax.set_xticks(range(len(dets)), labels, rotation=30, ha="right")
    ax.set_ylim(bottom=floor - 0.5)
    ax.set(
        ylabel="log10 |det Π(I − β k kᵀ)|",
        title=f"depth product of the shortcuts of {model}, per task",
    )
    handles, names = ax.get_legend_handles_labels()
    fig.tight_layout()
    fig.legend(
        handles,
        names,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=1,
        fontsize=7,
        markerscale=2,
    )
    return fig


@styled
def query_regimes(
    panels: Mapping[str, Mapping[str, tuple[Sequence[tuple[float, float]], int]]],
    regime: str,
    colors: Mapping[str, str],
) -> Figure:
    """One panel per task setting: per sublayer, the share of query tokens whose gate is in
    ``regime``, one line per Delta row (mean, 95% CI over seeds, clipped to [0, 1]); a row
    with several delta updates per sublayer (a product block) has a point per update.

    Args:
        panels: setting → row label → (per probe row ``(mean, CI half-width)``, NaN: none;
            delta updates per sublayer).
        regime: the regime counted, the task's stated one.
        colors: row label → colour.
    """
    fig, axes = panel_grid(len(panels), width=4.6, height=3.4, cols=3)
    for ax, (setting, rows) in zip(axes, panels.items(), strict=True):
        for model, (shares, updates) in sorted(rows.items()):
            mean, half = (np.array(column, float) for column in zip(*shares, strict=True))
            layers = sublayer_positions(len(mean), updates)
            error = clipped_error(mean.tolist(), np.nan_to_num(half).tolist(), 0.0, 1.0)
            ax.errorbar(
                layers,
                mean,
                yerr=error,
                fmt="o-",
                ms=3.5,
                lw=1.1,
                capsize=2,
                color=colors[model],
                label=model,
            )
            sublayer_ticks(ax, layers)
        ax.set(title=setting, ylabel=f"share of query tokens in {regime}", ylim=(-0.02, 1.02))
        ax.legend(fontsize=7)
    fig.suptitle(
        f"gates in the {regime} regime at the query tokens, per sublayer (mean, 95% CI over seeds)",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return fig
