"""Policy and value losses: hand-derived numbers, clip-case gradients, micro-batch invariance, TRL parity."""

import math
import types
from collections import defaultdict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.errors import ConfigError
from posttrain.losses.policy import AGGREGATIONS, aggregate, batch_normalizers, merge_metrics, policy_loss, value_loss

E = math.e


def _one(log_ratio, adv, **kw):
    """A single token: logps = log_ratio (with grad), old_logps = 0."""
    lp = torch.tensor([[float(log_ratio)]], requires_grad=True)
    loss, m = policy_loss(lp, torch.zeros(1, 1), torch.tensor([float(adv)]), torch.ones(1, 1), **kw)
    loss.backward()
    return loss.item(), lp.grad.item(), m


def test_hand_values_token_clip():
    # ratio=e, A=1 -> min(e, clip(e, .8, 1.2)=1.2) = 1.2 -> loss=-1.2, clipped: zero gradient
    loss, grad, m = _one(1.0, 1.0)
    assert loss == pytest.approx(-1.2) and grad == 0.0 and m["clip_frac_high"] == 1.0
    # ratio=1, A=1 -> loss=-1, gradient of -ratio*A w.r.t. logp = -ratio*A = -1 (REINFORCE on-policy)
    loss, grad, m = _one(0.0, 1.0)
    assert loss == pytest.approx(-1.0) and grad == pytest.approx(-1.0) and m["clip_frac_high"] == 0.0
    # ratio=e^-1, A=-1 -> min(-.3679, -.8) = -.8 -> loss=.8, clipped low: zero gradient
    loss, grad, m = _one(-1.0, -1.0)
    assert loss == pytest.approx(0.8) and grad == 0.0 and m["clip_frac_low"] == 1.0
    # ratio=e, A=-1 (the pessimistic side is the unclipped one): min(-e, -1.2) = -e -> loss=e, grad=e
    loss, grad, _ = _one(1.0, -1.0)
    assert loss == pytest.approx(E) and grad == pytest.approx(E)
    # ratio=e^-1, A=1: min(.3679, .8) -> loss=-.3679, grad = -ratio = -.3679 (not clipped)
    loss, grad, _ = _one(-1.0, 1.0)
    assert loss == pytest.approx(-1 / E) and grad == pytest.approx(-1 / E)


def test_clip_higher_asymmetric():
    # eps_low=.2, eps_high=.28: ratio=1.25, A=1 -> inside [0.8, 1.28] -> loss=-1.25, grad=-1.25
    loss, grad, m = _one(math.log(1.25), 1.0, clip_eps_low=0.2, clip_eps_high=0.28)
    assert loss == pytest.approx(-1.25) and grad == pytest.approx(-1.25) and m["clip_frac_high"] == 0.0
    # ratio=1.3 > 1.28 -> loss=-1.28, zero gradient
    loss, grad, _ = _one(math.log(1.3), 1.0, clip_eps_low=0.2, clip_eps_high=0.28)
    assert loss == pytest.approx(-1.28) and grad == 0.0
    # no clip at all (clip_eps_low=None): ratio=e, A=1 -> loss=-e
    loss, grad, _ = _one(1.0, 1.0, clip_eps_low=None)
    assert loss == pytest.approx(-E) and grad == pytest.approx(-E)


def test_dual_clip():
    # A=-1, ratio=e^2=7.39 > c=3 -> obj = max(min(-7.39, -1.2), -3) = -3 -> loss=3, zero gradient
    loss, grad, m = _one(2.0, -1.0, dual_clip=3.0)
    assert loss == pytest.approx(3.0) and grad == 0.0 and m["dual_clip_frac"] == 1.0
    # ratio=e=2.72 < 3: unchanged -> loss=e
    loss, grad, _ = _one(1.0, -1.0, dual_clip=3.0)
    assert loss == pytest.approx(E) and grad == pytest.approx(E)
    # A>0 untouched by the dual clip
    loss, _, _ = _one(2.0, 1.0, dual_clip=3.0)
    assert loss == pytest.approx(-1.2)
    with pytest.raises(ConfigError):
        _one(0.0, 1.0, dual_clip=1.0)


