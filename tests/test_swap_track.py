"""swap-track and its vector twin: answers against an independent composition of the swaps,
held-out words, the shortcut levels against the guesses they describe, the commuting
control; and the Transformer Delta block's gate ceiling beta_max (the beta > 1 control)."""

import pytest
import torch
from ddl_dynamics.tasks.swap_track import FLOOR_SAMPLE

from ddl_dynamics import IGNORE_INDEX, REGIMES, check_task, make_model, make_task
from ddl_dynamics._task import content_split

SPECS = [
    {"items": 3, "swaps": 3},
    {"items": 4, "swaps": 5},
    {"items": 5, "swaps": 1},
    {"items": 5, "swaps": 4, "commute": True},
]


def arrangement_after(word: list[tuple[int, int]], items: int) -> list[int]:
    """The item at each position after the swaps, applied one by one to a list."""
    at = list(range(items))
    for i, j in word:
        at[i], at[j] = at[j], at[i]
    return at


@pytest.mark.parametrize("spec", SPECS)
def test_answers_compose_the_swaps_in_order(spec: dict) -> None:
    task = make_task("swap-track", **spec)
    data = task.sample(64, 0, "test")
    L, n = task.swaps, task.items
    pairs = [tuple(p) for p in task.pairs.tolist()]
    for row, target in zip(data.inputs.tolist(), data.targets.tolist(), strict=True):
        word = [pairs[t - n] for t in row[:L]]
        assert all(t >= n for t in row[:L]) and sorted(row[L:]) == list(range(n))
        at = arrangement_after(word, n)
        assert target[:L] == [IGNORE_INDEX] * L
        assert target[L:] == [at.index(q) for q in row[L:]]


def test_order_matters_unless_the_control_commutes() -> None:
    """Reversing every word changes some answers; under commute it changes none."""
    for commute, changes in ((False, True), (True, False)):
        task = make_task("swap-track", items=5, swaps=4, commute=commute)
        inputs = task.sample(256, 0).inputs
        reversed_words = torch.cat([inputs[:, :4].flip(1), inputs[:, 4:]], dim=1)
        moved = (task.answers(reversed_words) != task.answers(inputs)).any()
        assert bool(moved) is changes


def test_commuting_words_use_disjoint_pairs() -> None:
    task = make_task("swap-track", items=5, swaps=6, commute=True)
    words = task.pairs[task.sample(256, 0).inputs[:, :6] - 5]  # (n, swaps, 2)
    for word in words.tolist():
        used = {tuple(p) for p in word}
        touched = [i for p in used for i in p]
        assert len(touched) == len(set(touched)) and len(used) <= 2  # repeats, never overlaps


@pytest.mark.parametrize(
    "spec", [{"swaps": 2}, {"swaps": 4, "items": 4}, {"swaps": 3, "commute": True}]
)
def test_val_and_test_words_never_occur_in_train(spec: dict) -> None:
    task = make_task("swap-track", **spec)
    words = {
        split: {tuple(r) for r in task.sample(512, 0, split).inputs[:, : task.swaps].tolist()}
        for split in ("train", "val", "test")
    }
    assert words["val"] and words["test"]
    assert not words["train"] & (words["val"] | words["test"])
    words = task.sample(64, 0, "val").inputs[:, : task.swaps] - task.items  # pair indices
    assert set(content_split(words)) == {"val"}  # held out by the word alone


@pytest.mark.parametrize(
    "spec",
    [
        {"swaps": 1},
        {"swaps": 2},
        {"swaps": 4},
        {"swaps": 3, "items": 4},
        {"swaps": 2, "commute": True},
    ],
)
def test_shortcut_levels_are_the_guesses_accuracies_on_test(spec: dict) -> None:
    """Each level against the guess it names, computed here on the same test examples."""
    task = make_task("swap-track", **spec)
    data = task.sample(FLOOR_SAMPLE, 0, "test")
    L, n = task.swaps, task.items
    asked, answers = data.inputs[:, L:].tolist(), data.targets[:, L:].tolist()
    guesses = {"start": asked}
    if L > 1:
        last = [tuple(task.pairs[t - n].tolist()) for t in data.inputs[:, L - 1].tolist()]
        guesses["last swap"] = [
            [arrangement_after([p], n).index(q) for q in row]
            for p, row in zip(last, asked, strict=True)
        ]
    levels = task.shortcut_levels
    assert set(levels) == {"chance", *guesses} and levels["chance"] == 1 / n
    for name, guess in guesses.items():
        right = sum(
            g == a
            for gs, ans in zip(guess, answers, strict=True)
            for g, a in zip(gs, ans, strict=True)
        )
        assert levels[name] == pytest.approx(right / (len(answers) * n), abs=1e-6), name
    assert task.floor == max(levels.values()) < 1


