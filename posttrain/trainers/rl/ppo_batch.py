"""PPO's batch: the shared rollout (``rollout.py``) + pi_old / V_old / pi_ref recomputed with the update's own
forward + the KL-shaped token rewards + GAE.

Key insight: the importance ratio pi_theta / pi_old of the first minibatch must be exactly 1 (nothing has
moved yet), so pi_old is *recomputed* with the very forward the update will run — same module in the same
mode, same micro-batch rows in the same order, same trimmed width — rather than taken from the sampler
(whose KV-cached, one-token-at-a-time arithmetic differs in the last bits). The first minibatch of every
rollout then has ratio == 1, clip fraction 0 and approx-KL 0 bit for bit (tested), and the values V_old
that GAE and the value clip use come from the same pass. When the first minibatch is the whole rollout in one
micro-batch (the default: minibatches = grad_accum = 1), that pass runs with gradients and *is* the update's
first forward (:func:`folds_first_forward`): one forward of the three per step saved, the run unchanged bit for bit.

Per rollout (N = prompts_per_step * num_generations rows, T completion tokens):

    score_i   = reward(prompt_i, completion_i)            (missing EOS -> missing_eos_penalty; clip to +-reward_clip)
    r_{i,t}   = -beta * KL_t(pi_old || pi_ref)  (+ score_i on the last real token)          (Ziegler et al. 2019)
    A, R      = GAE(r, V_old, mask, gamma, lam[, critic_lam]);  A whitened over real tokens  (Schulman et al. 2015)

The KL unit: ``kl_per_seq`` is sum_t KL_t over a sequence's real tokens, averaged over sequences (the unit of
Ziegler's target of 6 nats, and of the adaptive controller here); ``kl`` is the per-token mean.

Samples come from the run's rollout engine (``--engine``; ours by default), with the truncated-IS weights
of pi_old against the engine's own log-probs (``rollout_engine.py``; exactly 1 with ours). Under
``torchrun`` each rank samples its contiguous share of the step's prompts with its own stream, and the
whitening and the metrics are the global batch's (``ppo_distributed.py``).

Not handled: dynamic sampling (the critic's baseline gives a group of equal rewards a signal anyway),
multi-turn masks (``gae`` handles holes, the sampler does not make them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from posttrain.losses.advantages import gae
from posttrain.losses.kl import kl_estimate, kl_penalized_token_rewards
from posttrain.losses.logprobs import token_entropy
from posttrain.models.heads import positions_from_mask
from posttrain.models.value import completion_values, shared_forward
from posttrain.scoring import completion_token_logps, prefix_shared_completion_logps, shared_prefix_forward
from posttrain.trainers import distributed
from posttrain.trainers.distributed import World
from posttrain.trainers.rl import ppo_distributed
from posttrain.trainers.rl.rollout import Rollout
from posttrain.trainers.rl.rollout_engine import is_weights
from posttrain.trainers.rl.schedule import micro_schedule
from posttrain.trainers.rl.streams import epoch_order


@dataclass(frozen=True)
class ActorCritic:
    """The models of a PPO step: the policy, its critic (a separate value model, or a value head on the policy's
    hidden states) and the frozen reference (None when beta = 0)."""

    policy: torch.nn.Module
    critic: torch.nn.Module | None  # the separate value model, or None with ``shared_head``
    shared_head: torch.nn.Module | None  # the value head on the policy, or None
    ref: torch.nn.Module | None
    share_prefix: bool  # each distinct prompt runs once per model (posttrain GPTs, not FSDP)


@dataclass
class PPOBatch:
    """One rollout batch (rows prompt-major), everything the update reads."""

    sequences: torch.Tensor  # (N, P+T)
    attention_mask: torch.Tensor  # (N, P+T)
    completion_mask: torch.Tensor  # (N, T)
    prompt_length: int
    prompt_index: torch.Tensor  # (N,) which prompt each row samples
    old_logps: torch.Tensor  # (N, T) pi_old, recomputed by the update's forward
    old_values: torch.Tensor  # (N, T) V_old, same pass
    advantages: torch.Tensor  # (N, T) GAE (whitened if asked), 0 on masked slots
    returns: torch.Tensor  # (N, T) value targets
    metrics: dict
    is_weights: torch.Tensor | None = None  # (N, T) truncated IS weights pi_old / pi_sampler (1 with our sampler)
    first_forward: list | None = None  # the pi_old pass's (logps, entropy, values) graphs: the update's first forward


def prefix_shared_outputs(gpt, seqs, attn, P: int, prompt_index):
    """posttrain GPT over [prompt | completion] with each distinct prompt run once (``scoring.shared_prefix_forward``):
    -> (logits (N, W, V), final hidden states (N, W, D)) at the W positions that predict the completion tokens,
    P-1 .. P+W-2 (as ``scoring.prefix_shared_completion_logps``). The last completion position predicts nothing
    that is scored and no position attends to it (causal), so it is not run (1/W of the completion work)."""
    out = shared_prefix_forward(gpt, seqs[:, :-1], attn[:, :-1], P, prompt_index, output_hidden_states=True)
    logits = torch.cat([out.last_logits[:, None], out.logits], dim=1)
    hidden = torch.cat([out.last_hidden[:, None], out.hidden], dim=1)
    return logits, hidden


def forward(
    policy,
    critic,
    shared_head,
    seqs,
    attn,
    cmask,
    P: int,
    prompt_index=None,
    *,
    temperature,
    top_k,
    top_p,
    need_entropy: bool,
):
    """The one forward of rollout and update: -> (logps (B, W), entropy (B, W) | None, values (B, W)).

    Rows are trimmed to W = their longest completion (the padding all rows share is never run).
    ``shared_head`` set: the value head reads the policy's own hidden states; else ``critic`` runs separately.
    ``prompt_index`` given (posttrain GPTs only): each distinct prompt runs once per model (:func:`prefix_shared_outputs`).
    """
    width = int(cmask.sum(-1).max()) if cmask.any() else 1
    seqs, attn, cmask = seqs[:, : P + width], attn[:, : P + width], cmask[:, :width]
    pos = positions_from_mask(attn)
    if prompt_index is not None:
        logits, hidden = prefix_shared_outputs(policy, seqs, attn, P, prompt_index)
        if shared_head is not None:
            vals = shared_head(hidden)
        else:
            vals = critic.head(prefix_shared_outputs(critic.backbone.model, seqs, attn, P, prompt_index)[1])
        values = torch.where(cmask.bool(), vals, torch.zeros_like(vals))
        lp, warped = completion_token_logps(logits, seqs[:, P:], temperature, top_k, top_p, cmask)
        return lp, (token_entropy(warped) if need_entropy else None), values
    if shared_head is not None:
        logits, vals = shared_forward(policy, shared_head, seqs, attn, pos)
        values = completion_values(vals, P, cmask)
    else:
        logits = policy(input_ids=seqs, attention_mask=attn, position_ids=pos).logits
        values = critic(seqs, attn, P, cmask, position_ids=pos)
    lp, warped = completion_token_logps(logits[:, P - 1 : -1], seqs[:, P:], temperature, top_k, top_p, cmask)
    return lp, (token_entropy(warped) if need_entropy else None), values


def folds_first_forward(cfg, fsdp: bool) -> bool:
    """Whether the rollout's pi_old / V_old pass can double as the update's first forward: when the first minibatch
    is the whole rollout in one micro-batch (minibatches = grad_accum = 1, not FSDP), that pass runs with gradients
    and the update's first loss reads it instead of running the same forward again (one forward of three saved per
    step with mu = 2; bitwise the same run, tested)."""
    return cfg.minibatches == 1 and cfg.grad_accum == 1 and not fsdp


def recompute(m: ActorCritic, ro: Rollout, cfg, order_micro: list[list[tuple]], keep_graph: bool = False):
    """pi_old, V_old and pi_ref of the rollout ``ro`` over the epoch-0 micro-batches, row for row as the update will
    run them -> (old_lp, old_v, ref_lp, kept). ``keep_graph``: the policy/critic pass runs with gradients and ``kept``
    holds its (logps, entropy, values) per micro-batch for the update's first minibatch; else ``kept`` is None."""
    N, T = ro.completion_mask.shape
    where = ro.completion_mask.device  # the run's device (engine/device.py), where the forwards' outputs are
    old_lp, old_v = torch.zeros(N, T, device=where), torch.zeros(N, T, device=where)
    ref_lp = torch.zeros(N, T, device=where) if m.ref is not None else None
    warp = dict(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p)
    P, kept = ro.prompt_length, []
    for mb in order_micro:
        for rows, dummy in mb:  # a dummy (FSDP: this rank has no row there) runs for the collectives, kept nowhere
            seqs, attn, cmask = ro.sequences[rows], ro.attention_mask[rows], ro.completion_mask[rows]
            index = ro.prompt_index[rows] if m.share_prefix else None
            with torch.set_grad_enabled(keep_graph):
                out = forward(
                    m.policy, m.critic, m.shared_head, seqs, attn, cmask, P, index, **warp, need_entropy=keep_graph
                )
            if keep_graph:
                kept.append(out)
            lp, v = out[0].detach(), out[2].detach()
            w = lp.shape[1]
            if dummy:
                continue
            old_lp[rows, :w], old_v[rows, :w] = lp, v.float()  # a value head under bf16 autocast gives bf16
            if ref_lp is not None:
                ref_lp[rows, :w] = _ref_logps(m, seqs[:, : P + w], attn[:, : P + w], cmask[:, :w], P, index, warp)
    return old_lp, old_v, ref_lp, (kept if keep_graph else None)


