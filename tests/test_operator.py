"""The Delta operator against a dense reference, closed forms and gradcheck (float64), on
every backend; autocast, FLOP counts, torch.func and the backend switch."""

import copy
import os
import shutil
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.func import functional_call, grad, hessian, jacrev, stack_module_state, vmap
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

import ddl_dynamics as dd
from ddl_dynamics.models import delta_kernels
from ddl_dynamics.models.delta_kernels import BACKEND_ENV, BACKENDS, choose_backend
from ddl_dynamics.models.operator import (
    gate_logit,
    generated_update,
    regime,
    regime_index,
    shortcut_matrix,
    split_generators,
)


def backend(name):
    """``name`` as a test parameter, skipped with the backend's own reason where it cannot run."""
    reason = BACKENDS[name].unsupported(torch.zeros(1, 1, 1, dtype=torch.float64), 1)
    return pytest.param(name, marks=pytest.mark.skipif(reason is not None, reason=str(reason)))


FUSED = [backend("cpu"), backend("triton")]
ALL_BACKENDS = [backend("reference"), *FUSED]


def random_case(batch, d, d_v, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    state_shape = (*batch, d) if d_v is None else (*batch, d, d_v)
    X = torch.randn(state_shape, generator=g, dtype=dtype)
    k = dd.normalize_direction(torch.randn((*batch, d), generator=g, dtype=dtype))
    v = torch.randn(batch if d_v is None else (*batch, d_v), generator=g, dtype=dtype)
    beta = 2 * torch.rand(batch, generator=g, dtype=dtype)
    return X, k, v, beta


def readout(X, k):
    """kᵀX for either state layout, computed densely."""
    return (k.unsqueeze(-1) * (X if X.dim() > k.dim() else X.unsqueeze(-1))).sum(-2)


def dense_update(X, k, v, beta, erase=True):
    """Independent reference: A X + β k vᵀ, A = I − βkkᵀ materialised (A = I: write only)."""
    col = X.dim() == k.dim()
    Xm = X.unsqueeze(-1) if col else X
    vm = v.unsqueeze(-1) if col else v
    A = shortcut_matrix(k, beta if erase else torch.zeros_like(beta))
    out = A @ Xm + beta[..., None, None] * k.unsqueeze(-1) * vm.unsqueeze(-2)
    return out.squeeze(-1) if col else out


@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0, 1.7, 2.0])
def test_proposition_2_1_spectrum(beta):
    d = 7
    k = dd.normalize_direction(torch.randn(d, dtype=torch.float64), eps=0.0)
    b = torch.tensor(beta, dtype=torch.float64)
    A = shortcut_matrix(k, b)
    eigvals, eigvecs = torch.linalg.eigh(A)
    expected = torch.sort(torch.tensor([1.0] * (d - 1) + [1 - beta], dtype=torch.float64)).values
    torch.testing.assert_close(eigvals, expected)
    torch.testing.assert_close(A @ k, (1 - beta) * k)  # k is the eigenvector of 1 − β
    torch.testing.assert_close(torch.linalg.det(A), b.new_tensor(1 - beta))
    if beta != 0.0:  # the 1 − β eigenspace is spanned by k alone
        idx = torch.argmin((eigvals - (1 - beta)).abs())
        assert abs(torch.dot(eigvecs[:, idx], k).abs().item() - 1) < 1e-7


shapes = st.tuples(
    st.lists(st.integers(1, 3), min_size=0, max_size=2),  # batch dims
    st.integers(1, 9),  # d
    st.one_of(st.none(), st.integers(1, 4)),  # d_v (None: vector state)
    st.integers(0, 2**16),
)


@pytest.mark.parametrize("name", ALL_BACKENDS)
@pytest.mark.parametrize(("update", "erase"), [(dd.delta_update, True), (dd.write_update, False)])
@settings(max_examples=30, deadline=None)
@given(shapes)
def test_update_matches_dense_reference(name, update, erase, case):
    batch, d, d_v, seed = case
    X, k, v, beta = random_case(tuple(batch), d, d_v, seed)
    out = update(X, k, v, beta, backend=name)
    torch.testing.assert_close(out, dense_update(X, k, v, beta, erase))