@settings(max_examples=80, deadline=None)
@given(st.floats(-3, 3), st.floats(-3, 3).filter(lambda a: abs(a) > 1e-3), st.floats(0.05, 0.4), st.floats(0.05, 0.4))
def test_clip_cases_have_zero_gradient_property(log_ratio, adv, lo, hi):
    ratio = math.exp(log_ratio)
    _, grad, _ = _one(log_ratio, adv, clip_eps_low=lo, clip_eps_high=hi)
    clipped = (adv > 0 and ratio > 1 + hi) or (adv < 0 and ratio < 1 - lo)
    if clipped:
        assert grad == 0.0
    else:  # d(-ratio*A)/d logp = -ratio*A
        assert grad == pytest.approx(-ratio * adv, rel=1e-5)


def test_aggregation_hand_values():
    # x=[[1,3],[5,0]], mask=[[1,1],[1,0]]
    x, mask = torch.tensor([[1.0, 3.0], [5.0, 7.0]]), torch.tensor([[1, 1], [1, 0]])
    assert aggregate(x, mask, "seq_mean_token_mean").item() == pytest.approx((2 + 5) / 2)  # per-seq means 2, 5
    assert aggregate(x, mask, "token_mean").item() == pytest.approx(9 / 3)
    assert aggregate(x, mask, "seq_mean_token_sum_norm").item() == pytest.approx(9 / (2 * 2))
    assert aggregate(x, mask, "seq_mean_token_sum_norm", max_len=10).item() == pytest.approx(9 / 20)
    with pytest.raises(ConfigError):
        aggregate(x, mask, "mean")


def test_sequence_level_ratio_gspo():
    # log ratios [.1, .3] on 2 real tokens (third padded) -> seq log ratio .2 -> ratio e^.2=1.2214 > 1.2 for A>0
    lp = torch.tensor([[0.1, 0.3, 5.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0]])
    loss, m = policy_loss(lp, torch.zeros(1, 3), torch.tensor([1.0]), mask, ratio_level="sequence")
    loss.backward()
    assert loss.item() == pytest.approx(-1.2) and torch.equal(lp.grad, torch.zeros(1, 3))
    # within the clip: loss = -s*A, d/d logp_t = -s*A/|y| on each real token, 0 on padding
    lp = torch.tensor([[0.05, 0.05, 5.0]], requires_grad=True)
    loss, _ = policy_loss(lp, torch.zeros(1, 3), torch.tensor([2.0]), mask, ratio_level="sequence")
    loss.backward()
    s = math.exp(0.05)
    assert loss.item() == pytest.approx(-2 * s)
    assert torch.allclose(lp.grad, torch.tensor([[-2 * s / 2, -2 * s / 2, 0.0]]))


def test_kl_and_entropy_terms():
    # on-policy (ratio 1), A=0: loss = beta * mean k3 - coef * mean H
    lp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-2.0, -2.0]])
    ent = torch.tensor([[0.5, 1.5]])
    loss, m = policy_loss(
        lp, lp, torch.zeros(1), torch.ones(1, 2), ref_logps=ref, beta=0.1, entropy=ent, entropy_coef=0.01
    )
    k3 = (math.exp(-1) + 1 - 1 + 0.0) / 2  # tokens: e^-1 - (-1) - 1 = .3679, and 0
    assert m["kl"] == pytest.approx(k3)
    assert m["entropy"] == pytest.approx(1.0)
    assert loss.item() == pytest.approx(0.1 * k3 - 0.01 * 1.0)
    assert m["loss"] == pytest.approx(m["pg_loss"] + m["kl_loss"] + m["entropy_loss"])
    with pytest.raises(ValueError):
        policy_loss(lp, lp, torch.zeros(1), torch.ones(1, 2), beta=0.1)


