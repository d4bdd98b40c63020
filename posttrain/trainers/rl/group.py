"""GRPO's batch: the shared rollout (``rollout.py``) + the reference log-probs + group advantages (REINFORCE / RLOO /
GRPO), and pi_old with its truncated-IS weights when the engine is not the trainer's own distribution.

Key insight: everything the update needs is fixed here, at sampling time: pi_old (the sampler's own log-probs of
the distribution it sampled from, or the trainer's forward for a mismatched engine), the reference log-probs, and
the advantages, so the mu x minibatches updates that follow reuse one batch:

    r      = the rollout's optimised rewards (N = groups x G,)      (optionally r - beta * KL(pi_old || pi_ref))
    A      = ADVANTAGE_ESTIMATORS[algo](r, G, **ESTIMATOR_OPTIONS[algo](cfg))      (losses/advantages.py)
    w      = min(pi_old / pi_sampler, C)                                             (rollout_engine.py)

(pi_sampler differs from pi_old for a mismatched engine, and for the rows of the retry at ``retry_temperature``.)

The logged reward, accuracy and lengths are round 0's (the unfiltered measure of the policy), whatever dynamic
sampling kept. :func:`policy_logps` is GRPO's forward, run by the update and by the pi_old recompute alike.
Not handled: per-token rewards (one reward per completion), a reference model on another tokenizer.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from posttrain.losses.advantages import ADVANTAGE_ESTIMATORS
from posttrain.losses.kl import kl_penalized_rewards
from posttrain.losses.policy_objectives import OBJECTIVE_OPTIONS
from posttrain.scoring import completion_logps, prefix_shared_completion_logps
from posttrain.trainers.rl.dynamic_sampling import informative_groups
from posttrain.trainers.rl.prompt_filter import PromptHistory
from posttrain.trainers.rl.rollout import Rollout, RolloutSettings
from posttrain.trainers.rl.rollout_engine import is_weights

# Options each advantage estimator takes from the config: the visible table instead of if/elif on names.
ESTIMATOR_OPTIONS = {
    "grpo": lambda c: {"scale_rewards": c.scale_rewards},
    "rloo": lambda c: {},
    "reinforce": lambda c: {"baseline": c.reinforce_baseline},
}


@dataclass
class GroupBatch:
    """One rollout batch, everything the update needs (rows prompt-major: G samples per prompt)."""

    sequences: torch.Tensor  # (N, P+T)
    attention_mask: torch.Tensor  # (N, P+T)
    completion_mask: torch.Tensor  # (N, T)
    old_logps: torch.Tensor  # (N, T) pi_old (the sampler's log-probs until ``correct`` says otherwise)
    ref_logps: torch.Tensor | None  # (N, T) or None when beta = 0
    advantages: torch.Tensor  # (N,)
    prompt_length: int
    prompt_index: torch.Tensor  # (N,) which prompt each row samples
    metrics: dict
    apply: bool = True  # False: no group had signal; the update only measures (no gradient, no optimizer step)
    is_weights: torch.Tensor | None = None  # (N, T) truncated IS weights (rollout_engine.py)
    off_policy: torch.Tensor | None = None  # (N,) bool: rows sampled at retry_temperature (rollout.py)


def rollout_settings(cfg) -> RolloutSettings:
    """What GRPO's rollout reads of its config: the sampling, dynamic sampling and the prompt filter."""
    return RolloutSettings(
        cfg.seed,
        cfg.prompts_per_step,
        cfg.sampling,
        "grpo",
        cfg.dynamic_sampling,
        cfg.max_sample_rounds,
        cfg.prompt_filter_p,
        cfg.prompt_filter_pool,
        cfg.prompt_filter_fill,
        cfg.retry_temperature,
    )


def prompt_history(cfg, world, num_prompts: int) -> PromptHistory | None:
    """The prompt filter's history (GRESO, ``prompt_filter.py``): with dynamic sampling, on one process only."""
    if not (cfg.prompt_filter and cfg.dynamic_sampling):
        return None
    if world.distributed:
        if world.is_main:
            print("prompt_filter: off under several processes (its prompt history is one process's)")
        return None
    return PromptHistory(num_prompts)


def loss_options(cfg) -> dict:
    """The policy loss's options fixed by the config (``losses/policy.py::policy_loss``): the clipped ratio and its
    level, the aggregation, the entropy bonus, the KL estimator, the objective and its own options."""
    return dict(
        clip_eps_low=cfg.clip_eps_low,
        clip_eps_high=cfg.clip_eps_high,
        dual_clip=cfg.dual_clip,
        ratio_level=cfg.ratio_level,
        agg=cfg.loss_agg,
        entropy_coef=cfg.entropy_coef,
        kl_estimator=cfg.kl_estimator,
        objective=cfg.objective,
        kl_bias_correction=cfg.kl_bias_correction,
        objective_kwargs={k: getattr(cfg, f"{cfg.objective}_{k}") for k in OBJECTIVE_OPTIONS[cfg.objective]},
    )


def warp(cfg) -> dict:
    """The sampling distribution's warp, which every log-prob of it is taken under."""
    return dict(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p)


