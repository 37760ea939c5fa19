"""The per-member Dormand–Prince solver: torchdiffeq's dopri5, one step-size control per
ensemble member, so that a member integrates as it would alone."""

import numpy as np
import pytest
import torch
from torchdiffeq import odeint

import ddl_dynamics as dd
from ddl_dynamics.experiment.batches import fold_data
from ddl_dynamics.models.dopri5 import _MID, _STAGES, DENSE, SolverCapped, dopri5
from ddl_dynamics.models.ensemble import fold

ROWS, DIM = 5, 3


def fields(members: int, scale: float = 1.0, dtype=torch.float64):
    """``members`` fields ``y' = A_s tanh(y) + b_s``, growing stiffer with ``s``, and the
    one that applies member ``s``'s to its rows of a folded state."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(members, DIM, DIM, generator=gen, dtype=dtype) * scale
    a = a * torch.arange(1, members + 1, dtype=dtype)[:, None, None]
    b = torch.randn(members, 1, DIM, generator=gen, dtype=dtype)

    def folded(y):
        return (torch.tanh(y.view(members, ROWS, DIM)) @ a.mT + b).view(-1, DIM)

    return [lambda y, s=s: torch.tanh(y) @ a[s].T + b[s] for s in range(members)], folded


def start(members: int, dtype=torch.float64):
    return torch.randn(members * ROWS, DIM, generator=torch.Generator().manual_seed(1), dtype=dtype)


SOLVE = {"rtol": 1e-6, "atol": 1e-6, "first_step": 0.25, "max_steps": 1000}


def reference(field, y0, times):
    """torchdiffeq's dopri5 on one member alone, and its count of evaluations."""
    calls = []

    def f(t, y):
        calls.append(1)
        return field(y)

    options = {"first_step": SOLVE["first_step"], "max_num_steps": SOLVE["max_steps"]}
    states = odeint(
        f, y0, times, method="dopri5", rtol=SOLVE["rtol"], atol=SOLVE["atol"], options=options
    )
    return states, len(calls)


def test_dense_output_is_the_quartic_through_the_step():
    """Its weights give no change at x = 0, the solution at 1, Shampine's midpoint at 1/2,
    and the end slopes (the first and last stage) as derivatives."""

    def weights(x):
        return np.array([x, x**2, x**3, x**4]) @ DENSE

    np.testing.assert_allclose(weights(0.0), 0, atol=1e-15)
    np.testing.assert_allclose(weights(1.0), (*_STAGES[-1], 0.0), atol=1e-14)
    np.testing.assert_allclose(weights(0.5), _MID, atol=1e-14)
    slopes = np.arange(1, 5)[:, None] * DENSE  # d/dx of x^p is p x^(p-1)
    np.testing.assert_allclose(slopes.sum(0), np.eye(7)[6], atol=1e-13)
    np.testing.assert_allclose(slopes[0], np.eye(7)[0])


@pytest.mark.parametrize(
    "times", [[0.0, 0.3, 0.35, 1.0, 2.5], [2.0, 1.0, -0.5]], ids=["forward", "backward"]
)
def test_each_member_is_torchdiffeq_alone(times):
    """Same tableau, error norm, step-size rule and dense output: in float64 every member's
    states and evaluations are torchdiffeq's on that member alone (measured: 1e-13)."""
    members = 3
    alone, folded = fields(members)
    y0, times = start(members), torch.tensor(times, dtype=torch.float64)
    states, evaluations = dopri5(folded, y0, times, members=members, **SOLVE)
    assert states.shape == (len(times), members * ROWS, DIM)
    for s, (field, rows) in enumerate(zip(alone, y0.split(ROWS), strict=True)):
        want, calls = reference(field, rows, times)
        torch.testing.assert_close(states[:, s * ROWS : (s + 1) * ROWS], want, rtol=0, atol=1e-11)
        assert evaluations[s] == calls
    assert len(set(evaluations)) == members  # the stiffer, the more steps


def test_a_member_does_not_depend_on_its_ensemble():
    """In float32, a member's states and evaluations are the same alone and beside members
    that need many more steps, or one whose field blows up (whose states turn NaN)."""
    members = 3
    _, folded = fields(members, scale=3.0, dtype=torch.float32)

    def poisoned(y):  # member 2's slope is infinite once its state leaves the unit ball
        out = folded(y).view(members, ROWS, DIM).clone()
        out[2] = out[2] / (1 - y.view(members, ROWS, DIM)[2].norm()).clamp(min=0)
        return out.view(-1, DIM)

    y0, times = start(members, torch.float32), torch.linspace(0, 2, 5)
    states, evaluations = dopri5(poisoned, y0, times, members=members, **SOLVE)
    alone, _ = fields(members, scale=3.0, dtype=torch.float32)
    own, own_evaluations = dopri5(alone[0], y0[:ROWS], times, **SOLVE)
    torch.testing.assert_close(states[:, :ROWS], own, rtol=1e-6, atol=1e-6)
    assert evaluations[0] == own_evaluations[0] < evaluations[1]
    assert states[1:, 2 * ROWS :].isnan().all() and states[:, : 2 * ROWS].isfinite().all()


