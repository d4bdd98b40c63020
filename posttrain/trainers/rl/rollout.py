"""The rollout GRPO and PPO share, as a pure function of values: prompts -> G samples each -> rewards (one batch).

Key insight: a rollout needs only values (the sampling policy's weights, the engine, the prompts and their scorer,
the reward function, the step and its settings), never the trainer that holds them, so one function serves both
algorithms and a test can call it on its own. What each algorithm builds on the batch is its own: GRPO adds the
reference log-probs and group advantages (``group.py``), PPO pi_old / V_old recomputed by its update's forward, the
KL-shaped token rewards and GAE (``ppo_batch.py``).

    round r:   prompts = batch_indices(step, stream r)   (r > 0 with a prompt filter: the pool's prompts that pass)
               gen     = engine.generate(prompts, G, sampling, generator(seed, step, r[, rank]))  (rollout_engine.py)
               reward  = reward_fn(prompt, completion, **columns);  optimised = reward - sum_k (1 - f) w_k r_k
    rollout:   round 0; with dynamic sampling (DAPO, Yu et al. 2025) keep the groups whose G rewards differ and draw
               rounds 1, 2, ... until ``prompts_per_step`` such groups are kept or ``max_sample_rounds`` are drawn
    retry:     (``retry_temperature`` T') before round 1, round 0's *stuck* groups -- equal rewards, no sample correct --
               are drawn once more at T' > T; their rows are off-policy (``Rollout.off_policy``), and the update
               weights them by min(pi_old / pi_T', C) (group.py), so the gradient stays that of the policy at T
               (``retry_is`` off: weight 1, the hot draw a biased guide)

The optimised reward takes the annealed terms k of a reward spec down by their factor f (``reward_anneal``);
``base`` is the spec's reward, logged. Round 0 is always the classic, unfiltered batch: the step's measure of the
policy (reward, accuracy) whatever dynamic sampling keeps. A step with no informative group keeps round 0 with
``apply`` False (the update then only measures). Every draw is a function of (seed, step, round[, rank])
(``streams.py``), so a resumed run reproduces an uninterrupted one. Under ``torchrun`` each rank samples its
contiguous share of each round's prompts (whole groups) with its own stream.

Here: :func:`draw` (one round), :func:`rollout` (the rounds as one batch), :func:`score_rollout` (texts, ids,
rewards and correctness of sampled completions; a NaN/Inf reward is a one-line error), :func:`annealed_terms`.
Not handled: asynchronous or off-policy rollouts, multi-turn episodes.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from posttrain.data.batches import batch_indices
from posttrain.data.prompts import completion_id_lists
from posttrain.errors import UserError
from posttrain.evaluation import encode_prompt
from posttrain.generate import SamplingConfig, decode_completions
from posttrain.trainers import distributed
from posttrain.trainers.distributed import World
from posttrain.trainers.rl import prompt_filter, streams
from posttrain.trainers.rl.dynamic_sampling import group_rows, informative_groups, merge_rows, stuck_groups
from posttrain.trainers.rl.rollout_engine import sample


@dataclass(frozen=True)
class RolloutSettings:
    """What a rollout reads of a run's configuration (built once from it)."""

    seed: int
    prompts_per_step: int  # groups per step, over all processes
    sampling: SamplingConfig  # num_samples = G, the group size
    streams: str = "grpo"  # whose random streams (streams.py): "grpo" | "ppo"
    dynamic_sampling: bool = False
    max_sample_rounds: int = 1
    prompt_filter_p: float = 1.0  # P(sample) = p ** z in refill rounds (with a PromptHistory)
    prompt_filter_pool: int = 1  # a filtered round's candidates: this many times the round's prompts
    prompt_filter_fill: bool = True  # too few pass: fill with skipped ones (False: a smaller round)
    retry_temperature: float | None = None  # round 0's stuck groups drawn once more at this temperature (None: off)


@dataclass
class Scored:
    texts: list[str]  # (N,) the completions' text
    ids: list[list[int]]  # (N,) their token ids
    scores: list[float]  # (N,) the reward spec's reward, as the reward function returned it
    rewards: torch.Tensor  # (N,) float32, the same
    correct: torch.Tensor  # (N,) float32, 1 where the verifier accepts the completion


@dataclass
class Round:
    """One round's samples (a ``Generation``, rows prompt-major) and their rewards."""

    gen: object  # sequences, attention_mask, completion_mask, logps (the sampler's), truncated, prompt_index, ...
    prompts: torch.Tensor  # (B,) this rank's prompt indices
    rewards: torch.Tensor  # (N,) the optimised reward (annealed terms scaled down)
    base: torch.Tensor  # (N,) the reward spec's reward
    correct: torch.Tensor  # (N,) 1 where the verifier accepts


