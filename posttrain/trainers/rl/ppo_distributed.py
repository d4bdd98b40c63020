"""PPO under ``torchrun``: every statistic the update reads is the global batch's, so N processes make 1's update.

Key insight: PPO couples the rows of a rollout in more places than GRPO: the advantages are whitened over the
batch, the sequence scores may be scaled by the batch's std, the policy and the value losses are token means
over each minibatch, beta adapts to the batch's KL, and the target-KL stop reads a minibatch's approx-KL. Each
of these is a function of a few sums over rows, so each rank computes its own sums and an all-reduce (SUM,
then divide: pytorch#162338) gives every rank the 1-process value:

    mean   = sum_r S_r(x m) / sum_r S_r(m)
    var    = sum_r S_r((x - mean)^2 m) / sum_r S_r(m)     (two passes, as ``masked_var``; Bessel on the global count)
    min/max: all-reduce MIN / MAX
    minibatch metrics: ``merge_metrics`` over every rank's micro-batch parts (all-gathered), token-weighted

Rank r holds a contiguous share of the step's prompts (all G samples of a prompt on one rank); the epoch's
row order is a permutation of the *global* rows, cut into minibatches exactly as one process cuts it, and each
rank runs its own rows of each minibatch. Gradients of the policy and of the critic are summed in one flat
all-reduce each (``distributed.all_reduce_grads``: the shared-prefix forward bypasses a DDP wrapper). Every
decision (skip a non-finite step, stop the epochs at the target KL, beta) is then made on identical numbers
on every rank, so the ranks never diverge.

On one process every function here returns exactly what the single-process code computes (it calls the original
functions there), so a 1-process run stays bitwise what it was. GRPO takes its minibatch normalisers from here too.

Not handled: ranks with no rows at all in a step (``shard_bounds`` refuses fewer prompts than processes).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from posttrain.losses.advantages import masked_whiten_advantages, whiten_rewards
from posttrain.losses.policy import batch_normalizers, merge_metrics
from posttrain.losses.ppo import advantage_metrics, value_metrics
from posttrain.trainers import distributed
from posttrain.trainers.distributed import World


def _sums(values: list[torch.Tensor], w: World) -> list[float]:
    out = distributed.all_reduce_sum(torch.stack([v.detach().double().reshape(()) for v in values]), w)
    return out.tolist()


def global_mean(x: torch.Tensor, m: torch.Tensor, w: World) -> float:
    """sum(x m) / sum(m) over every rank's rows (0 with no real entry)."""
    m = m.to(x.dtype)
    s, n = _sums([(x * m).sum(), m.sum()], w)
    return s / max(n, 1.0)


def global_var(x: torch.Tensor, m: torch.Tensor, w: World, unbiased: bool = True) -> float:
    m = m.to(x.dtype)
    mean = global_mean(x, m, w)
    s, n = _sums([(((x.double() - mean) ** 2) * m).sum(), m.sum()], w)
    var = s / max(n, 1.0)
    return var * n / max(n - 1.0, 1.0) if unbiased else var


def global_extreme(x: torch.Tensor, w: World, op: str) -> float:
    """max / min of ``x`` over ranks (a rank with no entries contributes -inf / +inf)."""
    big = math.inf if op == "min" else -math.inf
    v = torch.tensor(big if x.numel() == 0 else float(x.max() if op == "max" else x.min()), dtype=torch.float64)
    if w.distributed:
        dist.all_reduce(v, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.MIN)
    return v.item()


def whiten_advantages(adv: torch.Tensor, mask: torch.Tensor, w: World, eps: float = 1e-8) -> torch.Tensor:
    """``masked_whiten_advantages`` with the global batch's mean and (Bessel) variance over real tokens."""
    if not w.distributed:
        return masked_whiten_advantages(adv, mask, eps=eps)
    real = mask.bool()
    x = torch.where(real, adv, torch.zeros_like(adv))
    mean, var = global_mean(x, real, w), global_var(x, real, w)
    return torch.where(real, (x - mean) * torch.rsqrt(torch.tensor(var + eps, dtype=x.dtype)), torch.zeros_like(x))


def scale_scores(scores: torch.Tensor, w: World, eps: float = 1e-8) -> torch.Tensor:
    """``whiten_rewards`` (unit std, mean kept) over the global batch's sequence scores."""
    if not w.distributed:
        return whiten_rewards(scores, eps=eps)
    ones = torch.ones_like(scores)
    if distributed.global_sum(scores.numel(), w) < 2:
        return scores.clone()
    mean, var = global_mean(scores, ones, w), global_var(scores, ones, w)
    return (scores - mean) * torch.rsqrt(torch.tensor(var + eps, dtype=scores.dtype)) + mean


