"""The crossover study: the paired difference across a task's knob, p*, and the gate use."""

import dataclasses
import json

import numpy as np
import pytest
import torch

import ddl_dynamics as dd
from ddl_dynamics.analysis.events import gate_use
from ddl_dynamics.analysis.judge.comparisons import Comparison
from ddl_dynamics.analysis.judge.crossover import Setting, crossover_point, star_interval
from ddl_dynamics.analysis.judge.stats import Paired
from ddl_dynamics.analysis.plots.sweeps import crossover
from ddl_dynamics.analysis.probes import probe_model
from ddl_dynamics.analysis.render.formats import render
from ddl_dynamics.analysis.run import load_run, run_of

P = (0.0, 0.1, 0.5, 1.0)
#: Eleven seeds of every model at every knob value.
SEEDS = tuple(range(11))
#: Test MSE of resnet per seed, and the offsets of each model from it per p (per seed).
RESNET = tuple(1.0 + 0.05 * ((3 * s) % 5 - 2) for s in SEEDS)
JITTER = tuple(0.01 * ((7 * s) % 5 - 2) for s in SEEDS)


def shifted(shift: float) -> tuple[float, ...]:
    """``shift`` on every seed, give or take a little."""
    return tuple(shift + j for j in JITTER)


def alternating(size: float) -> tuple[float, ...]:
    """Either side by ``size`` on alternate seeds: no difference."""
    return tuple(size * (-1) ** s + j for s, j in zip(SEEDS, JITTER, strict=True))


OFFSETS = {
    # worse at 0, a tie at 0.1 (the signs differ across seeds), better from 0.5 on
    "ddl": {0.0: shifted(0.2), 0.1: alternating(0.1), 0.5: shifted(-0.5), 1.0: shifted(-0.8)},
    # better at every p: the crossover lies at p = 0
    "ddl-lin": {p: shifted(-0.3) for p in P},
    # better at 0.5 only: it does not stay there, so no crossover in range
    "gated": {
        0.0: alternating(0.1),
        0.1: alternating(0.1),
        0.5: shifted(-0.2),
        1.0: alternating(0.1),
    },
    # worse than ddl wherever ddl wins
    "ddl-write": {
        0.0: shifted(0.25),
        0.1: alternating(0.05),
        0.5: shifted(-0.1),
        1.0: shifted(-0.2),
    },
}
REFLECTION = dd.REGIMES.index("reflection")
FAMILIES = {
    "resnet": ("resnet", {}),
    "ddl": ("ddl", {}),
    "ddl-write": ("ddl-write", {}),
    "ddl-lin": ("ddl", {"context": "control"}),
    "gated": ("gated", {}),
}


def label(event: str, p: float) -> str:
    return f"switched[event={event},p={p:g}]"


def row(event: str, p: float, model: str, seed: int, test: float) -> dd.RunResult:
    family, options = FAMILIES[model]
    spec = {"depth": 8, "p": p, "event": event, "dim": 4}
    return dd.RunResult(
        status="ok",
        message="",
        key=f"{label(event, p)}-{model}-{seed}",
        task=label(event, p),
        model=model,
        seed=seed,
        params=100,
        flops=1.0,
        wall_time=1.0,
        config={"task": "switched", "spec": spec, "model": family, "config": options},
        metrics={"metric": "mse", "higher_is_better": False, "test": test},
    )


def hand_made(events=("overwrite", "reflect")) -> list[dd.RunResult]:
    rows = []
    for event in events:
        for p in P:
            for seed, base in zip(SEEDS, RESNET, strict=True):
                rows.append(row(event, p, "resnet", seed, base))
                rows += [
                    row(event, p, m, seed, base + offsets[p][seed])
                    for m, offsets in OFFSETS.items()
                ]
    return rows


#: The experiment declares the erase-term contrast beside each row's baseline.
ERASE = {"config": '[[comparisons]]\nmodel = "ddl"\ncontrol = "ddl-write"\n'}


def crossover_of(rows, experiment=ERASE):
    return dd.build_report(run_of(rows, experiment=experiment)).crossovers


@pytest.fixture
def run_dir(tmp_path):
    store = dd.RunFolder.open(tmp_path, "w").store
    store.start_run("crossover", ERASE["config"])
    for r in hand_made():
        store.put(r)
    return tmp_path


