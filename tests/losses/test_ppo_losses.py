"""PPO losses: value-clip cases, the KL-penalty surrogate (PPO sec. 4), A2C's gradient, critic diagnostics,
and the two adaptive KL controllers against hand calculations and a save/restore."""

import json
import math

import pytest
import torch

from posttrain.errors import ConfigError
from posttrain.losses.kl import AdaptiveKLController, PPOKLController, kl_controller_from_state
from posttrain.losses.policy import batch_normalizers, policy_loss, value_loss
from posttrain.losses.ppo import advantage_metrics, kl_old_k3, kl_penalty_policy_loss, value_metrics


@pytest.mark.parametrize(
    "v,v_old,ret,eps,loss,grad,clipped",
    [
        (2.0, 1.0, 0.0, 0.5, 2.0, 2.0, 0.0),  # moved away from R beyond eps: unclipped error is the larger one
        (2.0, 1.0, 3.0, 0.5, 1.125, 0.0, 1.0),  # moved toward R beyond eps: the clipped error wins, no gradient
        (1.2, 1.0, 3.0, 0.5, 1.62, -1.8, 0.0),  # inside the clip range: plain squared error
        (0.0, 1.0, 3.0, 0.5, 4.5, -3.0, 0.0),  # moved away below: unclipped (V - R)^2 = 9 > (0.5 - 3)^2
        (0.0, 1.0, -3.0, 0.5, 6.125, 0.0, 1.0),  # moved toward R below: clipped (0.5 + 3)^2 = 12.25 > 9
        (2.0, 1.0, 3.0, None, 0.5, -1.0, 0.0),  # no clip at all
    ],
)
def test_value_clip_cases(v, v_old, ret, eps, loss, grad, clipped):
    V = torch.tensor([[v]], requires_grad=True)
    out, m = value_loss(V, torch.tensor([[v_old]]), torch.tensor([[ret]]), torch.ones(1, 1), clip_eps=eps)
    out.backward()
    assert out.item() == pytest.approx(loss) and V.grad.item() == pytest.approx(grad, abs=1e-7)
    assert m["value_clip_frac"] == clipped


def test_value_loss_is_token_mean_under_the_global_token_count():
    torch.manual_seed(0)
    V, ret = torch.randn(4, 5, requires_grad=True), torch.randn(4, 5)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]])
    full, _ = value_loss(V, V.detach(), ret, mask, clip_eps=0.2)
    norms = batch_normalizers(mask)
    parts = [
        value_loss(V[i : i + 1], V[i : i + 1].detach(), ret[i : i + 1], mask[i : i + 1], clip_eps=0.2, **norms)[0]
        for i in range(4)
    ]
    torch.testing.assert_close(sum(parts), full)
    torch.testing.assert_close(full, 0.5 * ((V - ret) ** 2 * mask).sum() / mask.sum())


def test_kl_penalty_surrogate():
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = torch.tensor([[-1.0, -3.0]])  # log r = [0, 1]
    adv, mask = torch.tensor([[2.0, -1.0]]), torch.ones(1, 2)
    loss, m = kl_penalty_policy_loss(lp, old, adv, mask, beta=0.5)
    r = torch.tensor([1.0, math.e])
    kl = r - 1 - torch.log(r)  # [0, e - 2]
    expect = (-(r * adv[0]) + 0.5 * kl).mean()  # unclipped: r = e is not cut at 1.2
    assert loss.item() == pytest.approx(expect.item())
    assert m["kl_old"] == pytest.approx(kl.mean().item()) and m["clip_frac_high"] == 0.0
    loss.backward()
    # d/d lp of (-r A + beta (r - 1 - log r)) / 2 = (-r A + beta (r - 1)) / 2
    torch.testing.assert_close(lp.grad, ((-r * adv[0] + 0.5 * (r - 1)) / 2)[None])
    assert kl_old_k3(old, old).abs().max().item() == 0.0