def rollout_metrics(w: World, *, rewards, scores, correct, mask, truncated, kl_tok, beta, old_v, ret, adv) -> dict:
    """The rollout's logged statistics over the global batch (the 1-process formulas on one process)."""
    N = rewards.numel()
    if not w.distributed:
        out = {
            "reward_mean": rewards.mean().item(),
            "reward_std": rewards.std().item() if N > 1 else 0.0,
            "score_mean": scores.mean().item(),
            "accuracy": correct.mean().item(),
            "completion_length": mask.sum(-1).float().mean().item(),
            "truncated_frac": truncated.float().mean().item(),
            "kl": (kl_tok.sum() / mask.sum().clamp_min(1)).item(),
            "kl_per_seq": kl_tok.sum(-1).mean().item(),
            "kl_penalty_mean": (beta * kl_tok.sum(-1)).mean().item(),
        }
        return {**out, **value_metrics(old_v, ret, mask), **advantage_metrics(adv, mask)}
    rows = torch.ones(N)
    n_glob = distributed.global_sum(N, w)
    out = {
        "reward_mean": global_mean(rewards, rows, w),
        "reward_std": math.sqrt(global_var(rewards, rows, w)) if n_glob > 1 else 0.0,
        "score_mean": global_mean(scores, rows, w),
        "accuracy": global_mean(correct, rows, w),
        "completion_length": global_mean(mask.sum(-1).float(), rows, w),
        "truncated_frac": global_mean(truncated.float(), rows, w),
        "kl": global_mean(kl_tok, mask, w),
        "kl_per_seq": global_mean(kl_tok.sum(-1), rows, w),
    }
    out["kl_penalty_mean"] = beta * out["kl_per_seq"]
    m = mask.to(old_v.dtype)
    real = m > 0
    var_r = global_var(ret, m, w, unbiased=False)
    var_err = global_var(ret - old_v, m, w, unbiased=False)
    out.update(
        {
            "explained_variance": 1.0 - var_err / var_r if var_r > 0 else float("nan"),
            "value_mean": global_mean(old_v, m, w),
            "value_min": global_extreme(old_v[real], w, "min"),
            "value_max": global_extreme(old_v[real], w, "max"),
            "returns_mean": global_mean(ret, m, w),
            "returns_std": math.sqrt(global_var(ret, m, w)),
            "advantage_mean": global_mean(adv, m, w),
            "advantage_std": math.sqrt(global_var(adv, m, w)),
            "advantage_abs_max": max(global_extreme(adv[real].abs(), w, "max"), 0.0),
        }
    )
    return out


def minibatch_metrics(parts: list[dict], w: World) -> dict:
    """The global minibatch's metrics from every rank's micro-batch parts (identical on every rank)."""
    if not w.distributed:
        return merge_metrics(parts)
    gathered: list = [None] * w.world_size
    dist.all_gather_object(gathered, parts)
    return merge_metrics([p for rank_parts in gathered for p in rank_parts])


def all_reduce_grads(module: torch.nn.Module | None, w: World) -> None:
    """Sum the gradients of ``module``'s trainable parameters over ranks in one flat buffer. A parameter that has
    no gradient on any rank keeps ``grad = None`` (so AdamW skips it, as on one process); one that has a gradient
    somewhere counts zeros on the ranks where it has none (a rank with no rows in a minibatch)."""
    if module is None or not w.distributed:
        return
    params = [p for p in module.parameters() if p.requires_grad]
    has = distributed.all_reduce_sum(torch.tensor([float(p.grad is not None) for p in params]), w)
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for p, h in zip(params, has.tolist()):
        n = p.numel()
        p.grad = flat[offset : offset + n].view_as(p).clone() if h > 0 else None
        offset += n


def normalizers(mask: torch.Tensor, w: World, max_len: int | None = None) -> dict:
    """A minibatch's loss normalisers (``batch_normalizers``); under torchrun its token and sequence counts over
    every rank (``mask``: this rank's rows of the minibatch)."""
    norms = batch_normalizers(mask, max_len=max_len)
    if w.distributed:
        norms["num_seqs"] = int(distributed.global_sum(int(mask.shape[0]), w))
        norms["num_tokens"] = max(distributed.global_sum(float(mask.sum().item()), w), 1.0)
    return norms


def clip_grad_norm(params: list, max_norm: float) -> float:
    """The L2 norm of the gradients of ``params`` (those that have one), clipped to ``max_norm`` when it is > 0."""
    params = [p for p in params if p.grad is not None]
    if not params:
        return 0.0
    if max_norm and max_norm > 0:
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params])))
