"""From a run folder to figures, drawn from the results store and the cached probes only.

Every figure group is drawn from one `Run` and its `Report`,
read once; each row appears at its chosen grid value, as in the report, and in one colour
in every figure of the run (`row_colors` of its labels). A group with
nothing to draw says why (`NothingToDraw`, collected in `Figures.skipped`).

The documentation's headline figure (`draw_headline`, from the points ``publish`` reads off
the findings) is made here too, and every figure's caption beside, in `captions`, so that
the pages around them only place them.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from PIL import Image

from .._registry import first_paragraph
from .._task import make_task
from ..experiment.folder import write_atomically
from .events import gate_use
from .hops import auditable, hop_audit
from .judge.crossover import curve
from .judge.regimes import contraction, depth_determinant, regime_fractions
from .judge.width import width_panels
from .plots.depth import depth_profiles, phase_portraits
from .plots.gates import (
    beta_histograms,
    determinant_plot,
    probe_consistency,
    query_regimes,
    regime_atlas,
)
from .plots.headline import headline
from .plots.style import row_colors, save_figure
from .plots.summary import comparison, verdict_matrix
from .plots.sweeps import crossover, hop_gates, width_sweep
from .plots.training import nfe_curves, training_curves
from .probes import erases, load_probes, probe_run, usable_rows
from .queries import query_gates
from .report.build import Report, build_report
from .report.text import signed
from .run import Run, load_run

#: The figure groups of ``ddl-dyn plot``.
FIGURE_KINDS = (
    "regimes",
    "trajectories",
    "curves",
    "compare",
    "crossover",
    "hops",
    "queries",
    "width",
)
#: The groups that read probes (made first, for the cells that have none yet).
_PROBED = {"regimes", "trajectories", "crossover", "hops", "queries"}
#: Run folders whose figures are drawn elsewhere for now (`drawn_where_possible`).
_ELSEWHERE: dict[Path, Path] = {}


class NothingToDraw(Exception):
    """A figure group has nothing in the run to draw; the message says why."""


class Figures(list[Path]):
    """The files drawn, and for each figure group that drew none, why (``skipped``)."""

    def __init__(self, paths: Iterable[Path] = (), skipped: Mapping[str, str] | None = None):
        super().__init__(paths)
        self.skipped: dict[str, str] = dict(skipped or {})


#: Model label → colour, one for the whole run.
Colors = Mapping[str, str]


def figure_dir(run_dir: str | Path) -> Path:
    run_dir = Path(run_dir)
    return _ELSEWHERE.get(run_dir.resolve(), run_dir / "figures")


def writable(folder: Path) -> bool:
    """Whether files can be made in ``folder`` (made first if missing)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


@contextmanager
def drawn_where_possible(run_dir: str | Path) -> Iterator[None]:
    """While open, the figures of a run folder that cannot take them (read-only storage) go
    to a temporary folder, removed at the end: for a report that embeds them."""
    key = Path(run_dir).resolve()
    if writable(figure_dir(run_dir)):
        yield
        return
    with tempfile.TemporaryDirectory(prefix="ddl-dyn-figures-") as folder:
        _ELSEWHERE[key] = Path(folder)
        try:
            yield
        finally:
            del _ELSEWHERE[key]


