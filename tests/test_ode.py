"""Neural ODE families: time grid, controls, NFE accounting, adjoint, reconstruction check."""

import pytest
import torch

from ddl_dynamics import make_model

BASE = {"in_dim": 3, "out_dim": 2, "width": 6, "depth": 4, "hidden": 16}


def ode(name: str = "node", **options):
    torch.manual_seed(0)
    return make_model(name, **{**BASE, **options})


def test_ode_models_are_always_tied_and_extrapolate():
    m = ode(tied=False)
    assert m.tied and m.can_extrapolate and len(m.layers) == 1
    x = torch.randn(3, 3)
    assert m.trajectory(x, steps=16).shape == (3, 17, 6)
    assert m(x, steps=16, per_step=True).shape == (3, 16, 2)


def test_steps_span_horizon_over_depth_each():
    """depth 4 over T=2 and depth 2 over T=1 put their steps at the same times."""
    long, short = ode(horizon=2.0, rtol=1e-8, atol=1e-8), ode(depth=2, rtol=1e-8, atol=1e-8)
    x = torch.randn(5, 3)
    torch.testing.assert_close(long.trajectory(x), short.trajectory(x, steps=4), atol=1e-5, rtol=0)
    # four times the depth integrates to four times the horizon, through the same states
    torch.testing.assert_close(
        long.trajectory(x, steps=16)[:, :5], long.trajectory(x), atol=1e-5, rtol=0
    )


def test_euler_node_is_a_tied_resnet_with_step_t_over_depth():
    """Fixed-grid methods take one step per depth step; the control of step l holds on
    [t_l, t_{l+1})."""
    node = ode(method="euler", horizon=2.0, control_dim=2)
    resnet = make_model("resnet", **BASE, control_dim=2, tied=True, step_size=0.5)
    resnet.load_state_dict(node.state_dict())
    x, u = torch.randn(3, 3), torch.randn(3, 8, 2)
    torch.testing.assert_close(node.trajectory(x, u), resnet.trajectory(x, u))


def test_gradcheck_vector_field_and_short_forward():
    m = ode(method="rk4", control_dim=2, depth=2).double()
    z = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
    u = torch.randn(2, 2, 2, dtype=torch.float64, requires_grad=True)
    field = m.layer(0)
    assert torch.autograd.gradcheck(lambda z, c: field(torch.cat([z, c], -1)), (z, u[:, 0]))
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, u: m(x, u, per_step=True), (x, u))


def test_nfe_is_counted_and_grows_as_rtol_shrinks():
    x = torch.randn(16, 3)
    counts = []
    for tol in (1e-2, 1e-6):
        m = ode(rtol=tol, atol=tol, horizon=3.0)
        m(x)
        counts += m.nfe_forward  # one count per member; a model alone is one member
        assert m.nfe_backward == [0]
        m.reset_nfe()
        assert m.nfe_forward == [0]
    assert 0 < counts[0] < counts[1]


def test_adjoint_backward_costs_evaluations_and_matches_direct_backprop():
    x = torch.randn(8, 3)
    grads, backward_nfe = {}, {}
    for adjoint in (False, True):
        m = ode("anode", augment_dim=2, adjoint=adjoint, rtol=1e-8, atol=1e-8, horizon=2.0)
        m(x).square().sum().backward()
        (forward_nfe,) = m.nfe_forward
        (backward_nfe[adjoint],) = m.nfe_backward
        grads[adjoint] = [p.grad for p in m.parameters()]
        m(x)
        assert m.nfe_forward == [2 * forward_nfe]  # cumulative, and only forward calls count
    assert backward_nfe[False] == 0 and backward_nfe[True] > 0
    for direct, adjoint in zip(grads[False], grads[True], strict=True):
        torch.testing.assert_close(adjoint, direct, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("control_dim", [0, 2])
def test_reconstruction_error_is_small_at_tight_tolerance(control_dim):
    x = torch.randn(8, 3, dtype=torch.float64)
    u = torch.randn(8, 4, control_dim, dtype=torch.float64) if control_dim else None
    errors = []
    for tol in (1e-9, 1e-1):
        m = ode(rtol=tol, atol=tol, horizon=2.0, control_dim=control_dim).double()
        with torch.no_grad():  # a field that moves the state far enough to challenge the solver
            m.layer(0).out.weight.mul_(5.0)
        errors.append(m.reconstruction_error(x, u))
        assert m.nfe_forward == m.nfe_backward == [0]  # the check is not counted
    tight, loose = errors
    assert tight < 1e-7 and loose > 100 * tight


def test_anode_pads_the_state_with_zeros():
    m = ode("anode", augment_dim=3, decoder="identity")
    x = torch.randn(4, 3)
    traj = m.trajectory(x)
    assert m.state_dim == 9 and traj.shape == (4, 5, 9)
    assert (traj[:, 0, 6:] == 0).all() and (traj[:, -1, 6:] != 0).any()
    torch.testing.assert_close(m(x), traj[:, -1, :2])


def test_solver_failure_is_one_clear_error():
    m = ode(rtol=1e-12, atol=1e-12, max_steps=2, horizon=5.0)
    with pytest.raises(RuntimeError, match="max_steps=2"):
        m(torch.randn(4, 3))
