"""The Delta operator against a dense reference, closed forms and gradcheck (float64)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import ddl_dynamics as dd


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
    A = dd.shortcut_matrix(k, beta if erase else torch.zeros_like(beta))
    out = A @ Xm + beta[..., None, None] * k.unsqueeze(-1) * vm.unsqueeze(-2)
    return out.squeeze(-1) if col else out


@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0, 1.7, 2.0])
def test_proposition_2_1_spectrum(beta):
    d = 7
    k = dd.normalize_direction(torch.randn(d, dtype=torch.float64), eps=0.0)
    b = torch.tensor(beta, dtype=torch.float64)
    A = dd.shortcut_matrix(k, b)
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


@settings(max_examples=60, deadline=None)
@given(shapes)
def test_delta_update_matches_dense_reference(case):
    batch, d, d_v, seed = case
    X, k, v, beta = random_case(tuple(batch), d, d_v, seed)
    torch.testing.assert_close(dd.delta_update(X, k, v, beta), dense_update(X, k, v, beta))


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


@pytest.mark.parametrize("d_v", [None, 3])
@pytest.mark.parametrize("update", [dd.delta_update, dd.write_update])
def test_gradcheck_float64(update, d_v):
    X, k, v, beta = random_case((2,), 4, d_v)
    beta = beta.clamp(0.1, 1.9)
    inputs = tuple(t.clone().requires_grad_() for t in (X, k, v, beta))
    assert torch.autograd.gradcheck(update, inputs)
    assert torch.autograd.gradgradcheck(update, inputs)


@pytest.mark.parametrize(("update", "erase"), [(dd.delta_update, True), (dd.write_update, False)])
@settings(max_examples=30, deadline=None)
@given(shapes, st.lists(st.booleans(), min_size=4, max_size=4))
def test_gradients_match_autograd_through_the_dense_reference(update, erase, case, needs):
    batch, d, d_v, seed = case
    needs[seed % 4] = True  # at least one input asks for a gradient
    tensors = random_case(tuple(batch), d, d_v, seed)
    inputs = [t.requires_grad_(n) for t, n in zip(tensors, needs, strict=True)]
    wanted = [t for t in inputs if t.requires_grad]
    out, ref = update(*inputs), dense_update(*inputs, erase=erase)
    upstream = torch.randn_like(out)
    got = torch.autograd.grad(out, wanted, upstream)
    expected = torch.autograd.grad(ref, wanted, upstream)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)


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
    """Records the largest tensor any aten op produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("d_v", [1, 4])
@pytest.mark.parametrize("update", [dd.delta_update, dd.write_update])
def test_no_d_by_d_matrix_at_d_16384(update, d_v):
    batch, d = 2, 16384
    X, k, v, beta = (t.float().requires_grad_() for t in random_case((batch,), d, d_v))
    with LargestTensor() as mode:
        out = update(X, k, v, beta)
        out.square().sum().backward()
    assert out.shape == (batch, d, d_v) and torch.isfinite(X.grad).all()
    assert mode.largest <= batch * d * d_v  # a d×d operator would be 4096× larger


def test_bfloat16_state_keeps_fp32_readout():
    X, k, v, beta = (t.float() for t in random_case((8,), 64, 2))
    out16 = dd.delta_update(X.bfloat16(), k.bfloat16(), v.bfloat16(), beta.bfloat16())
    assert out16.dtype == torch.bfloat16
    ref = dd.delta_update(*(t.bfloat16().float() for t in (X, k, v, beta)))
    torch.testing.assert_close(out16.float(), ref, atol=0.05, rtol=0.02)


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
    out = dd.gate(torch.tensor(dd.gate_logit(b0, beta_max)), beta_max)
    assert abs(out.item() - b0) < 1e-6
    assert 0 < dd.gate(torch.tensor(-50.0), beta_max) < dd.gate(torch.tensor(50.0)) <= 2.0


@pytest.mark.parametrize("bad", [0.0, 2.0, -1.0, 3.0])
def test_gate_logit_rejects_values_outside_the_open_range(bad):
    with pytest.raises(ValueError, match="strictly inside"):
        dd.gate_logit(bad, 2.0)


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
    assert dd.regime(beta) == label
    assert dd.regime(torch.tensor([beta])) == [label]
    assert dd.REGIMES[dd.regime_index(torch.tensor(beta)).item()] == label


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