def _batch(seed, B=7, T=6):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = 0  # an empty completion must not break anything
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    old = -torch.rand(B, T, generator=g) * 3
    logits = (old + 0.3 * torch.randn(B, T, generator=g)).requires_grad_(False)
    ref = old + 0.2 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    ent = torch.rand(B, T, generator=g)
    return logits, old, ref, adv, ent, mask


@pytest.mark.parametrize("agg", sorted(AGGREGATIONS))
@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
@pytest.mark.parametrize("splits", [[7], [3, 4], [1, 4, 2]])
def test_micro_batch_invariance(agg, ratio_level, splits):
    """Loss and gradient are the same whether the batch is one piece or 2-3 uneven micro-batches that are each
    right-trimmed to their own longest sequence (as a trainer's padding would be)."""
    base, old, ref, adv, ent, mask = _batch(1)
    kw = dict(
        agg=agg,
        ratio_level=ratio_level,
        clip_eps_low=0.1,
        clip_eps_high=0.15,
        dual_clip=2.0,
        ref_logps=None,
        beta=0.05,
        kl_estimator="k3",
        entropy_coef=0.01,
    )
    norms = batch_normalizers(mask, max_len=8)

    def run(pieces):
        w = base.clone().requires_grad_(True)
        total, parts = 0.0, []
        start = 0
        for n in pieces:
            sl = slice(start, start + n)
            start += n
            T = max(int(mask[sl].sum(-1).max().item()), 1)  # trim padding to this micro-batch's longest
            loss, m = policy_loss(
                w[sl, :T],
                old[sl, :T],
                adv[sl],
                mask[sl, :T],
                entropy=ent[sl, :T],
                **{**kw, "ref_logps": ref[sl, :T]},
                **norms,
            )
            loss.backward()
            total += loss.item()
            parts.append(m)
        return total, w.grad.clone(), merge_metrics(parts)

    full_loss, full_grad, full_m = run([7])
    loss, grad, m = run(splits)
    assert loss == pytest.approx(full_loss, abs=1e-6)
    assert torch.allclose(grad, full_grad, atol=1e-6)
    for key in full_m:
        assert m[key] == pytest.approx(full_m[key], abs=1e-6), key


def test_local_normalisers_are_not_invariant():
    """The reason the global normaliser matters: per-micro-batch means / n_accum (TRL's "bnpo" style) differ."""
    base, old, _, adv, _, mask = _batch(2)
    full, _ = policy_loss(base, old, adv, mask, agg="token_mean")
    parts = [policy_loss(base[s], old[s], adv[s], mask[s], agg="token_mean")[0] / 2 for s in (slice(0, 2), slice(2, 7))]
    assert abs(sum(p.item() for p in parts) - full.item()) > 1e-4


def test_metrics_values():
    lp = torch.log(torch.tensor([[2.0, 0.5, 1.0]]))  # ratios 2, .5, (pad)
    mask = torch.tensor([[1, 1, 0]])
    _, m = policy_loss(lp, torch.zeros(1, 3), torch.tensor([1.0]), mask)
    assert m["ratio_max"] == pytest.approx(2.0) and m["ratio_min"] == pytest.approx(0.5)
    assert m["ratio_mean"] == pytest.approx(1.25)
    assert m["clip_frac_high"] == pytest.approx(0.5) and m["clip_frac_low"] == 0.0  # A>0: low side not clipped
    # approx_kl = mean (r - 1 - log r) = ((1 - ln2) + (-.5 + ln2)) / 2 = .25
    assert m["approx_kl"] == pytest.approx(0.25)
    assert m["num_tokens"] == 2


