"""The figures' layout defects stay fixed: no legend over the points, no label under the
title, a floor that is said, a difference axis that separates magnitudes, and a compare
figure at page width."""

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg

from ddl_dynamics.analysis.plots.gates import DET_FLOOR, beta_histograms, determinant_plot
from ddl_dynamics.analysis.plots.summary import comparison
from ddl_dynamics.analysis.plots.sweeps import crossover


def _drawn(fig):
    """Lay the figure out as it would be saved (text extents need a renderer)."""
    FigureCanvasAgg(fig).draw()
    return fig.canvas.get_renderer()


def test_the_determinant_legend_is_below_the_axes_and_the_floor_is_labelled():
    rng = np.random.default_rng(0)
    dets = {
        "depth-recall": np.r_[np.zeros(50), -np.full(50, 1e-20)],  # on the floor
        "oscillator": 10.0 ** rng.uniform(-6, -3, 100) * rng.choice([-1, 1], 100),
    }
    fig = determinant_plot(dets, "ddl")
    renderer = _drawn(fig)
    (ax,) = fig.axes
    assert ax.get_legend() is None and len(fig.legends) == 1
    legend = fig.legends[0]
    assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))
    assert any(
        "floor" in t.get_text() and f"{DET_FLOOR:g}" in t.get_text() for t in legend.get_texts()
    )
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert "100% on the floor" in ticks[0] and "0% on the floor" in ticks[1]


def test_the_beta_colour_bar_labels_stay_clear_of_the_title():
    rng = np.random.default_rng(0)
    betas = {task: rng.uniform(0, 2, (200, 8)) for task in ("overwrite", "oscillator", "parity")}
    fig = beta_histograms(betas, "ddl")
    renderer = _drawn(fig)
    title = fig._suptitle.get_window_extent(renderer)
    labels = [ax.yaxis.label for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(labels) == 3
    assert not any(label.get_window_extent(renderer).overlaps(title) for label in labels)


def test_the_crossover_axis_is_linear_so_1e_4_and_1e_2_are_apart():
    values = [0.0, 0.1, 0.5]
    curves = {"ddl − resnet": ((values, [1e-4, 1e-2, -0.1], [1e-5, 1e-3, 1e-2]), None)}
    fig = crossover({"p": curves}, {}, "p", "mse", higher_is_better=False)
    ax = fig.axes[0]
    assert ax.get_yscale() == "linear"
    low, high = ax.get_ylim()
    assert (1e-2 - 1e-4) / (high - low) > 0.05  # a visible share of the axis


def test_a_lone_compare_panel_is_page_wide_and_its_caption_no_wider():
    rng = np.random.default_rng(0)
    tables = {
        "char-lm": {
            m: (mu, 0.02, list(mu + 0.03 * rng.standard_normal(8)))
            for m, mu in (("transformer", 2.38), ("ddl-dv4", 2.22))
        }
    }
    fig = comparison(tables, {"char-lm": "bpc"})
    renderer = _drawn(fig)
    assert fig.get_figwidth() >= 7.5
    assert fig._suptitle.get_window_extent(renderer).width <= fig.bbox.width
