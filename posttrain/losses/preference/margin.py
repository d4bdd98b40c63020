"""The DPO family proper: losses of the implicit-reward margin h = log pi/pi_ref (y_w) - log pi/pi_ref (y_l).

dpo (reverse-KL DPO), ipo, hinge, cdpo, robust, sigmoid_norm (h per token), exo_pair, discopop. Each takes
per-sequence log-probs (B,) and returns ``(loss, metrics)`` (see the package docstring). The f-divergence
variants of DPO, which change how h is formed from the log-ratios, are in :mod:`.fdiv`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from posttrain.losses.preference.base import (
    Tensor,
    _check_beta,
    _logratios,
    _pair_metrics,
    _smoothed_logistic,
    check_same_shape,
)


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
    chosen_lr, rejected_lr = _logratios(
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
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
    chosen_lr, rejected_lr = _logratios(
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
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
    chosen_lr, rejected_lr = _logratios(
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
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
    chosen_lr, rejected_lr = _logratios(
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
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
    chosen_lr, rejected_lr = _logratios(
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
    z = beta * (chosen_lr - rejected_lr)  # (B,)
    eps = label_smoothing
    losses = (-(1 - eps) * F.logsigmoid(z) + eps * F.logsigmoid(-z)) / (1 - 2 * eps)  # (B,)
    metrics = _pair_metrics(beta * chosen_lr, beta * rejected_lr, policy_chosen_logps, policy_rejected_logps)
    return losses.mean(), metrics


def sigmoid_norm_loss(
    *,
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    chosen_lengths: Tensor,
    rejected_lengths: Tensor,
    beta: float = 0.1,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Length-normalised DPO: L = -log sigma(beta * (lr_w / |y_w| - lr_l / |y_l|)), lr = log pi/pi_ref  (TRL "sigmoid_norm").

    The DPO logistic loss on per-token log-ratios, so that long completions do not dominate the margin
    (the normalisation SimPO and IPO's per-token form use, here kept with the reference). Lengths are
    clamped at 1. Rewards logged: the unnormalised beta * lr, as TRL.
    Example: beta=1, lr_w = 2 over 2 tokens, lr_l = -1 over 1 token -> -log sigma(1 + 1) = 0.1269.
    """
    _check_beta(beta)
    chosen_lr, rejected_lr = _logratios(
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
    check_same_shape(chosen_logratios=chosen_lr, chosen_lengths=chosen_lengths, rejected_lengths=rejected_lengths)
    h = chosen_lr / chosen_lengths.clamp_min(1) - rejected_lr / rejected_lengths.clamp_min(1)  # (B,) per token
    losses = -F.logsigmoid(beta * h)
    metrics = _pair_metrics(beta * chosen_lr, beta * rejected_lr, policy_chosen_logps, policy_rejected_logps)
    return losses.mean(), metrics


def exo_pair_loss(
    *,
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float = 0.1,
    label_smoothing: float = 1e-3,
) -> tuple[Tensor, dict[str, Tensor]]:
    """EXO: L = KL(q || p) = q_w (log q_w - log(1 - eps)) + q_l (log q_l - log eps), q_w = sigma(beta h) = 1 - q_l  (Ji et al. 2024, eq. 16).

    "Towards Efficient Exact Optimization of Language Model Alignment": instead of DPO's forward
    cross-entropy against the label, minimise the reverse KL from the model's pairwise distribution
    q = softmax(beta * log-ratios) over {y_w, y_l} to the smoothed label p = (1 - eps, eps), which is
    mode-seeking like the RLHF objective itself. eps must be in (0, 1) (log eps); the paper uses 1e-3.
    Example: beta=1, h=0, eps=1e-3 -> 0.5 (log 0.5 - log 0.999) + 0.5 (log 0.5 - log 0.001) = 2.7612.
    """
    _check_beta(beta)
    if not 0.0 < label_smoothing < 1.0:
        raise ValueError(f"label_smoothing={label_smoothing} must be in (0, 1) for EXO (the paper uses 1e-3)")
    chosen_lr, rejected_lr = _logratios(
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
    z = beta * (chosen_lr - rejected_lr)  # (B,)
    log_qw, log_ql = F.logsigmoid(z), F.logsigmoid(-z)
    eps = label_smoothing
    losses = log_qw.exp() * (log_qw - math.log1p(-eps)) + log_ql.exp() * (log_ql - math.log(eps))  # (B,)
    metrics = _pair_metrics(beta * chosen_lr, beta * rejected_lr, policy_chosen_logps, policy_rejected_logps)
    return losses.mean(), metrics


def discopop_loss(
    *,
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float = 0.1,
    tau: float = 0.05,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DiscoPOP: L = (1 - m) * (-log sigma(z)) + m * exp(-z), z = beta h, m = sigma(z / tau)  (Chris Lu et al. 2024, eq. 5).

    "Discovering Preference Optimization Algorithms with and for LLMs": the log-ratio modulated loss an
    LLM-driven search found, blending the logistic (DPO) loss for z << 0 with the exponential loss for
    z >> 0; tau (TRL's ``discopop_tau``, paper default 0.05) sets how sharp the switch is.
    Example: beta=1, h=0 -> m = 0.5 -> 0.5 log 2 + 0.5 = 0.8466.
    """
    _check_beta(beta)
    if not tau > 0:
        raise ValueError(f"tau={tau} must be > 0")
    chosen_lr, rejected_lr = _logratios(
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
    z = beta * (chosen_lr - rejected_lr)  # (B,)
    m = torch.sigmoid(z / tau)
    losses = -F.logsigmoid(z) * (1 - m) + torch.exp(-z) * m  # (B,)
    metrics = _pair_metrics(beta * chosen_lr, beta * rejected_lr, policy_chosen_logps, policy_rejected_logps)
    return losses.mean(), metrics