def test_crossover_is_where_the_model_wins_from_on_after_adjustment(run_dir):
    report = dd.build_report(run_dir)
    assert report.tests == 2 * len(P) * 5  # every point of every curve is one test
    found = {(c.setting.label, c.model, c.control): c for c in report.crossovers}
    assert {(m, c) for _, m, c in found} == {
        ("ddl", "resnet"),
        ("ddl-lin", "resnet"),
        ("gated", "resnet"),
        ("ddl-write", "resnet"),
        ("ddl", "ddl-write"),
    }
    for event in ("overwrite", "reflect"):
        ddl = found[f"event={event}", "ddl", "resnet"]
        assert [v for v, _ in ddl.points] == list(P)
        assert ddl.star == 0.5
        assert [c.label for _, c in ddl.points] == ["loss", "inconclusive", "win", "win"]
        assert ddl.points[2][1].paired.mean == pytest.approx(np.mean(OFFSETS["ddl"][0.5]))
        assert all(c.paired.total == len(SEEDS) for _, c in ddl.points)
        # every seed agrees at 0.5 and 1 and none can tip 0.1: p* stands on any resample
        assert ddl.interval == (0.5, 0.5)
        assert found[f"event={event}", "ddl-lin", "resnet"].star == 0.0
        assert found[f"event={event}", "gated", "resnet"].star is None
        erase = found[f"event={event}", "ddl", "ddl-write"]
        assert erase.star == 0.5
        diffs = np.subtract(OFFSETS["ddl"][1.0], OFFSETS["ddl-write"][1.0])
        assert erase.points[-1][1].paired.differences == pytest.approx(tuple(diffs))


def point(diffs, factor=1.0, failed=()):
    """A judged MSE comparison whose model − control differences are ``diffs`` (the model
    failing the seeds in ``failed``), its p scaled by ``factor`` as Holm would."""
    model = {s: None if s in failed else d for s, d in enumerate(diffs)}
    paired = Paired.of(model, dict.fromkeys(range(len(diffs)), 0.0), False)
    return Comparison(
        "t",
        "m",
        "c",
        "test",
        ("baseline",),
        "mse",
        False,
        "",
        paired,
        p_adjusted=min(1.0, paired.p * factor),
    )


def test_the_star_interval_resamples_the_verdict_that_defines_p_star():
    worse, better = point([0.2, 0.3, 0.1, 0.2] * 2), point([-0.2, -0.3, -0.1, -0.2] * 2)
    assert star_interval([(0.0, worse), (1.0, better)], higher_is_better=False) == (1.0, 1.0)
    # the same agreement on 3 seeds is not significant (paired t p = 0.074): no p*, and no
    # interval around one; a resample that draws a seed twice has fewer than 3 pairs, where
    # its smaller spread alone would have pinned it at 1
    three = [(0.0, point([0.2, 0.3, 0.1])), (1.0, point([-0.2, -0.3, -0.1]))]
    assert star_interval(three, higher_is_better=False) == (np.inf, np.inf)
    # a model that diverged on 6 of 8 seeds does not win on the 2 it finished, in any
    # resample: the failed seeds are resampled with the others
    diverged = point([-0.2] * 8, failed=range(2, 8))
    assert star_interval([(0.0, worse), (1.0, diverged)], False) == (np.inf, np.inf)
    # a family that takes the win away in the report takes it away in the resamples: 99
    # more tests at p = 1, and every resampled p is Holm-adjusted among them
    noisy = [-0.05, -0.35, -0.15, -0.25, -0.1, -0.3, -0.2, -0.2]
    others = [dataclasses.replace(point([0.1, -0.1] * 4), model=f"o{i}") for i in range(99)]
    assert point(noisy).p_adjusted < 0.05 < point(noisy, factor=100).p_adjusted
    assert star_interval([(0.0, worse), (1.0, point(noisy))], False) == (1.0, 1.0)
    assert (
        star_interval(
            [(0.0, worse), (1.0, point(noisy, factor=100))],
            False,
            [point(noisy, factor=100), *others],
        )[1]
        == np.inf
    )


def test_resampled_p_values_take_holms_multiplier_of_their_rank_not_a_capped_factor():
    """A point of no clear difference (raw p 0.49) in a family of five, which Holm capped at
    1 in the report. Before, each resampled p was scaled by adjusted/raw = 1/0.49 ≈ 2, not
    by the 5 Holm gives a p that ranks first: 6.1% of resamples won, and the interval of p*
    read (1, none); Holm over the family with the resampled p, 1.6%."""
    worse = point([0.2, 0.3, 0.1, 0.2] * 2)
    weak = point([0.37, -0.02, -0.27, -0.06, -0.45, -0.02, -0.1, 0.06])
    assert weak.paired.p == pytest.approx(0.492, abs=1e-3)
    weak = dataclasses.replace(weak, p_adjusted=1.0)
    others = [dataclasses.replace(point([0.1, -0.1] * 4), model=f"o{i}") for i in range(4)]
    assert star_interval([(0.0, worse), (1.0, weak)], False, [weak, *others]) == (np.inf, np.inf)


