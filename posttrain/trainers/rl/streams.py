"""Every random stream of an RL run, each a pure function of (seed, step[, round, rank, epoch]).

Key insight: nothing random in a GRPO or PPO step reads a generator that lives across steps, so a run resumed at
step k draws exactly what the uninterrupted run drew there (the checkpoint needs no sampler state), and a change
to one stream (say, more dynamic-sampling rounds) leaves the others as they were.

    prompts of round r      batch_indices(n, prompts_per_step, step, seed + PROMPT_SALT[algo] + r * 2**32)
    samples of round 0      GRPO: stream_seed(seed, step) * 7          PPO: (seed * 1_000_003 + step) * 11
    samples of round r > 0  blake2b("dynamic-sampling:seed:step:r")     (GRPO's refill rounds)
    under torchrun          each rank its own: GRPO blake2b(...:rank), PPO ((...) * 11 + 5) * 1_009 + rank
    prompt filter           blake2b("prompt-filter:seed:step:r")        (refill rounds, apart from sampling)
    retry of failed groups  blake2b("retry:seed:step[:rank]")           (GRPO's retry_temperature)
    minibatch order         the round-0 formula with salt 1 + epoch

The two algorithms keep the formulas they were first written with, so a run of either is bitwise what it was.
Not handled: streams that survive a change of ``prompts_per_step`` or of the number of processes.
"""

from __future__ import annotations

import hashlib

import torch

from posttrain.data.batches import stream_seed

PROMPT_SALT = {"grpo": 17, "ppo": 29}  # the prompt stream of round 0: seed + salt


def _hashed(key: str) -> torch.Generator:
    h = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(h, "big") >> 1)


def grpo_generator(seed: int, step: int, salt: int = 0) -> torch.Generator:
    """GRPO's round-0 samples (salt 0) and minibatch order (salt 1 + epoch) at ``step``."""
    return torch.Generator().manual_seed(stream_seed(seed, step) * 7 + salt)


def ppo_generator(seed: int, step: int, salt: int = 0) -> torch.Generator:
    """PPO's samples (salt 0) and epoch order (salt 1 + epoch) at ``step``."""
    return torch.Generator().manual_seed((seed * 1_000_003 + step) * 11 + salt)


def ppo_rank_generator(seed: int, step: int, rank: int) -> torch.Generator:
    """PPO's samples of rank ``rank`` at ``step`` under several processes (each rank draws its own)."""
    return torch.Generator().manual_seed(((seed * 1_000_003 + step) * 11 + 5) * 1_009 + rank)


def round_generator(seed: int, step: int, rnd: int, rank: int | None = None) -> torch.Generator:
    """Sampling generator of dynamic-sampling round ``rnd`` >= 1: a hash of (seed, step, round); under several
    processes every round's (0 included) is a hash of (seed, step, round, rank)."""
    return _hashed(f"dynamic-sampling:{seed}:{step}:{rnd}" + (f":rank{rank}" if rank is not None else ""))


def retry_generator(seed: int, step: int, rank: int | None = None) -> torch.Generator:
    """Sampling generator of the retry of round 0's failed groups at ``step`` (``retry_temperature``): its own hash,
    so the refill rounds draw what they draw without it."""
    return _hashed(f"retry:{seed}:{step}" + (f":rank{rank}" if rank is not None else ""))


def filter_generator(seed: int, step: int, rnd: int) -> torch.Generator:
    """The prompt filter's draws of (step, round): apart from the sampling streams."""
    return _hashed(f"prompt-filter:{seed}:{step}:{rnd}")


def sampling_generator(algo: str, seed: int, step: int, rnd: int, rank: int | None) -> torch.Generator:
    """The generator that samples round ``rnd`` of ``step`` (``rank`` None: one process)."""
    if algo == "ppo":
        return ppo_generator(seed, step) if rank is None else ppo_rank_generator(seed, step, rank)
    if rank is not None:
        return round_generator(seed, step, rnd, rank=rank)
    return grpo_generator(seed, step) if rnd == 0 else round_generator(seed, step, rnd)


def epoch_order(algo: str, seed: int, step: int, epoch: int, n: int, minibatches: int) -> torch.Tensor:
    """Row order of one epoch over the global batch of ``n`` rows: a (seed, step, epoch) permutation when the batch
    is split into minibatches, else 0..n-1."""
    if minibatches == 1:
        return torch.arange(n)
    generator = (ppo_generator if algo == "ppo" else grpo_generator)(seed, step, salt=1 + epoch)
    return torch.randperm(n, generator=generator)
