"""Figure builders: plain data in, a matplotlib ``Figure`` out, one house style.

The builders never touch the store or a model (``figures.py`` gathers the data), so
each can be tested on hand-made arrays. A builder that draws models takes ``colors`` (model
label → colour; :func:`row_colors` gives a run's, so a model keeps its colour in every
figure of the run) and names the model and the task in its titles. Intervals are clipped
to the range their quantity can take (a share to [0, 1], an MSE above 0 on a log axis).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

from ..models.operator import DIRECTION_EPS, REGIME_BOUNDS, REGIMES
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

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

#: Okabe–Ito's colour-blind-safe set and Tol's muted set, ordered so that the first of them
#: differ in hue (Okabe–Ito's sky blue, close to its blue, comes late; yellow, faint on
#: white, last).
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#000000", "#882255",
           "#999933", "#999999", "#56B4E9", "#44AA99", "#F0E442")
#: The range each metric can take: the ends its intervals are clipped to.
METRIC_RANGE = {"mse": (0.0, np.inf), "accuracy": (0.0, 1.0)}
#: One colour per gate regime, identity → reflection.
REGIME_COLORS = dict(zip(REGIMES, ("#BBBBBB", "#56B4E9", "#009E73", "#E69F00", "#D55E00"),
                         strict=True))

_STYLE: dict[RcKeyType, Any] = {
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


def row_colors(labels: Iterable[str]) -> dict[str, str]:
    """One colour per model label (sorted; distinct up to ``len(PALETTE)`` labels): a
    run's mapping, handed to every figure of the run so that a model keeps its colour."""
    return {m: PALETTE[i % len(PALETTE)] for i, m in enumerate(sorted(set(labels)))}


def model_colors(panels: Mapping[str, Mapping[str, object]]) -> dict[str, str]:
    """:func:`row_colors` of the models of a figure's panels (for a figure drawn alone)."""
    return row_colors(m for by_model in panels.values() for m in by_model)


def clipped_error(mean: Sequence[float] | float, half: Sequence[float] | float,
                  low: float = -np.inf, high: float = np.inf) -> np.ndarray:
    """``yerr`` of ``errorbar`` for ``mean ± half`` clipped to ``[low, high]``: ``(2, n)``
    distances below and above each mean (a mean outside the range gets none)."""
    means = np.atleast_1d(np.asarray(mean, float))
    halves = np.atleast_1d(np.asarray(half, float))
    below = np.clip(means - np.maximum(means - halves, low), 0, None)
    above = np.clip(np.minimum(means + halves, high) - means, 0, None)
    return np.stack([below, above])


def _short(value: float, _: object = None) -> str:
    """A tick label of at most two significant digits, the shorter of plain and exponent
    form: ``1.5e12``, ``1e-4``, ``0.03``, ``50``."""
    plain = f"{value:.2g}"
    mantissa, exponent = f"{value:.1e}".split("e")
    power = f"{mantissa.removesuffix('.0')}e{int(exponent)}"
    return plain if "e" not in plain and len(plain) <= len(power) else power


#: Tick multiples of a decade on a log axis, the sparsest first.
_LOG_SUBS = ((1.0,), (1.0, 3.0), (1.0, 2.0, 5.0), (1.0, 1.5, 2.0, 3.0, 5.0, 7.0))