def policy_logps(model, seqs, attn, P: int, prompt_index, mask, warp: dict, share_prefix: bool, entropy: bool):
    """-> (logps (B, W), entropy (B, W) | None) of rows [prompt | W completion tokens] under ``model``; with
    ``share_prefix`` (a posttrain GPT, not FSDP) each distinct prompt runs once (``scoring.py``)."""
    if share_prefix:
        out = prefix_shared_completion_logps(
            model, seqs, attn, P, prompt_index, **warp, completion_mask=mask, return_entropy=entropy
        )
    else:
        out = completion_logps(model, seqs, attn, P, **warp, completion_mask=mask, return_entropy=entropy)
    return out if entropy else (out, None)


def group_batch(ro: Rollout, step: int, cfg, *, ref_model, beta: float) -> GroupBatch:
    """The update's batch from the rollout ``ro`` of ``step``: reference log-probs (``ref_model`` None: beta = 0), the
    KL folded into the rewards when ``cfg.kl_in == "reward"`` (at coefficient ``beta``), the group advantages."""
    G, first = cfg.num_generations, ro.first
    t0 = time.perf_counter()
    ref_logps = None
    if ref_model is not None:
        with torch.no_grad():
            ref_logps = completion_logps(
                ref_model,
                ro.sequences,
                ro.attention_mask,
                ro.prompt_length,
                **warp(cfg),
                completion_mask=ro.completion_mask,
            )
    base, gen = first.base, first.gen
    metrics = {
        "reward_mean": base.mean().item(),
        "reward_std": base.std().item() if base.numel() > 1 else 0.0,
        "accuracy": first.correct.mean().item(),
        "completion_length": gen.completion_mask.sum(-1).float().mean().item(),
        "truncated_frac": gen.truncated.float().mean().item(),
        "zero_std_frac": 1.0 - informative_groups(first.rewards, G).float().mean().item(),
        "time_generate": ro.metrics["time_generate"],
        "time_score": time.perf_counter() - t0,
    }
    if cfg.anneal_names:
        metrics["reward_anneal_factor"] = cfg.anneal_factor(step)
        metrics["reward_optimised"] = first.rewards.mean().item()  # round 0 under the annealed weights
    metrics.update({k: v for k, v in ro.metrics.items() if k != "time_generate"})  # dynamic sampling, the filter
    shaped = ro.rewards
    if ref_logps is not None and cfg.kl_in == "reward":
        shaped = kl_penalized_rewards(shaped, ro.sampler_logps, ref_logps, ro.completion_mask, beta, cfg.kl_estimator)
    advantages, adv_metrics = ADVANTAGE_ESTIMATORS[cfg.algo](shaped, G, **ESTIMATOR_OPTIONS[cfg.algo](cfg))
    if cfg.dynamic_sampling:
        adv_metrics.pop("zero_std_frac", None)  # of the round-0 batch above (the kept groups have none)
    metrics.update(adv_metrics)
    return GroupBatch(
        ro.sequences,
        ro.attention_mask,
        ro.completion_mask,
        ro.sampler_logps,
        ref_logps,
        advantages,
        ro.prompt_length,
        ro.prompt_index,
        metrics,
        ro.apply,
        off_policy=ro.off_policy,
    )


@torch.no_grad()
def trainer_logps(model, b: GroupBatch, warp: dict, share_prefix: bool) -> torch.Tensor:
    """pi_old of the batch ``b`` by the update's own forward (rows trimmed to the longest completion)."""
    P, mask = b.prompt_length, b.completion_mask
    width = int(mask.sum(-1).max()) if mask.any() else 1
    seqs, attn = b.sequences[:, : P + width], b.attention_mask[:, : P + width]
    lp, _ = policy_logps(model, seqs, attn, P, b.prompt_index, mask[:, :width], warp, share_prefix, entropy=False)
    out = torch.zeros_like(b.old_logps)
    out[:, :width] = lp
    return out * mask


def correct(b: GroupBatch, model, cfg, *, matched: bool, share_prefix: bool) -> GroupBatch:
    """``b`` with the trainer's pi_old (the sampler's own when ``matched``) and the TIS weights against the sampler.
    Rows of the retry (``b.off_policy``) were sampled at another temperature: pi_old is then the trainer's forward
    at the training temperature for every row, and with a matched engine the other rows keep weight 1 exactly; with
    ``retry_is`` off the retry's rows keep weight 1 too (the biased guide)."""
    sampler = b.old_logps
    retry = b.off_policy is not None and bool(b.off_policy.any())
    old = sampler if matched and not retry else trainer_logps(model, b, warp(cfg), share_prefix)
    guide = retry and not cfg.retry_is  # the retry's rows trained on as if drawn from pi_old (weight 1)
    if guide:
        sampler = torch.where(b.off_policy[:, None], old, sampler)
    elif matched and retry:  # only the retry's rows came from another distribution than pi_old
        sampler = torch.where(b.off_policy[:, None], sampler, old)
    mis = not matched or (retry and not guide)
    w, stats = is_weights(old, sampler, b.completion_mask, matched=not mis, cap=cfg.tis_cap, level=cfg.tis_level)
    return dataclasses.replace(b, old_logps=old, is_weights=w, metrics={**b.metrics, **stats})