@torch.no_grad()
def _ref_logps(m: ActorCritic, ids, am, cmask, P: int, prompt_index, warp: dict) -> torch.Tensor:
    if m.share_prefix:  # each prompt once, as the policy's pass (the reference is a GPT copy)
        return prefix_shared_completion_logps(
            m.ref, ids, am, P, prompt_index, **warp, completion_mask=cmask, return_entropy=False
        )
    out = m.ref(input_ids=ids, attention_mask=am, position_ids=positions_from_mask(am))
    rlp, _ = completion_token_logps(
        out.logits[:, P - 1 : -1], ids[:, P:], warp["temperature"], warp["top_k"], warp["top_p"], cmask
    )
    return rlp


def scores_of(cfg, rewards: torch.Tensor, truncated: torch.Tensor, w: World | None = None) -> torch.Tensor:
    """Sequence scores: the missing-EOS penalty replaces a truncated completion's reward, then the clip, then
    optional whitening (scale only; over the global batch under ``torchrun``)."""
    s = rewards.clone()
    if cfg.missing_eos_penalty is not None:
        s = torch.where(truncated, torch.full_like(s, cfg.missing_eos_penalty), s)
    if cfg.reward_clip is not None:
        s = s.clamp(-cfg.reward_clip, cfg.reward_clip)
    if cfg.whiten_rewards:
        s = ppo_distributed.scale_scores(s, w or World())
    return s