@settings(max_examples=40, deadline=None)
@given(shapes)
def test_discrepancy_contracts_by_one_minus_beta(case):
    batch, d, d_v, seed = case
    X, k, v, beta = random_case(tuple(batch), d, d_v, seed)
    e_pre = readout(X, k) - (v.unsqueeze(-1) if d_v is None else v)
    e_post = readout(dd.delta_update(X, k, v, beta), k) - (v.unsqueeze(-1) if d_v is None else v)
    factor = (1 - beta).unsqueeze(-1)
    # k is unit only up to eps²/‖k̃‖², so compare with a tolerance that covers it.
    torch.testing.assert_close(e_post, factor * e_pre, atol=1e-8, rtol=1e-6)


def test_beta_one_overwrites_readout_exactly():
    X, k, v, _ = random_case((5,), 6, 3)
    k = dd.normalize_direction(k, eps=0.0)
    out = dd.delta_update(X, k, v, torch.ones(5, dtype=torch.float64))
    torch.testing.assert_close(readout(out, k), v)
    # Everything orthogonal to k is untouched.
    P = torch.eye(6, dtype=torch.float64) - k.unsqueeze(-1) * k.unsqueeze(-2)
    torch.testing.assert_close(P @ out, P @ X)


def test_beta_two_with_zero_value_is_a_householder_involution():
    X, k, _, _ = random_case((4,), 5, None)
    k = dd.normalize_direction(k, eps=0.0)
    zero, two = torch.zeros(4, dtype=torch.float64), torch.full((4,), 2.0, dtype=torch.float64)
    once = dd.delta_update(X, k, zero, two)
    householder = torch.eye(5, dtype=torch.float64) - 2 * k.unsqueeze(-1) * k.unsqueeze(-2)
    torch.testing.assert_close(once, (householder @ X.unsqueeze(-1)).squeeze(-1))
    torch.testing.assert_close(dd.delta_update(once, k, zero, two), X)
    torch.testing.assert_close(once.norm(dim=-1), X.norm(dim=-1))  # an isometry


def test_beta_zero_is_the_identity():
    X, k, v, _ = random_case((3,), 4, 2)
    assert torch.equal(dd.delta_update(X, k, v, torch.zeros(3, dtype=torch.float64)), X)


def test_value_channels_update_column_by_column():
    X, k, v, beta = random_case((3,), 6, 4)
    out = dd.delta_update(X, k, v, beta)
    for j in range(4):
        torch.testing.assert_close(out[..., j], dd.delta_update(X[..., j], k, v[..., j], beta))


def test_write_update_is_the_delta_rule_without_erasure():
    X, k, v, beta = random_case((3,), 6, 2)
    out = dd.write_update(X, k, v, beta)
    torch.testing.assert_close(out, X + beta[:, None, None] * k[:, :, None] * v[:, None, :])
    # The erase term is exactly the difference between the two updates.
    erase = beta[:, None, None] * k[:, :, None] * readout(X, k)[:, None, :]
    torch.testing.assert_close(out - dd.delta_update(X, k, v, beta), erase)


@pytest.mark.parametrize("name", ALL_BACKENDS)
@pytest.mark.parametrize("d_v", [None, 3])
@pytest.mark.parametrize("update", [dd.delta_update, dd.write_update])
def test_gradcheck_float64(update, d_v, name):
    X, k, v, beta = random_case((2,), 4, d_v)
    beta = beta.clamp(0.1, 1.9)
    inputs = tuple(t.clone().requires_grad_() for t in (X, k, v, beta))

    def layer(*inputs):
        return update(*inputs, backend=name)

    fast = name == "triton"  # interpreted: check random projections of the Jacobians only
    assert torch.autograd.gradcheck(layer, inputs, fast_mode=fast)  # the closed-form backward
    assert torch.autograd.gradgradcheck(layer, inputs, fast_mode=fast)  # the reference's ops


@pytest.mark.parametrize("name", ALL_BACKENDS)
@pytest.mark.parametrize(("update", "erase"), [(dd.delta_update, True), (dd.write_update, False)])
@settings(max_examples=20, deadline=None)
@given(shapes, st.lists(st.booleans(), min_size=4, max_size=4))
def test_gradients_match_autograd_through_the_dense_reference(name, update, erase, case, needs):
    batch, d, d_v, seed = case
    needs[seed % 4] = True  # at least one input asks for a gradient
    tensors = random_case(tuple(batch), d, d_v, seed)
    inputs = [t.requires_grad_(n) for t, n in zip(tensors, needs, strict=True)]
    wanted = [t for t in inputs if t.requires_grad]
    out, ref = update(*inputs, backend=name), dense_update(*inputs, erase=erase)
    upstream = torch.randn_like(out)
    got = torch.autograd.grad(out, wanted, upstream)
    expected = torch.autograd.grad(ref, wanted, upstream)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("name", ALL_BACKENDS)
