"""GAE (losses/advantages.gae): brute force on random masked batches, the special cases, masking, whitening."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.errors import ConfigError
from posttrain.losses.advantages import gae, masked_whiten_advantages, whiten_rewards


def brute_force(r, v, real, gamma, lam):
    """Sum_l (gamma lam)^l delta_{t+l} over the real steps only, written out with Python floats."""
    steps = [t for t, ok in enumerate(real) if ok]
    rr, vv = [r[t] for t in steps], [v[t] for t in steps] + [0.0]
    n = len(steps)
    delta = [rr[i] + gamma * vv[i + 1] - vv[i] for i in range(n)]
    adv = [sum((gamma * lam) ** k * delta[i + k] for k in range(n - i)) for i in range(n)]
    out_a, out_r = [0.0] * len(r), [0.0] * len(r)
    for i, t in enumerate(steps):
        out_a[t], out_r[t] = adv[i], adv[i] + vv[i]
    return out_a, out_r


def random_batch(seed, B=5, T=7, holes=True):
    g = torch.Generator().manual_seed(seed)
    if holes:  # any pattern: left/right padding, holes in the middle, empty rows
        mask = torch.rand(B, T, generator=g) < 0.6
    else:
        lengths = torch.randint(0, T + 1, (B,), generator=g)
        mask = torch.arange(T)[None] < lengths[:, None]
    r = torch.randn(B, T, generator=g, dtype=torch.float64)
    v = torch.randn(B, T, generator=g, dtype=torch.float64)
    return r, v, mask


@settings(max_examples=60)
@given(st.integers(0, 2**31 - 1), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.booleans())
def test_matches_brute_force_on_random_masked_batches(seed, gamma, lam, holes):
    r, v, mask = random_batch(seed, holes=holes)
    a, ret = gae(r, v, mask, gamma, lam)
    for b in range(r.shape[0]):
        ra, rr = brute_force(r[b].tolist(), v[b].tolist(), mask[b].tolist(), gamma, lam)
        torch.testing.assert_close(a[b], torch.tensor(ra, dtype=torch.float64), atol=1e-10, rtol=1e-9)
        torch.testing.assert_close(ret[b], torch.tensor(rr, dtype=torch.float64), atol=1e-10, rtol=1e-9)


def test_hand_values():
    # gamma = lam = 1: r = [0, 1], V = [.5, .5] -> delta = [0, .5] -> A = [.5, .5], returns = [1, 1]
    a, ret = gae(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.5]]), torch.ones(1, 2), 1.0, 1.0)
    torch.testing.assert_close(a, torch.tensor([[0.5, 0.5]]))
    torch.testing.assert_close(ret, torch.ones(1, 2))
    # gamma = .5, lam = .5, r = [1, 2], V = [0, 0]: delta = [1, 2]; A_1 = 2, A_0 = 1 + .25 * 2 = 1.5
    a, _ = gae(torch.tensor([[1.0, 2.0]]), torch.zeros(1, 2), torch.ones(1, 2), 0.5, 0.5)
    torch.testing.assert_close(a, torch.tensor([[1.5, 2.0]]))


def test_lambda_zero_is_the_td_error():
    r, v, mask = random_batch(1, holes=False)
    a, _ = gae(r, v, mask, gamma=0.9, lam=0.0)
    nxt = torch.cat([v[:, 1:], torch.zeros(v.shape[0], 1, dtype=v.dtype)], 1)
    nxt = torch.where(
        torch.cat([mask[:, 1:], torch.zeros(v.shape[0], 1, dtype=torch.bool)], 1), nxt, torch.zeros_like(nxt)
    )
    delta = (r + 0.9 * nxt - v) * mask
    torch.testing.assert_close(a, delta, atol=1e-12, rtol=0)


def test_gamma_lambda_one_is_future_rewards_minus_value_and_reinforce_with_zero_values():
    r, v, mask = random_batch(2, holes=False)
    future = torch.flip(torch.cumsum(torch.flip(r * mask, [1]), 1), [1]) * mask  # sum_{t' >= t} r_t'
    a, ret = gae(r, v, mask, 1.0, 1.0)
    torch.testing.assert_close(a, (future - v) * mask, atol=1e-12, rtol=0)
    torch.testing.assert_close(ret, future, atol=1e-12, rtol=0)
    a0, _ = gae(r, torch.zeros_like(v), mask, 1.0, 1.0)  # V = 0: the REINFORCE return-to-go
    torch.testing.assert_close(a0, future, atol=1e-12, rtol=0)


def test_sparse_reward_at_eos_reaches_every_earlier_token_discounted():
    T, gamma, lam = 5, 0.9, 0.8
    lengths = torch.tensor([5, 3])
    mask = torch.arange(T)[None] < lengths[:, None]
    r = torch.zeros(2, T)
    r[0, 4], r[1, 2] = 1.0, 1.0  # the sequence reward on the last real token
    a, ret = gae(r, torch.zeros(2, T), mask, gamma, lam)
    for b, L in enumerate(lengths.tolist()):
        for t in range(L):
            assert a[b, t].item() == pytest.approx((gamma * lam) ** (L - 1 - t))
            assert ret[b, t].item() == pytest.approx((gamma * lam) ** (L - 1 - t))
    assert torch.all(a[1, 3:] == 0)


def test_garbage_in_masked_slots_and_extra_padding_change_nothing():
    r, v, mask = random_batch(3)
    a, ret = gae(r, v, mask, 0.95, 0.9)
    junk_r, junk_v = r.clone(), v.clone()
    junk_r[~mask], junk_v[~mask] = float("nan"), 1e6
    a2, ret2 = gae(junk_r, junk_v, mask, 0.95, 0.9)
    assert torch.equal(a, a2) and torch.equal(ret, ret2)
    pad = lambda x, val: torch.cat(
        [
            torch.full((x.shape[0], 1), val, dtype=x.dtype),
            x,  # noqa: E731
            torch.full((x.shape[0], 3), val, dtype=x.dtype),
        ],
        1,
    )
    a3, ret3 = gae(pad(r, 5.0), pad(v, -7.0), pad(mask, False), 0.95, 0.9)
    assert torch.equal(a3[:, 1:-3], a) and torch.equal(ret3[:, 1:-3], ret)
    assert torch.all(a3[:, 0] == 0) and torch.all(a3[:, -3:] == 0)


def test_decoupled_lambda():
    r, v, mask = random_batch(4)
    a_actor, _ = gae(r, v, mask, 1.0, 0.95)
    a_critic, ret_critic = gae(r, v, mask, 1.0, 1.0)
    a, ret = gae(r, v, mask, 1.0, 0.95, critic_lam=1.0)
    assert torch.equal(a, a_actor)
    torch.testing.assert_close(ret, (a_critic + v) * mask)
    torch.testing.assert_close(ret, ret_critic)
    with pytest.raises(ConfigError, match="lam"):
        gae(r, v, mask, 1.0, 1.5)


def test_whitening_uses_masked_tokens_only():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    a = torch.tensor([[1.0, 3.0, 100.0], [5.0, -50.0, 7.0]])
    w = masked_whiten_advantages(a, mask)
    real = torch.tensor([1.0, 3.0, 5.0])
    ref = (real - real.mean()) / real.std()  # Bessel-corrected, as masked_whiten
    torch.testing.assert_close(w[mask], ref, atol=1e-6, rtol=1e-5)
    assert torch.all(w[~mask] == 0)
    b = a.clone()
    b[~mask] = float("nan")
    assert torch.equal(masked_whiten_advantages(b, mask), w)
    one = masked_whiten_advantages(torch.tensor([[2.0, 9.0]]), torch.tensor([[True, False]]))
    assert torch.equal(one, torch.zeros(1, 2))  # one real token: 0, never NaN


def test_reward_whitening_keeps_the_mean_scales_the_std():
    s = torch.tensor([1.0, 2.0, 6.0])
    w = whiten_rewards(s)
    assert w.mean().item() == pytest.approx(s.mean().item(), abs=1e-6)
    assert w.std().item() == pytest.approx(1.0, abs=1e-5)
    assert not math.isnan(whiten_rewards(torch.tensor([3.0]))[0].item())
