"""On-policy preference pairs: sample a model G times per prompt and let the verifier label the samples.

The data side (``PairDataConfig``, ``label_pairs``, the JSONL cache) is :mod:`posttrain.data.preference_pairs`;
this module is the part that runs the model, beside :mod:`posttrain.generate` (the sampler it calls).
Example: prompt "2+2=", answer "4", samples ["4", "5", "4", "3"] -> pairs from {"4"} x {"5", "3"}.

Not handled: tasks without a ``verify(completion, answer)`` function.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import torch

from posttrain.data.preference import PreferencePair, encode_prompt
from posttrain.data.preference_pairs import PairDataConfig, PairStats, label_pairs
from posttrain.generate import SamplingConfig, decode_completions, generate
from posttrain.tasks.arithmetic import Problem, verify


@torch.no_grad()
def sample_completions(
    model,
    tokenizer,
    prompts: Sequence[str],
    *,
    num_samples: int,
    temperature: float = 1.0,
    max_new_tokens: int = 8,
    batch_prompts: int = 256,
    generator: torch.Generator | None = None,
) -> list[list[str]]:
    """``num_samples`` sampled completion texts per prompt (EOS excluded), prompt order kept."""
    cfg = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, num_samples=num_samples)
    out: list[list[str]] = []
    for start in range(0, len(prompts), batch_prompts):
        chunk = prompts[start : start + batch_prompts]
        gen = generate(
            model,
            [encode_prompt(tokenizer, p) for p in chunk],
            pad_id=tokenizer.pad_id,
            eos_id=tokenizer.eos_id,
            cfg=cfg,
            generator=generator,
        )
        texts = decode_completions(tokenizer, gen)  # prompt-major: G rows per prompt
        out.extend(texts[i * num_samples : (i + 1) * num_samples] for i in range(len(chunk)))
    return out


def on_policy_pairs(
    model,
    tokenizer,
    problems: Sequence[Problem],
    cfg: PairDataConfig,
    *,
    num_prompts: int | None = None,
    verifier: Callable[[str, str], bool] = verify,
) -> tuple[list[PreferencePair], PairStats]:
    """Sample ``model`` on ``num_prompts`` (default ``cfg.num_prompts``) of ``problems`` and label the pairs."""
    n = min(num_prompts or cfg.num_prompts, len(problems))
    chosen_problems = random.Random(f"pair-prompts:{cfg.seed}").sample(list(problems), n)
    gen = torch.Generator().manual_seed(cfg.seed)
    samples = sample_completions(
        model,
        tokenizer,
        [p.prompt for p in chosen_problems],
        num_samples=cfg.samples_per_prompt,
        temperature=cfg.temperature,
        max_new_tokens=cfg.max_new_tokens,
        batch_prompts=cfg.batch_prompts,
        generator=gen,
    )
    stats = PairStats()
    pairs = label_pairs(
        [p.prompt for p in chosen_problems],
        [p.answer for p in chosen_problems],
        samples,
        max_pairs_per_prompt=cfg.max_pairs_per_prompt,
        gold_chosen=cfg.gold_chosen,
        rng=random.Random(f"pair-choice:{cfg.seed}"),
        verifier=verifier,
        stats=stats,
    )
    return pairs, stats
