"""The built-in tasks: the interface on every one, then each task's own semantics."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from ddl_dynamics.tasks import switched
from scipy.integrate import solve_ivp
from torchdiffeq import odeint

import ddl_dynamics as dd
from ddl_dynamics import (
    REGIMES,
    Subject,
    Task,
    TaskData,
    check_task,
    list_tasks,
    make_model,
    make_task,
    split_generator,
)
from ddl_dynamics._task import LONG_FACTOR, MAX_OVERLAP, content_overlap
from ddl_dynamics.experiment.splits import TaskDataError

NAMES = list_tasks()
N = 64


@pytest.fixture(params=NAMES, ids=NAMES)
def task(request: pytest.FixtureRequest) -> Task:
    return make_task(request.param)


def tensors(data: TaskData) -> list[torch.Tensor | None]:
    return [data.inputs, data.targets, data.controls, data.trajectory]


def test_check_task(task: Task) -> None:
    said = check_task(task)  # says that it passed, and what it checked
    assert said.startswith(f"{type(task).__name__}: ok (") and "content shared with train" in said


@pytest.mark.parametrize(
    "name, spec",
    [
        ("sign-flip", {"variant": "reflect"}),
        ("sign-flip", {"variant": "conditional"}),
        ("overwrite", {"per_step": True}),
        ("depth-recall", {"read": "query"}),
        ("nested-spheres", {"dim": 3}),
        ("switched", {"p": 0.0, "event": "overwrite"}),
        ("switched", {"p": 1.0, "event": "reflect", "dim": 2}),
    ],
)
def test_check_task_on_variants(name: str, spec: dict) -> None:
    check_task(make_task(name, **spec))


def test_describes_itself(task: Task) -> None:
    assert task.regime and type(task).__doc__.strip().splitlines()[0]


def test_expectations_compare_buildable_models_on_a_split(task: Task) -> None:
    dims = {"in_dim": task.in_dim, "out_dim": task.out_dim, "control_dim": task.control_dim}
    for e in task.expectations:
        assert e.reason and e.split in task.splits
        assert e.split == "test" or e.requires is not None  # OOD: succeed in distribution first
        subjects = [e.model, e.control] if isinstance(e.control, Subject) else [e.model]
        assert isinstance(e.control, Subject) or e.control > 0  # else an analytic bound
        for subject in subjects:
            make_model(subject.family, **dims, depth=task.depth, **subject.options)


def test_sampler_is_a_function_of_the_seed(task: Task) -> None:
    for split in task.splits:
        a, b = task.sample(N, 3, split), task.sample(N, 3, split)
        for x, y in zip(tensors(a), tensors(b), strict=True):
            assert (x is None and y is None) or torch.equal(x, y)
        assert not torch.equal(a.inputs, task.sample(N, 4, split).inputs)


def test_splits_differ(task: Task) -> None:
    data = [task.sample(N, 0, split) for split in task.splits]
    for i, a in enumerate(data):
        for b in data[i + 1 :]:
            assert not torch.equal(a.inputs, b.inputs)


def test_split_steps(task: Task) -> None:
    for split in task.splits:
        data = task.sample(4, 0, split)
        if task.kind == "sequence":  # steps are the sequence length
            want = data.inputs.shape[1]
        else:
            want = task.depth * (LONG_FACTOR if split == "long" else 1)
        assert data.steps == task.split_steps(split) == want
    with pytest.raises(ValueError, match="no split 'nope'"):
        task.sample(4, 0, "nope")


def one_hot(task: Task, ids: torch.Tensor) -> torch.Tensor:
    """Logits that pick class ``ids`` (clipped into range; unscored positions pick 0)."""
    return F.one_hot(ids.clamp(0, task.out_dim - 1), task.out_dim).float()


def trivial_predictions(task: Task, data: TaskData) -> list[torch.Tensor]:
    """Predict zero, and predict the input (held constant over the steps); for sequences,
    class 0 everywhere, and a copy of the input token."""
    if task.kind == "sequence":
        return [one_hot(task, torch.zeros_like(data.inputs)), one_hot(task, data.inputs)]
    guesses = [torch.zeros_like(data.targets)]
    if task.in_dim >= task.out_dim:
        held = data.inputs[:, : task.out_dim]
        guesses.append(held if task.supervise == "final" else held[:, None].expand_as(data.targets))
    return guesses


def test_metric_separates_perfect_from_trivial(task: Task) -> None:
    data = task.sample(512, 0, "test")
    if task.metric_name == "accuracy":
        perfect = one_hot(task, data.targets) if task.kind == "sequence" else 2 * data.targets - 1
        assert task.metric(perfect, data.targets) == 1.0
        for guess in trivial_predictions(task, data):
            assert task.metric(guess, data.targets) < 0.8
    elif task.metric_name == "bpc":  # bits per character: 0 for sure logits, > 1 for guesses
        assert task.metric(100 * one_hot(task, data.targets), data.targets) < 1e-6
        for guess in trivial_predictions(task, data):
            assert task.metric(guess, data.targets) > 1.0
    else:
        assert task.metric(data.targets.clone(), data.targets) == 0.0
        assert 0.05 < data.targets.square().mean() < 5  # O(1) targets
        for guess in trivial_predictions(task, data):
            assert task.metric(guess, data.targets) > 0.05


def test_make_task_overrides_and_rejects_unknown_options() -> None:
    task = make_task("parity", depth=12)
    assert task.depth == 12 and task.sample(4, 0).steps == 12
    assert task.sample(4, 0, "long").controls.shape == (4, 12 * LONG_FACTOR, 1)
    with pytest.raises(ValueError, match=r"no option 'depht'.*Did you mean 'depth'"):
        make_task("parity", depht=12)
    with pytest.raises(ValueError, match="unknown task"):
        make_task("partiy")


@pytest.mark.parametrize(
    "name, spec",
    [
        ("sign-flip", {"variant": "2d"}),
        ("sign-flip", {"dim": 0}),
        ("oscillator", {"horizon": 0}),
        ("overwrite", {"slots": 0}),
        ("depth-recall", {"value_dim": 0}),
        ("depth-recall", {"read": "all"}),
        ("nested-spheres", {"dim": 0}),
        ("switched", {"p": 1.5}),
        ("switched", {"event": "erase"}),
        ("switched", {"dim": 3}),
    ],
)
def test_bad_spec_values_raise(name: str, spec: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(spec))):
        make_task(name, **spec)


# --- depth is time


@pytest.mark.parametrize("name", ["oscillator", "damped-oscillator", "van-der-pol"])
def test_flow_targets_are_the_trajectory_after_t0(name: str) -> None:
    task = make_task(name)
    for split in task.splits:
        data = task.sample(N, 0, split)
        assert torch.equal(data.targets, data.trajectory[:, 1:])
        torch.testing.assert_close(data.trajectory[:, 0], data.inputs[:, :2])


def test_oscillator_is_the_closed_form_on_a_fixed_time_grid() -> None:
    task = make_task("oscillator", depth=4, horizon=2.0)
    data = task.sample(N, 0, "long")
    q0, p0, omega = (c[:, None].double() for c in data.inputs.unbind(-1))
    t = torch.arange(1, data.steps + 1, dtype=torch.float64) * 0.5  # h = T / depth everywhere
    q = q0 * torch.cos(omega * t) + p0 / omega * torch.sin(omega * t)
    p = p0 * torch.cos(omega * t) - q0 * omega * torch.sin(omega * t)
    torch.testing.assert_close(data.targets.double(), torch.stack([q, p], -1), atol=1e-6, rtol=0)


def energy(states: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
    """½(p² + ω²q²) of states ``(n, T, 2)``, ``omega`` ``(n, 1)``."""
    return 0.5 * (states[..., 1] ** 2 + (omega * states[..., 0]) ** 2)


def test_oscillator_conserves_energy_and_reports_drift() -> None:
    task = make_task("oscillator")
    data = task.sample(N, 0, "long")
    e = energy(data.trajectory, data.inputs[:, 2:3])  # (n, steps + 1)
    torch.testing.assert_close(e, e[:, :1].expand_as(e), rtol=1e-5, atol=0)
    assert task.extra_metrics(data.targets, data)["energy_drift"] < 1e-5
    assert task.extra_metrics(1.1 * data.targets, data)["energy_drift"] == pytest.approx(0.21)


def test_damped_oscillator_matches_a_numerical_solution_and_decays() -> None:
    task = make_task("damped-oscillator")
    state0 = torch.tensor([[1.0, 0.5], [-0.3, 0.8]], dtype=torch.float64)
    params = torch.tensor([[0.7, 0.1], [1.3, 0.3]], dtype=torch.float64)  # (ω, ζ)
    t = torch.linspace(0, 6, 13, dtype=torch.float64)
    exact = task.solve(state0, params, t)
    for (w, z), y0, want in zip(params.tolist(), state0.numpy(), exact.numpy(), strict=True):
        sol = solve_ivp(
            lambda _, y, w=w, z=z: [y[1], -(w**2) * y[0] - 2 * z * w * y[1]],
            (0, 6),
            y0,
            t_eval=t.numpy(),
            rtol=1e-11,
            atol=1e-11,
        )
        np.testing.assert_allclose(want, sol.y.T, atol=1e-8)
    data = task.sample(N, 0, "long")
    assert (energy(data.trajectory, data.inputs[:, 2:3]).diff(dim=1) < 0).all()


def test_van_der_pol_matches_an_independent_integrator_and_reaches_the_limit_cycle() -> None:
    task = make_task("van-der-pol", depth=100, horizon=25.0)
    data = task.sample(8, 0)
    mu = data.inputs[:, 2].double()

    def field(_: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.stack([y[:, 1], mu * (1 - y[:, 0] ** 2) * y[:, 1] - y[:, 0]], dim=-1)

    t = torch.linspace(0, 25.0, 101, dtype=torch.float64)
    rk4 = odeint(field, data.inputs[:, :2].double(), t, method="rk4", options={"step_size": 1e-2})
    torch.testing.assert_close(data.trajectory.double(), rk4.transpose(0, 1), atol=1e-5, rtol=0)
    amplitude = data.trajectory[:, -40:, 0].abs().amax(dim=1)  # ≈ 2 for every μ
    torch.testing.assert_close(amplitude, torch.full_like(amplitude, 2.0), atol=0.05, rtol=0)


# --- reflection, projection, parity, recall, spheres


def test_sign_flip_variants() -> None:
    flip = make_task("sign-flip")
    data = flip.sample(N, 0)
    assert torch.equal(data.targets, -data.inputs)
    assert data.inputs.abs().min() >= 0.5 and data.inputs.abs().max() <= 1.5
    assert flip.model_defaults["width"] == 1
    assert {e.model.family for e in flip.expectations} >= {"node"}

    reflect = make_task("sign-flip", variant="reflect", dim=3)
    data = reflect.sample(N, 0)
    x, n = data.inputs.split(3, dim=-1)
    torch.testing.assert_close(n.norm(dim=-1), torch.ones(N))
    torch.testing.assert_close(data.targets.norm(dim=-1), x.norm(dim=-1))  # an isometry
    torch.testing.assert_close((data.targets * n).sum(-1), -(x * n).sum(-1))  # flips along n
    assert reflect.expectations == () and reflect.model_defaults == {}

    data = make_task("sign-flip", variant="conditional", dim=3).sample(N, 0)
    x, flag = data.inputs[:, :3], data.inputs[:, 3:]
    assert set(flag.flatten().tolist()) == {0.0, 1.0}
    assert torch.equal(data.targets, torch.where(flag > 0, -x, x))


@pytest.mark.parametrize("per_step", [False, True])
def test_overwrite_target_replays_the_writes(per_step: bool) -> None:
    task = make_task("overwrite", slots=3, depth=6, per_step=per_step)
    data = task.sample(N, 0)
    for i in range(N):
        registers, history = data.inputs[i].tolist(), []
        for control in data.controls[i]:
            assert control[:3].sum() == 1
            registers[int(control[:3].argmax())] = control[3].item()
            history.append(list(registers))
        want = torch.tensor(history if per_step else history[-1])
        assert torch.equal(data.targets[i], want)
    assert task.supervise == ("trajectory" if per_step else "final")


# --- the switched system: a smooth flow, or with probability p an event

PROJECTION, REFLECTION = REGIMES.index("projection"), REGIMES.index("reflection")


def replay_switched(x: torch.Tensor, controls: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
    """The trajectory the controls describe, step by step and sample by sample."""
    states = [x]
    for control in controls:
        overwrite, reflect, n, c = control[0], control[1], control[2:-1], control[-1]
        if overwrite:
            x = x + n * (c - n @ x)
        elif reflect:
            x = x - 2 * (n @ x) * n
        else:
            x = flow @ x
        states.append(x)
    return torch.stack(states)


@pytest.mark.parametrize("event", ["overwrite", "reflect", "mixed"])
@pytest.mark.parametrize("p", [0.0, 0.3, 1.0])
def test_switched_trajectory_follows_its_controls(event: str, p: float) -> None:
    task = make_task("switched", p=p, event=event, dim=4, depth=6)
    data = task.sample(N, 0)
    flow = switched.flow_map(4)
    assert data.targets.shape == (N, 6, 4) and data.controls.shape == (N, 6, 7)
    for i in range(N):
        want = replay_switched(data.inputs[i], data.controls[i], flow)
        torch.testing.assert_close(data.trajectory[i], want, rtol=0, atol=1e-5)
    torch.testing.assert_close(data.targets, data.trajectory[:, 1:])
    overwrite, reflect = data.controls[..., 0] == 1, data.controls[..., 1] == 1
    happens = overwrite | reflect
    assert not (overwrite & reflect).any()
    # p = 0 is a pure flow, p = 1 an event at every step; event kinds as asked
    assert (
        happens.all()
        if p == 1
        else (not happens.any() if p == 0 else 0 < happens.float().mean() < 1)
    )
    assert not (
        reflect.any() if event == "overwrite" else overwrite.any() if event == "reflect" else False
    )
    # the events' regimes, and a control that is zero on every flow step
    want = torch.where(overwrite, PROJECTION, torch.where(reflect, REFLECTION, -1))
    assert torch.equal(data.step_regimes, want)
    assert (data.controls[~happens] == 0).all()
    assert (data.controls[reflect][:, -1] == 0).all()
    torch.testing.assert_close(
        data.controls[happens][:, 2:-1].norm(dim=-1), torch.ones(int(happens.sum()))
    )


def test_switched_events_overwrite_or_reflect_the_readout_along_n() -> None:
    data = make_task("switched", p=1.0, event="mixed", dim=4).sample(N, 0)
    before, after = data.trajectory[:, :-1], data.trajectory[:, 1:]
    n, c = data.controls[..., 2:-1], data.controls[..., -1]
    readout = (n * before).sum(-1), (n * after).sum(-1)
    overwrite, reflect = data.controls[..., 0] == 1, data.controls[..., 1] == 1
    torch.testing.assert_close(readout[1][overwrite], c[overwrite])
    torch.testing.assert_close(readout[1][reflect], -readout[0][reflect])
    torch.testing.assert_close(after[reflect].norm(dim=-1), before[reflect].norm(dim=-1))
    # the rest of the state is untouched: only the component along n changes
    kept = after - readout[1][..., None] * n - (before - readout[0][..., None] * n)
    torch.testing.assert_close(kept, torch.zeros_like(kept))
    assert 0.4 < reflect.float().mean() < 0.6


def test_switched_rates_and_positions_share_one_draw_across_settings() -> None:
    """The same seed puts events at the same steps for every event kind, and a larger p
    keeps every event of a smaller one: settings differ only in what they vary."""
    rate = {
        p: make_task("switched", p=p, event="reflect").sample(512, 3).controls[..., 1] == 1
        for p in (0.05, 0.25, 0.5)
    }
    assert (rate[0.05] <= rate[0.25]).all() and (rate[0.25] <= rate[0.5]).all()
    for p, events in rate.items():
        assert abs(events.float().mean().item() - p) < 0.02
    overwrite = make_task("switched", p=0.25, event="overwrite").sample(512, 3).controls
    assert torch.equal(overwrite[..., 0] == 1, rate[0.25])


def test_switched_flow_is_a_damped_rotation_of_each_plane() -> None:
    flow = switched.flow_map(4).double()
    scale = math.exp(-switched.DAMPING)
    torch.testing.assert_close(flow @ flow.T, scale**2 * torch.eye(4, dtype=torch.float64))
    angles = [math.atan2(flow[1, 0], flow[0, 0]), math.atan2(flow[3, 2], flow[2, 2])]
    assert angles == pytest.approx(list(switched.ANGLES))
    assert flow[:2, 2:].abs().max() == 0 and flow[2:, :2].abs().max() == 0


def test_switched_states_its_hypotheses_by_p() -> None:
    claims = {
        p: {
            (str(e.model), e.relation, str(e.control))
            for e in make_task("switched", p=p).expectations
        }
        for p in (0.0, 0.5, 1.0)
    }
    assert ("ddl", "worse", "resnet") in claims[0.0]
    assert ("ddl (context='control')", "worse", "resnet") in claims[0.0]
    assert claims[0.5] == set()
    assert {("ddl", "better", "resnet"), ("ddl", "better", "ddl-write")} <= claims[1.0]
    assert make_task("switched", p=0).regimes == ()
    assert make_task("switched", p=1, event="mixed").regimes == ("projection", "reflection")


def test_every_split_is_held_out_from_train_by_content(task: Task) -> None:
    for split in ("val", "test"):
        assert content_overlap(task, split, n=512) <= MAX_OVERLAP


def test_parity_holds_whole_sequences_out_even_when_train_sees_every_one() -> None:
    task = make_task("parity")  # depth 8: 2⁹ = 512 sequences
    assert task.splits[:3] == ("train", "val", "test")
    train = task.sample(4096, 0, "train")
    assert len(torch.cat([train.inputs, train.controls[..., 0]], 1).unique(dim=0)) < 512 * 0.8
    for split in ("val", "test"):
        assert content_overlap(task, split, n=4096) == 0.0
        for seed in (1, 2):  # a content's split is the same for every seed
            assert content_overlap(task, split, n=1024, seed=seed) == 0.0
    assert 0.3 < task.sample(1024, 0, "test").targets[:, -1].mean() < 0.7  # both labels
    long = task.sample(256, 0, "long")
    assert long.steps == 8 * LONG_FACTOR  # new by length, drawn from every sequence


class AllSequencesParity(type(make_task("parity"))):
    """Parity as it was sampled before content was held out: any sequence in any split."""

    def sample(self, n: int, seed: int, split: str = "train") -> TaskData:
        steps = self.split_steps(split)
        bits = torch.randint(0, 2, (n, steps + 1, 1), generator=split_generator(seed, split))
        parity = (bits.cumsum(dim=1) % 2).float()
        return TaskData(
            inputs=bits[:, 0].float(),
            targets=parity[:, 1:],
            steps=steps,
            controls=bits[:, 1:].float(),
        )


def test_check_task_catches_test_examples_seen_in_training() -> None:
    leaky = AllSequencesParity()
    assert content_overlap(leaky, "test", n=4096) == 1.0  # 4096 draws cover all 512
    with pytest.raises(ValueError, match=r"of val examples also occur in train"):
        check_task(leaky)
    check_task(AllSequencesParity(depth=40))  # a space too large to repeat itself


def test_an_overlap_only_run_sizes_reveal_fails_the_cell_as_the_tasks() -> None:
    """2¹⁵ sequences drawn without holding any out: 256 draws per split rarely collide, so
    check_task passes; 4096 training draws cover an eighth of the space, so about a tenth
    of the test sequences were trained on. Training checks at its own sizes and seeds."""
    leaky = AllSequencesParity(depth=14)
    check_task(leaky)
    assert content_overlap(leaky, "test", n=4096) > 0.05
    cell = dd.expand_cells(
        dd.parse_experiment(
            {
                "tasks": [{"name": "parity", "spec": {"depth": 14}}],
                "models": [{"name": "resnet"}],
                "defaults": {"model": {"width": 4, "hidden": 4}, "train": {"steps": 2}},
            }
        )
    )[0]
    with pytest.raises(
        TaskDataError,
        match=r"of the val examples for seed 0 also occur among "
        r"its 4096 training examples",
    ):
        dd.train(leaky, cell.build()[1], cell.train, seed=0)


def test_held_out_fails_clearly_when_the_space_is_too_small() -> None:
    with pytest.raises(ValueError, match="too small to hold out"):
        make_task("parity", depth=1).sample(8, 0, "val")


def test_parity_target_is_the_running_xor_and_the_metric_scores_the_last_bit() -> None:
    task = make_task("parity", depth=10)
    data = task.sample(N, 0)
    for i in range(N):
        bit = int(data.inputs[i, 0])
        for step in range(10):
            bit ^= int(data.controls[i, step, 0])
            assert data.targets[i, step, 0] == bit
    logits = 2 * data.targets - 1
    logits[:, :-1] *= -1  # wrong on every step but the last
    assert task.metric(logits, data.targets) == 1.0
    assert task.extra_metrics(logits, data)["step_accuracy"] == pytest.approx(0.1)


def replay_memory(memory: list[list[float]], key: torch.Tensor, value: torch.Tensor) -> None:
    """Write ``value`` under the unit ``key``: replace the memory's component along it."""
    for column, v in enumerate(value.tolist()):
        old = sum(k * row[column] for k, row in zip(key.tolist(), memory, strict=True))
        for k, row in zip(key.tolist(), memory, strict=True):
            row[column] += k * (v - old)