def first_epoch_micro(cfg, step: int, n: int, w: World, fsdp: bool = False) -> list[list[tuple]]:
    """This rank's epoch-0 micro-batches (local rows, dummy), cut from the global row order as the update cuts them."""
    offset, total = distributed.row_offsets(n, w)
    order = epoch_order("ppo", cfg.seed, step, 0, total, cfg.minibatches)
    return micro_schedule(order, cfg.minibatches, cfg.grad_accum, offset, n, fsdp)


def ppo_batch(ro: Rollout, step: int, cfg, m: ActorCritic, *, beta: float, world: World, fsdp: bool, matched: bool):
    """The update's batch from the rollout ``ro`` of ``step`` (under ``torchrun``: this rank's share of the prompts,
    with the global batch's statistics): pi_old / V_old / pi_ref, scores, KL-shaped token rewards at coefficient
    ``beta``, GAE advantages and returns, the TIS weights against the engine's log-probs (``matched``: exactly 1)."""
    t0 = time.perf_counter()
    rewards, N = ro.first.base, ro.rewards.numel()
    micro = first_epoch_micro(cfg, step, N, world, fsdp)
    old_lp, old_v, ref_lp, first = recompute(m, ro, cfg, micro, folds_first_forward(cfg, fsdp))
    mask, truncated = ro.completion_mask, ro.first.gen.truncated
    scores = scores_of(cfg, ro.rewards, truncated, world)
    if ref_lp is not None:
        token_rewards = kl_penalized_token_rewards(scores, old_lp, ref_lp, mask, beta, cfg.kl_estimator)
        kl_tok = kl_estimate(old_lp, ref_lp, cfg.kl_estimator) * mask
    else:
        token_rewards = kl_penalized_token_rewards(scores, old_lp, old_lp, mask, 0.0, "k1")
        kl_tok = torch.zeros_like(old_lp)
    adv, ret = gae(token_rewards, old_v, mask, cfg.gamma, cfg.lam, cfg.critic_lam)
    metrics = ppo_distributed.rollout_metrics(
        world,
        rewards=rewards,
        scores=scores,
        correct=ro.first.correct,
        mask=mask,
        truncated=truncated,
        kl_tok=kl_tok,
        beta=beta,
        old_v=old_v,
        ret=ret,
        adv=adv,
    )  # advantages before whitening: the scale the critic leaves
    w, is_stats = is_weights(old_lp, ro.sampler_logps, mask, matched=matched, cap=cfg.tis_cap, level=cfg.tis_level)
    if world.distributed:  # token-weighted means, min and max over every rank's tokens
        is_stats = ppo_distributed.minibatch_metrics([{**is_stats, "num_tokens": float(mask.sum())}], world)
        is_stats.pop("num_tokens")
    metrics.update(is_stats)
    metrics.update(time_generate=ro.metrics["time_generate"], time_recompute=time.perf_counter() - t0)
    if cfg.whiten_advantages:
        adv = ppo_distributed.whiten_advantages(adv, mask, world)
    return PPOBatch(
        ro.sequences,
        ro.attention_mask,
        mask,
        ro.prompt_length,
        ro.prompt_index,
        old_lp,
        old_v,
        adv,
        ret,
        metrics,
        w,
        first,
    )