def test_a2c_gradient_is_the_policy_gradient_with_gae_advantages():
    """One on-policy update (ratio exactly 1): the clipped, unclipped and KL-penalty surrogates all have the
    gradient of the reference loss -sum_t A_t log pi_t / N_tokens."""
    torch.manual_seed(1)
    logits = torch.randn(3, 4, 6, requires_grad=True)
    labels = torch.randint(0, 6, (3, 4))
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.float32)
    adv = torch.randn(3, 4)

    def logps():
        return torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)

    ref = -(adv * logps() * mask).sum() / mask.sum()
    (g_ref,) = torch.autograd.grad(ref, logits)
    old = logps().detach()
    for fn in (
        lambda lp: policy_loss(lp, old, adv, mask, agg="token_mean")[0],
        lambda lp: policy_loss(lp, old, adv, mask, clip_eps_low=None, agg="token_mean")[0],
        lambda lp: kl_penalty_policy_loss(lp, old, adv, mask, beta=0.3)[0],
    ):
        (g,) = torch.autograd.grad(fn(logps()), logits)
        torch.testing.assert_close(g, g_ref, atol=1e-7, rtol=1e-6)


def test_value_metrics_explained_variance():
    ret = torch.tensor([[1.0, 2.0, 9.0], [3.0, 0.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    assert value_metrics(ret, ret, mask)["explained_variance"] == pytest.approx(1.0)
    m = value_metrics(torch.full_like(ret, 1.5), ret, mask)  # the mean of the real returns: explains nothing
    assert m["explained_variance"] == pytest.approx(0.0, abs=1e-6)
    assert m["value_min"] == m["value_max"] == 1.5 and m["returns_mean"] == pytest.approx(1.5)
    assert math.isnan(
        value_metrics(torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2))["explained_variance"]
    )  # Var(R)=0
    a = advantage_metrics(torch.tensor([[1.0, -1.0, 50.0]]), torch.tensor([[1, 1, 0]]))
    assert a["advantage_mean"] == 0.0 and a["advantage_abs_max"] == 1.0


def test_ziegler_controller_after_k_updates_equals_the_hand_calculation_and_survives_restore():
    # beta <- beta (1 + clip(KL/target - 1, -.2, .2) n / H); target 6 nats per sequence, n = 64 sequences
    c = AdaptiveKLController(value=0.15, target=6.0, horizon=10000)
    kls = [12.0, 3.0, 6.6, 5.7, float("nan"), 30.0]
    beta = 0.15
    for kl in kls[:3]:
        c.update(kl, 64)
    for e in (0.2, -0.2, 0.1):
        beta *= 1 + e * 64 / 10000
    assert c.value == pytest.approx(beta, rel=1e-12)
    restored = kl_controller_from_state(json.loads(json.dumps(c.state_dict())))
    for kl in kls[3:]:
        c.update(kl, 64)
        restored.update(kl, 64)
    for e in (-0.05, 0.0, 0.2):  # 5.7/6 - 1 = -.05; NaN leaves beta unchanged
        beta *= 1 + e * 64 / 10000
    assert restored.value == c.value == pytest.approx(beta, rel=1e-12)
    with pytest.raises(ConfigError, match="horizon > 0"):
        AdaptiveKLController(0.1, target=6.0, horizon=0.0)


def test_ppo_paper_controller():
    c = PPOKLController(value=1.0, target=0.01)
    assert c.update(0.02) == 2.0  # > 1.5 target: double
    assert c.update(0.012) == 2.0  # inside [target / 1.5, 1.5 target]: keep
    assert c.update(0.001) == 1.0  # < target / 1.5: halve
    r = kl_controller_from_state(c.state_dict())
    assert isinstance(r, PPOKLController) and r.value == 1.0 and r.target == 0.01
    with pytest.raises(ConfigError):
        PPOKLController(1.0, target=0.0)
