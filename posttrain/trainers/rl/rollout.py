"""The part of a rollout that GRPO and PPO share, as a pure function of values: sampled completions -> their text,
their token ids, the reward and the correctness of each (``score_rollout``).

    gen (N = prompts x G rows) -> texts, ids -> data.score(reward_fn, problems, texts, G, ids) -> rewards (N,), correct (N,)

The reward function sees the prompts, the completions' text and the task's columns (``fn(prompts, completions,
**columns)``); a NaN/Inf reward is a one-line error. Not handled here: choosing the prompts and the sampling stream,
sampling itself (``engine_rollout.sample``), and what each algorithm builds on the rewards (GRPO's group
advantages and dynamic sampling in ``pg_rollout.py``; PPO's values, KL-shaped token rewards and GAE in
``ppo_rollout.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posttrain.data.prompts import completion_id_lists
from posttrain.errors import UserError
from posttrain.generate import decode_completions


@dataclass
class Scored:
    texts: list[str]  # (N,) the completions' text
    ids: list[list[int]]  # (N,) their token ids
    scores: list[float]  # (N,) the reward spec's reward, as the reward function returned it
    rewards: torch.Tensor  # (N,) float32, the same
    correct: torch.Tensor  # (N,) float32, 1 where the verifier accepts the completion


def score_rollout(gen, tokenizer, data, reward_fn, problems: list, G: int) -> Scored:
    """Decode and score ``gen``'s completions of ``problems`` (G rows each, prompt-major)."""
    texts = decode_completions(tokenizer, gen)
    ids = completion_id_lists(gen)
    scores, hits = data.score(reward_fn, problems, texts, G, ids)  # reward_fn(prompts, texts, **columns)
    rewards = torch.tensor(scores, dtype=torch.float32)  # (N,)
    if not torch.isfinite(rewards).all():
        raise UserError("the reward function returned NaN/Inf; rewards must be finite floats")
    return Scored(texts, ids, scores, rewards, torch.tensor(hits, dtype=torch.float32))