@pytest.mark.parametrize(("update", "erase"), [(dd.delta_update, True), (dd.write_update, False)])
def test_a_state_held_channels_first_is_updated_in_its_layout(name, update, erase):
    """X (..., d, d_v) stored channel by channel (``X.mT`` row-major, as the Transformer holds
    its state): the update equals the dense reference and passes gradcheck in float64, and the
    ops (what a FLOP count and torch.compile run) return Y and dX in X's layout, as their fake
    tensors promise; the C++ kernel reads and writes that layout without a copy."""
    X, k, v, beta = random_case((2, 3), 5, 4)
    X = X.mT.contiguous().mT
    assert not X.is_contiguous() and X.mT.is_contiguous()
    out = update(X, k, v, beta, backend=name)
    torch.testing.assert_close(out, dense_update(X, k, v, beta, erase))
    if name == "cpu":
        assert out.stride() == X.stride()
    first = X.mT.clone().requires_grad_()
    inputs = (first, *(t.clone().requires_grad_() for t in (k, v, beta.clamp(0.1, 1.9))))
    fast = name == "triton"  # interpreted: random projections of the Jacobians only
    assert torch.autograd.gradcheck(
        lambda Xt, *rest: update(Xt.mT, *rest, backend=name), inputs, fast_mode=fast
    )
    ops = torch.ops.ddl_dynamics
    assert ops.rank_one_update(X, k, v, beta, erase, name).stride() == X.stride()
    G = torch.randn_like(out).contiguous()  # an upstream gradient in the other layout
    dX = ops.rank_one_update_backward(G, X, k, v, beta, erase, name)[0]
    assert dX.stride() == X.stride()
    torch.testing.assert_close(
        dX, ops.rank_one_update_backward(G, X.contiguous(), k, v, beta, erase, name)[0]
    )


def test_gradcheck_through_normalisation_and_gate():
    g = torch.Generator().manual_seed(1)
    X, k_raw, v, logit = (
        torch.randn(s, generator=g, dtype=torch.float64, requires_grad=True)
        for s in ((2, 5, 2), (2, 5), (2, 2), (2,))
    )

    def layer(X, k_raw, v, logit):
        return dd.delta_update(X, dd.normalize_direction(k_raw), v, dd.gate(logit))

    assert torch.autograd.gradcheck(layer, (X, k_raw, v, logit))


