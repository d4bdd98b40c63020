"""Preference losses: the DPO family, as pure tensor functions (the reward-model losses are :mod:`ranking`).

Key insight: humans compare more consistently than they score, so preferences are modelled as
Bradley-Terry, P(y_w > y_l) = sigma(r_w - r_l). A reward model learns r directly (:mod:`ranking`). DPO instead uses the
closed-form optimum of the KL-regularised RLHF objective, r(x, y) = beta * log(pi(y|x) / pi_ref(y|x)) +
beta * log Z(x); the log Z(x) term cancels in r_w - r_l, so with the implicit reward

    h = (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l))
    L_DPO = -log sigma(beta * h)            grad = -beta * sigma(-beta * h) * grad(log pi(y_w) - log pi(y_l))

alignment becomes a classification loss over (chosen, rejected) pairs. Every variant below changes only
how ``h`` is formed (length terms, no reference, adaptive beta) or the function applied to it.

Inputs are per-sequence log-probs (B,), i.e. ``sequence_logps`` of the completion tokens (prompt and
padding masked out; see ``posttrain.losses.logprobs``). Every loss is keyword-only and returns
``(loss, metrics)``: ``loss`` is a scalar mean over the batch, ``metrics`` a dict of detached 0-d tensors
(``rewards/chosen``, ``rewards/rejected``, ``rewards/margins``, ``rewards/accuracies``, ``logps/chosen``,
``logps/rejected`` plus per-type extras). The DPO family is gathered in :data:`PREFERENCE_LOSSES`;
trainers choose a loss from that dict, never by ``if/elif``.

Not handled here: computing log-probs from a model, gradient accumulation across micro-batches, and
the distributed all-gather that beta-DPO's batch statistics would need on several ranks.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

Tensor = torch.Tensor

# ---------------------------------------------------------------------------------------------
# shared pieces


def check_same_shape(**tensors: Tensor | None) -> None:
    """All given tensors are 1-D with the same length (None entries are skipped)."""
    named = {k: v for k, v in tensors.items() if v is not None}
    shapes = {k: tuple(v.shape) for k, v in named.items()}
    first = next(iter(shapes.values()))
    if len(first) != 1 or any(s != first for s in shapes.values()):
        raise ValueError(f"expected 1-D tensors of equal length (per-sequence values), got shapes {shapes}")


def _check_beta(beta: float) -> None:
    if not beta > 0:
        raise ValueError(f"beta={beta} must be > 0")


def _pair_metrics(
    chosen_rewards: Tensor, rejected_rewards: Tensor, chosen_logps: Tensor, rejected_logps: Tensor
) -> dict[str, Tensor]:
    """The metrics every paired loss reports (means over the batch, detached)."""
    cr, rr = chosen_rewards.detach(), rejected_rewards.detach()
    return {
        "rewards/chosen": cr.mean(),
        "rewards/rejected": rr.mean(),
        "rewards/margins": (cr - rr).mean(),
        "rewards/accuracies": (cr > rr).float().mean(),
        "logps/chosen": chosen_logps.detach().mean(),
        "logps/rejected": rejected_logps.detach().mean(),
    }


def _logratios(
    policy_chosen_logps: Tensor, policy_rejected_logps: Tensor, ref_chosen_logps: Tensor, ref_rejected_logps: Tensor
) -> tuple[Tensor, Tensor]:
    check_same_shape(
        policy_chosen_logps=policy_chosen_logps,
        policy_rejected_logps=policy_rejected_logps,
        ref_chosen_logps=ref_chosen_logps,
        ref_rejected_logps=ref_rejected_logps,
    )
    return policy_chosen_logps - ref_chosen_logps, policy_rejected_logps - ref_rejected_logps  # (B,), (B,)


def _smoothed_logistic(logits: Tensor, label_smoothing: float) -> Tensor:
    """-(1 - eps) log sigma(z) - eps log sigma(-z): BCE against the soft label 1 - eps. (B,) -> (B,)."""
    losses = -F.logsigmoid(logits)
    if label_smoothing:
        losses = (1 - label_smoothing) * losses - label_smoothing * F.logsigmoid(-logits)
    return losses


# ---------------------------------------------------------------------------------------------
# the DPO family


def dpo_loss(
    *,
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float = 0.1,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPO: L = -log sigma(beta * h), h = log pi/pi_ref (y_w) - log pi/pi_ref (y_l)  (Rafailov et al. 2023, eq. 7).

    Implicit rewards (logged): r = beta * (log pi - log pi_ref). The gradient w.r.t. log pi(y_w) is
    -beta * sigma(-beta * h) / B: pairs the model already ranks well contribute little.
    Example: beta=1, h=0 -> loss = log 2 = 0.6931.
    """
    _check_beta(beta)
    chosen_lr, rejected_lr = _logratios(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps)
    losses = -F.logsigmoid(beta * (chosen_lr - rejected_lr))  # (B,)
    metrics = _pair_metrics(beta * chosen_lr, beta * rejected_lr, policy_chosen_logps, policy_rejected_logps)
    return losses.mean(), metrics