def log_ticks(low: float, high: float, most: int = 6) -> list[float]:
    """Three to ``most`` round ticks on a log axis over ``[low, high]`` where they fit (else
    two): every decade, or every few where the data spans many; 1, 3 × …, 1, 2, 5 × …
    where it spans few; the two ends where it spans less than the finest set separates."""
    decades = range(int(np.floor(np.log10(low))), int(np.ceil(np.log10(high))) + 1)
    sets = [[s * 10.0**k for k in decades for s in subs if low <= s * 10.0**k <= high]
            for subs in _LOG_SUBS]
    fits = [t for t in sets if 3 <= len(t) <= most] or [t for t in sets if len(t) >= 2]
    if not fits:
        return [float(_short(low)), float(_short(high))]
    return fits[0][:: -(-len(fits[0]) // most)]


def log_axis(ax: Axes, which: str, values: Iterable[float]) -> None:
    """A log ``which`` (``"x"``, ``"y"``) axis whose labels never overlap: a few round
    ticks (:func:`log_ticks`) with short labels, the minor ticks unlabelled."""
    positive = np.asarray([v for v in values if np.isfinite(v) and v > 0], float)
    getattr(ax, f"set_{which}scale")("log")
    if not positive.size:
        return
    axis = getattr(ax, f"{which}axis")
    axis.set_major_locator(FixedLocator(log_ticks(positive.min(), positive.max())))
    axis.set_major_formatter(FuncFormatter(_short))
    axis.set_minor_formatter(NullFormatter())


def legend_below(fig: Figure, handles: Sequence, note: str = "") -> None:
    """One legend for every panel, right below them (never over the data), ``note`` as its
    title: lay the panels out above it, then place it."""
    ncol = max(1, min(len(handles), 6))
    lines = -(-len(handles) // ncol) + (1 if note else 0)
    bottom = min(0.45, (0.2 * lines + 0.12) / fig.get_figheight())
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, bottom), ncol=ncol,
               fontsize=7, title=note or None, title_fontsize=7)


def _model_handles(colors: Mapping[str, str], drawn: Iterable[str]) -> list[Line2D]:
    """Legend entries for the models drawn, in ``colors``'s order."""
    drawn = set(drawn)
    return [Line2D([], [], color=c, marker="o", ms=4, lw=1.2, label=m)
            for m, c in colors.items() if m in drawn]


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
def regime_atlas(fractions: Mapping[str, np.ndarray], model: str) -> Figure:
    """Stacked bars per layer of the fraction of gates in each regime, one panel per task.

    Args:
        fractions: task → ``(L, len(REGIMES))`` fractions (rows sum to 1).
        model: the Delta row's label.
    """
    fig, axes = _grid(len(fractions))
    for ax, (title, frac) in zip(axes, fractions.items(), strict=True):
        layers = np.arange(1, frac.shape[0] + 1)
        bottom = np.zeros(frac.shape[0])
        for r, name in enumerate(REGIMES):
            ax.bar(layers, frac[:, r], bottom=bottom, color=REGIME_COLORS[name], label=name,
                   width=0.85)
            bottom += frac[:, r]
        ax.set(title=f"{model} on {title}", xlabel="layer", ylabel="fraction of samples",
               ylim=(0, 1), xticks=layers)
        ax.grid(False)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0.1, 1, 0.95))
    fig.suptitle(f"gate regimes of {model} per layer (test samples, pooled over seeds)",
                 fontsize=9)
    fig.legend(handles, labels, loc="lower center", ncol=len(REGIMES), title="gate regime of β")
    return fig


@styled
def beta_histograms(betas: Mapping[str, np.ndarray], model: str,
                    beta_max: float = 2.0) -> Figure:
    """Per panel, a layer × β density map with the regime boundaries drawn in, on a log
    colour scale: gates pile up in a few bins, and a linear scale leaves the rest dark.

    Args:
        betas: task → ``(N, L)`` gate values.
        model: the Delta row's label.
    """
    fig, axes = _grid(len(betas))
    edges = np.linspace(0.0, beta_max, 41)
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#f4f4f4", under="#f4f4f4")
    for ax, (title, beta) in zip(axes, betas.items(), strict=True):
        hist = np.stack([np.histogram(layer, bins=edges)[0] for layer in beta.T])
        hist = hist / max(1, beta.shape[0])
        floor = 1.0 / max(2, beta.shape[0])  # one sample
        im = ax.imshow(np.ma.masked_equal(hist, 0), aspect="auto", origin="lower", cmap=cmap,
                       extent=(0, beta_max, 0.5, beta.shape[1] + 0.5),
                       norm=LogNorm(vmin=floor, vmax=1.0))
        for bound in REGIME_BOUNDS:
            if bound < beta_max:
                ax.axvline(bound, color="black", lw=0.8, ls=":")
        ax.set(title=f"{model} on {title}", xlabel="gate β", ylabel="layer")
        ax.grid(False)
        fig.colorbar(im, ax=ax, label="fraction of samples (log; blank: none)")
    fig.suptitle(f"gates β of {model} per layer (dotted: regime bounds)", fontsize=9)
    fig.tight_layout()
    return fig