class LargestTensor(TorchDispatchMode):
    """Records the size in bytes of the largest tensor any aten op produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel() * t.element_size())
        return out


@pytest.mark.parametrize("name", ALL_BACKENDS)
@pytest.mark.parametrize("d_v", [1, 4])
@pytest.mark.parametrize("erase", [True, False])
def test_no_d_by_d_matrix_at_d_16384(name, erase, d_v):
    batch, d = 2, 16384
    X, k, v, beta = (t.float() for t in random_case((batch,), d, d_v))
    kernels = BACKENDS[name]
    with LargestTensor() as mode:  # sees every torch op inside the kernels, called directly
        out = kernels.forward(X, k, v, beta, erase)
        grads = kernels.backward(torch.ones_like(out), X, k, v, beta, erase)
    assert out.shape == (batch, d, d_v) and torch.isfinite(grads[0]).all()
    assert mode.largest <= X.numel() * X.element_size()  # a d×d operator: 4096× larger


def test_bfloat16_state_is_updated_in_float32_and_rounded_once():
    X, k, v, beta = random_case((16,), 64, 3)
    X, k, v = (t.bfloat16() for t in (X, k, v))
    beta = beta.float()  # as dd.gate returns it
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = dd.delta_update(X, k, v, beta)
    assert out.dtype == torch.bfloat16
    exact = dense_update(X.double(), k.double(), v.double(), beta.double())
    # One rounding of a float32 result: within a bfloat16 half-ulp (2⁻⁸ relative) and the
    # float32 error of the readout.
    assert ((out.double() - exact).abs() <= exact.abs() * 2**-8 + 1e-5).all()


@pytest.mark.parametrize("name", ALL_BACKENDS)
@pytest.mark.parametrize("d_v", [None, 3])
def test_autocast_keeps_the_readout_and_gate_in_float32(name, d_v):
    """Under bfloat16 autocast a float32 state still contracts its readout error by exactly
    1 − β: neither the readout kᵀX nor β is rounded to bfloat16 (either would cost ~1e-2)."""
    X, k, v, beta = (t.float() for t in random_case((64,), 32, d_v, seed=3))
    assert (beta.bfloat16().float() != beta).any()  # gates bfloat16 cannot hold exactly
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = dd.delta_update(X, k, v, beta, backend=name)
    assert out.dtype == torch.float32
    target = (v if d_v else v.unsqueeze(-1)).double()
    e_pre = readout(X.double(), k.double()) - target
    e_post = readout(out.double(), k.double()) - target
    torch.testing.assert_close(e_post, (1 - beta.double()).unsqueeze(-1) * e_pre, atol=1e-5, rtol=0)


def test_ddl_model_hands_the_operator_a_float32_gate_under_autocast(monkeypatch):
    from ddl_dynamics.models import operator

    seen = []
    update = operator._update

    def spy(X, k, v, beta, erase, backend):
        seen.append((X.dtype, beta.dtype))
        return update(X, k, v, beta, erase, backend)

    monkeypatch.setattr(operator, "_update", spy)
    model = dd.make_model("ddl", in_dim=3, out_dim=2, width=16, depth=2, value_channels=4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randn(4, 3))
    assert seen == [(torch.bfloat16, torch.float32)] * 2


@pytest.mark.parametrize("update", [dd.delta_update, dd.write_update])
def test_bfloat16_gradients_come_back_in_the_input_dtypes(update):
    inputs = [t.bfloat16().requires_grad_() for t in random_case((8,), 64, 2)]
    out = update(*inputs)
    upstream = torch.randn_like(out)
    out.backward(upstream)
    ref_inputs = [t.detach().float().requires_grad_() for t in inputs]
    update(*ref_inputs).backward(upstream.float())
    for t, ref in zip(inputs, ref_inputs, strict=True):
        assert t.grad.dtype == torch.bfloat16
        torch.testing.assert_close(t.grad.float(), ref.grad, atol=0.05, rtol=0.02)
    # A float32 gate, as dd.gate returns, does not promote a bfloat16 state.
    X, k, v, beta = (t.detach() for t in inputs)
    assert update(X, k, v, beta.float()).dtype == torch.bfloat16


def test_normalize_direction():
    k = torch.randn(10, 6, dtype=torch.float64) * 10
    unit = dd.normalize_direction(k).norm(dim=-1)
    torch.testing.assert_close(unit, torch.ones(10, dtype=k.dtype))
    zero = dd.normalize_direction(torch.zeros(3, dtype=torch.float64))
    assert torch.equal(zero, torch.zeros(3, dtype=torch.float64))
    small = torch.tensor([3e-5, 4e-5], dtype=torch.float64)  # ‖k̃‖ = 5e-5
    expected = small / (5e-5**2 + 1e-10) ** 0.5
    torch.testing.assert_close(dd.normalize_direction(small), expected)


@pytest.mark.parametrize("beta_max", [1.0, 2.0])
@pytest.mark.parametrize("beta0", [0.05, 0.5, 0.99])
def test_gate_logit_inverts_gate(beta_max, beta0):
    b0 = beta0 * beta_max
    out = dd.gate(torch.tensor(gate_logit(b0, beta_max)), beta_max)
    assert abs(out.item() - b0) < 1e-6
    assert 0 < dd.gate(torch.tensor(-50.0), beta_max) < dd.gate(torch.tensor(50.0)) <= 2.0


@pytest.mark.parametrize("bad", [0.0, 2.0, -1.0, 3.0])
def test_gate_logit_rejects_values_outside_the_open_range(bad):
    with pytest.raises(ValueError, match="strictly inside"):
        gate_logit(bad, 2.0)


def test_gate_logits_are_fp32_for_bf16():
    assert dd.gate(torch.zeros(3, dtype=torch.bfloat16)).dtype == torch.float32


@pytest.mark.parametrize(
    ("beta", "label"),
    [
        (0.0, "identity"),
        (0.2499, "identity"),
        (0.25, "write"),
        (0.7499, "write"),
        (0.75, "projection"),
        (1.0, "projection"),
        (1.25, "projection"),
        (1.2501, "over-relaxed"),
        (1.75, "over-relaxed"),
        (1.7501, "reflection"),
        (2.0, "reflection"),
    ],
)
def test_regime_thresholds(beta, label):
    assert regime(beta) == label
    assert regime(torch.tensor([beta])) == [label]
    assert dd.REGIMES[regime_index(torch.tensor(beta)).item()] == label


@pytest.mark.parametrize(
    ("X", "k", "v", "beta", "match"),
    [
        ((4, 5), (4, 6), (4,), (4,), "does not match direction"),
        ((4, 5, 2), (4, 5), (4, 3), (4,), "value v has shape"),
        ((4, 5), (4, 5), (4, 1), (4,), "value v has shape"),
        ((4, 5), (4, 5), (4,), (3,), "gate beta has shape"),
        ((4, 5, 2, 1), (4, 5), (4, 2), (4,), "does not match direction"),
    ],
)
@pytest.mark.parametrize("update", [dd.delta_update, dd.write_update])
def test_shape_mismatch_names_the_shapes(update, X, k, v, beta, match):
    with pytest.raises(ValueError, match=match):
        update(torch.zeros(X), torch.zeros(k), torch.zeros(v), torch.zeros(beta))


# --- a layer's whole update from its packed generators [k̃ | gate logit | v]


def dense_generated(X, raw, d_v, beta_max, erase):
    """Independent reference: normalise k̃, gate the logit, then :func:`dense_update`."""
    d = X.shape[-1] // d_v
    k_raw, logit, v = raw[..., :d], raw[..., d], raw[..., d + 1 :]
    k = k_raw / torch.sqrt(k_raw.square().sum(-1, keepdim=True) + 1e-10)
    beta = beta_max * torch.sigmoid(logit)
    return dense_update(X.unflatten(-1, (d, d_v)), k, v, beta, erase).flatten(-2)


def generated_case(batch, d, d_v, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn((*batch, d * d_v), generator=g, dtype=dtype)
    return X, torch.randn((*batch, d + 1 + d_v), generator=g, dtype=dtype)


@pytest.mark.parametrize("name", ALL_BACKENDS)
@pytest.mark.parametrize("d_v", [1, 3])
@pytest.mark.parametrize("erase", [True, False])
def test_generated_update_matches_the_dense_reference_and_gradcheck(name, d_v, erase):
    X, raw = (t.requires_grad_() for t in generated_case((5,), 4, d_v, seed=d_v))

    def layer(X, raw):
        return generated_update(X, raw, value_channels=d_v, beta_max=1.5, erase=erase, backend=name)

    out, ref = layer(X, raw), dense_generated(X, raw, d_v, 1.5, erase)
    torch.testing.assert_close(out, ref)
    G = torch.randn_like(out)
    for got, want in zip(
        torch.autograd.grad(out, (X, raw), G), torch.autograd.grad(ref, (X, raw), G), strict=True
    ):
        torch.testing.assert_close(got, want)
    fast = name == "triton"
    assert torch.autograd.gradcheck(layer, (X, raw), fast_mode=fast)
    assert torch.autograd.gradgradcheck(layer, (X, raw), fast_mode=fast)


@pytest.mark.parametrize("name", [backend("cpu")])
@pytest.mark.parametrize("d_v", [1, 4, 5])
def test_generated_update_is_one_node_on_the_cpu_kernel_and_equals_the_composition(name, d_v):
    X, raw = (t.float().requires_grad_() for t in generated_case((3, 7), 6, d_v, seed=1))
    fused = generated_update(X, raw, value_channels=d_v, backend=name)
    composed = generated_update(X, raw, value_channels=d_v, backend="reference")
    assert type(fused.grad_fn).__name__ == "_GeneratedUpdateBackward"
    assert type(composed.grad_fn).__name__ != "_GeneratedUpdateBackward"
    torch.testing.assert_close(fused, composed)
    G = torch.randn_like(fused)
    want = torch.autograd.grad(composed, (X, raw), G)
    for got, w in zip(torch.autograd.grad(fused, (X, raw), G), want, strict=True):
        torch.testing.assert_close(got, w)
    # An input that needs no gradient gets none, also through a differentiable backward.
    (dX,) = torch.autograd.grad(
        generated_update(X, raw.detach(), value_channels=d_v), X, G, create_graph=True
    )
    torch.testing.assert_close(dX, want[0])


def test_generated_update_runs_under_vmap_and_split_generators_unpacks_it():
    X, raw = generated_case((4, 3), 5, 2, seed=2)
    got = vmap(lambda X, raw: generated_update(X, raw, value_channels=2))(X, raw)
    torch.testing.assert_close(got, dense_generated(X, raw, 2, 2.0, True))
    k_raw, v, beta = split_generators(raw, 2, beta_max=1.0)
    assert (k_raw.shape, v.shape, beta.shape) == ((4, 3, 5), (4, 3, 2), (4, 3))
    torch.testing.assert_close(beta, torch.sigmoid(raw[..., 5]))


def test_generated_update_names_the_shapes_it_needs():
    X, raw = generated_case((2,), 4, 2)
    with pytest.raises(ValueError, match=r"want \(\.\.\., d·2\) and \(\.\.\., d \+ 1 \+ 2\)"):
        generated_update(X, raw[:, :-1], value_channels=2)
    with pytest.raises(ValueError, match="do not fit value_channels=3"):
        generated_update(X, raw, value_channels=3)


# --- FLOP counts: the update is one op with a registered formula, forward and backward


@pytest.mark.parametrize(
    ("update", "forward", "backward"), [(dd.delta_update, 4, 10), (dd.write_update, 2, 4)]
)
@pytest.mark.parametrize("d_v", [None, 3])
def test_flop_counter_counts_the_update(update, forward, backward, d_v):
    X, k, v, beta = (t.float().requires_grad_() for t in random_case((5, 2), 16, d_v))
    with FlopCounterMode(display=False) as counter:
        out = update(X, k, v, beta)
        assert counter.get_total_flops() == forward * X.numel()  # per sample: forward·d·d_v
        out.backward(torch.ones_like(out))
    assert counter.get_total_flops() == (forward + backward) * X.numel()


def test_flop_count_under_vmap_is_that_of_the_whole_batch():
    X, k, v, beta = (t.float() for t in random_case((3, 4), 8, 2))
    with FlopCounterMode(display=False) as counter:
        torch.func.vmap(dd.delta_update)(X, k, v, beta)
    assert counter.get_total_flops() == 4 * X.numel()


def test_ddl_model_counts_its_updates_and_at_least_a_resnet():
    common = {"in_dim": 3, "out_dim": 2, "width": 32, "depth": 4, "hidden": 32}
    x = torch.randn(16, 3)

    def counted(model):
        with FlopCounterMode(display=False) as counter:
            model(x).sum().backward()
        return counter

    ddl = counted(dd.make_model("ddl", **common))
    resnet = counted(dd.make_model("resnet", **common))
    per_op = ddl.get_flop_counts()["Global"]
    state = 16 * 32  # batch × width
    assert per_op[torch.ops.ddl_dynamics.rank_one_update] == 4 * (4 * state)  # depth × 4·d·d_v·B
    assert per_op[torch.ops.ddl_dynamics.rank_one_update_backward] == 4 * (10 * state)
    assert ddl.get_total_flops() >= resnet.get_total_flops()


# --- torch.func: vmap, grad, jacrev, forward mode, and a vmapped ensemble of models


def members(case):
    return [tuple(t[i] for t in case) for i in range(case[0].shape[0])]


@pytest.mark.parametrize("d_v", [None, 3])
def test_vmap_matches_a_loop(d_v):
    case = random_case((5, 2), 6, d_v)
    loop = torch.stack([dd.delta_update(*m) for m in members(case)])
    torch.testing.assert_close(vmap(dd.delta_update)(*case), loop)
    X, k, v, beta = case
    shared = torch.stack([dd.delta_update(Xi, k[0], vi, bi) for Xi, _, vi, bi in members(case)])
    torch.testing.assert_close(
        vmap(dd.delta_update, in_dims=(0, None, 0, 0))(X, k[0], v, beta), shared
    )
    inner = vmap(dd.delta_update, in_dims=1, out_dims=1)(*case)  # a non-leading axis
    torch.testing.assert_close(inner, dd.delta_update(*case))


def scalar_loss(X, k, v, beta):
    return dd.delta_update(X, k, v, beta).sin().sum()


def test_vmap_of_grad_matches_a_loop_of_autograd():
    case = random_case((4,), 5, 3)
    got = vmap(grad(scalar_loss, argnums=(0, 1, 2, 3)))(*case)
    for i, member in enumerate(members(case)):
        inputs = [t.clone().requires_grad_() for t in member]
        want = torch.autograd.grad(scalar_loss(*inputs), inputs)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g[i], w)


@pytest.mark.parametrize("no_grad", [False, True])
def test_jacrev_matches_the_autograd_jacobian(no_grad):
    X, k, v, beta = random_case((), 5, 3)
    want = torch.autograd.functional.jacobian(dd.delta_update, (X, k, v, beta))
    with torch.set_grad_enabled(not no_grad):
        got = jacrev(dd.delta_update, argnums=(0, 1, 2, 3))(X, k, v, beta)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")  # torch's jvp decompositions
def test_forward_mode_hessian_matches_autograd():
    X, k, v, beta = random_case((), 5, 2)
    got = hessian(scalar_loss, argnums=1)(X, k, v, beta)  # jacfwd(jacrev): forward mode
    want = torch.autograd.functional.hessian(lambda k: scalar_loss(X, k, v, beta), k)
    torch.testing.assert_close(got, want)


def test_vmapped_ensemble_of_ddl_models_matches_each_member():
    """Stacked parameters, functional_call and vmap: how several seeds train as one model."""
    models = []
    for seed in range(3):
        torch.manual_seed(seed)
        models.append(
            dd.make_model(
                "ddl", in_dim=3, out_dim=2, width=8, depth=3, value_channels=2, hidden=8
            ).double()
        )
    params, buffers = stack_module_state(models)
    skeleton = copy.deepcopy(models[0]).to("meta")
    x, y = torch.randn(5, 3, dtype=torch.float64), torch.randn(5, 2, dtype=torch.float64)

    def loss(params, buffers):
        return (functional_call(skeleton, (params, buffers), (x,)) - y).square().mean()

    losses = vmap(loss)(params, buffers)
    grads = vmap(grad(loss))(params, buffers)  # the reference's differentiable backward
    losses.sum().backward()  # plain autograd through the vmapped forward: the fused backward
    for i, model in enumerate(models):
        want_loss = (model(x) - y).square().mean()
        names, tensors = zip(*model.named_parameters(), strict=True)
        want = dict(zip(names, torch.autograd.grad(want_loss, tensors), strict=True))
        torch.testing.assert_close(losses[i], want_loss)
        for name, w in want.items():
            torch.testing.assert_close(grads[name][i], w)
            torch.testing.assert_close(params[name].grad[i], w)


# --- the fused kernels against the reference's, and choosing between them


@pytest.mark.parametrize("name", FUSED)
@pytest.mark.parametrize("erase", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("batch", "d", "d_v"),
    [((3,), 5000, 1), ((2, 2), 37, 4), ((4,), 9, 5), ((2,), 17, 8), ((), 3, 2), ((0,), 4, 2)],
)
def test_fused_kernels_match_the_reference(name, erase, dtype, batch, d, d_v):
    X, k, v, beta = (t.to(dtype) for t in random_case(batch, d, d_v, seed=d))
    G = torch.randn_like(X)
    fused, reference = BACKENDS[name], BACKENDS["reference"]
    torch.testing.assert_close(
        fused.forward(X, k, v, beta, erase), reference.forward(X, k, v, beta, erase)
    )
    got = fused.backward(G, X, k, v, beta, erase)
    want = reference.backward(G, X, k, v, beta, erase)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("name", [backend("triton")])
def test_triton_kernels_take_bfloat16_states_with_a_float32_gate(name):
    """To one bfloat16 ulp: Triton's interpreter truncates where a GPU rounds to nearest."""
    X, k, v, beta = random_case((6,), 40, 3, seed=5)
    X, k, v, beta = X.bfloat16(), k.bfloat16(), v.bfloat16(), beta.float()
    G = torch.randn_like(X)
    fused, reference = BACKENDS[name], BACKENDS["reference"]
    torch.testing.assert_close(
        fused.forward(X, k, v, beta, True), reference.forward(X, k, v, beta, True)
    )
    for g, w in zip(
        fused.backward(G, X, k, v, beta, True),
        reference.backward(G, X, k, v, beta, True),
        strict=True,
    ):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("name", [backend("triton")])
