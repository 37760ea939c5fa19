"""The one training step (the trainer's and the benchmarks'): each member's loss read back,
then the per-member AdamW step of the members still training, on its rate's schedule."""

import dataclasses

import pytest
import torch

import ddl_dynamics as dd
from ddl_dynamics.experiment import step as step_module
from ddl_dynamics.experiment.batches import fold_data
from ddl_dynamics.experiment.config import Cell
from ddl_dynamics.experiment.optim import _lr_factor, make_optimizer
from ddl_dynamics.experiment.step import member_losses, predictor, training_step
from ddl_dynamics.models.ensemble import fold


def folded_pair():
    task = dd.make_task("overwrite", depth=3)
    models = [
        dd.make_model(
            "resnet",
            in_dim=task.in_dim,
            out_dim=task.out_dim,
            control_dim=task.control_dim,
            width=8,
            depth=3,
            seed=s,
        )
        for s in (0, 1)
    ]
    ensemble = fold(models)
    assert ensemble is not None and ensemble.size == 2
    return task, ensemble, fold_data([task.sample(16, s, "train") for s in (0, 1)])


def members_weights(ensemble):
    """Each member's parameters, flattened: row ``s`` is member ``s``'s."""
    return torch.cat([p.detach().reshape(2, -1) for p in ensemble.module.parameters()], 1)


def test_the_step_returns_each_members_loss_and_moves_only_the_members_kept():
    task, ensemble, batch = folded_pair()
    optimizer, cfg = make_optimizer(ensemble.module), dd.TrainConfig(steps=10)
    with torch.no_grad():
        expected = member_losses(ensemble.module, task, batch, predictor(task, False), 2)
    before, seen = members_weights(ensemble), []

    def keep(losses):
        seen.append(losses)
        return [True, False]

    losses = training_step(ensemble, optimizer, task, batch, cfg, keep=keep)
    assert losses == seen[0] and losses == pytest.approx(expected.tolist())
    after = members_weights(ensemble)
    assert (after[0] - before[0]).abs().max() > 1e-5  # member 0 stepped
    torch.testing.assert_close(after[1], before[1], rtol=0, atol=1e-7)  # member 1 frozen
    # no member kept: no step
    training_step(ensemble, optimizer, task, batch, cfg, 1, keep=lambda losses: [False] * 2)
    assert torch.equal(members_weights(ensemble), after)


def test_the_step_takes_each_members_own_config():
    task, ensemble, batch = folded_pair()
    before = members_weights(ensemble)
    cfgs = [dd.TrainConfig(steps=10, lr=1e-2), dd.TrainConfig(steps=10, lr=1e-4)]
    training_step(ensemble, make_optimizer(ensemble.module), task, batch, cfgs)
    moved = (members_weights(ensemble) - before).abs().max(dim=1).values
    assert moved[0] > 10 * moved[1] > 0  # AdamW's step is linear in the rate


def test_schedule_warms_up_then_decays_to_zero():
    factor = _lr_factor(dd.TrainConfig(steps=100, warmup=0.1))
    assert factor(0) == pytest.approx(0.1) and factor(9) == pytest.approx(1.0)
    assert factor(10) == pytest.approx(1.0) and factor(100) == pytest.approx(0.0)
    assert all(factor(s) >= factor(s + 1) for s in range(10, 100))
    assert _lr_factor(dd.TrainConfig(steps=100, warmup=20))(19) == pytest.approx(1.0)


def folded_transformers(size=2):
    """A folded pair of small Transformers with the depth study's attention options, and a
    var-chain batch per member."""
    task = dd.make_task("var-chain", hops=1)
    models = [
        dd.make_model(
            "ddl-transformer",
            in_dim=task.in_dim,
            out_dim=task.out_dim,
            width=8,
            depth=1,
            heads=2,
            qk_norm=True,
            norm_eps=1e-5,
            compressor_init="random",
            value_channels=2,
            seed=s,
        )
        for s in range(size)
    ]
    return task, models, fold_data([task.sample(8, s, "train") for s in range(size)])


def steps_of(compile, steps=3):
    task, models, batch = folded_transformers()
    ensemble = fold(models)
    optimizer = make_optimizer(ensemble.module)
    cfg = dd.TrainConfig(steps=10, compile=compile)
    losses = [training_step(ensemble, optimizer, task, batch, cfg, i) for i in range(steps)]
    return losses, members_weights(ensemble)


@pytest.mark.slow  # compiling takes 20-40 s cold
def test_compiled_steps_agree_with_eager_ones_from_the_same_init():
    eager_losses, eager_weights = steps_of(False)
    compiled_losses_, compiled_weights = steps_of(True)
    assert step_module.compiled_losses.losses is not None  # it did compile
    assert not step_module.compiled_losses.failed
    torch.testing.assert_close(
        torch.tensor(compiled_losses_), torch.tensor(eager_losses), rtol=1e-5, atol=1e-6
    )
    torch.testing.assert_close(compiled_weights, eager_weights, rtol=1e-4, atol=1e-5)


def test_compile_falls_back_to_eager_with_a_warning_where_no_compiler_is_found(monkeypatch):
    monkeypatch.setattr(torch._inductor.config.cpp, "cxx", ("/nonexistent/c++",))
    monkeypatch.setattr(step_module, "compiled_losses", step_module._Compiled())
    eager_losses, eager_weights = steps_of(False, steps=2)
    with pytest.warns(step_module.CompileWarning, match="no C\\+\\+ compiler"):
        losses, weights = steps_of(True, steps=2)
    assert step_module.compiled_losses.failed and step_module.compiled_losses.losses is None
    assert losses == eager_losses and torch.equal(weights, eager_weights)


def test_an_eager_cell_keeps_its_key_and_a_compiled_one_has_its_own():
    cell = Cell(
        task="overwrite",
        task_label="overwrite",
        spec={},
        model="resnet",
        label="resnet",
        config={},
        train=dd.TrainConfig(),
        seed=0,
    )
    assert "compile" not in cell.to_dict()["train"]  # the key from before the field
    compiled = dataclasses.replace(cell, train=dd.TrainConfig(compile=True))
    assert compiled.to_dict()["train"]["compile"] is True and compiled.key != cell.key
    assert Cell.from_dict(compiled.to_dict()) == compiled and Cell.from_dict(cell.to_dict()) == cell


@pytest.mark.parametrize("name", ["var-chain", "overwrite", "parity"])  # ce, mse, bce
def test_members_losses_at_once_are_each_members_own_loss(name):
    """All members' losses in one batched computation equal each member's ``loss`` on its own
    rows; a task that overrides ``loss`` is served member by member."""
    task = dd.make_task(name)
    data = task.sample(3 * 8, 0, "train")
    g = torch.Generator().manual_seed(0)
    shape = (*data.targets.shape, task.out_dim) if task.loss_name == "ce" else data.targets.shape
    preds = torch.randn(shape, generator=g, dtype=torch.float64).unflatten(0, (3, -1))
    targets = data.targets.unflatten(0, (3, -1))
    targets = targets if task.loss_name == "ce" else targets.double()
    each = torch.stack([task.loss(p, t) for p, t in zip(preds, targets, strict=True)])
    torch.testing.assert_close(task.member_losses(preds, targets), each)

    class Halved(type(task)):
        def loss(self, pred, target):
            return super().loss(pred, target) / 2

    halved = Halved(**{f.name: getattr(task, f.name) for f in dataclasses.fields(task)})
    torch.testing.assert_close(halved.member_losses(preds, targets), each / 2)