def test_closed_form_decay_within_the_tolerance():
    """``y' = −λ_s y``: every member lands on ``y0 e^{−λ_s t}`` within its tolerance."""
    rates = torch.tensor([0.5, 4.0, 20.0], dtype=torch.float64)
    per_row = rates.repeat_interleave(ROWS)[:, None]
    y0, times = start(3), torch.linspace(0, 1, 4, dtype=torch.float64)
    for tol in (1e-3, 1e-7):
        solve = {**SOLVE, "rtol": tol, "atol": tol}
        states, _ = dopri5(lambda y: -per_row * y, y0, times, members=3, **solve)
        exact = y0 * torch.exp(-per_row * times[:, None, None])
        assert (states - exact).abs().max() < 10 * tol


def test_gradients_are_torchdiffeqs_and_pass_gradcheck():
    """Backpropagation runs through the accepted steps and takes the step sizes as given,
    as torchdiffeq's does: its gradients are torchdiffeq's, and where the step sizes do not
    depend on the inputs (a tolerance so loose that every step is accepted and grows 10×)
    they are the solution's exact derivatives."""
    members = 2
    a = torch.randn(members, DIM, DIM, dtype=torch.float64, requires_grad=True)
    y0 = start(members).requires_grad_()
    times = torch.tensor([0.0, 0.3, 0.35, 1.0, 2.5], dtype=torch.float64)

    def solve(y0, a, tol=SOLVE["rtol"]):
        def f(y):
            return (torch.tanh(y.view(members, ROWS, DIM)) @ a.mT).view(-1, DIM)

        return dopri5(f, y0, times, members=members, **{**SOLVE, "rtol": tol, "atol": tol})[0]

    assert torch.autograd.gradcheck(lambda y0, a: solve(y0, a, tol=1e3), (y0, a))
    grads = torch.autograd.grad(solve(y0, a).square().sum(), (y0, a))
    for s in range(members):
        rows = y0[s * ROWS : (s + 1) * ROWS]
        want, _ = reference(lambda y, s=s: torch.tanh(y) @ a[s].T, rows, times)
        g_y0, g_a = torch.autograd.grad(want.square().sum(), (rows, a))
        torch.testing.assert_close(grads[0][s * ROWS : (s + 1) * ROWS], g_y0)
        torch.testing.assert_close(grads[1][s], g_a[s])


def test_a_member_out_of_steps_raises_what_the_trainer_caps_on():
    _, folded = fields(2, scale=5.0)
    with pytest.raises(SolverCapped, match="max_num_steps"):
        dopri5(
            folded,
            start(2),
            torch.tensor([0.0, 5.0], dtype=torch.float64),
            members=2,
            **{**SOLVE, "max_steps": 2},
        )


def test_a_folded_node_is_each_member_alone_and_near_torchdiffeq():
    """The model's own solver runs alone and folded alike (what the trainer's fold check
    compares); against torchdiffeq alone, in float32 at the default rtol = atol = 1e-3, a
    folded member's outputs agree to 1e-4 relative (measured ≤ 3e-5)."""
    task = dd.make_task("overwrite", depth=4)
    models = []
    for seed in range(3):
        torch.manual_seed(seed)
        model = dd.make_model(
            "node",
            in_dim=task.in_dim,
            out_dim=task.out_dim,
            control_dim=task.control_dim,
            width=8,
            depth=4,
            horizon=8.0,
        )
        with torch.no_grad():  # members of unequal stiffness take unequal steps
            model.layer(0).out.weight.mul_(1 + 4 * seed)
        models.append(model)
    parts = [task.sample(16, seed, "train") for seed in range(3)]
    ensemble = fold(models).module
    batch = fold_data(parts)
    out = ensemble(batch.inputs, u=batch.controls).unflatten(0, (3, -1))
    nfe = ensemble.nfe_forward
    assert ensemble.members == 3 and len(set(nfe)) == 3
    losses = [task.loss(o, part.targets) for o, part in zip(out, parts, strict=True)]
    sum(losses).backward()
    for s, (model, part, got) in enumerate(zip(models, parts, out, strict=True)):
        own = model(part.inputs, u=part.controls)
        torch.testing.assert_close(got, own, rtol=1e-6, atol=1e-6)
        assert model.nfe_forward == [nfe[s]]
        task.loss(own, part.targets).backward()  # through steps the others did not take
        for name, param in model.named_parameters():
            torch.testing.assert_close(
                ensemble.get_parameter(name).grad[s], param.grad, rtol=1e-4, atol=1e-5
            )
        model.solver = "torchdiffeq"
        want = model(part.inputs, u=part.controls)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
