"""Held-out evaluation by generation: sample (greedy by default) and score with an exact verifier.

    accuracy = (1/n) * sum_i [verify(completion_i, answer_i)]

Used by every trainer's periodic evaluation and by ``posttrain eval``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from posttrain.generate import SamplingConfig, decode_completions, generate
from posttrain.tasks.arithmetic import verify as exact_verify


@dataclass
class EvalResult:
    accuracy: float
    n: int
    correct: int
    samples: list[dict] = field(default_factory=list)  # {"prompt", "answer", "completion", "correct"}
    truncated_fraction: float = 0.0

    def summary(self) -> dict:
        return {"accuracy": self.accuracy, "n": self.n, "correct": self.correct, "truncated_fraction": self.truncated_fraction}


def encode_prompt(tokenizer, prompt: str) -> list[int]:
    """BOS (if the tokenizer has one) + prompt tokens: the same prefix SFT trains on."""
    ids = tokenizer.encode(prompt)
    return ([tokenizer.bos_id] if tokenizer.bos_id is not None else []) + ids


@torch.no_grad()
def evaluate(
    model,
    tokenizer,
    prompts: Sequence[str],
    answers: Sequence[str],
    *,
    max_new_tokens: int = 8,
    temperature: float = 0.0,
    batch_size: int = 256,
    verifier: Callable[[str, str], bool] = exact_verify,
    generator: torch.Generator | None = None,
    keep_samples: int = 0,
) -> EvalResult:
    """Accuracy of ``model`` on (prompt, answer) pairs; ``keep_samples`` completions are kept for display."""
    if len(prompts) != len(answers):
        raise ValueError("prompts and answers differ in length")
    cfg = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature)
    correct, truncated, samples = 0, 0, []
    for start in range(0, len(prompts), batch_size):
        ps, ans = prompts[start : start + batch_size], answers[start : start + batch_size]
        gen = generate(model, [encode_prompt(tokenizer, p) for p in ps], pad_id=tokenizer.pad_id,
                       eos_id=tokenizer.eos_id, cfg=cfg, generator=generator)
        texts = decode_completions(tokenizer, gen)
        truncated += int(gen.truncated.sum())
        for p, a, c in zip(ps, ans, texts):
            ok = bool(verifier(c, a))
            correct += ok
            if len(samples) < keep_samples:
                samples.append({"prompt": p, "answer": a, "completion": c, "correct": ok})
    n = len(prompts)
    return EvalResult(accuracy=correct / max(n, 1), n=n, correct=correct, samples=samples,
                      truncated_fraction=truncated / max(n, 1))
