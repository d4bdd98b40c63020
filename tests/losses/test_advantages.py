"""Advantage estimators: hand-derived values, brute-force oracles, TRL parity, and the baseline property."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.errors import ConfigError
from posttrain.losses.advantages import (
    ADVANTAGE_ESTIMATORS,
    gae_advantages,
    grpo_advantages,
    reinforce_advantages,
    rloo_advantages,
    zero_std_groups,
)


def test_reinforce_hand_values():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    a, _ = reinforce_advantages(r)
    assert torch.equal(a, r)
    a, m = reinforce_advantages(r, group_size=2, baseline="batch_mean")  # mean .5
    assert torch.allclose(a, torch.tensor([0.5, -0.5, -0.5, 0.5]))
    assert m["zero_std_frac"] == 0.0
    with pytest.raises(ConfigError):
        reinforce_advantages(r, baseline="ema")


def test_rloo_hand_values():
    # G=3: r=[1,0,0] -> leave-one-out baselines [0, .5, .5] -> A=[1, -.5, -.5]
    # second group r=[2,2,2] -> all equal -> A=0
    r = torch.tensor([1.0, 0.0, 0.0, 2.0, 2.0, 2.0])
    a, m = rloo_advantages(r, group_size=3)
    assert torch.allclose(a, torch.tensor([1.0, -0.5, -0.5, 0.0, 0.0, 0.0]))
    assert m["zero_std_frac"] == 0.5
    with pytest.raises(ConfigError):
        rloo_advantages(r, group_size=1)


def test_grpo_hand_values():
    # G=2: r=[1,0] -> mean .5, unbiased std sqrt(.5)=.70711 -> A=+-.5/(.70711+1e-4)
    a, _ = grpo_advantages(torch.tensor([1.0, 0.0]), 2)
    assert torch.allclose(a, torch.tensor([0.5, -0.5]) / (math.sqrt(0.5) + 1e-4))
    # "none": only centred (Dr. GRPO)
    a, _ = grpo_advantages(torch.tensor([3.0, 1.0, 5.0, 5.0]), 2, scale_rewards="none")
    assert torch.equal(a, torch.tensor([1.0, -1.0, 0.0, 0.0]))
    # "batch": centred per group, scaled by the std of all 4 rewards: std([3,1,5,5]) = sqrt(11/3)
    a, _ = grpo_advantages(torch.tensor([3.0, 1.0, 5.0, 5.0]), 2, scale_rewards="batch")
    s = math.sqrt(((3 - 3.5) ** 2 + (1 - 3.5) ** 2 + 2 * (5 - 3.5) ** 2) / 3)
    assert torch.allclose(a, torch.tensor([1.0, -1.0, 0.0, 0.0]) / (s + 1e-4))


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
@pytest.mark.parametrize("value", [0.0, 0.1, 0.3, 1e6])
def test_all_equal_groups_give_exact_zero(name, value):
    # 0.1 and 0.3 are not exactly representable, so mean() of equal copies may leave residue: must still be 0
    r = torch.full((12,), value)
    kw = {"baseline": "batch_mean"} if name == "reinforce" else {}
    a, m = ADVANTAGE_ESTIMATORS[name](r, 4, **kw)
    assert torch.equal(a, torch.zeros(12)) and not torch.isnan(a).any()
    assert m["zero_std_frac"] == 1.0


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_grpo_matches_trl_formula(scale):
    # Transcription of TRL 1.16 GRPOTrainer._generate_and_score_completions (sum_then_normalize):
    # advantages = (r - group_mean) / (std + 1e-4), std unbiased, per group or over the batch.
    from trl.trainer.utils import nanstd

    torch.manual_seed(0)
    G = 4
    r = torch.randint(0, 3, (24,)).float()
    mean = r.view(-1, G).mean(1).repeat_interleave(G)
    std = nanstd(r.view(-1, G), dim=1).repeat_interleave(G) if scale != "batch" else nanstd(r).expand_as(r)
    ref = r - mean
    if scale != "none":
        ref = ref / (std + 1e-4)
    ref = torch.where(torch.isclose(nanstd(r.view(-1, G), dim=1), torch.zeros(1)).repeat_interleave(G), 0.0, ref)
    ours, m = grpo_advantages(r, G, scale_rewards=scale)
    assert torch.allclose(ours, ref, atol=1e-6)
    assert m["zero_std_frac"] == pytest.approx(zero_std_groups(r, G).float().mean().item())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-5, 5), min_size=2, max_size=6), st.integers(1, 4))
def test_rloo_is_leave_one_out_brute_force(vals, n_groups):
    G = len(vals)
    r = torch.tensor(vals * n_groups, dtype=torch.float32) + torch.arange(G * n_groups).float() % 3
    a, _ = rloo_advantages(r, G)
    for i in range(r.numel()):
        g = i // G
        others = [r[j].item() for j in range(g * G, (g + 1) * G) if j != i]
        assert a[i].item() == pytest.approx(r[i].item() - sum(others) / len(others), abs=1e-5)
    # RLOO = G/(G-1) * (r - mean): the known identity
    centred = (r.view(-1, G) - r.view(-1, G).mean(1, keepdim=True)).reshape(-1)
    assert torch.allclose(a, centred * G / (G - 1), atol=1e-5)


def test_bad_shapes():
    with pytest.raises(ValueError):
        grpo_advantages(torch.zeros(5), 2)
    with pytest.raises(ValueError):
        grpo_advantages(torch.zeros(2, 2), 2)
    with pytest.raises(ConfigError):
        grpo_advantages(torch.zeros(4), 2, scale_rewards="std")


def _gae_oracle(r, v, T, gamma, lam):
    # direct definition: A_t = sum_l (gamma lam)^l delta_{t+l}, V_T = 0 (episode ends at the last real token)
    vv = list(v[:T]) + [0.0]
    delta = [r[t] + gamma * vv[t + 1] - vv[t] for t in range(T)]
    return [sum((gamma * lam) ** l * delta[t + l] for l in range(T - t)) for t in range(T)]


def test_gae_hand_values():
    # gamma=lam=1: r=[0,1], V=[.5,.5] -> delta=[0+.5-.5, 1+0-.5]=[0,.5] -> A=[.5,.5], returns=[1,1]
    a, ret = gae_advantages(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.5]]), torch.ones(1, 2), 1.0, 1.0)
    assert torch.allclose(a, torch.tensor([[0.5, 0.5]])) and torch.allclose(ret, torch.ones(1, 2))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.floats(0.5, 1.0), st.floats(0.0, 1.0))
def test_gae_matches_definition_on_right_padded_batches(seed, gamma, lam):
    g = torch.Generator().manual_seed(seed)
    B, T = 4, 6
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    r = torch.randn(B, T, generator=g, dtype=torch.float64)
    v = torch.randn(B, T, generator=g, dtype=torch.float64)
    r_pad, v_pad = r.clone(), v.clone()
    r_pad[mask == 0], v_pad[mask == 0] = 99.0, -99.0  # garbage in the padding must not leak
    a, ret = gae_advantages(r_pad, v_pad, mask, gamma, lam)
    for b in range(B):
        L = int(lengths[b])
        ref = _gae_oracle(r[b].tolist(), v[b].tolist(), L, gamma, lam)
        assert torch.allclose(a[b, :L], torch.tensor(ref, dtype=torch.float64), atol=1e-9)
        assert torch.all(a[b, L:] == 0) and torch.all(ret[b, L:] == 0)
        assert torch.allclose(ret[b, :L], a[b, :L] + v[b, :L])


def test_baseline_leaves_expected_gradient_unchanged():
    """Monte Carlo on a 5-way categorical policy: E[grad log pi(a) * (r(a) - b)] is the same for every
    action-independent b (and equals the exact gradient of E[r]); the group baselines (RLOO, GRPO 'none')
    also match it, while lowering the variance."""
    torch.manual_seed(0)
    logits = torch.tensor([0.3, -0.2, 0.1, 0.5, -0.4])
    reward_of = torch.tensor([1.0, 0.0, 2.0, 0.5, 3.0])
    p = logits.softmax(0)
    # exact gradient of J = sum_a p_a r_a w.r.t. logits: p_a (r_a - J)
    exact = p * (reward_of - (p * reward_of).sum())
    N, G = 40000, 4
    actions = torch.multinomial(p, N * G, replacement=True)  # (N*G,)
    score = torch.nn.functional.one_hot(actions, 5).float() - p  # grad log pi(a) w.r.t. logits, (N*G, 5)
    r = reward_of[actions]
    estimates = {
        "none": reinforce_advantages(r)[0],
        "const_baseline": r - 1.7,
        "rloo": rloo_advantages(r, G)[0],
        "grpo_none": grpo_advantages(r, G, scale_rewards="none")[0] * G / (G - 1),  # unbiased rescale of centring
    }
    variances = {}
    for name, adv in estimates.items():
        g = score * adv[:, None]  # per-sample gradient estimates (N*G, 5)
        mean, se = g.mean(0), g.std(0) / math.sqrt(g.shape[0])
        assert torch.all((mean - exact).abs() < 5 * se + 1e-3), (name, mean, exact)
        variances[name] = g.var(0).sum().item()
    assert variances["rloo"] < variances["none"]