def test_value_loss_hand_values():
    # V=2, V_old=1, R=0, eps=.5 -> clipped V=1.5 -> .5*max(4, 2.25)=2, gradient from unclipped: (V-R)=2
    v = torch.tensor([[2.0]], requires_grad=True)
    loss, m = value_loss(v, torch.tensor([[1.0]]), torch.tensor([[0.0]]), torch.ones(1, 1), clip_eps=0.5)
    loss.backward()
    assert loss.item() == pytest.approx(2.0) and v.grad.item() == pytest.approx(2.0) and m["value_clip_frac"] == 0.0
    # V=2, V_old=1, R=3, eps=.5 -> clipped 1.5 -> max(1, 2.25)=2.25 -> loss 1.125, zero grad (clipped branch)
    v = torch.tensor([[2.0]], requires_grad=True)
    loss, m = value_loss(v, torch.tensor([[1.0]]), torch.tensor([[3.0]]), torch.ones(1, 1), clip_eps=0.5)
    loss.backward()
    assert loss.item() == pytest.approx(1.125) and v.grad.item() == 0.0 and m["value_clip_frac"] == 1.0
    # no clip: .5 * (2-3)^2
    loss, _ = value_loss(
        torch.tensor([[2.0]]), torch.tensor([[1.0]]), torch.tensor([[3.0]]), torch.ones(1, 1), clip_eps=None
    )
    assert loss.item() == pytest.approx(0.5)


# ------------------------------------------------------------------------------------------------- TRL parity
#
# We call TRL 1.16's own GRPOTrainer._compute_loss, unbound, with a stub `self` that supplies the attributes it
# reads and a stub `_get_per_token_logps_and_entropies` returning our fixed log-probs (so no model is built).
# Loss and gradient w.r.t. the log-probs must match ours for each TRL loss_type with a single micro-batch
# (gradient_accumulation_steps=1): grpo -> seq_mean_token_mean, dapo and bnpo -> token_mean,
# dr_grpo -> seq_mean_token_sum_norm with max_len = max_completion_length.

TRL_TO_OURS = {
    "grpo": "seq_mean_token_mean",
    "dapo": "token_mean",
    "bnpo": "token_mean",
    "dr_grpo": "seq_mean_token_sum_norm",
}


def _trl_loss(loss_type, logps, inputs, *, beta, eps_low, eps_high, delta, level, max_len, bias_kl=False, **trl_args):
    from trl.trainer.grpo_trainer import GRPOTrainer

    ident = lambda x, **_: x  # noqa: E731
    stub = types.SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logps, torch.zeros_like(logps), None),
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level=level,
        beta=beta,
        args=types.SimpleNamespace(use_bias_correction_kl=bias_kl, delta=delta, **trl_args),
        get_gamma_weights=GRPOTrainer.get_gamma_weights,
        loss_type=loss_type,
        epsilon_low=eps_low,
        epsilon_high=eps_high,
        use_vllm=False,
        model=types.SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=max_len,
        accelerator=types.SimpleNamespace(
            num_processes=1, gather=ident, reduce=ident, gather_for_metrics=ident, sync_gradients=True
        ),
        _metrics={"train": defaultdict(list)},
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
    )
    stub.args.steps_per_generation = 1
    loss = GRPOTrainer._compute_loss(stub, None, inputs)
    return loss, stub._metrics["train"]


PARITY_CASES = [
    (loss_type, *case)
    for loss_type in sorted(TRL_TO_OURS)
    for case in [(0.0, 0.2, None, "token"), (0.04, 0.28, None, "token"), (0.1, 0.2, 3.0, "token")]
] + [("grpo", 0.0, 0.2, None, "sequence"), ("grpo", 0.04, 0.28, None, "sequence")]  # GSPO: TRL pairs it with "grpo"