@dataclass
class Rollout:
    """One step's batch: the kept rows of every round (rows prompt-major, G per prompt), and round 0."""

    sequences: torch.Tensor  # (N, P+T)
    attention_mask: torch.Tensor  # (N, P+T)
    completion_mask: torch.Tensor  # (N, T)
    sampler_logps: torch.Tensor  # (N, T) the engine's log-probs of its samples
    prompt_length: int
    prompt_index: torch.Tensor  # (N,) which prompt each row samples
    rewards: torch.Tensor  # (N,) the optimised rewards of these rows
    first: Round  # round 0: the unfiltered measure of the policy
    apply: bool  # False: no group had signal (dynamic sampling); the rows are round 0's, to measure only
    metrics: dict  # time_generate; with dynamic sampling groups_drawn/kept, no_signal_step; filter_pass_rate
    off_policy: torch.Tensor | None = None  # (N,) bool: rows of the retry at retry_temperature (None: none kept)


def score_rollout(gen, tokenizer, data, reward_fn, problems: list, G: int) -> Scored:
    """Decode and score ``gen``'s completions of ``problems`` (G rows each, prompt-major):
    ``data.score(reward_fn, problems, texts, G, ids)`` -> rewards (N,), correct (N,)."""
    texts = decode_completions(tokenizer, gen)
    ids = completion_id_lists(gen)
    scores, hits = data.score(reward_fn, problems, texts, G, ids)  # reward_fn(prompts, texts, **columns)
    rewards = torch.tensor(scores, dtype=torch.float32)  # (N,)
    if not torch.isfinite(rewards).all():
        raise UserError("the reward function returned NaN/Inf; rewards must be finite floats")
    return Scored(texts, ids, scores, rewards, torch.tensor(hits, dtype=torch.float32))


def annealed_terms(reward_fn, names: list[str], factor: float):
    """What ``reward_anneal`` takes off the reward at factor f: sum_k (1 - f) w_k r_k over the annealed terms k, as a
    reward function (None when nothing is annealed yet: f >= 1 or no term named)."""
    if not names or factor >= 1.0:
        return None
    return reward_fn.reweighted({k: (1.0 - factor) * reward_fn.terms[k][1] for k in names})


def _prompts(n: int, s: RolloutSettings, step: int, rnd: int, history) -> torch.Tensor | None:
    """Round ``rnd``'s prompt indices (all processes'); None when a filtered round passes no prompt."""
    stream = s.seed + streams.PROMPT_SALT[s.streams] + rnd * 2**32
    if history is None or rnd == 0:
        return batch_indices(n, s.prompts_per_step, step, stream)
    # GRESO (prompt_filter.py): skip prompts that were uninformative in a row (one process)
    pool = batch_indices(n, s.prompts_per_step * s.prompt_filter_pool, step, stream)
    gen = streams.filter_generator(s.seed, step, rnd)
    idx, passed = prompt_filter.select(
        pool, history.streak, s.prompt_filter_p, s.prompts_per_step, gen, fill=s.prompt_filter_fill
    )
    history.pass_rates.append(passed)
    return idx if len(idx) else None  # none passed and the round is not filled: nothing is sampled


def draw(policy, engine, tokenizer, data, reward_fn, s: RolloutSettings, step: int, rnd: int, *, fading=None,
         history=None, world: World = World(), retry: torch.Tensor | None = None) -> Round | None:  # fmt: skip
    """Round ``rnd`` of step ``step`` from ``data.train`` (None: a filtered round with no prompt). ``fading``: the
    annealed terms' share of the reward (:func:`annealed_terms`); ``history``: the prompt filter's counts, updated.
    ``retry``: this rank's prompt indices to draw again at ``s.retry_temperature`` instead (the history untouched:
    it counts what the policy does at its own temperature)."""
    rank = world.rank if world.distributed else None
    if retry is None:
        idx = _prompts(len(data.train), s, step, rnd, history)
        if idx is None:
            return None
        idx = distributed.shard(idx, world)  # this rank's prompts (all of them on one process)
        sampling, generator = s.sampling, streams.sampling_generator(s.streams, s.seed, step, rnd, rank)
    else:
        idx, history = retry, None
        sampling = dataclasses.replace(s.sampling, temperature=s.retry_temperature)
        generator = streams.retry_generator(s.seed, step, rank)
    problems = [data.train[i] for i in idx.tolist()]
    gen = sample(engine, policy, [encode_prompt(tokenizer, p.prompt) for p in problems], sampling, generator, step)
    G = s.sampling.num_samples
    sc = score_rollout(gen, tokenizer, data, reward_fn, problems, G)
    rewards = sc.rewards  # (N,) the reward spec's reward
    if fading is not None:
        cut, _ = data.score(fading, problems, sc.texts, G, sc.ids)  # sum_k (1 - f) w_k r_k, the annealed terms k
        rewards = sc.rewards - torch.tensor(cut, dtype=torch.float32)
    if history is not None:
        history.update(idx, ~informative_groups(rewards, G))
    return Round(gen, idx, rewards, sc.rewards, sc.correct)


