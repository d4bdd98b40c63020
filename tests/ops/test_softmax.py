"""Softmax, its hand backward and the online variants against torch and the explicit Jacobian."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.ops.softmax import (
    CrossEntropy,
    Softmax,
    cross_entropy,
    cross_entropy_backward,
    online_attention_row,
    online_softmax_2pass,
    safe_softmax_3pass,
    softmax,
    softmax_backward,
    softmax_jacobian,
)


def test_softmax_hand_example():
    # x = [0, ln 3] -> exp = [1, 3] -> [0.25, 0.75]
    s = softmax(torch.tensor([0.0, math.log(3.0)], dtype=torch.float64))
    torch.testing.assert_close(s, torch.tensor([0.25, 0.75], dtype=torch.float64))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-50, 50), min_size=1, max_size=12), st.floats(-1e4, 1e4))
def test_softmax_matches_torch_and_is_shift_invariant(values, shift):
    x = torch.tensor(values, dtype=torch.float64)
    s = softmax(x)
    torch.testing.assert_close(s, torch.softmax(x, -1))
    torch.testing.assert_close(softmax(x + shift), s, atol=1e-9, rtol=1e-7)
    assert abs(s.sum().item() - 1.0) < 1e-12


def test_softmax_large_logits_and_empty_row():
    x = torch.tensor([[1e4, 1e4 - 1.0, -1e4], [float("-inf")] * 3])
    s = softmax(x)
    assert torch.isfinite(s).all()
    torch.testing.assert_close(s[0], torch.softmax(torch.tensor([1.0, 0.0, -2e4]), -1))
    assert (s[1] == 0).all()  # a row with no finite logit gives zeros, not NaN


def test_softmax_backward_equals_jacobian_oracle():
    torch.manual_seed(0)
    x = torch.randn(5, 7, dtype=torch.float64)
    g = torch.randn(5, 7, dtype=torch.float64)
    s = softmax(x)
    jac = softmax_jacobian(s)  # (5, 7, 7), symmetric
    torch.testing.assert_close(softmax_backward(g, s), torch.einsum("bi,bij->bj", g, jac))
    # and the explicit Jacobian is what autograd computes
    auto = torch.autograd.functional.jacobian(lambda r: torch.softmax(r, -1), x[0])
    torch.testing.assert_close(jac[0], auto)


def test_softmax_backward_gradcheck():
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: Softmax.apply(t, -1), (x,))
    y = torch.randn(4, 3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: Softmax.apply(t, 1), (y,))


def test_cross_entropy_matches_torch_and_gradient_is_softmax_minus_onehot():
    torch.manual_seed(1)
    logits = torch.randn(6, 9, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 9, (6,))
    loss = cross_entropy(logits, targets)
    torch.testing.assert_close(loss, F.cross_entropy(logits, targets))
    (auto,) = torch.autograd.grad(F.cross_entropy(logits, targets), logits)
    hand = cross_entropy_backward(logits.detach(), targets)
    torch.testing.assert_close(hand, auto)
    # hand-derived numbers: logits=[0, 0], target 0 -> softmax [.5, .5] - [1, 0] = [-.5, .5]; N=1
    torch.testing.assert_close(
        cross_entropy_backward(torch.zeros(1, 2, dtype=torch.float64), torch.tensor([0])),
        torch.tensor([[-0.5, 0.5]], dtype=torch.float64),
    )
    assert torch.autograd.gradcheck(lambda t: CrossEntropy.apply(t, targets), (logits,))


def test_cross_entropy_large_logits_and_bad_shapes():
    logits = torch.tensor([[1e4, 0.0], [0.0, 1e4]])
    assert cross_entropy(logits, torch.tensor([0, 1])).item() == pytest.approx(0.0, abs=1e-6)
    assert cross_entropy(logits, torch.tensor([1, 0])).item() == pytest.approx(1e4, rel=1e-6)
    with pytest.raises(ValueError, match="logits"):
        cross_entropy(torch.zeros(2, 3, 4), torch.zeros(2, dtype=torch.long))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4), min_size=1, max_size=10))
def test_three_pass_and_two_pass_equal_reference(values):
    x = torch.tensor(values, dtype=torch.float64)
    ref = torch.softmax(x, -1)
    torch.testing.assert_close(safe_softmax_3pass(x), ref)
    torch.testing.assert_close(online_softmax_2pass(x), ref)


@pytest.mark.parametrize("n", [1, 2, 17])
@pytest.mark.parametrize("big", [1.0, 300.0])
def test_online_attention_row_equals_softmax_weighted_sum(n, big):
    torch.manual_seed(n)
    q = torch.randn(8, dtype=torch.float64) * big  # big -> logits of order 1e4
    k = torch.randn(n, 8, dtype=torch.float64) * big
    v = torch.randn(n, 5, dtype=torch.float64)
    ref = torch.softmax(k @ q * 8**-0.5, -1) @ v
    out = online_attention_row(q, k, v)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref)
