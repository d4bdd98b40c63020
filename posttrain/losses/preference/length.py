"""Losses with a length or likelihood term: SimPO (length-normalised, reference-free), R-DPO (length
penalty), RPO (DPO + NLL of the chosen answer) and ``sft`` (the chosen answer's NLL alone, TRL's "sft").

They need per-sequence lengths or NLLs beyond the log-probs (declared in the package's ``LOSS_EXTRAS``).
"""

from __future__ import annotations

import torch.nn.functional as F

from posttrain.losses.preference.base import (
    Tensor,
    _check_beta,
    _logratios,
    _pair_metrics,
    _smoothed_logistic,
    check_same_shape,
)
from posttrain.losses.preference.margin import dpo_loss


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
    chosen_lr, rejected_lr = _logratios(
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
    check_same_shape(chosen_logratios=chosen_lr, chosen_lengths=chosen_lengths, rejected_lengths=rejected_lengths)
    length_term = alpha * (chosen_lengths.to(chosen_lr.dtype) - rejected_lengths.to(chosen_lr.dtype))  # (B,)
    losses = -F.logsigmoid(beta * (chosen_lr - rejected_lr) + length_term)  # (B,)
    metrics = _pair_metrics(beta * chosen_lr, beta * rejected_lr, policy_chosen_logps, policy_rejected_logps)
    metrics["rdpo/length_term"] = length_term.detach().mean()
    return losses.mean(), metrics


def sft_loss(
    *,
    policy_chosen_logps: Tensor,
    chosen_lengths: Tensor,
    policy_rejected_logps: Tensor | None = None,
    rejected_lengths: Tensor | None = None,
    ref_chosen_logps: Tensor | None = None,
    ref_rejected_logps: Tensor | None = None,
    beta: float = 0.1,
) -> tuple[Tensor, dict[str, Tensor]]:
    """SFT on the chosen completions: L = -sum_i log pi(y_w,i) / sum_i |y_w,i|  (TRL "sft"; the NLL term of RPO and MPO).

    The token-mean NLL over all chosen tokens of the batch (not a mean of per-sequence means: a long
    answer weighs more), as TRL. Reference-free; its use is as a term of a weighted combination
    (``dpo,sft``). ``beta`` and the other log-probs are accepted so the trainer calls every loss the same
    way; rewards are logged as beta * log-ratio when the reference log-probs are given, else as
    beta * log pi(y) / |y| (SimPO's). Extra metric ``nll/chosen``.
    Example: chosen log-probs [-2, -6] over [1, 3] tokens -> 8 / 4 = 2.
    """
    check_same_shape(policy_chosen_logps=policy_chosen_logps, chosen_lengths=chosen_lengths)
    nll = -policy_chosen_logps.sum() / chosen_lengths.sum().clamp_min(1)
    rejected = policy_rejected_logps if policy_rejected_logps is not None else policy_chosen_logps
    rejected_lengths = rejected_lengths if rejected_lengths is not None else chosen_lengths
    if ref_chosen_logps is not None and ref_rejected_logps is not None:
        cr, rr = beta * (policy_chosen_logps - ref_chosen_logps), beta * (rejected - ref_rejected_logps)
    else:
        cr, rr = (
            beta * policy_chosen_logps / chosen_lengths.clamp_min(1),
            beta * rejected / rejected_lengths.clamp_min(1),
        )
    metrics = _pair_metrics(cr, rr, policy_chosen_logps, rejected)
    metrics["nll/chosen"] = nll.detach()
    return nll, metrics