@pytest.mark.parametrize("read", ["memory", "query"])
def test_depth_recall_holds_the_latest_value_of_every_key(read: str) -> None:
    d, dv = 3, 2
    task = make_task("depth-recall", key_dim=d, value_dim=dv, depth=9, read=read)
    data = task.sample(N, 0)
    writes = data.controls if read == "memory" else data.controls[:, :-1]
    keys = writes[..., :d]
    gram = keys @ keys.transpose(1, 2)
    assert torch.allclose(gram.abs().round(), gram, atol=1e-5)  # orthonormal keys, repeated
    assert (gram.abs().round().sum((1, 2)) > writes.shape[1]).all()
    for i in range(N):
        memory = data.inputs[i].reshape(d, dv).tolist()
        for control in writes[i]:
            replay_memory(memory, control[:d], control[d : d + dv])
        memory = torch.tensor(memory)
        if read == "memory":
            want = memory.flatten()
        else:
            assert torch.equal(writes[i, :, -1], torch.zeros(8)) and data.controls[i, -1, -1] == 1
            query = data.controls[i, -1, :d]
            want = query @ memory
            stored = [c[d : d + dv] for c in writes[i] if torch.allclose(c[:d], query, atol=1e-6)]
            if stored:  # a written key returns the last value written under it
                torch.testing.assert_close(data.targets[i], stored[-1], atol=1e-5, rtol=0)
        torch.testing.assert_close(data.targets[i], want, atol=1e-5, rtol=0)
        torch.testing.assert_close(data.trajectory[i, -1], memory.flatten(), atol=1e-5, rtol=0)
    assert task.model_defaults == {"value_channels": dv}


@pytest.mark.parametrize("dim", [2, 3])
def test_nested_spheres_radii(dim: int) -> None:
    task = make_task("nested-spheres", dim=dim)
    data = task.sample(1024, 0)
    r, inner = data.inputs.norm(dim=-1), data.targets[:, 0] == 1
    assert r[inner].max() <= 0.5 + 1e-6
    assert r[~inner].min() >= 1.0 - 1e-6 and r[~inner].max() <= 1.5 + 1e-6
    assert 0.4 < inner.float().mean() < 0.6
    # Uniform in volume: the median inner radius is 0.5 · 2^(-1/dim).
    assert r[inner].median() == pytest.approx(0.5 * 2 ** (-1 / dim), abs=0.03)
    assert task.model_defaults == {"encoder": "identity", "width": dim}


def test_training_data_keeps_what_a_step_reads_and_drops_the_ground_truth():
    data = dd.make_task("switched").sample(16, 0, "train")
    assert data.trajectory is not None and data.step_regimes is not None
    lean = data.for_training()
    assert lean.trajectory is None and lean.step_regimes is None
    for name in ("inputs", "targets", "controls"):
        assert getattr(lean, name) is getattr(data, name)
    assert lean.steps == data.steps
