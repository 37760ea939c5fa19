"""The one training step (the trainer's and the benchmarks'): each member's loss read back,
then the per-member AdamW step of the members still training, on its rate's schedule."""

import pytest
import torch

import ddl_dynamics as dd
from ddl_dynamics.experiment.batches import fold_data
from ddl_dynamics.experiment.optim import _lr_factor, make_optimizer
from ddl_dynamics.experiment.step import member_losses, predictor, training_step
from ddl_dynamics.models.ensemble import fold


def folded_pair():
    task = dd.make_task("overwrite", depth=3)
    models = [dd.make_model("resnet", in_dim=task.in_dim, out_dim=task.out_dim,
                            control_dim=task.control_dim, width=8, depth=3, seed=s)
              for s in (0, 1)]
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