def test_p_star_lies_inside_its_interval():
    rng = np.random.default_rng(3)
    values = (0.0, 0.25, 0.5, 1.0)
    for _ in range(5):
        points = [(v, point(list(0.3 - 0.6 * v + 0.3 * rng.standard_normal(10)))) for v in values]
        points = [
            (
                v,
                dataclasses.replace(
                    c, label="win" if c.p_adjusted < 0.05 and c.paired.mean < 0 else "loss"
                ),
            )
            for v, c in points
        ]
        star = crossover_point(points)
        low, high = star_interval(points, higher_is_better=False)
        assert low <= (np.inf if star is None else star) <= high


def test_the_report_has_a_crossover_table(run_dir):
    report = dd.build_report(run_dir)
    stars = {
        (c["setting"]["label"], c["model"], c["control"]): c["star"]
        for c in json.loads(render(report, "json"))["crossovers"]
    }
    assert stars["event=reflect", "ddl", "resnet"] == 0.5
    assert stars["event=reflect", "gated", "resnet"] is None
    md = render(report, "md")
    assert "## Crossover" in md and "### switched: test mse ↓ against p" in md
    lines = [line for line in md.splitlines() if "| ddl − resnet |" in line]
    assert len(lines) == 2 and lines[0].startswith(
        "| event=overwrite | ddl − resnet | p* = 0.5 | [0.5, 0.5] |"
    )
    assert "(loss (n = 11))" in lines[0] and "(inconclusive (n = 11; detectable" in lines[0]
    assert lines[0].count("(win (n = 11))") == 2
    assert any("| ddl-lin − resnet | p* = 0 |" in line for line in md.splitlines())
    assert any("| gated − resnet | none in range |" in line for line in md.splitlines())
    assert md.index("## Crossover") < md.index("## Results per task")


def test_one_setting_is_labelled_by_nothing_and_one_knob_value_makes_no_curve():
    rows = [r for r in hand_made(events=("reflect",)) if r.model in ("ddl", "ddl-write")]
    (ddl,) = crossover_of(rows)
    assert ddl.setting == Setting("switched", "p", "")
    assert ddl.control == "ddl-write"  # the declared comparison: no baseline in the run
    assert crossover_of(rows, experiment={}) == []  # nothing declared, nothing to follow
    single = [r for r in rows if r.config["spec"]["p"] == 1.0]
    assert crossover_of(single) == []


def test_a_seed_one_side_did_not_run_is_left_out_and_one_it_failed_counts():
    rows = [r for r in hand_made(events=("reflect",)) if not (r.model == "ddl" and r.seed == 3)]
    (erase,) = [c for c in crossover_of(rows) if c.model == "ddl" and c.control == "ddl-write"]
    rest = tuple(s for s in SEEDS if s != 3)
    assert all(c.paired.seeds == rest and c.paired.total == len(rest) for _, c in erase.points)
    assert all("seed(s) 3 only in ddl-write, not compared" in c.note for _, c in erase.points)
    rows = hand_made(events=("reflect",))
    for r in rows:
        if r.model == "ddl" and r.seed == 3:
            r.status = "diverged"
    (erase,) = [c for c in crossover_of(rows) if c.model == "ddl" and c.control == "ddl-write"]
    assert all(c.paired.failed == (3,) and c.paired.total == len(SEEDS) for _, c in erase.points)


def test_a_control_trained_on_another_budget_gets_no_verdict_at_that_knob_value():
    rows = hand_made(events=("reflect",))
    for r in rows:  # ddl-write trained half the steps at p = 1 only
        r.config["train"] = {
            "steps": 50 if r.model == "ddl-write" and r.config["spec"]["p"] == 1.0 else 100
        }
    (erase,) = [c for c in crossover_of(rows) if c.model == "ddl" and c.control == "ddl-write"]
    assert [c.label for _, c in erase.points][-1] == "unequal budget"
    assert erase.star is None  # no win at the largest knob value


