"""The house style of every figure: the palette and colours, the rc settings, log axes
whose labels never overlap, a legend below the panels, a panel grid, and the file writer."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

from ...models.operator import REGIMES

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

#: Okabe–Ito's colour-blind-safe set and Tol's muted set, ordered so that the first of them
#: differ in hue (Okabe–Ito's sky blue, close to its blue, comes late; yellow, faint on
#: white, last).
PALETTE = (
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#D55E00",
    "#CC79A7",
    "#000000",
    "#882255",
    "#999933",
    "#999999",
    "#56B4E9",
    "#44AA99",
    "#F0E442",
)
#: The range each metric can take: the ends its intervals are clipped to.
METRIC_RANGE = {"mse": (0.0, np.inf), "accuracy": (0.0, 1.0)}
#: One colour per gate regime, identity → reflection.
REGIME_COLORS = dict(
    zip(REGIMES, ("#BBBBBB", "#56B4E9", "#009E73", "#E69F00", "#D55E00"), strict=True)
)

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
    """`row_colors` of the models of a figure's panels (for a figure drawn alone)."""
    return row_colors(m for by_model in panels.values() for m in by_model)


def clipped_error(
    mean: Sequence[float] | float,
    half: Sequence[float] | float,
    low: float = -np.inf,
    high: float = np.inf,
) -> np.ndarray:
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
    sets = [
        [s * 10.0**k for k in decades for s in subs if low <= s * 10.0**k <= high]
        for subs in _LOG_SUBS
    ]
    fits = [t for t in sets if 3 <= len(t) <= most] or [t for t in sets if len(t) >= 2]
    if not fits:
        return [float(_short(low)), float(_short(high))]
    return fits[0][:: -(-len(fits[0]) // most)]


def log_axis(ax: Axes, which: str, values: Iterable[float]) -> None:
    """A log ``which`` (``"x"``, ``"y"``) axis whose labels never overlap: a few round
    ticks (`log_ticks`) with short labels, the minor ticks unlabelled."""
    positive = np.asarray([v for v in values if np.isfinite(v) and v > 0], float)
    getattr(ax, f"set_{which}scale")("log")
    if not positive.size:
        return
    axis = getattr(ax, f"{which}axis")
    axis.set_major_locator(FixedLocator(log_ticks(positive.min(), positive.max())))
    axis.set_major_formatter(FuncFormatter(_short))
    axis.set_minor_formatter(NullFormatter())


def sublayer_positions(count: int, updates: int = 1) -> np.ndarray:
    """Where a Transformer's ``count`` probe rows sit on a sublayer axis (1 = the first
    attention, 2 = the first MLP, …): a sublayer's n_h delta updates at ``s``, ``s + 1/n_h``,
    …, so that rows with one update and with several share the axis."""
    return 1 + np.arange(count) / updates


def sublayer_ticks(ax: Axes, positions: Iterable[float]) -> None:
    """Ticks at every sublayer ``positions`` reach, named ``attn 1``, ``mlp 1``, ``attn 2``, …"""
    sublayers = np.arange(1, int(max(positions, default=0)) + 1)
    ax.set_xticks(
        sublayers,
        [f"{'mlp' if s % 2 == 0 else 'attn'} {(s + 1) // 2}" for s in sublayers],
        fontsize=7,
    )


def legend_below(fig: Figure, handles: Sequence, note: str = "") -> None:
    """One legend for every panel, right below them (never over the data), ``note`` as its
    title: lay the panels out above it, then place it."""
    ncol = max(1, min(len(handles), 6))
    lines = -(-len(handles) // ncol) + (1 if note else 0)
    bottom = min(0.45, (0.2 * lines + 0.12) / fig.get_figheight())
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, bottom),
        ncol=ncol,
        fontsize=7,
        title=note or None,
        title_fontsize=7,
    )


def model_handles(colors: Mapping[str, str], drawn: Iterable[str]) -> list[Line2D]:
    """Legend entries for the models drawn, in ``colors``'s order."""
    drawn = set(drawn)
    return [
        Line2D([], [], color=c, marker="o", ms=4, lw=1.2, label=m)
        for m, c in colors.items()
        if m in drawn
    ]


def save_figure(fig: Figure, stem: str | Path) -> list[Path]:
    """Write ``stem.png`` and ``stem.svg``; return both paths. The suffix is appended, never
    put in place of one: a stem may end like one (``regime_atlas_ddl-b0.5``)."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_name(f"{stem.name}.png"), stem.with_name(f"{stem.name}.svg")]
    for path in paths:
        fig.savefig(path, bbox_inches="tight")
    return paths


def panel_grid(
    n: int, width: float = 3.2, height: float = 2.6, cols: int = 4
) -> tuple[Figure, list]:
    """A figure of ``n`` panels, ``cols`` to a row, each ``width`` × ``height`` inches;
    returns the figure and its ``n`` visible axes."""
    cols = max(1, min(cols, n))
    rows = -(-n // cols)
    fig = Figure(figsize=(width * cols, height * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]
