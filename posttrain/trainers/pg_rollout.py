"""The policy-gradient trainer's rollout: prompts -> G samples each -> rewards -> advantages (one batch).

Key insight: everything the update needs is fixed here, at sampling time: pi_old (the sampler's own log-probs of
the distribution it sampled from), the reference log-probs, and the advantages, so the mu x minibatches updates
that follow reuse one batch. ``draw`` is one round (prompts of step ``step``, round ``rnd``; round 0 is the classic
batch); ``rollout`` adds DAPO dynamic sampling (keep groups whose rewards differ, draw more rounds to refill, with
``prompt_filter`` the refill rounds' prompts filtered by their history: trainers/prompt_filter.py), the
reference log-probs, the optional KL-in-reward shaping and the advantage estimator.

Under ``torchrun`` each rank draws its own contiguous share of the step's prompts (whole groups) with its own
sampling stream, and refills its own share.

Samples come from the trainer's rollout engine (``--engine``; trainers/engine_rollout.py). Not handled: asynchronous or
off-policy rollouts.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

import torch

from posttrain.data.batches import batch_indices, stream_seed
from posttrain.evaluation import encode_prompt
from posttrain.losses.advantages import ADVANTAGE_ESTIMATORS
from posttrain.losses.kl import kl_penalized_rewards
from posttrain.scoring import completion_logps
from posttrain.trainers import distributed, engine_rollout, prompt_filter
from posttrain.trainers.dynamic_sampling import group_rows, informative_groups, merge_rows, round_generator
from posttrain.trainers.rl.rollout import score_rollout

# Options each advantage estimator takes from the config: the visible table instead of if/elif on names.
ESTIMATOR_OPTIONS = {
    "grpo": lambda c: {"scale_rewards": c.scale_rewards},
    "rloo": lambda c: {},
    "reinforce": lambda c: {"baseline": c.reinforce_baseline},
}


def step_generator(seed: int, step: int, salt: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(stream_seed(seed, step) * 7 + salt)


@dataclass
class Rollout:
    """One rollout batch, everything the update needs (rows prompt-major: G samples per prompt)."""

    sequences: torch.Tensor  # (N, P+T)
    attention_mask: torch.Tensor  # (N, P+T)
    completion_mask: torch.Tensor  # (N, T)
    old_logps: torch.Tensor  # (N, T) sampling-distribution log-probs (pi_old)
    ref_logps: torch.Tensor | None  # (N, T) or None when beta = 0
    advantages: torch.Tensor  # (N,)
    prompt_length: int
    prompt_index: torch.Tensor  # (N,) which prompt each row samples
    metrics: dict
    apply: bool = True  # False: no group had signal; the update only measures (no gradient, no optimizer step)
    is_weights: torch.Tensor | None = None  # (N, T) truncated IS weights (trainers/engine_rollout.py)


def filter_generator(seed: int, step: int, rnd: int) -> torch.Generator:
    """The prompt filter's draws of (step, round): apart from the sampling streams."""
    h = hashlib.blake2b(f"prompt-filter:{seed}:{step}:{rnd}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(h, "big") >> 1)


def draw(tr, step: int, rnd: int):
    """Round ``rnd`` of step ``step``: prompts, samples, rewards (None: a filtered round with no prompt). Round 0 is
    the classic batch."""
    cfg = tr.cfg
    stream, history = cfg.seed + 17 + rnd * 2**32, tr.prompt_history
    if history is not None and rnd > 0:  # GRESO: skip prompts that were uninformative in a row (one process)
        pool = batch_indices(len(tr.prompts), cfg.prompts_per_step * cfg.prompt_filter_pool, step, stream)
        gen = filter_generator(cfg.seed, step, rnd)
        idx, passed = prompt_filter.select(
            pool, history.streak, cfg.prompt_filter_p, cfg.prompts_per_step, gen, fill=cfg.prompt_filter_fill
        )
        history.pass_rates.append(passed)
        if not len(idx):  # no candidate passed and the round is not filled: nothing is sampled
            return None
    else:
        idx = batch_indices(len(tr.prompts), cfg.prompts_per_step, step, stream)
    idx = distributed.shard(idx, tr.world)  # this rank's prompts (all of them on one process)
    problems = [tr.prompts[i] for i in idx.tolist()]
    if tr.world.distributed:  # each rank its own sampling stream
        generator = round_generator(cfg.seed, step, rnd, rank=tr.world.rank)
    else:
        generator = step_generator(cfg.seed, step) if rnd == 0 else round_generator(cfg.seed, step, rnd)
    gen = engine_rollout.sample(tr, [encode_prompt(tr.tokenizer, p.prompt) for p in problems], cfg.sampling, generator)
    G = cfg.num_generations
    sc = score_rollout(gen, tr.tokenizer, tr.data, tr.reward_fn, problems, G)  # trainers/rl/rollout.py
    base, correct = sc.rewards, sc.correct  # (N,) the reward spec's reward
    rewards, fading = base, tr.annealed_terms(step)  # the reward optimised: annealed terms scaled down
    if fading is not None:
        cut, _ = tr.data.score(fading, problems, sc.texts, G, sc.ids)  # sum_k (1 - f) w_k r_k, the annealed terms k
        rewards = base - torch.tensor(cut, dtype=torch.float32)
    if history is not None:
        history.update(idx, ~informative_groups(rewards, G))
    return gen, rewards, correct, base


def rollout(tr, step: int) -> Rollout:
    cfg = tr.cfg
    G = cfg.num_generations
    t0 = time.perf_counter()
    gen, rewards, correct, base = first = draw(tr, step, 0)
    sel = torch.arange(len(rewards))
    want = cfg.prompts_per_step // tr.world.world_size  # this rank's groups per step
    parts, kept, drawn = [(gen, sel)], [rewards], want
    if cfg.dynamic_sampling:  # DAPO: keep only groups with signal, draw more rounds to refill
        parts, kept, n_kept, rnd = [], [], 0, 0
        while True:
            ok = informative_groups(rewards, G).nonzero().squeeze(1)[: want - n_kept]
            if len(ok):
                rows = group_rows(ok, G)
                parts.append((gen, rows))
                kept.append(rewards[rows])
                n_kept += len(ok)
            rnd += 1
            if n_kept >= want or rnd >= cfg.max_sample_rounds:
                break
            res = draw(tr, step, rnd)
            if res is None:  # the prompt filter passed no prompt of this round (prompt_filter_fill off)
                rewards = torch.zeros(0)
                continue
            gen, rewards, _, _ = res
            drawn += len(rewards) // G
    t1 = time.perf_counter()
    gen, rewards, correct, base = first  # the round-0 batch: an unfiltered measure of the policy
    if len(parts) == 1 and len(parts[0][1]) == len(rewards):
        batch = {
            "sequences": gen.sequences,
            "attention_mask": gen.attention_mask,
            "completion_mask": gen.completion_mask,
            "logps": gen.logps,
            "prompt_length": gen.prompt_length,
            "prompt_index": gen.prompt_index,
        }
    elif parts:
        batch = merge_rows(parts, tr.tokenizer.pad_id, G)
    else:  # no group with signal in any round: the step makes no update
        batch = None
    apply, groups_kept = batch is not None, sum(len(k) for k in kept) // G
    if batch is None:  # measured on round 0 (the one vocabulary of metrics), not applied
        batch = {
            "sequences": gen.sequences,
            "attention_mask": gen.attention_mask,
            "completion_mask": gen.completion_mask,
            "logps": gen.logps,
            "prompt_length": gen.prompt_length,
            "prompt_index": gen.prompt_index,
        }
        kept = [rewards]
    t2 = time.perf_counter()
    ref_logps = None
    if tr.ref_model is not None:
        with torch.no_grad():
            ref_logps = completion_logps(
                tr.ref_model,
                batch["sequences"],
                batch["attention_mask"],
                batch["prompt_length"],
                temperature=cfg.temperature,
                top_k=cfg.top_k,
                top_p=cfg.top_p,
                completion_mask=batch["completion_mask"],
            )
    lengths = gen.completion_mask.sum(-1).float()
    metrics = {
        "reward_mean": base.mean().item(),
        "reward_std": base.std().item() if base.numel() > 1 else 0.0,
        "accuracy": correct.mean().item(),
        "completion_length": lengths.mean().item(),
        "truncated_frac": gen.truncated.float().mean().item(),
        "zero_std_frac": 1.0 - informative_groups(rewards, G).float().mean().item(),
        "time_generate": t1 - t0,
        "time_score": t2 - t1,
    }
    if cfg.anneal_names:
        metrics["reward_anneal_factor"] = cfg.anneal_factor(step)
        metrics["reward_optimised"] = rewards.mean().item()  # round 0 under the annealed weights
    if cfg.dynamic_sampling:
        metrics.update(groups_drawn=drawn, groups_kept=groups_kept, no_signal_step=int(not apply))
    if tr.prompt_history is not None:  # the share of the refill rounds' candidate pools that passed the filter
        rates, tr.prompt_history.pass_rates = tr.prompt_history.pass_rates, []
        metrics["filter_pass_rate"] = sum(rates) / len(rates) if rates else 1.0
    shaped = torch.cat(kept)
    if ref_logps is not None and cfg.kl_in == "reward":
        shaped = kl_penalized_rewards(
            shaped, batch["logps"], ref_logps, batch["completion_mask"], tr.kl_ctl.value, cfg.kl_estimator
        )
    advantages, adv_metrics = ADVANTAGE_ESTIMATORS[cfg.algo](shaped, G, **ESTIMATOR_OPTIONS[cfg.algo](cfg))
    if cfg.dynamic_sampling:
        adv_metrics.pop("zero_std_frac", None)  # of the round-0 batch above (the kept groups have none)
    metrics.update(adv_metrics)
    return Rollout(
        batch["sequences"],
        batch["attention_mask"],
        batch["completion_mask"],
        batch["logps"],
        ref_logps,
        advantages,
        batch["prompt_length"],
        batch["prompt_index"],
        metrics,
        apply,
    )