def _rows(gen) -> dict:
    keys = ("sequences", "attention_mask", "completion_mask", "logps", "prompt_length", "prompt_index")
    return {k: getattr(gen, k) for k in keys}


def rollout(policy, engine, tokenizer, data, reward_fn, s: RolloutSettings, step: int, *, fading=None,
            history=None, world: World = World()) -> Rollout:  # fmt: skip
    """Step ``step``'s batch: round 0, and with dynamic sampling the informative groups of as many rounds as it
    takes (see the module's docstring). ``policy`` is the model whose weights go into ``engine`` before sampling."""
    G, t0 = s.sampling.num_samples, time.perf_counter()
    args = (policy, engine, tokenizer, data, reward_fn, s, step)
    first = draw(*args, 0, fading=fading, history=history, world=world)
    want = s.prompts_per_step // world.world_size  # this rank's groups per step
    parts, kept, drawn, metrics = [(first.gen, torch.arange(len(first.rewards)))], [first.rewards], want, {}
    hot: list[torch.Tensor] = []  # per kept part: its rows are the retry's (off-policy)
    if s.dynamic_sampling:  # DAPO: keep only groups with signal, draw more rounds to refill
        parts, kept = [], []

        def keep(r: Round | None, off_policy: bool) -> int:
            """Keep ``r``'s informative groups, as many as are still wanted; -> how many."""
            if r is None:
                return 0
            ok = informative_groups(r.rewards, G).nonzero().squeeze(1)[: want - sum(len(k) for k in kept) // G]
            if len(ok):
                rows = group_rows(ok, G)
                parts.append((r.gen, rows))
                kept.append(r.rewards[rows])
                hot.append(torch.full((len(rows),), off_policy))
            return len(ok)

        n_kept = keep(first, False)
        if s.retry_temperature is not None and n_kept < want:
            stuck = stuck_groups(first.rewards, first.correct, G)
            if stuck.any():
                again = draw(*args, 0, fading=fading, world=world, retry=first.prompts[stuck])
                drawn += int(stuck.sum())
                metrics["retry_groups_kept"] = keep(again, True)
                n_kept += metrics["retry_groups_kept"]
            else:
                metrics["retry_groups_kept"] = 0
        rnd = 1
        while n_kept < want and rnd < s.max_sample_rounds:
            more = draw(*args, rnd, fading=fading, history=history, world=world)
            drawn += 0 if more is None else len(more.rewards) // G
            n_kept += keep(more, False)
            rnd += 1
    if len(parts) == 1 and len(parts[0][1]) == len(parts[0][0].sequences):
        batch = _rows(parts[0][0])  # one round kept whole (round 0 without dynamic sampling: the classic batch)
    elif parts:
        batch = merge_rows(parts, tokenizer.pad_id, G)
    else:  # no group with signal in any round: measured on round 0, not applied
        batch, kept = None, []
    apply = batch is not None
    if s.dynamic_sampling:
        metrics.update(groups_drawn=drawn, groups_kept=sum(len(k) for k in kept) // G, no_signal_step=int(not apply))
    if history is not None:  # the share of the refill rounds' candidate pools that passed the filter
        rates, history.pass_rates = history.pass_rates, []
        metrics["filter_pass_rate"] = sum(rates) / len(rates) if rates else 1.0
    metrics["time_generate"] = time.perf_counter() - t0
    off_policy = torch.cat(hot) if apply and any(h.any() for h in hot) else None
    if batch is None:
        batch, kept = _rows(first.gen), [first.rewards]
    return Rollout(
        batch["sequences"],
        batch["attention_mask"],
        batch["completion_mask"],
        batch["logps"],
        batch["prompt_length"],
        batch["prompt_index"],
        torch.cat(kept),
        first,
        apply,
        metrics,
        off_policy,
    )