def regime_figures(run: Run, report: Report, colors: Colors) -> list[Path]:
    """Regime atlas and β histograms per Delta-stack label, the probe-consistency check,
    the depth determinants."""
    betas: dict[str, dict[str, list[np.ndarray]]] = defaultdict(lambda: defaultdict(list))
    checks: dict[str, list[tuple[np.ndarray, ...]]] = defaultdict(list)
    for row, arrays in load_probes(run):
        if not erases(row):
            continue
        betas[row.model][row.task].append(arrays["beta"])
        ratio = contraction(arrays["e_pre"], arrays["e_post"])
        scale = np.linalg.norm(arrays["readout"], axis=-1) + np.linalg.norm(arrays["v"], axis=-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            relative = np.linalg.norm(arrays["e_pre"], axis=-1) / scale
        checks[row.task].append(
            (
                np.abs(1 - arrays["beta"]).ravel(),
                ratio.ravel(),
                relative.ravel(),
                arrays["k_raw_norm"].ravel(),
            )
        )
    if not betas:
        raise NothingToDraw(
            "no probed Delta stack with the erase term (ddl, "
            "ddl-transformer) among the run's finished rows"
        )
    out: list[Path] = []
    out_dir = figure_dir(run.run_dir)
    for label, by_task in sorted(betas.items()):
        pooled = {task: np.concatenate(b) for task, b in sorted(by_task.items())}
        fractions = {task: regime_fractions(b) for task, b in pooled.items()}
        out += save_figure(regime_atlas(fractions, label), out_dir / f"regime_atlas_{label}")
        out += save_figure(beta_histograms(pooled, label), out_dir / f"beta_hist_{label}")
        dets = {task: depth_determinant(b) for task, b in pooled.items()}
        out += save_figure(determinant_plot(dets, label), out_dir / f"determinant_{label}")
    points = {
        task: tuple(np.concatenate(parts) for parts in zip(*found, strict=True))
        for task, found in sorted(checks.items())
    }
    out += save_figure(probe_consistency(points), out_dir / "probe_consistency")
    return out


def trajectory_figures(run: Run, report: Report, colors: Colors, samples: int = 3) -> list[Path]:
    """Phase portraits against the truth (tasks with a 2-D ground-truth trajectory, on the
    longest split each model ran, axes named by the task) and, for every task, the
    hidden-state norm over depth."""
    portraits: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = defaultdict(dict)
    train_steps: dict[str, int] = {}
    names: dict[str, tuple[str, ...] | None] = {}
    norms: dict[str, dict[str, np.ndarray]] = defaultdict(dict)
    for row, arrays in load_probes(run):  # ordered by seed: keep each model's first seed
        if row.model in norms[row.task] or "test_states" not in arrays:  # sequence models
            continue
        norms[row.task][row.model] = np.linalg.norm(arrays["test_states"], axis=-1).mean(0)
        split = max(
            (k[: -len("_truth")] for k in arrays if k.endswith("_truth")),
            key=lambda s: arrays[f"{s}_pred"].shape[1],
            default=None,
        )
        if split is None or arrays[f"{split}_truth"].shape[-1] != 2:  # phase-plane flows only
            continue
        truth = arrays[f"{split}_truth"][:samples, 1:]
        portraits[row.task][row.model] = (arrays[f"{split}_pred"][:samples], truth)
        train_steps[row.task] = arrays["test_pred"].shape[1]
        if row.task not in names:
            names[row.task] = make_task(row.config["task"], **row.config["spec"]).state_names
    norms = {task: by_model for task, by_model in norms.items() if by_model}
    if not norms:
        raise NothingToDraw(
            "no probed model with a hidden-state trajectory (the vector "
            "tasks' depth models) among the run's finished rows"
        )
    out: list[Path] = []
    out_dir = figure_dir(run.run_dir)
    for task, panels in sorted(portraits.items()):
        fig = phase_portraits(dict(sorted(panels.items())), task, train_steps[task], names[task])
        out += save_figure(fig, out_dir / f"trajectories_{task}")
    fig = depth_profiles(dict(sorted(norms.items())), "mean ‖hidden state‖", colors)
    out += save_figure(fig, out_dir / "state_norms")
    return out


def curve_figures(run: Run, report: Report, colors: Colors) -> list[Path]:
    """Val metric against step and against training FLOPs (seed bands), and ODE NFE."""
    metric = {t.task: t.metric for t in report.tables}
    by_step: dict[str, dict[str, list[np.ndarray]]] = defaultdict(lambda: defaultdict(list))
    by_flops: dict[str, dict[str, list[np.ndarray]]] = defaultdict(lambda: defaultdict(list))
    nfe: dict[str, dict[str, list[np.ndarray]]] = defaultdict(lambda: defaultdict(list))
    for row in usable_rows(run):
        curve = np.array(row.curve, dtype=float)
        if curve.ndim != 2 or len(curve) == 0:
            continue
        by_step[row.task][row.model].append(curve[:, [0, 2]])
        by_flops[row.task][row.model].append(curve[:, [3, 2]])
        if curve.shape[1] > 4 and np.isfinite(curve[:, 4]).any():
            nfe[row.task][row.model].append(curve[:, [0, 4]])
    if not by_step:
        raise NothingToDraw("no finished cell with stored weights and a training curve")
    out_dir = figure_dir(run.run_dir)
    out = save_figure(training_curves(by_step, metric, colors=colors), out_dir / "curves_step")
    out += save_figure(
        training_curves(by_flops, metric, x="FLOPs", colors=colors), out_dir / "curves_flops"
    )
    if nfe:
        out += save_figure(nfe_curves(nfe, colors), out_dir / "nfe")
    return out


def compare_figures(run: Run, report: Report, colors: Colors) -> list[Path]:
    """The verdict matrix (each model against its baseline) and, per task, every model's
    test metric per seed with the mean and 95% CI, from the report."""
    out: list[Path] = []
    cells: dict[str, dict[str, tuple[str, str]]] = defaultdict(dict)
    for c in report.comparisons:
        if "baseline" not in c.kinds:
            continue
        task = f"{c.task}\n{c.metric} {'↑' if c.higher_is_better else '↓'}"
        n = f"n={c.paired.total}" if c.paired else "no test"
        difference = signed(c.paired) if c.paired else c.label
        cells[task][c.model] = (c.label, f"{difference}\n{n} vs {c.control_text}")
    if cells:
        out += save_figure(verdict_matrix(cells), figure_dir(run.run_dir) / "verdicts")
    tables = {
        t.task: {
            r.model: (
                r.test.mean,
                r.test.ci or 0.0,
                [v for v in r.per_seed.values() if not isinstance(v, str)],
            )
            for r in t.rows
            if r.test.n
        }
        for t in report.tables
        if any(r.test.n for r in t.rows)
    }
    if tables:
        metric = {t.task: t.metric for t in report.tables}
        out += save_figure(comparison(tables, metric, colors), figure_dir(run.run_dir) / "compare")
    if not out:
        raise NothingToDraw("no finished cell with a test metric")
    return out


def crossover_figures(run: Run, report: Report, colors: Colors) -> list[Path]:
    """Per swept task family with a knob: every model's paired difference against its
    controls across the knob, with the crossover, and the Delta stacks' gate use."""
    if not report.crossovers:
        raise NothingToDraw(_NO_CROSSOVER)
    gates = gate_use(run)
    out: list[Path] = []
    for family in dict.fromkeys(c.setting.family for c in report.crossovers):
        found = [c for c in report.crossovers if c.setting.family == family]
        differences: dict[str, dict[str, tuple]] = defaultdict(dict)
        for c in found:
            drawn = [(v, p.paired) for v, p in c.points if p.paired is not None]
            differences[c.setting.label or family][f"{c.model} − {c.control}"] = (
                curve(drawn),
                c.star,
            )
        uses: dict[str, dict[tuple[str, str], tuple]] = defaultdict(dict)
        for g in gates:
            if g.setting.family == family:
                uses[g.setting.label or family][g.model, g.regime] = (
                    curve(g.at_events),
                    curve(g.elsewhere),
                )
        fig = crossover(
            differences,
            uses,
            found[0].setting.knob,
            found[0].metric,
            found[0].higher_is_better,
            colors,
        )
        out += save_figure(fig, figure_dir(run.run_dir) / f"crossover_{family}")
    return out


_NO_CROSSOVER = (
    "no task family swept over its knob: a crossover needs a task with a knob "
    "(e.g. switched's p) run at two or more of its values, with a comparison "
    "at each"
)
_NO_HOPS = (
    "no Delta Transformer row with the erase term (ddl-transformer) on a multi-hop "
    "task with a knob (var-chain's hops) among the run's finished rows"
)


def hop_figures(run: Run, report: Report, colors: Colors) -> list[Path]:
    """Per Delta row on a multi-hop task (``var-chain``): do its gates project at the query
    tokens' sublayers that perform a hop, across the knob (`hops`)."""
    by_model: dict[str, list] = defaultdict(list)
    for audit in hop_audit(run):
        by_model[audit.model].append(audit)
    if not by_model:
        raise NothingToDraw(_NO_HOPS)
    out: list[Path] = []
    for model, audits in sorted(by_model.items()):
        settings = {
            f"{a.family}, {a.setting}" if a.setting else a.family: (
                {
                    "projecting where it hops": curve(a.at_hops),
                    "projecting elsewhere": curve(a.elsewhere),
                    "hops its attention looked at": curve(a.followed),
                },
                dict(a.profile),
            )
            for a in audits
        }
        fig = hop_gates(settings, model, audits[0].knob, audits[0].updates)
        out += save_figure(fig, figure_dir(run.run_dir) / f"hop_gates_{model}")
    return out


def query_figures(run: Run, report: Report, colors: Colors) -> list[Path]:
    """Per sequence task that states a regime (``swap-track``: reflection): how often each
    Delta row's gate is in it at the query tokens, sublayer by sublayer, the write-only
    control beside the erasing rows (`queries`)."""
    audits = query_gates(run)
    if not audits:
        raise NothingToDraw(
            "no Delta Transformer row (ddl-transformer or its write-only "
            "twin) on a sequence task that states a regime (swap-track) among "
            "the run's finished rows"
        )
    out: list[Path] = []
    for regime in dict.fromkeys(a.regime for a in audits):
        panels: dict[str, dict[str, tuple[list[tuple[float, float]], int]]] = defaultdict(dict)
        for a in audits:
            if a.regime == regime:
                panels[a.task][a.model] = (
                    [
                        (np.nan if e.mean is None else e.mean, np.nan if e.ci is None else e.ci)
                        for e in a.shares
                    ],
                    a.updates,
                )
        fig = query_regimes(panels, regime, colors)
        out += save_figure(fig, figure_dir(run.run_dir) / f"query_{regime}")
    return out


def width_figures(run: Run, report: Report, colors: Colors) -> list[Path]:
    """Per task family with a width sweep (the same task at several model widths): every
    row's test metric against the width at its chosen grid value, the smallest width that
    solves it marked (`width`)."""
    panels = width_panels(run)
    if not panels:
        raise NothingToDraw(
            "no width sweep: it needs one task family with the same spec at "
            "two or more model widths (e.g. var-chain-w16, -w32, -w64)"
        )
    out: list[Path] = []
    for family in dict.fromkeys(p.family for p in panels):
        fig = width_sweep([p for p in panels if p.family == family], colors)
        out += save_figure(fig, figure_dir(run.run_dir) / f"width_{family}")
    return out


_BUILDERS: dict[str, Callable[[Run, Report, Colors], list[Path]]] = {
    "regimes": regime_figures,
    "trajectories": trajectory_figures,
    "curves": curve_figures,
    "compare": compare_figures,
    "crossover": crossover_figures,
    "hops": hop_figures,
    "queries": query_figures,
    "width": width_figures,
}
#: One line per figure group, for ``ddl-dyn plot --help``: its builder's summary.
FIGURE_HELP = {kind: first_paragraph(build) for kind, build in _BUILDERS.items()}


def _unprobed_reason(run: Run, report: Report, kind: str) -> str | None:
    """Why a probed figure group has nothing to draw, where that is known before probing
    (so that a run without the rows it needs is not probed for it); else None."""
    if kind == "crossover" and not report.crossovers:
        return _NO_CROSSOVER
    if kind == "hops" and not any(auditable(row) for row in usable_rows(run)):
        return _NO_HOPS
    return None


def run_colors(run: Run) -> Colors:
    """One colour per row label, the same in every figure of the run."""
    return row_colors(label for _, label in run.rows)


def make_figures(
    run: Run | str | Path,
    kinds: tuple[str, ...] = FIGURE_KINDS,
    progress: bool = True,
    report: Report | None = None,
) -> Figures:
    """Probe what is missing, then draw the figure groups ``kinds`` of a run folder (or a
    run read once, with its report where it is built already); returns the files, and
    for each group that drew none, why."""
    run = run if isinstance(run, Run) else load_run(run)
    unknown = sorted(set(kinds) - set(FIGURE_KINDS))
    if unknown:
        raise ValueError(f"unknown figure kind {unknown[0]!r}; choose from {FIGURE_KINDS}")
    if not writable(figure_dir(run.run_dir)):  # say so before probing
        raise OSError(
            f"cannot write figures into {figure_dir(run.run_dir)}: read-only or no permission"
        )
    report = report or build_report(run)  # the figures read no probe through it
    skipped = {
        kind: reason
        for kind in kinds
        if (reason := _unprobed_reason(run, report, kind)) is not None
    }
    if (set(kinds) - set(skipped)) & _PROBED:
        probe_run(run, progress=progress)
    colors = run_colors(run)
    drawn = Figures()
    for kind in kinds:
        if kind in skipped:
            continue
        try:
            drawn += _BUILDERS[kind](run, report, colors)
        except NothingToDraw as reason:
            skipped[kind] = str(reason)
    drawn.skipped = skipped
    return drawn


# --- the documentation's headline figure


def draw_headline(
    panels: Mapping[str, Mapping[str, Sequence[tuple[float, str]]]],
    path: Path,
    colors: Mapping[str, str] | None = None,
) -> Path:
    """The headline figure of ``panels`` (`plots.headline`: question → pair of rows → a
    difference in margins and a label per task), at most 1,600 px tall, written to ``path``;
    left unchanged where the data it draws have not (the PNG carries their digest)."""
    digest = hashlib.sha256(json.dumps(panels, sort_keys=True).encode()).hexdigest()
    if _digest(path) == digest:
        return path
    fig = headline(panels, colors)
    write_atomically(
        path, lambda file: fig.savefig(file, format="png", dpi=100, metadata={"Source": digest})
    )
    return path


def _digest(path: Path) -> str | None:
    """The data digest a generated PNG carries, if it exists and has one."""
    if not path.is_file():
        return None
    with Image.open(path) as image:
        return getattr(image, "text", {}).get("Source")