#: Where ``|e_pre|`` is below this fraction of the readout's and the target's size, the
#: float32 rounding of ``e_post`` is a visible part of the ratio (see :func:`probe_consistency`).
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
    fig, axes = _grid(len(points), width=3.0, height=3.3)
    for ax, (title, (expected, measured, relative, key)) in zip(axes, points.items(),
                                                                strict=True):
        ok = np.isfinite(measured)
        apart = ok & ((relative < ROUNDING_SCALE) | (key < SHORT_KEY * DIRECTION_EPS))
        clear = ok & ~apart
        for keep, color in ((apart, PALETTE[8]), (clear, PALETTE[0])):
            ax.scatter(expected[keep], measured[keep], s=4, alpha=0.4, color=color,
                       rasterized=True)
        top = max(1.0, float(np.nanmax(expected, initial=0)))
        ax.plot([0, top], [0, top], color="black", lw=0.8, ls="--", label="|1 − β|")
        off = np.abs(measured - expected)
        ax.set_title(f"{title}\nmax deviation {_largest(off, clear)}\n"
                     f"grey ({apart.sum()} of {ok.sum()}): {_largest(off, apart)}", fontsize=8)
        top = max(top, float(np.nanmax(measured[ok], initial=0))) * 1.03
        ax.set(xlabel="|1 − β|", ylabel="|e_post| / |e_pre|", xlim=(-0.03, top),
               ylim=(-0.03, top))  # the panel near square: the diagonal at 45°
    fig.suptitle("probe against operator (not evidence about training): expected on the "
                 "diagonal, e_post = (1 − β) e_pre for a unit direction k.\nGrey, where it "
                 f"may leave it: |e_pre| < {ROUNDING_SCALE:g} (|kᵀX| + |v|), little left to "
                 "erase, float32 rounding moving the ratio;\nor a raw key ‖k̃‖ < "
                 f"{SHORT_KEY * DIRECTION_EPS:g}, too short for k to be a unit vector (the "
                 "gate then acts as β‖k‖²)", fontsize=8)
    fig.tight_layout()
    return fig


@styled
def determinant_plot(dets: Mapping[str, np.ndarray], model: str) -> Figure:
    """Distribution of ``log10|Π(1 − β_l)|`` of one Delta row per task, split by the
    determinant's sign."""
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
    ax.set(ylabel="log10 |det Π(I − β k kᵀ)|",
           title=f"depth product of the shortcuts of {model}, per task")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


@styled
def phase_portraits(panels: Mapping[str, tuple[np.ndarray, np.ndarray]], task: str,
                    train_steps: int | None = None,
                    state_names: Sequence[str] | None = None) -> Figure:
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
    fig, axes = _grid(len(panels), width=2.8, height=2.8)
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
def depth_profiles(profiles: Mapping[str, Mapping[str, np.ndarray]], ylabel: str,
                   colors: Mapping[str, str] | None = None) -> Figure:
    """One panel per task: a per-depth quantity (mean over samples) for every model."""
    fig, axes = _grid(len(profiles))
    colors = colors or model_colors(profiles)
    for ax, (task, by_model) in zip(axes, profiles.items(), strict=True):
        for model, values in by_model.items():
            ax.plot(np.arange(len(values)), values, color=colors[model], lw=1.2,
                    marker="o" if len(values) < 3 else None, ms=4)
        ax.set(title=task, xlabel="depth step", ylabel=ylabel)
    drawn = {m for by_model in profiles.values() for m in by_model}
    legend_below(fig, _model_handles(colors, drawn))
    return fig


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
        ax.errorbar(xs, mean, yerr=np.stack([mean - low, high - mean]), fmt="o-", ms=4,
                    lw=1.2, capsize=2, color=color)
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
def training_curves(curves: Mapping[str, Mapping[str, list[np.ndarray]]], metric: Mapping[str, str],
                    x: str = "step", colors: Mapping[str, str] | None = None) -> Figure:
    """Val metric against training step (or cumulative FLOPs), with seed bands, one legend
    for all panels below them; a model with no finite val metric is named under it.

    Args:
        curves: task → model → per-seed ``(P, 2)`` arrays of (x, val metric).
        metric: task → metric name (axis label).
        x: ``"step"`` or ``"FLOPs"`` (axis label only; the arrays carry the values).
        colors: model → colour (default: :func:`model_colors`).
    """
    fig, axes = _grid(len(curves))
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
        ax.set(title=task, xlabel="training step" if x == "step" else "training FLOPs",
               ylabel=f"val {metric[task]}")
        if metric[task] == "mse" and any(v > 0 for v in ys_all):
            log_axis(ax, "y", ys_all)
        if x == "step":
            _step_axis(ax, xs_all)
        elif any(v > 0 for v in xs_all):
            log_axis(ax, "x", xs_all)
    note = "line: mean over seeds; band: min–max over seeds"
    if missing:
        note += "; no finite val metric, not drawn: " + ", ".join(sorted(missing))
    legend_below(fig, _model_handles(colors, drawn), note)
    return fig


