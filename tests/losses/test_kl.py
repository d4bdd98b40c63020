"""KL estimators (hand values, exact-KL Monte Carlo oracle), reward folding, and the controllers' state."""

import json
import math

import pytest
import torch

from posttrain.errors import ConfigError
from posttrain.losses.kl import (
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    kl_controller_from_state,
    kl_estimate,
    kl_penalized_rewards,
    kl_penalized_token_rewards,
)


def test_hand_values():
    lp, ref = torch.tensor([-1.0]), torch.tensor([-2.0])
    assert kl_estimate(lp, ref, "k1").item() == pytest.approx(1.0)  # -1 - (-2)
    assert kl_estimate(lp, ref, "k2").item() == pytest.approx(0.5)  # 1^2 / 2
    assert kl_estimate(lp, ref, "k3").item() == pytest.approx(math.exp(-1) + 1 - 1)  # e^-1 - (-1) - 1
    for name in KL_ESTIMATORS:  # identical policies -> 0
        assert kl_estimate(ref, ref, name).item() == 0.0
    with pytest.raises(ConfigError):
        kl_estimate(lp, ref, "k4")


def test_k3_matches_trl_expression():
    # TRL grpo_trainer: exp(ref - logp) - (ref - logp) - 1
    torch.manual_seed(0)
    lp, ref = -torch.rand(50) * 3, -torch.rand(50) * 3
    trl = torch.exp(ref - lp) - (ref - lp) - 1
    assert torch.allclose(kl_estimate(lp, ref, "k3"), trl, atol=1e-6)


def test_estimators_against_exact_kl():
    """Sample from p; k1 and k3 average to KL(p||q) (unbiased), k2 is close for nearby q; k2, k3 >= 0."""
    torch.manual_seed(0)
    p = torch.tensor([0.4, 0.3, 0.2, 0.1])
    q = torch.tensor([0.3, 0.3, 0.25, 0.15])
    exact = (p * (p / q).log()).sum().item()
    x = torch.multinomial(p, 200_000, replacement=True)
    lp, ref = p.log()[x], q.log()[x]
    for name in ("k1", "k3"):
        k = kl_estimate(lp, ref, name)
        se = k.std().item() / math.sqrt(k.numel())
        assert abs(k.mean().item() - exact) < 5 * se, name
    assert abs(kl_estimate(lp, ref, "k2").mean().item() - exact) < 0.1 * exact
    assert (kl_estimate(lp, ref, "k2") >= 0).all() and (kl_estimate(lp, ref, "k3") >= 0).all()
    # and k3 has lower variance than k1 here (the reason GRPO uses it)
    assert kl_estimate(lp, ref, "k3").var() < kl_estimate(lp, ref, "k1").var()


def test_kl_in_reward_hand_values():
    # r=[1, 2]; k1 kl = [[.1, .2, pad], [.3, pad, pad]]; beta=.5
    lp = torch.tensor([[0.1, 0.2, 7.0], [0.3, 9.0, 9.0]])
    ref = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    tok = kl_penalized_token_rewards(torch.tensor([1.0, 2.0]), lp, ref, mask, beta=0.5, estimator="k1")
    # seq 0: [-.05, 1 - .1, 0]; seq 1: [2 - .15, 0, 0]
    assert torch.allclose(tok, torch.tensor([[-0.05, 0.9, 0.0], [1.85, 0.0, 0.0]]))
    seq = kl_penalized_rewards(torch.tensor([1.0, 2.0]), lp, ref, mask, beta=0.5, estimator="k1")
    assert torch.allclose(seq, tok.sum(-1))


def test_kl_in_reward_empty_sequence_and_no_grad():
    lp = torch.zeros(2, 2, requires_grad=True)
    tok = kl_penalized_token_rewards(
        torch.tensor([1.0, 5.0]), lp, torch.zeros(2, 2), torch.tensor([[1, 1], [0, 0]]), 0.1
    )
    assert not tok.requires_grad
    assert torch.equal(tok[1], torch.zeros(2))  # no real token: nothing to credit


def test_adaptive_controller_hand_values():
    c = AdaptiveKLController(value=0.1, target=6.0, horizon=10000)
    # KL=12 -> 12/6-1 = 1 -> clipped to .2 -> value *= 1 + .2*256/10000
    assert c.update(12.0, 256) == pytest.approx(0.1 * (1 + 0.2 * 256 / 10000))
    v = c.value
    # KL=4.5 -> 4.5/6-1 = -.25 -> clipped to -.2
    assert c.update(4.5, 100) == pytest.approx(v * (1 - 0.2 * 100 / 10000))
    v = c.value
    # KL=6.6 -> +.1 (inside the clip)
    assert c.update(6.6, 1000) == pytest.approx(v * (1 + 0.1 * 1000 / 10000))
    with pytest.raises(ConfigError):
        AdaptiveKLController(0.1, target=0.0)


def test_fixed_controller():
    c = FixedKLController(0.04)
    assert c.update(100.0, 10) == 0.04 and c.value == 0.04


@pytest.mark.parametrize("kind", sorted(KL_CONTROLLERS))
def test_controller_state_round_trip_resumes_exactly(kind):
    make = lambda: KL_CONTROLLERS[kind](0.05, 2.0, 500) if kind == "adaptive" else KL_CONTROLLERS[kind](0.05)  # noqa: E731
    kls = [3.0, 1.0, 2.5, 0.2, 8.0, 1.9]
    full = make()
    for k in kls:
        full.update(k, 8)
    first = make()
    for k in kls[:3]:
        first.update(k, 8)
    state = json.loads(json.dumps(first.state_dict()))  # must survive JSON (trainer_state.json)
    resumed = kl_controller_from_state(state)
    for k in kls[3:]:
        resumed.update(k, 8)
    assert resumed.value == full.value  # bit-exact
    other = make()
    other.load_state_dict(state)
    assert other.state_dict() == state


def test_expected_gradient_of_each_estimator_used_as_a_loss():
    """What autograd through a sampled estimator optimises (exact expectation over a 4-way categorical, the
    sampling weights held constant as they are in training): k1 -> 0 (useless as a loss), k2 -> grad KL(pi||ref)
    (the reverse KL), k3 -> grad KL(ref||pi) (the forward KL). Documented in docs/rl.md."""
    logits = torch.tensor([0.2, -0.5, 1.0, 0.1], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([0.25, 0.25, 0.3, 0.2], dtype=torch.float64).log()

    def expected_grad(estimator):
        logp = logits.log_softmax(0)
        w = logp.exp().detach()  # E_{x ~ pi}[grad k(x)] with pi's weights constant
        return torch.autograd.grad((w * kl_estimate(logp, ref, estimator)).sum(), logits)[0]

    def exact_grad(fn):
        return torch.autograd.grad(fn(logits.log_softmax(0)), logits)[0]

    reverse = exact_grad(lambda lp: (lp.exp() * (lp - ref)).sum())  # KL(pi || ref)
    forward = exact_grad(lambda lp: (ref.exp() * (ref - lp)).sum())  # KL(ref || pi)
    assert torch.allclose(expected_grad("k1"), torch.zeros(4, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(expected_grad("k2"), reverse, atol=1e-12)
    assert torch.allclose(expected_grad("k3"), forward, atol=1e-12)