@pytest.mark.parametrize("swaps", [3, 4, 6])
def test_shortcut_levels_match_the_closed_form_over_many_words(swaps: int) -> None:
    """An item is home after L random swaps of 5 with probability 1/5 + 4/5 · (1/2)^L."""
    home = [0.2 + 0.8 * 0.5**L for L in (swaps, swaps - 1)]
    for name in ("swap-track", "swap-track-depth"):
        task = make_task(name, **{"swaps" if name == "swap-track" else "depth": swaps})
        levels = task.shortcut_levels
        assert levels["start"] == pytest.approx(home[0], abs=0.02)
        assert levels["last swap"] == pytest.approx(home[1], abs=0.02)


def test_floors() -> None:
    assert make_task("swap-track", swaps=1).floor == pytest.approx(0.6)  # one swap moves 2 of 5
    assert make_task("swap-track", swaps=4).floor == pytest.approx(0.3, abs=0.01)  # last swap
    assert make_task("swap-track", items=3, swaps=6).floor == pytest.approx(1 / 3, abs=0.03)
    assert make_task("swap-track", commute=True, swaps=4).floor == pytest.approx(0.6, abs=0.02)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"swaps": 0}, "at least 1 swap"),
        ({"items": 2}, "items must be at least 3"),
        ({"items": 3, "commute": True}, "4 with commute"),
        ({"length": 7}, "length follows from the word"),
    ],
)
def test_bad_specs_raise(spec: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_task("swap-track", **spec)


# --- the vector twin: one swap per depth step


@pytest.mark.parametrize(
    ("name", "spec"),
    [
        ("swap-track", {"items": 4, "commute": True, "swaps": 6}),
        ("swap-track", {"items": 3, "swaps": 1}),
        ("swap-track-depth", {"items": 4, "commute": True, "depth": 6}),
        ("swap-track-depth", {"depth": 1}),
    ],
)
def test_check_task_on_variants(name: str, spec: dict) -> None:
    check_task(make_task(name, **spec))


@pytest.mark.parametrize("split", ["test", "long"])
def test_depth_twin_follows_the_queried_item_one_swap_per_step(split: str) -> None:
    task = make_task("swap-track-depth", depth=3)
    data = task.sample(64, 0, split)
    assert data.steps == (12 if split == "long" else 3)
    pairs = [tuple(p) for p in task.pairs.tolist()]
    for x, u, y, path in zip(
        data.inputs, data.controls, data.targets, data.trajectory, strict=True
    ):
        q = int(x.argmax())
        assert x.sum() == 1 and (u.sum(-1) == 1).all()
        word = [pairs[int(s)] for s in u.argmax(-1)]
        for step in range(data.steps + 1):
            at = arrangement_after(word[:step], task.items)
            assert int(path[step].argmax()) == at.index(q)
        assert torch.equal(y, path[-1])
    assert (data.step_regimes == REGIMES.index("reflection")).all()


def test_depth_twin_metric_reads_the_argmax() -> None:
    task = make_task("swap-track-depth")
    data = task.sample(1024, 0, "test")
    assert task.metric(data.targets + 0.3, data.targets) == 1.0
    assert task.metric(data.inputs, data.targets) == pytest.approx(
        task.shortcut_levels["start"], abs=0.04
    )


def test_a_reflection_per_step_solves_the_depth_twin() -> None:
    """The exact solution the hypothesis names: x <- (I - 2kk^T)x per step, k = (e_i - e_j)/√2
    from the control, solves the task; the same steps at beta = 1 do not."""
    task = make_task("swap-track-depth", depth=6)
    data = task.sample(256, 0, "test")
    k = torch.zeros(task.transpositions, task.items)
    k[torch.arange(task.transpositions)[:, None], task.pairs] = torch.tensor([1.0, -1.0])
    k = k / 2**0.5
    for beta, solves in ((2.0, True), (1.0, False)):
        x = data.inputs
        for u in data.controls.unbind(1):
            kl = u @ k
            x = x - beta * kl * (kl * x).sum(-1, keepdim=True)
        assert (task.metric(x, data.targets) == 1.0) is solves


# --- the Transformer Delta block's gate ceiling

TOKENS = torch.randint(0, 9, (3, 7), generator=torch.Generator().manual_seed(0))
SIZE = {"in_dim": 9, "out_dim": 9, "width": 16, "depth": 2, "heads": 2}


@pytest.mark.parametrize("name", ["ddl-transformer", "ddl-write-transformer"])
def test_beta_max_one_caps_every_gate_at_one(name: str) -> None:
    model = make_model(name, seed=0, **SIZE, beta_max=1.0, beta_init=0.5)
    with torch.no_grad():
        for block in model.blocks:
            for residual in block.residuals:
                residual.gate[-1].bias.fill_(30.0)  # sigma saturates: beta at its ceiling
    beta = model.probe(TOKENS).beta
    assert (beta <= 1.0).all() and beta.max() > 0.999


def test_beta_max_scales_the_gate_and_defaults_to_two() -> None:
    """Same weights, beta_max = 1: every gate is half the default's; the default is
    beta_max = 2, output for output."""
    default = make_model("ddl-transformer", seed=0, **SIZE)
    two = make_model("ddl-transformer", seed=0, **SIZE, beta_max=2.0)
    one = make_model("ddl-transformer", seed=0, **SIZE, beta_max=1.0, beta_init=0.5)
    assert torch.equal(default(TOKENS), two(TOKENS))
    one.load_state_dict(default.state_dict())
    torch.testing.assert_close(
        one.probe(TOKENS).beta[..., 0], default.probe(TOKENS).beta[..., 0] / 2, rtol=1e-6, atol=0
    )
    first = default.blocks[0].residuals[0]
    c = torch.randn(4, 16)
    torch.testing.assert_close(
        first.generators(c, c, c)[2], 2 * torch.sigmoid(first.gate(c)).squeeze(-1)
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"beta_max": 2.5}, "beta_max must lie in"),
        ({"beta_max": 1.0}, "initial gate 1.0 must lie strictly inside"),
    ],
)
def test_bad_beta_max_raises(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_model("ddl-transformer", **SIZE, **options)


def test_the_query_audit_counts_reflecting_gates_at_scored_tokens_only(tmp_path) -> None:
    """Planted probes: the Delta row reflects (β = 2) at attention sublayer 1 on every
    query token, and at sublayer 2 only on the word's tokens (not scored); its write-only
    twin never does. The audit reads 1 and 0 per sublayer; tokens from another seed refuse."""
    import numpy as np

    import ddl_dynamics as dd
    from ddl_dynamics.analysis.queries import query_gates
    from ddl_dynamics.analysis.run import load_run

    folder = dd.RunFolder.open(tmp_path, "w")
    spec = {"items": 3, "swaps": 2}
    task = make_task("swap-track", **spec)
    for model, family in (
        ("ddl-dv1", "ddl-transformer"),
        ("ddl-write-dv1", "ddl-write-transformer"),
    ):
        for seed in (0, 1):
            data = task.sample(16, seed, "test")
            queries = (data.targets != IGNORE_INDEX).numpy().reshape(-1)
            beta = np.zeros((queries.size, 4))
            if model == "ddl-dv1":
                beta[queries, 0] = 2.0
                beta[~queries, 1] = 2.0
            r = dd.RunResult(
                status="ok",
                message="",
                key=f"{model}-{seed}",
                task="swap-track",
                model=model,
                seed=seed,
                params=100,
                flops=1.0,
                wall_time=1.0,
                config={"task": "swap-track", "spec": spec, "model": family, "config": {}},
                metrics={"metric": "accuracy", "higher_is_better": True, "test": 0.5},
            )
            folder.store.put(r)
            for path in (folder.model_path(r.key), folder.probe_path(r.key)):
                path.parent.mkdir(exist_ok=True)
            folder.model_path(r.key).touch()
            np.savez(folder.probe_path(r.key), beta=beta, test_tokens=data.inputs.numpy())
    found = {a.model: a for a in query_gates(load_run(tmp_path))}
    assert {a.regime for a in found.values()} == {"reflection"}
    assert [e.mean for e in found["ddl-dv1"].shares] == [1.0, 0.0, 0.0, 0.0]
    assert [e.mean for e in found["ddl-write-dv1"].shares] == [0.0] * 4
    assert found["ddl-dv1"].shares[0].n == 2
    other = task.sample(16, 5, "test").inputs.numpy()
    np.savez(folder.probe_path("ddl-dv1-0"), beta=np.zeros((other.size, 4)), test_tokens=other)
    with pytest.raises(ValueError, match="not the test split of seed 0"):
        query_gates(load_run(tmp_path))