def test_the_triton_kernels_do_not_import_the_backend_choice(name):
    """The backends' modules import one way: the choice loads the Triton kernels, never the
    reverse (they share their input layout through a module of its own)."""
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, ddl_dynamics.models._delta_triton; "
            "print(sorted(m for m in sys.modules if m.startswith('ddl_dynamics.models.')))",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )
    assert "ddl_dynamics.models.delta_kernels" not in loaded.stdout
    assert "ddl_dynamics.models._delta_triton" in loaded.stdout


def test_backend_is_chosen_automatically_or_forced(monkeypatch):
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    X = torch.zeros(2, 3, 1)
    auto = "cpu" if BACKENDS["cpu"].unsupported(X, X.shape[-1]) is None else "reference"
    assert choose_backend(X) == auto
    assert choose_backend(X.bfloat16()) == "reference"  # the C++ kernel runs float32/float64
    monkeypatch.setenv(BACKEND_ENV, "reference")
    assert choose_backend(X) == "reference"
    assert choose_backend(X, "auto") == auto  # an argument overrides the environment


def test_environment_variable_routes_the_update(monkeypatch):
    calls = []
    reference = BACKENDS["reference"]

    def spy(*args):
        calls.append(args[0].shape)
        return reference.forward(*args)

    monkeypatch.setitem(BACKENDS, "reference", delta_kernels.Backend(spy, reference.backward))
    monkeypatch.setenv(BACKEND_ENV, "reference")
    dd.delta_update(*random_case((2,), 4, 3))
    assert calls == [(2, 4, 3)]


