"""The RL trainers' side of a rollout engine: the policy's weights in, samples out, and the truncated-IS weights.

Key insight: the ratio pi_theta / pi_old of the clipped surrogate must use the *trainer's* pi_old; the sampler's
log-probs only say how far the engine's distribution is from it. With an engine that is not ``matched`` (vLLM,
the skewed test engine) the trainer recomputes pi_old with its own forward and weights each token's policy loss
by ``w = min(pi_old / pi_sampler, C)`` (:func:`posttrain.losses.importance.truncated_is_weights`, per token or per
sequence). A matched engine (ours) *is* pi_old: the weights are computed from pi_old against itself, exactly 1,
and the loss is bitwise what it is without them (x * 1.0 == x).

    GRPO:  old = engine log-probs (matched) | recompute(trainer forward) (otherwise);  w = TIS(old, sampler)  (group.py)
    PPO:   old = recomputed always (ppo_batch.py);  sampler = old (matched) | engine log-probs;  w = TIS(old, sampler)

Logged: ``sampling_logp_difference``, ``is_weight_mean/min/max``, ``is_clipped_frac``. The training step reaches
the engine, so a sampler that refuses NaN/Inf logits names it in its one-line error.
Not handled: masking tokens with extreme ratios instead of truncating (MIS), per-rank exact IS metrics for GRPO
under ``torchrun`` (rank means, as GRPO's other metrics).
"""

from __future__ import annotations

import torch

from posttrain.engines import push_weights
from posttrain.losses.importance import truncated_is_weights
from posttrain.trainers.engine import device


def sample(engine, policy, prompt_ids: list[list[int]], sampling, generator: torch.Generator, step: int | None = None):
    """``policy``'s current weights into ``engine``, then ``engine.generate`` (rows prompt-major). Under FSDP
    ``policy`` is the trainer's replica (``trainers/sharded.py``), refreshed from the shards once per step."""
    push_weights(engine, policy)
    gen = None
    with device.rollout_timer(lambda: int(gen.completion_mask.sum())):  # the step's rollout_tokens_per_s
        gen = engine.generate(prompt_ids, sampling.num_samples, sampling, generator, step=step)
    return gen


def matched(engine) -> bool:
    """Whether ``engine`` samples from the trainer's own distribution (its log-probs are pi_old)."""
    return getattr(engine, "matched", False)


def is_weights(old_logps, sampler_logps, mask, *, matched: bool, cap: float, level: str):
    """-> (w (N, T), statistics): min(pi_old / pi_sampler, cap) per token or per sequence; a matched engine's
    pi_sampler is pi_old itself (w exactly 1)."""
    sampler = old_logps if matched else sampler_logps
    return truncated_is_weights(old_logps, sampler, mask, cap=cap, level=level)