@pytest.mark.parametrize("loss_type,beta,eps_high,dual,level", PARITY_CASES)
def test_parity_with_trl_grpo_loss(loss_type, beta, eps_high, dual, level):
    torch.manual_seed(3)
    B, T, max_len = 6, 5, 7
    lengths = torch.tensor([5, 3, 1, 4, 5, 2])
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    old = -torch.rand(B, T) * 2
    base = old + 0.4 * torch.randn(B, T)
    ref = old + 0.3 * torch.randn(B, T)
    adv = torch.randn(B)
    adv[1], base[1, 0] = -0.7, old[1, 0] + 1.5  # ratio e^1.5 = 4.5 > 3 with A < 0: the dual clip acts
    inputs = {
        "prompt_ids": torch.zeros(B, 2, dtype=torch.long),
        "prompt_mask": torch.ones(B, 2, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": adv,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum(),
    }
    trl_lp = base.clone().requires_grad_(True)
    trl_loss, trl_m = _trl_loss(
        loss_type, trl_lp, inputs, beta=beta, eps_low=0.2, eps_high=eps_high, delta=dual, level=level, max_len=max_len
    )
    trl_loss.backward()

    lp = base.clone().requires_grad_(True)
    loss, m = policy_loss(
        lp,
        old,
        adv,
        mask,
        clip_eps_low=0.2,
        clip_eps_high=eps_high,
        dual_clip=dual,
        ratio_level=level,
        agg=TRL_TO_OURS[loss_type],
        max_len=max_len,
        ref_logps=ref if beta else None,
        beta=beta,
        kl_estimator="k3",
    )
    loss.backward()
    assert loss.item() == pytest.approx(trl_loss.item(), abs=1e-6)
    assert torch.allclose(lp.grad, trl_lp.grad, atol=1e-6)
    if dual:
        assert m["dual_clip_frac"] > 0
    if level == "token":
        assert m["clip_frac_low"] > 0 and m["clip_frac_high"] > 0  # the case exercises both clip sides
    if level == "sequence":  # TRL counts clipped *sequences* there; we count clipped tokens everywhere
        return
    assert m["clip_frac_low"] == pytest.approx(trl_m["clip_ratio/low_mean"][0], abs=1e-6)
    assert m["clip_frac_high"] == pytest.approx(trl_m["clip_ratio/high_mean"][0], abs=1e-6)
    if beta:
        assert m["kl"] == pytest.approx(trl_m["kl"][0], abs=1e-6)


def _parity_inputs(seed=3):
    torch.manual_seed(seed)
    B, T = 6, 5
    lengths = torch.tensor([5, 3, 1, 4, 5, 2])
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    old = -torch.rand(B, T, dtype=torch.float64) * 2
    base = old + 0.4 * torch.randn(B, T, dtype=torch.float64)
    ref = old + 0.3 * torch.randn(B, T, dtype=torch.float64)
    adv = torch.randn(B, dtype=torch.float64)
    adv[2] = 0.0  # A = 0: SAPO takes tau_neg, VESPO the (k, lambda)_pos pair
    inputs = {
        "prompt_ids": torch.zeros(B, 2, dtype=torch.long),
        "prompt_mask": torch.ones(B, 2, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": adv,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum(),
    }
    return base, old, ref, adv, mask, inputs


# TRL loss_type -> (our objective, aggregation, TRL's epsilon_high for our clip_eps_high); two settings each.
# (trl type, level, beta, bias-corrected KL, ours: objective, objective_kwargs, agg, clip_eps_high, TRL extra args)
_SAPO = lambda p, n: (
    {"temperature_pos": p, "temperature_neg": n},
    {"sapo_temperature_pos": p, "sapo_temperature_neg": n},
)  # noqa: E731
_VESPO = lambda kp, lp, kn, ln: (
    {"k_pos": kp, "lambda_pos": lp, "k_neg": kn, "lambda_neg": ln},  # noqa: E731
    {"vespo_k_pos": kp, "vespo_lambda_pos": lp, "vespo_k_neg": kn, "vespo_lambda_neg": ln},
)
ZOO_POLICY_CASES = [
    ("cispo", "token", 0.0, False, "cispo", ({}, {}), "token_mean", 4.0),  # TRL epsilon_high = 5.0 (ScaleRL)
    ("cispo", "token", 0.04, True, "cispo", ({}, {}), "token_mean", 0.25),  # a cap of 1.25 that acts
    ("sapo", "token", 0.0, False, "sapo", _SAPO(1.0, 1.05), "seq_mean_token_mean", 0.2),
    ("sapo", "token", 0.04, True, "sapo", _SAPO(0.5, 2.0), "seq_mean_token_mean", 0.2),
    ("luspo", "sequence", 0.0, False, "clip", ({}, {}), "seq_mean_token_sum", 0.2),
    ("luspo", "sequence", 0.04, True, "clip", ({}, {}), "seq_mean_token_sum", 0.28),
    ("luspo", "token", 0.04, False, "clip", ({}, {}), "seq_mean_token_sum", 0.2),
    ("vespo", "token", 0.0, False, "vespo", _VESPO(2.0, 3.0, 3.0, 2.0), "token_mean", 0.2),
    ("vespo", "token", 0.04, True, "vespo", _VESPO(1.0, 0.5, 4.0, 1.5), "token_mean", 0.2),
    ("grpo", "token", 0.04, True, "clip", ({}, {}), "seq_mean_token_mean", 0.2),  # bias-corrected KL alone
    ("grpo", "sequence", 0.1, True, "clip", ({}, {}), "seq_mean_token_mean", 0.28),
    ("dapo", "token", 0.1, True, "clip", ({}, {}), "token_mean", 0.28),
]


@pytest.mark.parametrize(
    "trl_type,level,beta,bias_kl,objective,opts,agg,eps_high",
    ZOO_POLICY_CASES,
    ids=[f"{c[0]}-{i}" for i, c in enumerate(ZOO_POLICY_CASES)],
)
def test_parity_with_trl_policy_zoo(trl_type, level, beta, bias_kl, objective, opts, agg, eps_high):
    ours_opts, trl_args = opts
    for seed in (3, 4):
        base, old, ref, adv, mask, inputs = _parity_inputs(seed)
        trl_eps_high = (
            1.0 + eps_high if trl_type == "cispo" else eps_high
        )  # TRL caps CISPO's ratio at epsilon_high itself
        trl_lp = base.clone().requires_grad_(True)
        trl_loss, trl_m = _trl_loss(trl_type, trl_lp, inputs, beta=beta, eps_low=0.2, eps_high=trl_eps_high, delta=None,
                                    level=level, max_len=7, bias_kl=bias_kl, **trl_args)  # fmt: skip
        trl_loss.backward()
        lp = base.clone().requires_grad_(True)
        loss, m = policy_loss(lp, old, adv, mask, clip_eps_low=0.2, clip_eps_high=eps_high, ratio_level=level, agg=agg,
                              ref_logps=ref if beta else None, beta=beta, objective=objective, objective_kwargs=ours_opts,
                              kl_bias_correction=bias_kl)  # fmt: skip
        loss.backward()
        assert loss.item() == pytest.approx(trl_loss.item(), abs=1e-6, rel=1e-9)
        torch.testing.assert_close(lp.grad * mask, trl_lp.grad * mask, atol=1e-6, rtol=1e-9)
        assert (lp.grad * mask).abs().sum() > 0
        if beta:
            assert m["kl"] == pytest.approx(trl_m["kl"][0], abs=1e-6)
        if trl_type == "cispo":
            assert m["clip_frac_high"] == pytest.approx(trl_m["cispo_clip_ratio"][0], abs=1e-6)
            assert m["clip_frac_low"] == 0.0
        if trl_type == "vespo":
            assert m["vespo/phi_mean"] == pytest.approx(trl_m["vespo/phi_seq_mean"][0], abs=1e-6)
    if trl_type == "cispo" and eps_high < 1:
        assert m["clip_frac_high"] > 0  # the cap acts in this case


def test_new_objectives_hand_values():
    one = lambda lr, a, **kw: _one(lr, a, **kw)  # noqa: E731  (logps = lr, old = 0, single token)
    # CISPO: r = e^-0.5 (uncapped), A = 2, log pi = -0.5: loss = -r * 2 * -0.5 = r = 0.606531; grad = -r * A = -1.213061
    loss, grad, _ = one(-0.5, 2.0, objective="cispo")
    assert loss == pytest.approx(math.exp(-0.5), rel=1e-6) and grad == pytest.approx(-2 * math.exp(-0.5), rel=1e-6)
    # CISPO capped: log pi = 1 -> r = e > 1.2 -> weight 1.2 (detached): loss = -1.2 * 1 * 1, grad = -1.2 (never zero)
    loss, grad, m = one(1.0, 1.0, objective="cispo")
    assert loss == pytest.approx(-1.2) and grad == pytest.approx(-1.2) and m["clip_frac_high"] == 1.0
    # SAPO: r = 1, A = 1, tau_pos = 1: loss = -(4/1) sigma(0) = -2, grad = -4 sigma'(0) r = -1 (REINFORCE on-policy)
    loss, grad, _ = one(0.0, 1.0, objective="sapo")
    assert loss == pytest.approx(-2.0) and grad == pytest.approx(-1.0)
    # SAPO, A = -1 (tau_neg = 2), r = e: loss = (4/2) sigma(2 (e - 1)); grad = 4 sigma(1 - sigma) * r
    x = 2 * (math.e - 1)
    s_ = 1 / (1 + math.exp(-x))
    loss, grad, _ = one(1.0, -1.0, objective="sapo", objective_kwargs={"temperature_neg": 2.0})
    assert loss == pytest.approx(2 * s_, rel=1e-6) and grad == pytest.approx(4 * s_ * (1 - s_) * math.e, rel=1e-5)
    # VESPO on-policy: phi(1) = 1 -> loss = -A log pi = 0.5 for A = 1, log pi = -0.5 ... with old = log pi (w = 1)
    lp = torch.tensor([[-0.5]], dtype=torch.float64, requires_grad=True)
    loss, m = policy_loss(
        lp, lp.detach(), torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 1), objective="vespo"
    )
    loss.backward()
    assert (
        loss.item() == pytest.approx(0.5)
        and lp.grad.item() == pytest.approx(-1.0)
        and m["vespo/phi_mean"] == pytest.approx(1.0)
    )
    # VESPO weight: k = 2, lambda = 3, w = 0.5 -> e^(3 - 1.5) * 0.25 = 1.120422
    from posttrain.losses.policy_objectives import vespo_weight

    w = vespo_weight(torch.tensor([[math.log(0.5)]]), torch.ones(1, 1), torch.tensor([[1.0]]))
    assert w.item() == pytest.approx(math.exp(1.5) / 4, rel=1e-6)
    # LUSPO aggregation: per-sequence token sums over N: x=[[1,3],[5,7]], mask [[1,1],[1,0]] -> (4 + 5) / 2
    assert (
        aggregate(torch.tensor([[1.0, 3.0], [5.0, 7.0]]), torch.tensor([[1, 1], [1, 0]]), "seq_mean_token_sum").item()
        == 4.5
    )
    with pytest.raises(ConfigError, match="objective='nope'"):
        one(0.0, 1.0, objective="nope")
    with pytest.raises(ConfigError, match="takes no option"):
        one(0.0, 1.0, objective="cispo", objective_kwargs={"k_pos": 1.0})


def test_kl_bias_correction_hand_value():
    # one token: logp = 0.5, old = 0 (r = e^0.5), ref = 0: k3 = e^-0.5 + 0.5 - 1 = 0.106531; corrected r * k3 = 0.175639
    # d(r k3)/d logp = r k3 + r (1 - e^-0.5) = r * (k3 + 1 - e^-0.5) = r * 0.5 = 0.824361
    lp = torch.tensor([[0.5]], dtype=torch.float64, requires_grad=True)
    z = torch.zeros(1, 1, dtype=torch.float64)
    loss, m = policy_loss(lp, z, torch.zeros(1, dtype=torch.float64), torch.ones(1, 1), ref_logps=z, beta=1.0,
                          kl_bias_correction=True, clip_eps_low=None)  # fmt: skip
    loss.backward()
    r, k3 = math.exp(0.5), math.exp(-0.5) + 0.5 - 1
    assert loss.item() == pytest.approx(r * k3) and m["kl"] == pytest.approx(r * k3)
    assert lp.grad.item() == pytest.approx(r * 0.5)