def test_bad_backend_names_a_clear_error(monkeypatch):
    case = random_case((2,), 4, 3)
    with pytest.raises(ValueError, match="unknown delta update backend 'fast'; choose from auto"):
        dd.delta_update(*case, backend="fast")
    monkeypatch.setenv(BACKEND_ENV, "refrence")
    with pytest.raises(ValueError, match="Did you mean 'reference'"):
        dd.delta_update(*case)
    if BACKENDS["cpu"].unsupported(case[0], case[0].shape[-1]) is None:
        with pytest.raises(ValueError, match=r"'cpu' cannot run this state: .* torch\.bfloat16"):
            dd.delta_update(*(t.bfloat16() for t in case), backend="cpu")


@pytest.mark.skipif(not (shutil.which("c++") or shutil.which("g++")), reason="no C++ compiler")
def test_the_cpu_kernel_is_built_where_a_compiler_is():
    assert delta_kernels._delta_cpu is not None, (
        "ddl_dynamics/models/_delta_cpu.cpp did not build: reinstall with `pip install -e .`"
    )


@pytest.mark.slow
def test_torch_compile_runs_the_update_as_one_op():
    X, k, v, beta = (t.float() for t in random_case((4,), 16, 2))
    X.requires_grad_()
    compiled = torch.compile(scalar_loss, fullgraph=True)
    got = compiled(X, k, v, beta)
    (got_grad,) = torch.autograd.grad(got, X)
    want = scalar_loss(X, k, v, beta)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grad, torch.autograd.grad(want, X)[0])


@pytest.mark.parametrize("name", [backend("cpu")])
def test_cpu_kernel_splits_large_calls_across_threads(name):
    X, k, v, beta = (t.float() for t in random_case((64,), 512, 4))  # 2¹⁷ elements
    G = torch.randn_like(X)
    flat, raw = (t.float() for t in generated_case((64,), 512, 4))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = (
            BACKENDS[name].forward(X, k, v, beta, True),
            *BACKENDS[name].backward(G, X, k, v, beta, True),
            *delta_kernels.cpu_generated(flat, raw, 4, 2.0, 1e-5, True, G.flatten(-2)),
        )
    finally:
        torch.set_num_threads(threads)
    want = (
        BACKENDS["reference"].forward(X, k, v, beta, True),
        *BACKENDS["reference"].backward(G, X, k, v, beta, True),
        *torch.autograd.grad(
            generated_update(
                flat.requires_grad_(), raw.requires_grad_(), value_channels=4, backend="reference"
            ),
            (flat, raw),
            G.flatten(-2),
        ),
    )
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
