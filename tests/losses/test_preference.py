"""Preference losses: hand-derived values, gradient directions, properties, and parity with TRL 1.16.

TRL keeps most of its DPO losses inline in ``DPOTrainer._compute_loss`` (which runs the model), so the
parity tests call that method with a minimal stub ``self`` and a stub model that returns fixed per-token
log-probs; KTO likewise through ``KTOTrainer._compute_loss``, SimPO/cDPO through ``CPOTrainer.cpo_loss``
and Bradley-Terry through ``RewardTrainer.compute_loss``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.errors import ConfigError
from posttrain.losses.preference import (
    LOSS_EXTRAS,
    PREFERENCE_LOSSES,
    REFERENCE_FREE_LOSSES,
    BCOState,
    BetaDPOState,
    bco_pair_loss,
    bco_update_state,
    beta_dpo_filter,
    beta_dpo_loss,
    beta_dpo_update_state,
    conservative_dpo_loss,
    dpo_loss,
    f_dpo_loss,
    hinge_loss,
    ipo_loss,
    kto_loss,
    parse_loss_weights,
    rdpo_loss,
    resolve_loss,
    robust_dpo_loss,
    rpo_loss,
    sft_loss,
    simpo_loss,
)
from posttrain.losses.ranking import (
    accuracy_by_margin_bucket,
    bradley_terry_loss,
    plackett_luce_loss,
    pointwise_mse_loss,
)

LOG2 = math.log(2.0)


def t(*xs):
    return torch.tensor(xs, dtype=torch.float64)


def pair(pc, pr, rc, rr):
    return dict(
        policy_chosen_logps=t(*pc), policy_rejected_logps=t(*pr), ref_chosen_logps=t(*rc), ref_rejected_logps=t(*rr)
    )


def softplus(x):  # -log sigma(x) = log(1 + e^-x), for the hand derivations
    return math.log1p(math.exp(-x))


# ---------------------------------------------------------------------------------------------
# hand-derived values


def test_dpo_hand_value_and_metrics():
    # pair 1: chosen ratio -1 - (-2) = 1, rejected ratio -3 - (-2) = -1 -> h = 2; beta=0.5 -> z = 1
    # pair 2: chosen ratio 0, rejected ratio 0 -> h = 0 -> z = 0
    # loss = (log(1 + e^-1) + log 2) / 2 = (0.313262 + 0.693147) / 2 = 0.503204
    loss, m = dpo_loss(**pair([-1, -5], [-3, -4], [-2, -5], [-2, -4]), beta=0.5)
    assert loss.item() == pytest.approx((softplus(1.0) + LOG2) / 2, abs=1e-12)
    assert loss.item() == pytest.approx(0.5032045, abs=1e-6)
    # implicit rewards beta*(logpi - logpi_ref): chosen [0.5, 0], rejected [-0.5, 0]
    assert m["rewards/chosen"].item() == pytest.approx(0.25)
    assert m["rewards/rejected"].item() == pytest.approx(-0.25)
    assert m["rewards/margins"].item() == pytest.approx(0.5)
    assert m["rewards/accuracies"].item() == pytest.approx(0.5)  # the tie does not count as correct
    assert m["logps/chosen"].item() == pytest.approx(-3.0)
    assert m["logps/rejected"].item() == pytest.approx(-3.5)
    assert all(not v.requires_grad and v.dim() == 0 for v in m.values())


def test_ipo_hand_value_summed_and_per_token():
    # h = (-1 - -2) - (-3 - -2) = 2; beta = 0.5 -> target 1/(2*0.5) = 1 -> (2 - 1)^2 = 1
    kw = pair([-1], [-3], [-2], [-2])
    assert ipo_loss(**kw, beta=0.5)[0].item() == pytest.approx(1.0)
    # per token: chosen ratio 1 / 2 tokens = 0.5, rejected -1 / 4 tokens = -0.25 -> h = 0.75 -> (0.75 - 1)^2 = 0.0625
    loss, _ = ipo_loss(**kw, beta=0.5, chosen_lengths=t(2), rejected_lengths=t(4))
    assert loss.item() == pytest.approx(0.0625)
    with pytest.raises(ValueError, match="both"):
        ipo_loss(**kw, beta=0.5, chosen_lengths=t(2))


def test_hinge_hand_value():
    # h = 1 and 3 with beta 0.5 -> relu(1 - 0.5) = 0.5 and relu(1 - 1.5) = 0 -> mean 0.25
    loss, _ = hinge_loss(**pair([0, 0], [-1, -3], [0, 0], [0, 0]), beta=0.5)
    assert loss.item() == pytest.approx(0.25)


def test_cdpo_and_robust_hand_values():
    kw = pair([-1], [-2], [0], [0])  # h = -1 - (-2) = 1; beta = 1 -> z = 1
    eps = 0.25
    # cDPO: 0.75 * softplus(1) + 0.25 * softplus(-1) = 0.75 * 0.313262 + 0.25 * 1.313262 = 0.563262
    c, _ = conservative_dpo_loss(**kw, beta=1.0, label_smoothing=eps)
    assert c.item() == pytest.approx(0.75 * softplus(1) + 0.25 * softplus(-1))
    assert c.item() == pytest.approx(0.5632617, abs=1e-6)
    # robust: (0.75 * softplus(1) - 0.25 * softplus(-1)) / 0.5 = (0.234946 - 0.328315) / 0.5 = -0.186738
    r, _ = robust_dpo_loss(**kw, beta=1.0, label_smoothing=eps)
    assert r.item() == pytest.approx((0.75 * softplus(1) - 0.25 * softplus(-1)) / 0.5)
    assert r.item() == pytest.approx(-0.1867383, abs=1e-6)
    # eps = 0 -> both are DPO
    d, _ = dpo_loss(**kw, beta=1.0)
    assert conservative_dpo_loss(**kw, beta=1.0, label_smoothing=0.0)[0].item() == pytest.approx(d.item())
    assert robust_dpo_loss(**kw, beta=1.0, label_smoothing=0.0)[0].item() == pytest.approx(d.item())
    with pytest.raises(ValueError):
        robust_dpo_loss(**kw, label_smoothing=0.5)
    with pytest.raises(ValueError):
        conservative_dpo_loss(**kw, label_smoothing=0.7)


def test_simpo_hand_value_and_reference_free():
    # chosen -4 over 4 tokens = -1/token, rejected -6 over 3 tokens = -2/token
    # beta=2, gamma=0.5: z = 2 * (-1 - -2) - 0.5 = 1.5 -> log(1 + e^-1.5) = 0.201413
    loss, m = simpo_loss(
        policy_chosen_logps=t(-4),
        policy_rejected_logps=t(-6),
        chosen_lengths=t(4),
        rejected_lengths=t(3),
        beta=2.0,
        gamma=0.5,
    )
    assert loss.item() == pytest.approx(softplus(1.5))
    assert loss.item() == pytest.approx(0.2014133, abs=1e-6)
    assert m["rewards/chosen"].item() == pytest.approx(-2.0)  # beta * avg logp
    assert m["rewards/rejected"].item() == pytest.approx(-4.0)
    assert "simpo" in REFERENCE_FREE_LOSSES


def test_rpo_hand_value():
    # h = 0 -> DPO part log 2; nll mean = (2 + 4) / 2 = 3; alpha = 0.5 -> log 2 + 1.5 = 2.193147
    loss, m = rpo_loss(**pair([-1, -1], [-1, -1], [-1, -1], [-1, -1]), chosen_nll=t(2, 4), beta=1.0, alpha=0.5)
    assert loss.item() == pytest.approx(LOG2 + 1.5)
    assert m["nll/chosen"].item() == pytest.approx(3.0)
    assert m["rpo/dpo_loss"].item() == pytest.approx(LOG2)


def test_rdpo_hand_value_and_length_direction():
    # h = 0, beta = 1, alpha = 0.1, |y_w| = 5, |y_l| = 3 -> z = 0.1 * 2 = 0.2 -> log(1 + e^-0.2) = 0.598139
    kw = pair([-1], [-1], [-1], [-1])
    loss, m = rdpo_loss(**kw, chosen_lengths=t(5), rejected_lengths=t(3), beta=1.0, alpha=0.1)
    assert loss.item() == pytest.approx(softplus(0.2))
    assert loss.item() == pytest.approx(0.5981389, abs=1e-6)
    assert m["rdpo/length_term"].item() == pytest.approx(0.2)
    # a longer chosen answer already "explains" part of the margin: less loss, smaller gradient than DPO
    pc = t(-1).requires_grad_()
    rdpo_loss(**{**kw, "policy_chosen_logps": pc}, chosen_lengths=t(5), rejected_lengths=t(3), beta=1.0, alpha=0.1)[
        0
    ].backward()
    pd = t(-1).requires_grad_()
    dpo_loss(**{**kw, "policy_chosen_logps": pd}, beta=1.0)[0].backward()
    assert 0 > pc.grad.item() > pd.grad.item()
    # alpha = 0 is DPO
    assert rdpo_loss(**kw, chosen_lengths=t(5), rejected_lengths=t(3), beta=1.0, alpha=0.0)[0].item() == pytest.approx(
        LOG2
    )


def test_kto_hand_value():
    # desirable: r = -1 - -2 = 1; undesirable: r = -3 - -2 = -1
    # KL pairs: policy - ref = [0.5, -0.1] -> mean 0.2 (clamped at 0: stays 0.2); beta = 1
    # desirable loss 1 - sigma(1 - 0.2) = 1 - 0.689974 = 0.310026
    # undesirable loss 1 - sigma(0.2 - -1) = 1 - sigma(1.2) = 1 - 0.768525 = 0.231475; weights 1 and 2 -> 0.462950
    loss, m = kto_loss(
        policy_logps=t(-1, -3), ref_logps=t(-2, -2), labels=torch.tensor([True, False]),
        policy_kl_logps=t(-1.5, -2.1), ref_kl_logps=t(-2, -2), beta=1.0, undesirable_weight=2.0,
    )  # fmt: skip
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    expected = ((1 - sig(0.8)) + 2 * (1 - sig(1.2))) / 2
    assert loss.item() == pytest.approx(expected)
    assert loss.item() == pytest.approx(0.3864880, abs=1e-6)
    assert m["kl"].item() == pytest.approx(0.2)
    assert m["rewards/chosen"].item() == pytest.approx(1.0)
    assert m["rewards/rejected"].item() == pytest.approx(-1.0)
    # a negative KL estimate is clamped to 0; an all-desirable batch has no rejected metrics
    _, m2 = kto_loss(
        policy_logps=t(-1), ref_logps=t(-2), labels=torch.tensor([True]), policy_kl_logps=t(-3), ref_kl_logps=t(-2)
    )
    assert m2["kl"].item() == 0.0 and "rewards/rejected" not in m2
    with pytest.raises(ValueError, match="kl"):
        kto_loss(policy_logps=t(-1), ref_logps=t(-2), labels=torch.tensor([True]))


def test_kto_reference_point_gets_no_gradient():
    # z0 is a detached batch estimate (TRL and the paper): the KL pairs' log-probs receive no gradient
    pk = t(-1.0, -2.0).requires_grad_()
    pl = t(-1, -3).requires_grad_()
    loss, _ = kto_loss(
        policy_logps=pl,
        ref_logps=t(-2, -2),
        labels=torch.tensor([True, False]),
        policy_kl_logps=pk,
        ref_kl_logps=t(-2, -3),
    )
    g_pl, g_pk = torch.autograd.grad(loss, [pl, pk], allow_unused=True)
    assert g_pk is None
    # desirable: d/dr (1 - sigma(r - z0)) / 2 < 0 (raise it); undesirable: d/dr (1 - sigma(z0 - r)) / 2 > 0 (lower it)
    assert g_pl[0] < 0 < g_pl[1]


# ---------------------------------------------------------------------------------------------
# beta-DPO


def test_beta_dpo_state_update_hand_value():
    # gap [1, 3]: mean 2, unbiased std sqrt(2) = 1.414214; m = 0.9 from (0, 0) -> (0.2, 0.1414214)
    s = beta_dpo_update_state(t(1, 3), BetaDPOState(0.0, 0.0), momentum=0.9)
    assert s.gap_mean == pytest.approx(0.2) and s.gap_std == pytest.approx(0.1 * math.sqrt(2))
    assert beta_dpo_update_state(t(1, 3), None) == pytest.approx(BetaDPOState(2.0, math.sqrt(2)))


def test_beta_dpo_hand_value_without_filtering():
    # gaps h = [1, 3] (ratios: chosen [1, 3], rejected [0, 0]); state (0.5, 1), momentum 0.5
    # M_0 = 0.5 * 0.5 + 0.5 * 2 = 1.25; nothing filtered -> mean gap 2
    # beta_b = 0.1 * (1 + 1.0 * (2 - 1.25)) = 0.175
    # loss = (softplus(0.175) + softplus(0.525)) / 2 = (0.609470 + 0.464712) / 2 = 0.537091
    kw = pair([1, 3], [0, 0], [0, 0], [0, 0])
    loss, m = beta_dpo_loss(**kw, beta=0.1, alpha=1.0, filter_ratio=0.0, momentum=0.5, state=BetaDPOState(0.5, 1.0))
    assert m["beta_dpo/beta"].item() == pytest.approx(0.175)
    assert loss.item() == pytest.approx((softplus(0.175) + softplus(0.525)) / 2)
    assert loss.item() == pytest.approx(0.5370911, abs=1e-6)
    assert BetaDPOState.from_metrics(m) == pytest.approx(BetaDPOState(1.25, 0.5 * 1 + 0.5 * math.sqrt(2)))
    assert m["beta_dpo/kept"].item() == 1.0
    assert m["rewards/chosen"].item() == pytest.approx(0.2)  # base beta * ratio: 0.1 * mean(1, 3)
    # alpha = 0 is DPO
    d, _ = dpo_loss(**kw, beta=0.1)
    assert beta_dpo_loss(**kw, beta=0.1, alpha=0.0, filter_ratio=0.0)[0].item() == pytest.approx(d.item())


def test_beta_dpo_beta_is_clamped_and_detached():
    pc = t(-10.0, -10.0).requires_grad_()
    # huge negative deviation from the running mean -> beta_b clamps at min_beta
    loss, m = beta_dpo_loss(
        policy_chosen_logps=pc, policy_rejected_logps=t(0, 0), ref_chosen_logps=t(0, 0), ref_rejected_logps=t(0, 0),
        beta=0.1, alpha=1.0, filter_ratio=0.0, state=BetaDPOState(100.0, 1.0), momentum=0.99,
    )  # fmt: skip
    assert m["beta_dpo/beta"].item() == pytest.approx(1e-3)
    loss.backward()  # the gradient is exactly DPO's at beta_b: beta_b treated as a constant
    h = -10.0
    assert pc.grad[0].item() == pytest.approx(-1e-3 * torch.sigmoid(torch.tensor(-1e-3 * h)).item() / 2)


def test_beta_dpo_filter_prefers_pairs_near_the_running_mean():
    gen = torch.Generator().manual_seed(0)
    gap = t(0.0, 0.1, -0.1, 0.05, 50.0, -50.0, 0.2, -0.2, 0.0, 0.1)
    state = BetaDPOState(0.0, 1.0)
    kept_outliers = 0
    for _ in range(50):
        keep = beta_dpo_filter(gap, state, filter_ratio=0.2, generator=gen)
        assert keep.sum().item() == 8  # int(10 * 0.8)
        kept_outliers += int(keep[4]) + int(keep[5])
    assert kept_outliers == 0  # weight exp(-1250) (floored at 1e-30) never beats the near-mean pairs
    # filtered-out pairs do not contribute to the loss
    pc = gap.clone().requires_grad_()
    z = torch.zeros(10, dtype=torch.float64)
    loss, m = beta_dpo_loss(policy_chosen_logps=pc, policy_rejected_logps=z, ref_chosen_logps=z, ref_rejected_logps=z,
                            filter_ratio=0.2, state=state, generator=torch.Generator().manual_seed(1))  # fmt: skip
    loss.backward()
    assert (pc.grad != 0).sum().item() == 8 and m["beta_dpo/kept"].item() == pytest.approx(0.8)
    with pytest.raises(ValueError):
        beta_dpo_filter(gap, state, filter_ratio=1.0)


# ---------------------------------------------------------------------------------------------
# gradients and properties


def test_dpo_gradient_is_sigma_minus_h_weighted():
    torch.manual_seed(0)
    B, beta = 6, 0.3
    pc, pr = (
        torch.randn(B, dtype=torch.float64, requires_grad=True),
        torch.randn(B, dtype=torch.float64, requires_grad=True),
    )
    rc, rr = torch.randn(B, dtype=torch.float64), torch.randn(B, dtype=torch.float64)
    loss, _ = dpo_loss(
        policy_chosen_logps=pc, policy_rejected_logps=pr, ref_chosen_logps=rc, ref_rejected_logps=rr, beta=beta
    )
    loss.backward()
    h = (pc - rc) - (pr - rr)
    weight = beta * torch.sigmoid(-beta * h.detach()) / B
    torch.testing.assert_close(pc.grad, -weight)  # raise the chosen log-prob ...
    torch.testing.assert_close(pr.grad, weight)  # ... lower the rejected one, by the same amount
    assert (pc.grad < 0).all() and (pr.grad > 0).all()
    # a confidently-ranked pair gets (much) less weight than a mis-ranked one
    assert pc.grad[h.argmax()].abs() < pc.grad[h.argmin()].abs()


@pytest.mark.parametrize("name", ["dpo", "ipo", "hinge", "robust", "cdpo", "rpo", "rdpo", "simpo"])
def test_every_paired_loss_pushes_chosen_up_rejected_down(name):
    # at a tie (h = 0, equal lengths) every paired loss should prefer raising the chosen log-prob
    B = 3
    pc, pr = torch.full((B,), -5.0, requires_grad=True), torch.full((B,), -5.0, requires_grad=True)
    extra = {"chosen_lengths": torch.full((B,), 4.0), "rejected_lengths": torch.full((B,), 4.0), "chosen_nll": -pc / 4}
    kw = dict(
        policy_chosen_logps=pc,
        policy_rejected_logps=pr,
        ref_chosen_logps=torch.full((B,), -5.0),
        ref_rejected_logps=torch.full((B,), -5.0),
    )
    kw.update({k: extra[k] for k in LOSS_EXTRAS.get(name, ())})
    if name in REFERENCE_FREE_LOSSES:
        kw["ref_chosen_logps"] = kw["ref_rejected_logps"] = None
    loss, metrics = PREFERENCE_LOSSES[name](**kw)
    loss.backward()
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert (pc.grad < 0).all() and (pr.grad > 0).all()
    assert {
        "rewards/chosen",
        "rewards/rejected",
        "rewards/margins",
        "rewards/accuracies",
        "logps/chosen",
        "logps/rejected",
    } <= set(metrics)


def test_dpo_implicit_reward_is_beta_log_ratio():
    torch.manual_seed(1)
    pc, pr, rc, rr = (torch.randn(5, dtype=torch.float64) for _ in range(4))
    _, m = dpo_loss(
        policy_chosen_logps=pc, policy_rejected_logps=pr, ref_chosen_logps=rc, ref_rejected_logps=rr, beta=0.7
    )
    assert m["rewards/chosen"].item() == pytest.approx((0.7 * (pc - rc)).mean().item())
    assert m["rewards/rejected"].item() == pytest.approx((0.7 * (pr - rr)).mean().item())
    assert m["rewards/accuracies"].item() == pytest.approx((((pc - rc) > (pr - rr)).double()).mean().item())


finite = st.floats(-30, 30, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(finite, finite, finite, finite), min_size=1, max_size=6), st.floats(0.01, 5.0))
def test_dpo_swap_symmetry(rows, beta):
    # swapping chosen and rejected negates h: loss(swapped) = mean softplus(beta h) = mean[-log sigma(-beta h)],
    # and loss(h) - loss(-h) = -mean(beta h) (since softplus(-x) - softplus(x) = -x)
    pc, pr, rc, rr = (t(*c) for c in zip(*rows))
    a, ma = dpo_loss(
        policy_chosen_logps=pc, policy_rejected_logps=pr, ref_chosen_logps=rc, ref_rejected_logps=rr, beta=beta
    )
    b, mb = dpo_loss(
        policy_chosen_logps=pr, policy_rejected_logps=pc, ref_chosen_logps=rr, ref_rejected_logps=rc, beta=beta
    )
    h = (pc - rc) - (pr - rr)
    assert (a - b).item() == pytest.approx(-(beta * h).mean().item(), abs=1e-9)
    assert ma["rewards/margins"].item() == pytest.approx(-mb["rewards/margins"].item(), abs=1e-12)
    assert a.item() >= 0 and math.isfinite(a.item())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(finite, finite), min_size=1, max_size=6))
def test_bt_equals_bce_on_reward_difference(rows):
    rw, rl = (t(*c) for c in zip(*rows))
    loss, _ = bradley_terry_loss(rw, rl)
    bce = F.binary_cross_entropy_with_logits(rw - rl, torch.ones_like(rw))
    assert loss.item() == pytest.approx(bce.item(), rel=1e-9, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(finite, finite), min_size=1, max_size=5), st.floats(-20, 20))
def test_dpo_invariant_to_a_shared_shift_of_policy_logps(rows, shift):
    # adding c to both policy log-probs of a pair (e.g. a prompt-dependent log Z) leaves h unchanged
    pc, pr = (t(*c) for c in zip(*rows))
    z = torch.zeros_like(pc)
    a, _ = dpo_loss(policy_chosen_logps=pc, policy_rejected_logps=pr, ref_chosen_logps=z, ref_rejected_logps=z)
    b, _ = dpo_loss(
        policy_chosen_logps=pc + shift, policy_rejected_logps=pr + shift, ref_chosen_logps=z, ref_rejected_logps=z
    )
    assert a.item() == pytest.approx(b.item(), abs=1e-9)


def test_dpo_stays_finite_at_extreme_margins():
    pc = t(-1e4, 1e4).requires_grad_()
    z = t(0, 0)
    loss, _ = dpo_loss(
        policy_chosen_logps=pc, policy_rejected_logps=z, ref_chosen_logps=z, ref_rejected_logps=z, beta=1.0
    )
    loss.backward()
    assert loss.item() == pytest.approx(1e4 / 2)  # softplus(-1e4)=0 ... softplus(1e4)=1e4 -> mean 5000
    assert torch.isfinite(pc.grad).all()


def test_shape_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="equal length"):
        dpo_loss(
            policy_chosen_logps=t(1, 2),
            policy_rejected_logps=t(1),
            ref_chosen_logps=t(1, 2),
            ref_rejected_logps=t(1, 2),
        )
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(**pair([1], [1], [1], [1]), beta=0.0)


# ---------------------------------------------------------------------------------------------
# reward-model losses


def test_bradley_terry_hand_value_margin_and_centering():
    # r_w - r_l = [1, -1] -> (softplus(1) + softplus(-1)) / 2 = (0.313262 + 1.313262) / 2 = 0.813262
    rw, rl = t(1, 0), t(0, 1)
    loss, m = bradley_terry_loss(rw, rl)
    assert loss.item() == pytest.approx((softplus(1) + softplus(-1)) / 2)
    assert loss.item() == pytest.approx(0.8132617, abs=1e-6)
    assert m["accuracy"].item() == 0.5 and m["margin"].item() == 0.0
    assert m["rewards/mean"].item() == pytest.approx(0.5)
    # margin [0.5, 0.5] -> softplus(0.5), softplus(-1.5); centre coef 0.1 * mean((1+0)^2, (0+1)^2) = 0.1
    loss2, _ = bradley_terry_loss(rw, rl, margin=t(0.5, 0.5), center_coef=0.1)
    assert loss2.item() == pytest.approx((softplus(0.5) + softplus(-1.5)) / 2 + 0.1)


def test_bradley_terry_uses_logsigmoid_not_log_of_sigmoid():
    # log(sigmoid(-200)) underflows to -inf in float32; logsigmoid gives 200
    loss, _ = bradley_terry_loss(torch.tensor([-100.0]), torch.tensor([100.0]))
    assert loss.item() == pytest.approx(200.0)


def _pl_brute_force(r):
    """P(ranking) as a product of successive softmax choices, in plain Python."""
    logp = 0.0
    for j in range(len(r)):
        logp += r[j] - math.log(sum(math.exp(x) for x in r[j:]))
    return -logp


def test_plackett_luce_hand_value_brute_force_and_k2_is_bt():
    # r = [2, 1, 0]: -(2 - log(e^2 + e + 1)) - (1 - log(e + 1)) - 0 = 0.407606 + 0.313262 = 0.720868
    loss, m = plackett_luce_loss(t(2, 1, 0).unsqueeze(0))
    assert loss.item() == pytest.approx(0.7208681, abs=1e-6)
    assert m["accuracy"].item() == 1.0 and m["top1_accuracy"].item() == 1.0
    torch.manual_seed(0)
    r = torch.randn(4, 5, dtype=torch.float64)
    assert plackett_luce_loss(r)[0].item() == pytest.approx(sum(_pl_brute_force(row.tolist()) for row in r) / 4)
    rw, rl = torch.randn(7, dtype=torch.float64), torch.randn(7, dtype=torch.float64)
    assert plackett_luce_loss(torch.stack([rw, rl], -1))[0].item() == pytest.approx(
        bradley_terry_loss(rw, rl)[0].item()
    )


def test_plackett_luce_mask_drops_entries_and_keeps_gradients_finite():
    r = t(2, 1, 0, 7).unsqueeze(0).requires_grad_()
    mask = torch.tensor([[True, True, False, True]])
    loss, m = plackett_luce_loss(r, mask)
    assert loss.item() == pytest.approx(_pl_brute_force([2, 1, 7]))
    loss.backward()
    assert torch.isfinite(r.grad).all() and r.grad[0, 2].item() == 0.0
    assert m["accuracy"].item() == pytest.approx(1 / 3)  # pairs (2,1) correct; (2,7), (1,7) wrong
    with pytest.raises(ValueError):
        plackett_luce_loss(t(1, 2))


def test_pointwise_mse_hand_value():
    loss, m = pointwise_mse_loss(t(1, 2), t(0, 0))
    assert loss.item() == pytest.approx(2.5)  # (1 + 4) / 2
    assert m["rewards/mean"].item() == pytest.approx(1.5)


def test_accuracy_by_margin_bucket():
    out = accuracy_by_margin_bucket(t(1, 0, 3, 2), t(0, 1, 1, 5), bucket_values=t(0.5, 0.7, 2.0, 5.0), edges=(1.0,))
    # bucket (-inf, 1): pairs 0 (correct), 1 (wrong) -> 0.5; bucket [1, inf): pairs 2 (correct), 3 (wrong) -> 0.5
    assert out["accuracy/bucket_-inf_1"].item() == 0.5 and out["count/bucket_-inf_1"].item() == 2
    assert out["accuracy/bucket_1_inf"].item() == 0.5
    out2 = accuracy_by_margin_bucket(t(1), t(0), bucket_values=t(3.0), edges=(1.0, 2.0))
    assert list(out2) == ["accuracy/bucket_2_inf", "count/bucket_2_inf"]


# ---------------------------------------------------------------------------------------------
# parity with TRL 1.16


trl = pytest.importorskip("trl")


class _StubLM(torch.nn.Module):
    """Returns fixed per-token log-probs for whichever input width it is called with (as TRL's fused head)."""

    def __init__(self, by_width: dict[int, torch.Tensor]):
        super().__init__()
        self.by_width = by_width

    def forward(self, input_ids, **kwargs):
        lp = self.by_width[input_ids.shape[1]]
        z = torch.zeros_like(lp)
        return SimpleNamespace(log_probs=lp, entropy=z, mean_logits=z, is_top1=torch.zeros_like(lp, dtype=torch.bool))


def _accel():
    return SimpleNamespace(device=torch.device("cpu"), gather=lambda x: x, gather_for_metrics=lambda x: x)


def _random_batch(B, T, seed, equal_chosen_lengths=False):
    """Per-token log-probs (2B, T-1) under a completion mask whose column 0 is the prompt."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T, (2 * B,), generator=g)
    if equal_chosen_lengths:
        lengths[:B] = T - 2
    completion_mask = torch.zeros(2 * B, T, dtype=torch.long)
    for i, n in enumerate(lengths.tolist()):
        completion_mask[i, T - n :] = 1
    token_lp = -torch.rand(2 * B, T - 1, generator=g, dtype=torch.float64) * 3 * completion_mask[:, 1:]
    ref = -torch.rand(2 * B, generator=g, dtype=torch.float64) * 3 * lengths
    return token_lp, completion_mask, ref


def _trl_dpo(
    loss_types,
    loss_weights,
    beta,
    label_smoothing,
    token_lp,
    completion_mask,
    ref,
    *,
    f_divergence_type="reverse_kl",
    f_alpha_divergence_coef=0.5,
    discopop_tau=0.05,
):
    from trl.trainer.dpo_trainer import DPOTrainer

    B2, T = completion_mask.shape
    model = _StubLM({T: token_lp})
    stub = SimpleNamespace(
        model=model, accelerator=_accel(), aux_loss_enabled=False, ld_alpha=None, precompute_ref_logps=True,
        f_divergence_type=f_divergence_type, f_alpha_divergence_coef=f_alpha_divergence_coef, loss_types=loss_types,
        loss_weights=loss_weights, beta=beta, label_smoothing=label_smoothing, use_weighting=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)}, _total_train_tokens=0, _tp_size=1,
        args=SimpleNamespace(discopop_tau=discopop_tau),
    )  # fmt: skip
    inputs = {
        "input_ids": torch.zeros(B2, T, dtype=torch.long), "attention_mask": torch.ones(B2, T, dtype=torch.long),
        "completion_mask": completion_mask, "ref_chosen_logps": ref[: B2 // 2], "ref_rejected_logps": ref[B2 // 2 :],
    }  # fmt: skip
    loss = DPOTrainer._compute_loss(stub, model, inputs, return_outputs=False)
    return loss, {k: v[-1] for k, v in stub._metrics["train"].items()}


def _ours(name, token_lp, completion_mask, ref, weights=None, **kw):
    B = completion_mask.shape[0] // 2
    seq = token_lp.sum(-1)  # (2B,) the stub's log-probs are already zero off the completion
    lengths = completion_mask.sum(-1).to(seq.dtype)
    extras = {"chosen_lengths": lengths[:B], "rejected_lengths": lengths[B:]}
    args = dict(
        policy_chosen_logps=seq[:B], policy_rejected_logps=seq[B:], ref_chosen_logps=ref[:B], ref_rejected_logps=ref[B:]
    )
    choice = resolve_loss(name, weights)
    args.update({k: v for k, v in extras.items() if k in choice.extras})
    return choice.fn(**args, **kw)


@pytest.mark.parametrize(
    "name,trl_type,kw",
    [
        ("dpo", "sigmoid", {"beta": 0.1}),
        ("dpo", "sigmoid", {"beta": 2.0}),
        ("hinge", "hinge", {"beta": 0.3}),
        ("ipo", "ipo", {"beta": 0.2}),
        ("robust", "robust", {"beta": 0.1, "label_smoothing": 0.2}),
    ],
)
def test_parity_with_trl_dpo_trainer(name, trl_type, kw):
    for seed in range(3):
        token_lp, cmask, ref = _random_batch(B=8, T=12, seed=seed)
        trl_loss, trl_m = _trl_dpo([trl_type], [1.0], kw["beta"], kw.get("label_smoothing", 0.0), token_lp, cmask, ref)
        loss, m = _ours(name, token_lp, cmask, ref, **kw)
        assert loss.item() == pytest.approx(trl_loss.item(), abs=1e-6, rel=1e-9)
        for key in (
            "rewards/chosen",
            "rewards/rejected",
            "rewards/margins",
            "rewards/accuracies",
            "logps/chosen",
            "logps/rejected",
        ):
            assert m[key].item() == pytest.approx(trl_m[key], abs=1e-6), key


def test_parity_with_trl_rpo_as_sigmoid_plus_weighted_sft():
    # TRL 1.16 writes RPO as loss_type=["sigmoid", "sft"], loss_weights=[1, alpha]; its "sft" term is the
    # token-mean NLL of the chosen completions, which equals our mean of per-sequence length-normalised
    # NLLs (Pang et al.'s form) when the chosen completions have equal lengths.
    for seed in range(3):
        token_lp, cmask, ref = _random_batch(B=6, T=10, seed=seed, equal_chosen_lengths=True)
        trl_loss, _ = _trl_dpo(["sigmoid", "sft"], [1.0, 0.5], 0.1, 0.0, token_lp, cmask, ref)
        B = 6
        lengths = cmask.sum(-1).to(token_lp.dtype)
        nll = -token_lp.sum(-1)[:B] / lengths[:B]
        loss, _ = _ours("rpo", token_lp, cmask, ref, beta=0.1, alpha=0.5, chosen_nll=nll)
        assert loss.item() == pytest.approx(trl_loss.item(), abs=1e-6, rel=1e-9)


def _trl_cpo(loss_type, beta, label_smoothing, simpo_gamma, chosen, rejected):
    from trl.experimental.cpo.cpo_trainer import CPOTrainer

    stub = SimpleNamespace(
        alpha=0.0,
        accelerator=_accel(),
        loss_type=loss_type,
        beta=beta,
        label_smoothing=label_smoothing,
        simpo_gamma=simpo_gamma,
    )
    losses, cr, rr = CPOTrainer.cpo_loss(stub, chosen, rejected)
    return losses.mean(), cr, rr


@pytest.mark.parametrize("beta,gamma,eps", [(2.0, 0.5, 0.0), (2.5, 1.4, 0.0), (1.0, 0.3, 0.1)])
def test_parity_with_trl_simpo(beta, gamma, eps):
    g = torch.Generator().manual_seed(3)
    B = 9
    chosen, rejected = (
        -torch.rand(B, generator=g, dtype=torch.float64) * 40,
        -torch.rand(B, generator=g, dtype=torch.float64) * 40,
    )
    lc, lr = torch.randint(1, 20, (B,), generator=g).double(), torch.randint(1, 20, (B,), generator=g).double()
    # TRL's CPO trainer feeds SimPO length-averaged log-probs (average_log_prob=True)
    trl_loss, cr, rr = _trl_cpo("simpo", beta, eps, gamma, chosen / lc, rejected / lr)
    loss, m = simpo_loss(policy_chosen_logps=chosen, policy_rejected_logps=rejected, chosen_lengths=lc, rejected_lengths=lr,
                         beta=beta, gamma=gamma, label_smoothing=eps)  # fmt: skip
    assert loss.item() == pytest.approx(trl_loss.item(), abs=1e-6, rel=1e-9)
    assert m["rewards/chosen"].item() == pytest.approx(cr.mean().item(), abs=1e-9)
    assert m["rewards/rejected"].item() == pytest.approx(rr.mean().item(), abs=1e-9)


def test_parity_with_trl_cdpo_label_smoothed_sigmoid():
    # TRL 1.16's DPO "sigmoid" has no label smoothing; its CPO "sigmoid" does (the cDPO form) on whatever
    # log-prob difference it is given, so feeding it the log-ratios gives cDPO exactly.
    g = torch.Generator().manual_seed(4)
    pc, pr, rc, rr = (-torch.rand(10, generator=g, dtype=torch.float64) * 20 for _ in range(4))
    trl_loss, _, _ = _trl_cpo("sigmoid", 0.2, 0.15, 0.0, pc - rc, pr - rr)
    loss, _ = conservative_dpo_loss(policy_chosen_logps=pc, policy_rejected_logps=pr, ref_chosen_logps=rc, ref_rejected_logps=rr,
                                    beta=0.2, label_smoothing=0.15)  # fmt: skip
    assert loss.item() == pytest.approx(trl_loss.item(), abs=1e-6, rel=1e-9)


@pytest.mark.parametrize("dw,uw,seed", [(1.0, 1.0, 0), (1.0, 1.33, 1), (0.8, 1.0, 2)])
def test_parity_with_trl_kto(dw, uw, seed):
    from trl.trainer.kto_trainer import KTOTrainer

    g = torch.Generator().manual_seed(seed)
    B, T, T_kl = 8, 9, 11
    labels = torch.tensor([True, False, True, True, False, False, True, False])
    token_lp = -torch.rand(B, T - 1, generator=g, dtype=torch.float64) * 2
    kl_lp = -torch.rand(B, T_kl - 1, generator=g, dtype=torch.float64) * 2
    ref_logps = token_lp.sum(-1) + torch.randn(B, generator=g, dtype=torch.float64)
    # make the KL estimate positive so TRL's clamp(min=0) is not what is being compared
    ref_kl = kl_lp.sum(-1) - torch.rand(B, generator=g, dtype=torch.float64)
    model = _StubLM({T: token_lp, T_kl: kl_lp})
    stub = SimpleNamespace(
        model=model, accelerator=_accel(), calculate_KL=True, precompute_ref_logps=True, loss_type="kto", beta=0.3,
        desirable_weight=dw, undesirable_weight=uw, aux_loss_enabled=False, args=SimpleNamespace(gradient_checkpointing_kwargs=None),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)}, _total_train_tokens=0, _tp_size=1,
    )  # fmt: skip
    stub._compute_kl_logps = lambda m, b: KTOTrainer._compute_kl_logps(stub, m, b)
    ones = lambda w: torch.ones(B, w, dtype=torch.long)  # noqa: E731
    inputs = {
        "input_ids": torch.zeros(B, T, dtype=torch.long), "attention_mask": ones(T), "completion_mask": ones(T),
        "KL_input_ids": torch.zeros(B, T_kl, dtype=torch.long), "KL_attention_mask": ones(T_kl), "KL_completion_mask": ones(T_kl),
        "label": labels, "ref_logps": ref_logps, "ref_KL_logps": ref_kl,
    }  # fmt: skip
    trl_loss = KTOTrainer._compute_loss(stub, model, inputs, return_outputs=False)
    loss, m = kto_loss(policy_logps=token_lp.sum(-1), ref_logps=ref_logps, labels=labels, policy_kl_logps=kl_lp.sum(-1),
                       ref_kl_logps=ref_kl, beta=0.3, desirable_weight=dw, undesirable_weight=uw)  # fmt: skip
    assert loss.item() == pytest.approx(trl_loss.item(), abs=1e-6, rel=1e-9)
    trl_m = {k: v[-1] for k, v in stub._metrics["train"].items()}
    for key in ("kl", "rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", "logps/rejected"):
        assert m[key].item() == pytest.approx(trl_m[key], abs=1e-6), key


def test_parity_with_trl_reward_trainer():
    from trl.trainer.reward_trainer import RewardTrainer

    g = torch.Generator().manual_seed(5)
    B = 7
    rewards = torch.randn(2 * B, 1, generator=g, dtype=torch.float64) * 3
    margin = torch.rand(B, generator=g, dtype=torch.float64)
    for use_margin, coef in [(False, None), (True, None), (True, 0.01)]:
        model = lambda **kw: SimpleNamespace(logits=rewards)  # noqa: E731
        model.training = True
        stub = SimpleNamespace(model=model, accelerator=_accel(), args=SimpleNamespace(center_rewards_coefficient=coef),
                               _metrics={"train": defaultdict(list)}, _total_train_tokens=0, _tp_size=1)  # fmt: skip
        inputs = {
            "input_ids": torch.zeros(2 * B, 3, dtype=torch.long),
            "attention_mask": torch.ones(2 * B, 3, dtype=torch.long),
        }
        if use_margin:
            inputs["margin"] = margin
        trl_loss = RewardTrainer.compute_loss(stub, model, inputs)
        loss, m = bradley_terry_loss(
            rewards[:B, 0], rewards[B:, 0], margin=margin if use_margin else None, center_coef=coef or 0.0
        )
        assert loss.item() == pytest.approx(trl_loss.item(), abs=1e-6, rel=1e-9)
        assert m["accuracy"].item() == pytest.approx(stub._metrics["train"]["accuracy"][-1])
        assert m["margin"].item() == pytest.approx(stub._metrics["train"]["margin"][-1])


# TRL 1.16's other DPOConfig.loss_type values, its f-divergences, and weighted combinations: loss, metrics and
# the gradient w.r.t. the per-token log-probs, in float64 (alpha_divergence: float32, see the test).
# (our name, TRL loss_type list, TRL weights, our kwargs, TRL's label_smoothing, extra TRL attributes)
ZOO_CASES = [
    ("sigmoid_norm", ["sigmoid_norm"], None, {"beta": 0.1}, 0.0, {}),
    ("sigmoid_norm", ["sigmoid_norm"], None, {"beta": 1.5}, 0.0, {}),
    ("exo_pair", ["exo_pair"], None, {"beta": 0.1, "label_smoothing": 1e-3}, 1e-3, {}),
    ("exo_pair", ["exo_pair"], None, {"beta": 0.5, "label_smoothing": 0.2}, 0.2, {}),
    ("discopop", ["discopop"], None, {"beta": 0.1, "tau": 0.05}, 0.0, {"discopop_tau": 0.05}),
    ("discopop", ["discopop"], None, {"beta": 1.0, "tau": 0.7}, 0.0, {"discopop_tau": 0.7}),
    ("nca_pair", ["nca_pair"], None, {"beta": 0.1}, 0.0, {}),
    ("nca_pair", ["nca_pair"], None, {"beta": 2.0}, 0.0, {}),
    ("bco_pair", ["bco_pair"], None, {"beta": 0.1, "reward_shift": 0.0}, 0.0, {}),  # TRL 1.16 dropped the shift
    ("bco_pair", ["bco_pair"], None, {"beta": 0.7, "reward_shift": 0.0}, 0.0, {}),
    ("sppo_hard", ["sppo_hard"], None, {"beta": 0.1}, 0.0, {}),
    ("sppo_hard", ["sppo_hard"], None, {"beta": 1.0}, 0.0, {}),
    ("aot", ["aot"], None, {"beta": 0.1}, 0.0, {}),
    ("aot", ["aot"], None, {"beta": 0.5, "label_smoothing": 0.2}, 0.2, {}),
    ("aot_unpaired", ["aot_unpaired"], None, {"beta": 0.1}, 0.0, {}),
    ("aot_unpaired", ["aot_unpaired"], None, {"beta": 0.5, "label_smoothing": 0.2}, 0.2, {}),
    ("apo_zero", ["apo_zero"], None, {"beta": 0.1}, 0.0, {}),
    ("apo_zero", ["apo_zero"], None, {"beta": 1.0}, 0.0, {}),
    ("apo_down", ["apo_down"], None, {"beta": 0.1}, 0.0, {}),
    ("apo_down", ["apo_down"], None, {"beta": 1.0}, 0.0, {}),
    ("sft", ["sft"], None, {"beta": 0.1}, 0.0, {}),
    ("sft", ["sft"], None, {"beta": 2.0}, 0.0, {}),
    ("forward_kl", ["sigmoid"], None, {"beta": 0.1}, 0.0, {"f_divergence_type": "forward_kl"}),
    ("forward_kl", ["sigmoid"], None, {"beta": 0.5}, 0.0, {"f_divergence_type": "forward_kl"}),
    ("js_divergence", ["sigmoid"], None, {"beta": 0.1}, 0.0, {"f_divergence_type": "js_divergence"}),
    ("js_divergence", ["sigmoid"], None, {"beta": 1.0}, 0.0, {"f_divergence_type": "js_divergence"}),
    (
        "alpha_divergence",
        ["sigmoid"],
        None,
        {"beta": 0.1, "alpha": 0.5},
        0.0,
        {"f_divergence_type": "alpha_divergence", "f_alpha_divergence_coef": 0.5},
    ),
    (
        "alpha_divergence",
        ["sigmoid"],
        None,
        {"beta": 0.5, "alpha": 0.3},
        0.0,
        {"f_divergence_type": "alpha_divergence", "f_alpha_divergence_coef": 0.3},
    ),
    (
        "dpo,bco_pair,sft",
        ["sigmoid", "bco_pair", "sft"],
        [0.8, 0.2, 1.0],
        {"beta": 0.1, "reward_shift": 0.0},
        0.0,
        {},
    ),  # MPO
    ("dpo,bco_pair,sft", ["sigmoid", "bco_pair", "sft"], [0.3, 1.5, 0.25], {"beta": 0.4, "reward_shift": 0.0}, 0.0, {}),
    ("hinge,sft", ["hinge", "sft"], [1.0, 0.5], {"beta": 0.3}, 0.0, {}),
]


@pytest.mark.parametrize(
    "name,trl_types,weights,kw,eps,trl_attrs", ZOO_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(ZOO_CASES)]
)
def test_parity_with_trl_dpo_zoo(name, trl_types, weights, kw, eps, trl_attrs):
    # TRL's alpha-divergence clamps in a per-dtype table without float64 (KeyError): compare in float32 there
    dtype = torch.float32 if name == "alpha_divergence" else torch.float64
    tol = 1e-6
    for seed in range(2):
        token_lp, cmask, ref = _random_batch(B=8, T=12, seed=seed)
        token_lp, ref = token_lp.to(dtype), ref.to(dtype)
        trl_lp = token_lp.clone().requires_grad_(True)
        trl_loss, trl_m = _trl_dpo(trl_types, weights or [1.0], kw["beta"], eps, trl_lp, cmask, ref, **trl_attrs)
        trl_loss.backward()
        lp = token_lp.clone().requires_grad_(True)
        loss, m = _ours(name, lp, cmask, ref, weights=weights, **kw)
        loss.backward()
        assert loss.item() == pytest.approx(trl_loss.item(), abs=tol, rel=1e-9)
        # gradient on the completion tokens (elsewhere the real log-probs are constants; the stub's zeros are not)
        on = cmask[:, 1:].to(dtype)
        torch.testing.assert_close(
            lp.grad * on, trl_lp.grad * on, atol=tol, rtol=1e-9 if dtype == torch.float64 else 1e-5
        )
        assert (lp.grad * on).abs().sum() > 0  # the case has a gradient to compare
        if (
            name.split(",")[0] != "sft"
        ):  # TRL logs the DPO implicit rewards whatever the loss; so do we (sft: none without ref)
            for key in (
                "rewards/chosen",
                "rewards/rejected",
                "rewards/margins",
                "rewards/accuracies",
                "logps/chosen",
                "logps/rejected",
            ):
                assert m[key].item() == pytest.approx(trl_m[key], abs=tol), key


def test_zoo_hand_values():
    # each the docstring's worked number, derived by hand (softplus(x) = -log sigma(-x) ... here softplus(x) = log(1 + e^-x))
    L = lambda name, pc, pr, rc, rr, **kw: resolve_loss(name).fn(**pair(pc, pr, rc, rr), **kw)[0].item()  # noqa: E731
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    # sigmoid_norm: lr_w = 2 over 2 tokens, lr_l = -1 over 1 -> h = 1 + 1 = 2 -> log(1 + e^-2) = 0.126928
    assert L(
        "sigmoid_norm", [2], [-1], [0], [0], beta=1.0, chosen_lengths=t(2), rejected_lengths=t(1)
    ) == pytest.approx(softplus(2))
    # exo: h = 0 -> q = (1/2, 1/2) -> 1/2 (log 1/2 - log .999) + 1/2 (log 1/2 - log .001) = 2.761231
    exo = 0.5 * (math.log(0.5) - math.log(0.999)) + 0.5 * (math.log(0.5) - math.log(0.001))
    assert L("exo_pair", [0], [0], [0], [0], beta=1.0) == pytest.approx(exo) and exo == pytest.approx(
        2.761231, abs=1e-6
    )
    # discopop: h = 0 -> m = 1/2 -> log 2 / 2 + 1/2
    assert L("discopop", [0], [0], [0], [0], beta=1.0) == pytest.approx(LOG2 / 2 + 0.5)
    # nca: all 0 -> log 2 + log 2 / 2 + log 2 / 2
    assert L("nca_pair", [0], [0], [0], [0], beta=1.0) == pytest.approx(2 * LOG2)
    # sppo_hard: beta 0.5 -> targets +-1 -> 1 + 1
    assert L("sppo_hard", [0], [0], [0], [0], beta=0.5) == pytest.approx(2.0)
    # apo_zero: (1 - 1/2) + 1/2; apo_down at r_w = 1, r_l = 0: sigma(1) + 1 - sigma(1) = 1; at r_w = 2, r_l = 1 likewise 1 ...
    assert L("apo_zero", [0], [0], [0], [0], beta=1.0) == pytest.approx(1.0)
    assert L("apo_down", [1], [0], [0], [0], beta=1.0) == pytest.approx(1.0)
    # ... and apo_down at r_w = 0, r_l = 1: 1/2 + 1 - sigma(-1)
    assert L("apo_down", [0], [1], [0], [0], beta=1.0) == pytest.approx(0.5 + 1 - sig(-1))
    # aot: policy margins [2, 0] sorted [0, 2], ref margins [0, 1] -> delta [0, 1] -> (log 2 + softplus(1)) / 2
    assert L("aot", [2, 0], [0, 0], [0, 1], [0, 0], beta=1.0) == pytest.approx((LOG2 + softplus(1)) / 2)
    # aot_unpaired: sorted chosen lr [0, 3] - sorted rejected lr [-1, 2] = [1, 1] -> softplus(1)
    assert L("aot_unpaired", [0, 3], [2, -1], [0, 0], [0, 0], beta=1.0) == pytest.approx(softplus(1))
    # sft: -(-2 - 6) / (1 + 3) = 2
    assert sft_loss(policy_chosen_logps=t(-2, -6), chosen_lengths=t(1, 3))[0].item() == pytest.approx(2.0)
    # f-DPO at u_w = 2 (or 4), u_l = 1: forward KL h = (1 - 1/2) - 0; JS h = log(4/3) - log 1; alpha 0.5: (4^-.5 - 1)/(-.5) = 1
    lg2, lg4 = math.log(2), math.log(4)
    assert L("forward_kl", [lg2], [0], [0], [0], beta=1.0) == pytest.approx(softplus(0.5))
    assert L("js_divergence", [lg2], [0], [0], [0], beta=1.0) == pytest.approx(softplus(math.log(4 / 3)))
    assert L("alpha_divergence", [lg4], [0], [0], [0], beta=1.0, alpha=0.5) == pytest.approx(softplus(1.0))
    # alpha -> 1 is DPO; reverse_kl through f_dpo_loss is DPO
    kw = pair([-1, -3], [-2, -1], [-2, -2], [-2, -2])
    assert L("alpha_divergence", [-1, -3], [-2, -1], [-2, -2], [-2, -2], beta=0.3, alpha=1.0) == pytest.approx(
        dpo_loss(**kw, beta=0.3)[0].item()
    )
    assert f_dpo_loss(**kw, beta=0.3)[0].item() == pytest.approx(dpo_loss(**kw, beta=0.3)[0].item())


def test_bco_running_shift_and_state():
    # step 1: r_w = 1, r_l = -1 -> batch mean 0 -> delta 0 -> 2 softplus(1) = 0.626523
    loss, m = bco_pair_loss(**pair([1], [-1], [0], [0]), beta=1.0)
    assert loss.item() == pytest.approx(2 * softplus(1)) and loss.item() == pytest.approx(0.6265234, abs=1e-6)
    s1 = BCOState.from_metrics(m)
    assert s1 == (0.0, 1)
    # step 2: r_w = 3, r_l = 1 -> batch mean 2 -> delta = (0 + 2) / 2 = 1 -> softplus(3 - 1) + softplus(-(1 - 1)) ...
    # i.e. -log sigma(2) - log sigma(0) = 0.126928 + 0.693147
    loss, m = bco_pair_loss(**pair([3], [1], [0], [0]), beta=1.0, state=s1)
    assert loss.item() == pytest.approx(softplus(2) + LOG2)
    assert BCOState.from_metrics(m) == (1.0, 2)
    # reward_shift = 0: the shift is tracked but not applied -> -log sigma(3) - log sigma(-1)
    loss0, m0 = bco_pair_loss(**pair([3], [1], [0], [0]), beta=1.0, state=s1, reward_shift=0.0)
    assert loss0.item() == pytest.approx(softplus(3) + softplus(-1)) and m0["bco/delta"].item() == 1.0
    # the shift is a constant: gradient of -log sigma(r_w - delta) w.r.t. lp_w is -beta sigma(-(r_w - delta))
    pc = t(3.0).requires_grad_()
    bco_pair_loss(policy_chosen_logps=pc, policy_rejected_logps=t(1), ref_chosen_logps=t(0), ref_rejected_logps=t(0), beta=1.0,
                  state=s1)[0].backward()  # fmt: skip
    assert pc.grad.item() == pytest.approx(-sig_(-2.0))
    assert bco_update_state(t(2, 4), BCOState(1.0, 1)) == (2.0, 2)


def sig_(x):
    return 1 / (1 + math.exp(-x))


def test_combination_weights_add_up_and_errors():
    torch.manual_seed(2)
    pc, pr, rc, rr = (-torch.rand(5, dtype=torch.float64) * 9 for _ in range(4))
    lengths = torch.randint(1, 6, (5,)).double()
    kw = dict(
        policy_chosen_logps=pc,
        policy_rejected_logps=pr,
        ref_chosen_logps=rc,
        ref_rejected_logps=rr,
        chosen_lengths=lengths,
        rejected_lengths=lengths,
        beta=0.2,
    )
    choice = resolve_loss("dpo, bco_pair,sft", "0.8,0.2,1.0")
    assert choice.components == ("dpo", "bco_pair", "sft") and choice.weights == (0.8, 0.2, 1.0)
    assert choice.state_type is BCOState and not choice.reference_free and not choice.unpaired
    loss, m = choice.fn(**kw)
    parts = {n: PREFERENCE_LOSSES[n](**{k: v for k, v in kw.items() if k in ("beta", *pair([0], [0], [0], [0]), *LOSS_EXTRAS.get(n, ()))})[0]
             for n in choice.components}  # fmt: skip
    assert loss.item() == pytest.approx(
        0.8 * parts["dpo"].item() + 0.2 * parts["bco_pair"].item() + parts["sft"].item(), abs=1e-12
    )
    assert loss.item() == pytest.approx(
        sum(w * m[f"loss/{n}"].item() for n, w in zip(choice.components, choice.weights)), abs=1e-12
    )
    assert "bco/delta" in m and m["rewards/chosen"].item() == pytest.approx((0.2 * (pc - rc)).mean().item())
    # default weights are 1; a single name is the dict's own function
    assert resolve_loss("dpo,sft").weights == (1.0, 1.0) and resolve_loss("dpo").fn is dpo_loss
    assert resolve_loss("simpo,sft").reference_free
    for spec, w, msg in [("dpo,nope", None, "loss='nope' is not valid"), ("dpo,dpo", None, "names a loss twice"),
                         ("dpo,sft", "1", "has 1 weights for 2"), ("dpo,sft", "1,x", "not a comma-separated"),
                         ("dpo,sft", "1,-1", ">= 0"), ("dpo,kto", None, "unpaired"),
                         ("beta_dpo,bco_pair", None, "at most one stateful")]:  # fmt: skip
        with pytest.raises(ConfigError, match=msg):
            resolve_loss(spec, w)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=5), st.sampled_from([",", ", ", " ,"]))
def test_parse_loss_weights_round_trips_and_counts(ws, sep):
    text = sep.join(repr(w) for w in ws)
    assert parse_loss_weights(text, len(ws)) == tuple(ws)
    assert parse_loss_weights(ws, len(ws)) == tuple(ws)
    with pytest.raises(ConfigError, match=f"has {len(ws)} weights for {len(ws) + 1} loss"):
        parse_loss_weights(text, len(ws) + 1)
    with pytest.raises(ConfigError, match="finite number >= 0"):
        parse_loss_weights(text + sep + "-1", len(ws) + 1)
