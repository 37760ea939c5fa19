"""The captions of the figure files, one per kind, read by the study pages and the HTML
report beside each figure."""

from __future__ import annotations

from .judge.width import SOLVED

#: Captions of the figure files, by name prefix.
CAPTIONS = {
    "verdicts": "Verdicts: per task and model, the paired difference of the test metric "
    "against the model's baseline (mean ± 95% CI over the seeds both finished, "
    "n seeds compared); colour: win / loss / equivalent / inconclusive on "
    "Holm-adjusted p-values, hatched: no test (unequal budget, unmatched size); "
    "blank: no comparison (the baseline itself, or not run there).",
    "crossover": "Crossover: per setting, each comparison's paired test-metric difference "
    "(a row against its baseline, or a declared comparison) across the knob, "
    "mean and 95% CI over seeds, with the crossover named after the knob (p*, "
    "hops*), the smallest knob value from which on the model wins (adjusted) "
    "at every larger value (dotted), or none in range. Right: for the ddl "
    "stacks, the share of gates in each event's regime at the steps with that "
    "event (solid) and at the steps without an event (dashed).",
    "width": "Test metric against the model width, per task setting swept at several "
    "widths: every row at its chosen grid value, the mean over its finished seeds "
    f"with its 95% CI; a star marks the smallest width whose mean reaches {SOLVED:g}, "
    "and the legend counts each row's failed seeds.",
    "compare": "Test metric per task and model: each finished seed (hollow) and their mean "
    "with its 95% CI (filled).",
    "regime_atlas": "Regime atlas: per layer, the fraction of test samples whose gate β falls "
    "in each regime (identity < 0.25 ≤ write < 0.75 ≤ projection ≤ 1.25 < "
    "over-relaxed ≤ 1.75 < reflection).",
    "beta_hist": "Distribution of the gate β per layer (dotted: regime boundaries).",
    "probe_consistency": "Probe consistency: measured |e_post|/|e_pre| against |1 − β| at "
    "every probed gate. e_post = (1 − β) e_pre holds for every exact Delta "
    "update, trained or not, so points on the diagonal show that the "
    "probe and the operator agree, not evidence about training; points "
    "with almost nothing left to erase (float32 rounding) or a key far "
    "from unit length leave it, drawn grey.",
    "determinant": "det Π(I − β_l k_l k_lᵀ) = Π(1 − β_l) per test sample: its sign counts "
    "the reflecting layers, its size the volume the shortcuts keep.",
    "hop_gates": "Gates at a multi-hop task's query tokens: left, the share of gates in the "
    "projection regime at the sublayers where some attention head looks at a hop "
    "position, at the query token's other sublayers, and the share of hops its "
    "attention looked at, against the knob (mean, 95% CI over seeds); right, the "
    "mean gate of every sublayer at query tokens.",
    "query_": "Gates at the query tokens: per sublayer, the share of the scored tokens whose "
    "gate is in the regime the task states (reflection: β > 1.75), each Delta row "
    "(mean, 95% CI over seeds); the write-only control's β only scales its write, so "
    "its share is the level a gate reaches without an erase term to reflect with.",
    "trajectories": "Depth trajectories against the ground truth (first two coordinates), on "
    "the longest split each model can run; the dot ends the training horizon.",
    "state_norms": "Mean norm of the hidden state over depth, per task and model.",
    "curves_step": "Val metric during training against the step (band: min–max over seeds).",
    "curves_flops": "Val metric during training against cumulative training FLOPs.",
    "nfe": "ODE function evaluations per forward pass during training.",
}


def caption(name: str) -> str:
    """The caption of a figure file (``name``: its file name or stem), by its prefix."""
    return next((c for prefix, c in CAPTIONS.items() if name.startswith(prefix)), "")
