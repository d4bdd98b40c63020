"""Reward-model losses, as pure tensor functions: Bradley-Terry pairs, Plackett-Luce rankings, pointwise scores.

Key insight: humans compare more consistently than they score, so a reward model r(x, y) is fitted to
comparisons, P(y_w > y_l) = sigma(r_w - r_l) (Bradley-Terry); a ranking of k responses is k successive
softmax choices (Plackett-Luce, k = 2 is BT); pointwise regression on ratings is the baseline. Every loss
returns ``(loss, metrics)`` with detached 0-d metric tensors, as the DPO family in :mod:`preference`
(which takes the same comparisons through the policy's implicit reward instead).

Not handled here: computing rewards from a model (``posttrain.models.heads.RewardModel``), ties.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from posttrain.losses.preference import check_same_shape

Tensor = torch.Tensor


def _reward_metrics(chosen_rewards: Tensor, rejected_rewards: Tensor) -> dict[str, Tensor]:
    cr, rr = chosen_rewards.detach(), rejected_rewards.detach()
    both = torch.cat([cr, rr])
    return {
        "accuracy": (cr > rr).float().mean(),
        "margin": (cr - rr).mean(),
        "rewards/chosen": cr.mean(),
        "rewards/rejected": rr.mean(),
        "rewards/mean": both.mean(),
        "rewards/std": both.std() if both.numel() > 1 else torch.zeros((), dtype=both.dtype, device=both.device),
    }


def bradley_terry_loss(
    chosen_rewards: Tensor, rejected_rewards: Tensor, margin: Tensor | None = None, center_coef: float = 0.0
) -> tuple[Tensor, dict[str, Tensor]]:
    """Bradley-Terry: L = -log sigma(r_w - r_l - m) + c * (r_w + r_l)^2  (Bradley & Terry 1952; InstructGPT, Ouyang et al. 2022, eq. 1).

    ``margin`` m (B,) asks the pair to be separated by at least m (Llama 2, Touvron et al. 2023, eq. 2:
    larger for clearly-better ratings). ``center_coef`` c pulls the rewards towards zero mean
    (Eisenstein et al. 2023), which fixes BT's free additive constant. Computed with ``logsigmoid``,
    which stays finite where log(sigmoid(x)) underflows to -inf. Equals binary cross-entropy with
    logits r_w - r_l - m and target 1.
    Example: r_w=1, r_l=0 -> -log sigma(1) = 0.3133.
    """
    check_same_shape(chosen_rewards=chosen_rewards, rejected_rewards=rejected_rewards, margin=margin)
    diff = chosen_rewards - rejected_rewards  # (B,)
    if margin is not None:
        diff = diff - margin
    loss = -F.logsigmoid(diff).mean()
    if center_coef:
        loss = loss + center_coef * ((chosen_rewards + rejected_rewards) ** 2).mean()
    return loss, _reward_metrics(chosen_rewards, rejected_rewards)


def plackett_luce_loss(rewards_ranked: Tensor, mask: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """Plackett-Luce: L = -sum_j [r_j - log sum_{m >= j} exp(r_m)] over a ranking best-first  (Plackett 1975; Luce 1959).

    The probability of a full ranking of k responses is the product of k successive softmax choices,
    each picking the best of those left. k=2 is exactly Bradley-Terry. ``rewards_ranked`` (B, k) holds
    each group's rewards in preference order (column 0 best). ``mask`` (B, k) marks valid entries for
    groups with fewer than k responses (invalid ones are skipped, whatever their position).
    Metrics: ``accuracy`` = fraction of ordered pairs (i < j) with r_i > r_j, ``top1_accuracy``.
    Example: r = [2, 1, 0] -> -(2 - log(e^2+e+1)) - (1 - log(e+1)) = 0.7209.
    """
    if rewards_ranked.dim() != 2 or rewards_ranked.shape[1] < 2:
        raise ValueError(f"rewards_ranked must be (B, k) with k >= 2, got {tuple(rewards_ranked.shape)}")
    if mask is None:
        mask = torch.ones_like(rewards_ranked, dtype=torch.bool)
    mask = mask.bool()
    if mask.shape != rewards_ranked.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} != rewards shape {tuple(rewards_ranked.shape)}")
    if (mask.sum(-1) < 1).any():
        raise ValueError("every ranking needs at least one valid entry")
    neg = torch.finfo(rewards_ranked.dtype).min
    r = rewards_ranked.masked_fill(~mask, neg)  # (B, k) invalid entries never win a softmax
    tail_lse = torch.logcumsumexp(r.flip(-1), dim=-1).flip(-1)  # (B, k) log sum_{m >= j} exp(r_m)
    terms = torch.where(mask, r - tail_lse, torch.zeros_like(r))  # (B, k) log P(choose j among the rest)
    loss = -terms.sum(-1).mean()
    with torch.no_grad():
        rd = rewards_ranked.detach()
        k = rd.shape[1]
        upper = torch.triu(torch.ones(k, k, dtype=torch.bool, device=rd.device), diagonal=1)  # (k, k) i < j
        valid = upper & mask.unsqueeze(-1) & mask.unsqueeze(-2)  # (B, k, k)
        correct = (rd.unsqueeze(-1) > rd.unsqueeze(-2)) & valid  # (B, k, k)
        first = mask.float().argmax(-1)  # (B,) first valid (best) position
        best = r.detach().argmax(-1)
        metrics = {
            "accuracy": correct.sum() / valid.sum().clamp_min(1),
            "top1_accuracy": (best == first).float().mean(),
            "rewards/mean": rd[mask].mean(),
        }
    return loss, metrics


def pointwise_mse_loss(rewards: Tensor, targets: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """Pointwise regression: L = mean (r - s)^2 for scored data (a rating s per response).

    The baseline that pairwise losses improve on: ratings from different annotators are on different
    scales, so prefer BT when comparisons are available. Example: r=[1, 2], s=[0, 0] -> (1 + 4) / 2 = 2.5.
    """
    check_same_shape(rewards=rewards, targets=targets)
    loss = ((rewards - targets.to(rewards.dtype)) ** 2).mean()
    rd = rewards.detach()
    return loss, {
        "mse": loss.detach(),
        "rewards/mean": rd.mean(),
        "rewards/std": rd.std() if rd.numel() > 1 else torch.zeros((), dtype=rd.dtype, device=rd.device),
    }


def accuracy_by_margin_bucket(
    chosen_rewards: Tensor, rejected_rewards: Tensor, bucket_values: Tensor, edges: tuple[float, ...] = (0.5, 1.0, 2.0)
) -> dict[str, Tensor]:
    """Pairwise accuracy split by a per-pair quantity (e.g. the label margin or |r_w - r_l|).

    ``edges`` (increasing) cut the line into len(edges) + 1 buckets: (-inf, e0), [e0, e1), ..., [e_last, inf).
    Returns {"accuracy/bucket_<lo>_<hi>": acc, "count/bucket_<lo>_<hi>": n} for non-empty buckets.
    Example: edges=(1,), values [0.5, 2], correct [False, True] -> bucket_-inf_1: 0.0, bucket_1_inf: 1.0.
    """
    check_same_shape(chosen_rewards=chosen_rewards, rejected_rewards=rejected_rewards, bucket_values=bucket_values)
    if list(edges) != sorted(edges):
        raise ValueError(f"edges must be increasing, got {edges}")
    correct = (chosen_rewards.detach() > rejected_rewards.detach()).float()
    bounds = [-math.inf, *edges, math.inf]
    out: dict[str, Tensor] = {}
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        sel = (bucket_values >= lo) & (bucket_values < hi)
        n = int(sel.sum())
        if n:
            name = f"bucket_{lo:g}_{hi:g}"
            out[f"accuracy/{name}"] = correct[sel].mean()
            out[f"count/{name}"] = torch.tensor(n)
    return out