def ipo_loss(
    *,
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float = 0.1,
    chosen_lengths: Tensor | None = None,
    rejected_lengths: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """IPO: L = (h - 1/(2 beta))^2  (Azar et al. 2023, "A General Theoretical Paradigm...", eq. 17; beta is tau).

    The squared loss regresses h onto a finite target instead of pushing it to infinity, so IPO does
    not overfit deterministic preferences the way DPO's logistic loss can. With ``chosen_lengths`` /
    ``rejected_lengths`` each log-ratio is divided by its completion length first (the per-token form
    TRL uses and the IPO authors confirmed); without them, h uses summed log-probs as in the paper.
    Example: beta=0.5, h=0 -> (0 - 1)^2 = 1.
    """
    _check_beta(beta)
    chosen_lr, rejected_lr = _logratios(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps)
    if (chosen_lengths is None) != (rejected_lengths is None):
        raise ValueError("ipo_loss: pass both chosen_lengths and rejected_lengths, or neither")
    h = chosen_lr - rejected_lr
    if chosen_lengths is not None:
        check_same_shape(chosen_logratios=chosen_lr, chosen_lengths=chosen_lengths, rejected_lengths=rejected_lengths)
        h = chosen_lr / chosen_lengths.clamp_min(1) - rejected_lr / rejected_lengths.clamp_min(1)  # per-token
    losses = (h - 1 / (2 * beta)) ** 2  # (B,)
    metrics = _pair_metrics(beta * chosen_lr, beta * rejected_lr, policy_chosen_logps, policy_rejected_logps)
    return losses.mean(), metrics


def hinge_loss(
    *,
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float = 0.1,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Hinge: L = max(0, 1 - beta * h)  (SLiC-HF, Zhao et al. 2023, eq. 1 with the DPO log-ratio; TRL "hinge").

    Pairs whose scaled margin already exceeds 1 give exactly zero loss and zero gradient.
    Example: beta=0.5, h=1 -> max(0, 0.5) = 0.5; h=3 -> 0.
    """
    _check_beta(beta)
    chosen_lr, rejected_lr = _logratios(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps)
    losses = torch.relu(1 - beta * (chosen_lr - rejected_lr))  # (B,)
    metrics = _pair_metrics(beta * chosen_lr, beta * rejected_lr, policy_chosen_logps, policy_rejected_logps)
    return losses.mean(), metrics


def conservative_dpo_loss(
    *,
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float = 0.1,
    label_smoothing: float = 0.1,
) -> tuple[Tensor, dict[str, Tensor]]:
    """cDPO: L = -(1 - eps) log sigma(beta h) - eps log sigma(-beta h)  (Mitchell 2023, "A note on DPO with noisy preferences").

    Binary cross-entropy against the soft label 1 - eps, i.e. each label is assumed flipped with
    probability eps. The loss is minimised at a finite h (sigma(beta h) = 1 - eps), not at infinity.
    Example: beta=1, h=0, eps=0.1 -> 0.9 log 2 + 0.1 log 2 = log 2.
    """
    _check_beta(beta)
    if not 0.0 <= label_smoothing <= 0.5:
        raise ValueError(f"label_smoothing={label_smoothing} must be in [0, 0.5]")
    chosen_lr, rejected_lr = _logratios(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps)
    losses = _smoothed_logistic(beta * (chosen_lr - rejected_lr), label_smoothing)  # (B,)
    metrics = _pair_metrics(beta * chosen_lr, beta * rejected_lr, policy_chosen_logps, policy_rejected_logps)
    return losses.mean(), metrics


def robust_dpo_loss(
    *,
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float = 0.1,
    label_smoothing: float = 0.1,
) -> tuple[Tensor, dict[str, Tensor]]:
    """rDPO: L = [-(1 - eps) log sigma(beta h) + eps log sigma(-beta h)] / (1 - 2 eps)  (Chowdhury et al. 2024, eq. 8).

    An unbiased estimate of the clean-label DPO loss when each label is flipped with known rate eps
    (unlike cDPO, the flipped term enters with a minus sign and the result is rescaled).
    Example: beta=1, h=0, eps=0.25 -> (0.75 log 2 - 0.25 log 2) / 0.5 = log 2.
    """
    _check_beta(beta)
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing={label_smoothing} must be in [0, 0.5) for robust DPO")
    chosen_lr, rejected_lr = _logratios(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps)
    z = beta * (chosen_lr - rejected_lr)  # (B,)
    eps = label_smoothing
    losses = (-(1 - eps) * F.logsigmoid(z) + eps * F.logsigmoid(-z)) / (1 - 2 * eps)  # (B,)
    metrics = _pair_metrics(beta * chosen_lr, beta * rejected_lr, policy_chosen_logps, policy_rejected_logps)
    return losses.mean(), metrics


def simpo_loss(
    *,
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    chosen_lengths: Tensor,
    rejected_lengths: Tensor,
    beta: float = 2.0,
    gamma: float = 0.5,
    label_smoothing: float = 0.0,
    ref_chosen_logps: Tensor | None = None,
    ref_rejected_logps: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """SimPO: L = -log sigma(beta/|y_w| log pi(y_w) - beta/|y_l| log pi(y_l) - gamma)  (Meng et al. 2024, eq. 6).

    Reference-free: the reward is the length-normalised log-likelihood beta * log pi(y) / |y| (which
    is what generation ranks by), and gamma is a target reward margin. ``ref_*_logps`` are accepted
    and ignored so a trainer can call every paired loss the same way; pass None. ``label_smoothing``
    gives the conservative form (as TRL's CPO trainer). Rewards logged: beta * log pi(y) / |y|.
    Example: beta=2, avg logps -1 and -2, gamma=0.5 -> -log sigma(2 - 0.5) = 0.2014.
    """
    _check_beta(beta)
    check_same_shape(
        policy_chosen_logps=policy_chosen_logps,
        policy_rejected_logps=policy_rejected_logps,
        chosen_lengths=chosen_lengths,
        rejected_lengths=rejected_lengths,
    )
    chosen_avg = policy_chosen_logps / chosen_lengths.clamp_min(1)  # (B,) per-token log-prob
    rejected_avg = policy_rejected_logps / rejected_lengths.clamp_min(1)
    losses = _smoothed_logistic(beta * (chosen_avg - rejected_avg) - gamma, label_smoothing)  # (B,)
    metrics = _pair_metrics(beta * chosen_avg, beta * rejected_avg, policy_chosen_logps, policy_rejected_logps)
    return losses.mean(), metrics


def rpo_loss(
    *,
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    chosen_nll: Tensor,
    beta: float = 0.1,
    alpha: float = 1.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """RPO: L = L_DPO + alpha * NLL(y_w)  (Pang et al. 2024, "Iterative Reasoning Preference Optimization", eq. 1).

    The NLL term keeps the chosen response's likelihood up, countering DPO's known tendency to lower
    both log-probs while the margin grows. ``chosen_nll`` (B,) is the per-sequence negative
    log-likelihood of the chosen completion as the caller defines it; Pang et al. normalise by length
    (-log pi(y_w) / |y_w|), which is ``-sequence_logps(..., average=True)``.
    Example: beta=1, h=0, nll=2, alpha=0.5 -> log 2 + 1 = 1.6931.
    """
    check_same_shape(policy_chosen_logps=policy_chosen_logps, chosen_nll=chosen_nll)
    loss, metrics = dpo_loss(
        policy_chosen_logps=policy_chosen_logps,
        policy_rejected_logps=policy_rejected_logps,
        ref_chosen_logps=ref_chosen_logps,
        ref_rejected_logps=ref_rejected_logps,
        beta=beta,
    )
    nll = chosen_nll.mean()
    metrics["rpo/dpo_loss"] = loss.detach()
    metrics["nll/chosen"] = nll.detach()
    return loss + alpha * nll, metrics


def rdpo_loss(
    *,
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    chosen_lengths: Tensor,
    rejected_lengths: Tensor,
    beta: float = 0.1,
    alpha: float = 0.01,
) -> tuple[Tensor, dict[str, Tensor]]:
    """R-DPO: L = -log sigma(beta * h + alpha * (|y_w| - |y_l|))  (Park et al. 2024, "Disentangling Length from Quality in DPO", eq. 9).

    Derivation: add a length penalty to the RLHF objective, max E[r(x,y) - alpha |y|] - beta KL. Its
    optimum inverts to r(x, y) = beta log pi/pi_ref + alpha |y| + beta log Z(x), and Bradley-Terry on
    r_w - r_l gives the margin above. When the chosen answer is longer, part of the margin is already
    "explained" by length, so the policy is pushed less to favour length itself. alpha is in reward
    units per token (the paper sweeps 0.005-0.05 at beta 0.1). Extra metric ``rdpo/length_term``.
    Example: beta=1, h=0, alpha=0.1, |y_w|=5, |y_l|=3 -> -log sigma(0.2) = 0.5981.
    """
    _check_beta(beta)
    chosen_lr, rejected_lr = _logratios(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps)
    check_same_shape(chosen_logratios=chosen_lr, chosen_lengths=chosen_lengths, rejected_lengths=rejected_lengths)
    length_term = alpha * (chosen_lengths.to(chosen_lr.dtype) - rejected_lengths.to(chosen_lr.dtype))  # (B,)
    losses = -F.logsigmoid(beta * (chosen_lr - rejected_lr) + length_term)  # (B,)
    metrics = _pair_metrics(beta * chosen_lr, beta * rejected_lr, policy_chosen_logps, policy_rejected_logps)
    metrics["rdpo/length_term"] = length_term.detach().mean()
    return losses.mean(), metrics


class BetaDPOState(NamedTuple):
    """Running statistics of the beta-DPO reward gap M = h, carried by the trainer between steps.

    ``gap_mean`` is the threshold M_0 of the paper; ``gap_std`` its running spread sigma. A trainer
    starts with ``None`` (initialise from the first batch) and passes ``BetaDPOState.from_metrics(m)``
    on; save it with the trainer state to resume exactly.
    """

    gap_mean: float
    gap_std: float

    @classmethod
    def from_metrics(cls, metrics: dict[str, Tensor]) -> "BetaDPOState":
        return cls(float(metrics["beta_dpo/gap_mean"]), float(metrics["beta_dpo/gap_std"]))


def beta_dpo_update_state(gap: Tensor, state: BetaDPOState | None, momentum: float = 0.9) -> BetaDPOState:
    """M_0 <- m * M_0 + (1 - m) * mean(M), sigma <- m * sigma + (1 - m) * std(M)   (Wu et al. 2024, eq. 7).

    ``state=None`` starts from the batch's own statistics (the reference code starts from 0, which
    biases the first hundred or so steps towards 0; pass ``BetaDPOState(0.0, 0.0)`` to reproduce it).
    std is the unbiased sample standard deviation (0 for a batch of one).
    Example: gap=[1, 3], state=(0, 0), m=0.9 -> mean 2, std 1.4142 -> (0.2, 0.14142).
    """
    gap = gap.detach().double()
    mean = float(gap.mean())
    std = float(gap.std()) if gap.numel() > 1 else 0.0
    if state is None:
        return BetaDPOState(mean, std)
    return BetaDPOState(momentum * state.gap_mean + (1 - momentum) * mean, momentum * state.gap_std + (1 - momentum) * std)


def beta_dpo_filter(
    gap: Tensor, state: BetaDPOState, filter_ratio: float, generator: torch.Generator | None = None
) -> Tensor:
    """Keep a (1 - rho) fraction of pairs, sampled without replacement with p_i ~ exp(-(M_i - M_0)^2 / (2 sigma^2)).

    Wu et al. 2024, Section 4.2 ("beta-guided data filtering"): pairs whose gap is far from the running
    mean, in either direction (trivially easy or likely mislabelled), are the least likely to be kept.
    Returns a (B,) bool mask with max(1, int(B * (1 - filter_ratio))) entries set. Weights are floored
    at 1e-30 so that multinomial sampling without replacement is always possible.
    """
    if not 0.0 <= filter_ratio < 1.0:
        raise ValueError(f"filter_ratio={filter_ratio} must be in [0, 1)")
    gap = gap.detach()
    n = gap.numel()
    keep_n = max(1, int(n * (1 - filter_ratio)))
    if keep_n >= n:
        return torch.ones(n, dtype=torch.bool, device=gap.device)
    sigma = max(state.gap_std, 1e-8)
    weights = torch.exp(-0.5 * ((gap.double() - state.gap_mean) / sigma) ** 2).clamp_min(1e-30)  # (B,)
    idx = torch.multinomial(weights.cpu(), keep_n, replacement=False, generator=generator).to(gap.device)
    mask = torch.zeros(n, dtype=torch.bool, device=gap.device)
    mask[idx] = True
    return mask


def beta_dpo_loss(
    *,
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float = 0.1,
    alpha: float = 0.6,
    filter_ratio: float = 0.2,
    momentum: float = 0.9,
    state: BetaDPOState | None = None,
    generator: torch.Generator | None = None,
    min_beta: float = 1e-3,
) -> tuple[Tensor, dict[str, Tensor]]:
    """beta-DPO: L = mean_{i in S} -log sigma(beta_b * h_i), beta_b = beta * (1 + alpha * (mean_{i in S} M_i - M_0))  (Wu et al. 2024, eqs. 6-8).

    Reading of the paper and its reference code (github.com/junkangwu/beta-DPO, ``trainers.py``):
      1. the gap M_i = h_i is the DPO log-ratio margin (without beta), detached;
      2. running statistics are updated with this batch first (:func:`beta_dpo_update_state`,
         momentum 0.9): M_0 = running mean, sigma = running std;
      3. a subset S of (1 - filter_ratio) * B pairs is sampled with Gaussian weights around M_0
         (:func:`beta_dpo_filter`; the paper's default keeps 80%);
      4. beta_b is computed from the mean gap of S, clamped at ``min_beta`` and detached: a batch of
         informative, large-gap pairs gets a larger beta (stay close to the reference), a batch of
         near-ties a smaller one (move further);
      5. the loss is the DPO loss with beta_b averaged over S only.
    The state is passed in and returned (in ``metrics``), so the function stays pure; ``generator``
    makes the sampling reproducible. Rewards are logged with the base beta, as in the reference code.
    Extra metrics: ``beta_dpo/beta``, ``beta_dpo/kept``, ``beta_dpo/gap_mean``, ``beta_dpo/gap_std``.
    Example (no filtering): beta=0.1, alpha=1, gaps [1, 3], state (0.5, 1), m=0.5 -> M_0 = 1.25, beta_b = 0.1 * 1.75.
    """
    _check_beta(beta)
    chosen_lr, rejected_lr = _logratios(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps)
    h = chosen_lr - rejected_lr  # (B,)
    new_state = beta_dpo_update_state(h, state, momentum)
    keep = beta_dpo_filter(h, new_state, filter_ratio, generator)  # (B,) bool
    beta_b = max(beta * (1 + alpha * (float(h.detach()[keep].double().mean()) - new_state.gap_mean)), min_beta)
    losses = -F.logsigmoid(beta_b * h)  # (B,)
    loss = losses[keep].mean()
    metrics = _pair_metrics(beta * chosen_lr, beta * rejected_lr, policy_chosen_logps, policy_rejected_logps)
    dev = h.device
    metrics["beta_dpo/beta"] = torch.tensor(beta_b, device=dev)
    metrics["beta_dpo/kept"] = keep.float().mean()
    metrics["beta_dpo/gap_mean"] = torch.tensor(new_state.gap_mean, dtype=torch.float64, device=dev)
    metrics["beta_dpo/gap_std"] = torch.tensor(new_state.gap_std, dtype=torch.float64, device=dev)
    return loss, metrics


def kto_loss(
    *,
    policy_logps: Tensor,
    ref_logps: Tensor,
    labels: Tensor,
    policy_kl_logps: Tensor | None = None,
    ref_kl_logps: Tensor | None = None,
    kl: Tensor | float | None = None,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """KTO: L = mean_i w_i (1 - v_i), v = sigma(beta (r - z0)) if desirable else sigma(beta (z0 - r))  (Ethayarajh et al. 2024, eq. 7).

    Unpaired data: each completion is labelled desirable (``labels`` True) or undesirable, with
    r = log pi(y|x) - log pi_ref(y|x). The reference point z0 is a batch estimate of
    KL(pi || pi_ref): mean(policy_kl_logps - ref_kl_logps) over *mismatched* (x, y') pairs, clamped at 0
    and detached (no gradient flows through it). Pass the mismatched log-probs, or ``kl`` directly.
    w = desirable_weight (lambda_D) or undesirable_weight (lambda_U); the paper advises
    lambda_D n_D / (lambda_U n_U) in [1, 4/3]. Rewards logged: beta * r per group (omitted when a group is
    empty in the batch). Extra metric ``kl``.
    Example: beta=1, z0=0, one desirable r=0 -> 1 - sigma(0) = 0.5.
    """
    _check_beta(beta)
    check_same_shape(policy_logps=policy_logps, ref_logps=ref_logps, labels=labels)
    if kl is None:
        if policy_kl_logps is None or ref_kl_logps is None:
            raise ValueError("kto_loss needs policy_kl_logps and ref_kl_logps (mismatched pairs), or kl")
        check_same_shape(policy_kl_logps=policy_kl_logps, ref_kl_logps=ref_kl_logps)
        z0 = (policy_kl_logps - ref_kl_logps).mean().detach().clamp_min(0)
    else:
        z0 = torch.as_tensor(kl, dtype=policy_logps.dtype, device=policy_logps.device).detach()
    desirable = labels.bool()  # (B,)
    r = policy_logps - ref_logps  # (B,)
    losses = torch.where(
        desirable,
        desirable_weight * (1 - torch.sigmoid(beta * (r - z0))),
        undesirable_weight * (1 - torch.sigmoid(beta * (z0 - r))),
    )  # (B,)
    rewards = beta * r.detach()
    metrics: dict[str, Tensor] = {"kl": z0.detach()}
    if desirable.any():
        metrics["rewards/chosen"] = rewards[desirable].mean()
        metrics["logps/chosen"] = policy_logps.detach()[desirable].mean()
    if (~desirable).any():
        metrics["rewards/rejected"] = rewards[~desirable].mean()
        metrics["logps/rejected"] = policy_logps.detach()[~desirable].mean()
    if desirable.any() and (~desirable).any():
        metrics["rewards/margins"] = metrics["rewards/chosen"] - metrics["rewards/rejected"]
    return losses.mean(), metrics


PREFERENCE_LOSSES = {
    "dpo": dpo_loss,
    "ipo": ipo_loss,
    "hinge": hinge_loss,
    "robust": robust_dpo_loss,
    "cdpo": conservative_dpo_loss,
    "kto": kto_loss,
    "simpo": simpo_loss,
    "rpo": rpo_loss,
    "rdpo": rdpo_loss,
    "beta_dpo": beta_dpo_loss,
}
"""Loss name -> function. Paired losses take ``policy_/ref_ chosen/rejected _logps`` and ``beta``;
their extras are keyword arguments (see :data:`LOSS_EXTRAS`). ``kto`` is unpaired."""

REFERENCE_FREE_LOSSES = frozenset({"simpo"})
"""Losses that need no reference model (the trainer can skip the reference forward pass)."""

UNPAIRED_LOSSES = frozenset({"kto"})
"""Losses that take unpaired, labelled completions instead of (chosen, rejected) pairs."""

LOSS_EXTRAS = {
    "ipo": ("chosen_lengths", "rejected_lengths"),
    "simpo": ("chosen_lengths", "rejected_lengths"),
    "rdpo": ("chosen_lengths", "rejected_lengths"),
    "rpo": ("chosen_nll",),
}
"""Per-sequence tensors a loss needs beyond the log-probs (the trainer computes them from the batch)."""