@styled
def comparison(tables: Mapping[str, Mapping[str, tuple[float, float, Sequence[float]]]],
               metric: Mapping[str, str], colors: Mapping[str, str] | None = None) -> Figure:
    """Per task, every model's test metric: each finished seed, and their mean with its
    95% CI, so that a bimodal result (two seeds solved, one not) shows as such.

    Points, not bars, so that a log axis (MSE) does not exaggerate; the models down the
    side, so that their names never overlap; each interval clipped to the metric's range
    (:data:`METRIC_RANGE`; on a log axis, to the lowest point drawn).

    Args:
        tables: task → model → (mean, CI half-width; 0 for a single seed, per-seed values).
        metric: task → metric name.
        colors: model → colour (default: :func:`model_colors`).
    """
    most = max((len(by_model) for by_model in tables.values()), default=1)
    fig, axes = _grid(len(tables), width=3.6, height=0.8 + 0.28 * most, cols=3)
    colors = colors or model_colors(tables)
    for ax, (task, by_model) in zip(axes, tables.items(), strict=True):
        names = list(by_model)
        values = np.array([v for m in names for v in (*by_model[m][2], by_model[m][0])], float)
        finite = values[np.isfinite(values)]
        low, high = METRIC_RANGE.get(metric[task], (-np.inf, np.inf))
        log = metric[task] == "mse" and finite.size > 0 and bool(np.all(finite > 0))
        if log:
            low = max(low, float(finite.min()) / 2)
        for y, name in enumerate(names):
            mean, half, seeds = by_model[name]
            ax.scatter(seeds, np.full(len(seeds), y + 0.22), s=12, facecolors="none",
                       edgecolors=colors[name], linewidths=0.9)
            ax.errorbar(mean, y, xerr=clipped_error(mean, half, low, high), fmt="o", ms=6,
                        capsize=3, color=colors[name])
        ax.set_yticks(range(len(names)), names)
        ax.set_ylim(len(names) - 0.5, -0.6)
        ax.set(title=task, xlabel=f"test {metric[task]}")
        if log:
            log_axis(ax, "x", finite)
    fig.suptitle("filled: mean over finished seeds with 95% CI (none for one seed), cut at "
                 "the metric's range (on a log axis, at half the lowest point); hollow: each "
                 "seed", fontsize=8)
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
def nfe_curves(curves: Mapping[str, Mapping[str, list[np.ndarray]]],
               colors: Mapping[str, str] | None = None) -> Figure:
    """ODE function evaluations per forward pass over training, one panel per task; a row
    evaluated once (its curve one point) shows as a marker, the axis from step 0."""
    fig, axes = _grid(len(curves))
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
    legend_below(fig, _model_handles(colors, drawn),
                 "mean over seeds; band or whiskers: min–max over seeds")
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
              metric: str, higher_is_better: bool,
              colors: Mapping[str, str] | None = None) -> Figure:
    """One row per setting: the paired test-metric difference model − control against the
    knob, with 95% CIs and each curve's crossover in its legend (a dotted line where it
    lies); beside it, where gates were probed, the Delta stacks' gate use against the knob.
    A curve has the colour of its model, and one style per control, in every row; the
    gate shares' intervals are clipped to [0, 1].

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
    styles = {n: ("o-", "s--", "^:", "D-.")[[k for k in names if models[k] == models[n]]
                                            .index(n) % 4] for n in names}
    better = "above" if higher_is_better else "below"
    legend = {"fontsize": 7, "loc": "upper center", "bbox_to_anchor": (0.5, -0.16), "ncol": 2}
    for row, setting in zip(axes, settings, strict=True):
        left, curves = row[0], differences[setting]
        means = np.array([m for (_, ms, _), _ in curves.values() for m in ms], dtype=float)
        scale = np.abs(means[np.isfinite(means) & (means != 0)])
        for name, ((values, mean, half), star) in curves.items():
            color = colors[models[name]]
            left.errorbar(values, mean, yerr=half, fmt=styles[name], ms=4, lw=1.2, capsize=3,
                          color=color, label=f"{name}: {star_text(star, knob)}")
            if star is not None:
                left.axvline(star, color=color, lw=0.9, ls=":")
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
                    right.errorbar(values, mean, yerr=clipped_error(mean, half, 0.0, 1.0),
                                   fmt=style, ms=3.5, lw=1.1, capsize=2, color=colors[model],
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
        settings: task and setting → (curve name → (values, means, CI half-widths), knob
            value → the mean β of every sublayer, attention and MLP alternating); shares'
            intervals are clipped to [0, 1].
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
                left.errorbar(values, mean, yerr=clipped_error(mean, half, 0.0, 1.0), fmt=fmt,
                              ms=4, lw=1.2, capsize=3, color=color, label=name)
        _knob_axis(left, [v for values, _, _ in curves.values() for v in values], knob)
        left.set(title=f"{model} on {setting}: query tokens",
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
        right.set(title=f"{model} on {setting}: mean gate of every sublayer at query "
                        "tokens", ylabel="β",
                  ylim=(0, 2))
        right.legend(**legend)
    fig.tight_layout()
    return fig
