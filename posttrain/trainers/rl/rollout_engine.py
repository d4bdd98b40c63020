"""The RL trainers' side of a rollout engine: pi_old from the trainer's own forward, and the truncated-IS weights.

Key insight: the ratio pi_theta / pi_old of the clipped surrogate must use the *trainer's* pi_old; the sampler's
log-probs only say how far the engine's distribution is from it. With an engine that is not ``matched`` (vLLM,
the skewed test engine) the trainer recomputes pi_old with its own forward and weights each token's policy loss
by ``w = min(pi_old / pi_sampler, C)`` (:func:`posttrain.losses.importance.truncated_is_weights`, per token or per
sequence). A matched engine (ours) *is* pi_old: the weights are computed from pi_old against itself, exactly 1,
and the loss is bitwise what it is without them (x * 1.0 == x).

    GRPO:  old = engine log-probs (matched) | recompute(trainer forward) (otherwise);  w = TIS(old, sampler)
    PPO:   old = recomputed always (ppo_rollout.py);  sampler = old (matched) | engine log-probs;  w = TIS(old, sampler)

Logged: ``sampling_logp_difference``, ``is_weight_mean/min/max``, ``is_clipped_frac``.
Not handled: masking tokens with extreme ratios instead of truncating (MIS), per-rank exact IS metrics for GRPO
under ``torchrun`` (rank means, as GRPO's other metrics).
"""

from __future__ import annotations

import dataclasses

import torch

from posttrain.engines import push_weights
from posttrain.losses.importance import truncated_is_weights
from posttrain.models.gpt import GPT
from posttrain.scoring import completion_logps, prefix_shared_completion_logps
from posttrain.trainers.engine import device


def sample(tr, prompt_ids: list[list[int]], sampling, generator: torch.Generator):
    """The trainer's current weights into its engine, then ``engine.generate`` (rows prompt-major). Under FSDP the
    engine holds the trainer's replica (``trainers/sharded.py``), refreshed from the shards once per step."""
    replica = getattr(tr, "replica", None)
    push_weights(tr.engine, tr.model if replica is None else replica)
    gen = None
    with device.rollout_timer(lambda: int(gen.completion_mask.sum())):  # the step's rollout_tokens_per_s
        gen = tr.engine.generate(prompt_ids, sampling.num_samples, sampling, generator)
    return gen


@torch.no_grad()
def _trainer_logps(tr, ro) -> torch.Tensor:
    """pi_old of the policy-gradient rollout ``ro`` by the update's own forward (shared prefix for a posttrain GPT)."""
    cfg, P, mask = tr.cfg, ro.prompt_length, ro.completion_mask
    width = int(mask.sum(-1).max()) if mask.any() else 1
    seqs, attn = ro.sequences[:, : P + width], ro.attention_mask[:, : P + width]
    kw = dict(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, completion_mask=mask[:, :width])
    if cfg.share_prompt_prefix and isinstance(tr.model, GPT) and not getattr(tr, "fsdp", False):
        lp, _ = prefix_shared_completion_logps(tr.model, seqs, attn, P, ro.prompt_index, **kw)
    else:
        lp = completion_logps(tr.model, seqs, attn, P, **kw)
    out = torch.zeros_like(ro.old_logps)
    out[:, :width] = lp
    return out * mask


def correct_rollout(tr, ro):
    """A policy-gradient :class:`~posttrain.trainers.rl.group.Rollout` with the trainer's pi_old and its TIS weights."""
    cfg = tr.cfg
    sampler = ro.old_logps
    old = sampler if getattr(tr.engine, "matched", False) else _trainer_logps(tr, ro)
    w, stats = truncated_is_weights(old, sampler, ro.completion_mask, cap=cfg.tis_cap, level=cfg.tis_level)
    return dataclasses.replace(ro, old_logps=old, is_weights=w, metrics={**ro.metrics, **stats})


def ppo_is_weights(tr, old_lp: torch.Tensor, sampler_lp: torch.Tensor, mask: torch.Tensor):
    """PPO's TIS weights and their statistics (pi_old is recomputed by PPO's rollout in any case)."""
    cfg = tr.cfg
    return truncated_is_weights(
        old_lp,
        old_lp if getattr(tr.engine, "matched", False) else sampler_lp,
        mask,
        cap=cfg.tis_cap,
        level=cfg.tis_level,
    )