def test_gate_use_follows_the_probed_events(tmp_path):
    """Planted probes: a stack that reflects exactly at the reflect events and sits at the
    identity elsewhere, and one that reflects everywhere."""
    folder = dd.RunFolder.open(tmp_path, "w")
    store = folder.store
    task = dd.make_task("switched", p=0.5, event="reflect")
    regimes = task.sample(64, 0, "test").step_regimes.numpy()
    reflecting = regimes == REFLECTION
    for p in (0.5, 1.0):
        for model, beta in (
            ("ddl", np.where(reflecting, 2.0, 0.0)),
            ("ddl-write", np.full(regimes.shape, 2.0)),  # no erase: not audited
            ("ddl-lin", np.full(regimes.shape, 1.9)),
        ):
            r = row("reflect", p, model, 0, 0.1)
            store.put(r)
            folder.model_path(r.key).parent.mkdir(exist_ok=True)
            folder.model_path(r.key).touch()
            folder.probe_path(r.key).parent.mkdir(exist_ok=True)
            events = regimes if p == 0.5 else np.full(regimes.shape, REFLECTION)
            np.savez(folder.probe_path(r.key), beta=beta, test_step_regimes=events)
    found = {(g.model, g.regime): g for g in gate_use(load_run(tmp_path))}
    assert set(found) == {("ddl", "reflection"), ("ddl-lin", "reflection")}
    ddl, lin = found["ddl", "reflection"], found["ddl-lin", "reflection"]
    assert [(v, e.mean) for v, e in ddl.at_events] == [
        (0.5, 1.0),
        (1.0, pytest.approx(reflecting.mean())),
    ]
    assert [(v, e.mean) for v, e in ddl.elsewhere] == [(0.5, 0.0)]  # p = 1: no quiet step
    assert [(v, e.mean) for v, e in lin.at_events] == [(0.5, 1.0), (1.0, 1.0)]
    assert [(v, e.mean) for v, e in lin.elsewhere] == [(0.5, 1.0)]


def test_crossover_figure_marks_p_star_and_keeps_p_zero_in_view():
    curve = ([0.0, 0.05, 0.5, 1.0], [0.2, 0.01, -0.3, -0.6], [0.05, 0.02, 0.1, 0.1])
    differences = {"event=reflect": {"ddl − resnet": (curve, 0.5), "gated − resnet": (curve, None)}}
    gates = {
        "event=reflect": {
            ("ddl", "reflection"): (
                ([0.05, 0.5, 1.0], [0.6, 0.8, 0.9], [0.1, 0.05, 0.0]),
                ([0.0, 0.05, 0.5], [0.0, 0.1, 0.2], [0.0, 0.0, 0.1]),
            )
        }
    }
    fig = crossover(differences, gates, "p", "mse", higher_is_better=False)
    left, right = fig.axes[:2]
    assert left.get_xscale() == "symlog" and left.get_xlim()[0] < 0.0 < left.get_xlim()[1]
    assert [t.get_text() for t in left.get_legend().get_texts()] == [
        "ddl − resnet: p* = 0.5",
        "gated − resnet: none in range",
    ]
    vertical = [line for line in left.get_lines() if list(line.get_xdata()) == [0.5, 0.5]]
    assert len(vertical) == 1  # one crossover in range, one dotted line
    assert "below 0: model better" in left.get_title()
    assert [t.get_text() for t in right.get_legend().get_texts()] == [
        "ddl: reflection at its events",
        "ddl: reflection elsewhere",
    ]
    # a curve keeps its colour in every row, whatever its crossover there
    two = {"event=overwrite": {"ddl − resnet": (curve, None)}, **differences}
    fig = crossover(two, gates, "p", "mse", higher_is_better=False)
    first, second = (fig.axes[i].containers[0].lines[0] for i in (0, 2))  # ddl − resnet
    assert first.get_color() == second.get_color()
    alone = crossover(differences, {}, "p", "mse", higher_is_better=False)
    assert len(alone.axes) == 1  # no probed gates: no second column


def test_the_knob_is_a_spec_field():
    assert dd.make_task("switched").knob == "p" and dd.make_task("parity").knob is None
    with pytest.raises(ValueError, match="knob 'q' is not a spec field"):
        dd.check_task(type("Bad", (type(dd.make_task("switched")),), {"knob": "q"})())


@torch.no_grad()
def test_probes_record_the_events_of_a_task_that_marks_them():
    task = dd.make_task("switched", p=0.5, event="mixed", depth=3)
    model = dd.make_model(
        "ddl",
        in_dim=task.in_dim,
        out_dim=task.out_dim,
        control_dim=task.control_dim,
        width=8,
        depth=3,
    )
    arrays = probe_model(task, model.eval(), seed=0, n=16)
    np.testing.assert_array_equal(
        arrays["test_step_regimes"], task.sample(16, 0, "test").step_regimes.numpy()
    )
    assert arrays["beta"].shape == arrays["test_step_regimes"].shape
