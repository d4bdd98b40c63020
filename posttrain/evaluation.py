"""Held-out evaluation by generation: sample (greedy by default) and score with an exact verifier.

    accuracy = (1/n) * sum_i [verify(completion_i, answer_i)]

Best-of-N (:func:`best_of_n_evaluate`, ``posttrain eval --best-of N --reward-model RM``): sample N completions
per prompt, keep the one a scorer (a reward function, e.g. the RM) ranks highest, and verify only that one:

    best_of_n = (1/n) sum_i [verify(y_i*, a_i)],  y_i* = argmax_j score(x_i, y_ij)   (ties: the first)
    pass@N    = (1/n) sum_i [max_j verify(y_ij, a_i)]      (an oracle scorer reaches it exactly)

``rule="weighted"`` picks by answer instead (best-of-N weighted, :func:`posttrain.models.heads.weighted_best_of_n`):
samples with the same stripped text pool their softmax(score) weights and the heaviest answer wins.

Used by every trainer's periodic evaluation and by ``posttrain eval``. :func:`fit_prompts` checks an
evaluation set against the tokenizer and the model's window at load time (unknown characters, the
``--long`` policy; see :mod:`posttrain.data.checks`); :func:`sample_line` formats a sample for printing
with model output and data escaped (:func:`posttrain.text.printable`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from posttrain.data.checks import fit_sequences, model_window
from posttrain.data.encode import encode_prompt  # noqa: F401  (re-exported: callers import it from here)
from posttrain.errors import UserError
from posttrain.generate import SamplingConfig, decode_completions, generate
from posttrain.tasks.arithmetic import verify as exact_verify
from posttrain.text import printable


@dataclass
class EvalResult:
    accuracy: float
    n: int
    correct: int
    samples: list[dict] = field(default_factory=list)  # {"prompt", "answer", "completion", "correct"}
    truncated_fraction: float = 0.0

    def summary(self) -> dict:
        return {
            "accuracy": self.accuracy,
            "n": self.n,
            "correct": self.correct,
            "truncated_fraction": self.truncated_fraction,
        }


def prompt_window(model, max_new_tokens: int) -> int | None:
    """Tokens a generation prompt may have: the model's max_seq_len minus the generation budget."""
    w = model_window(model)
    return None if w is None else w - max_new_tokens


def fit_prompts(tokenizer, pairs, *, model, max_new_tokens: int, long: str = "error", what: str = "evaluation"):
    """Check (prompt, answer) pairs for generation: unknown characters in both, the prompt (BOS included)
    against max_seq_len - max_new_tokens under the ``long`` policy. Returns the kept pairs (a ``Located``
    list when given one); under ``truncate`` :func:`evaluate` with ``max_prompt_tokens`` does the cut."""
    window = prompt_window(model, max_new_tokens)
    kept, _ = fit_sequences(
        tokenizer,
        pairs,
        lambda r: (r[0], []),
        window=window,
        long=long,
        what=what,
        generate=max_new_tokens,
        add_eos=False,
        also=lambda r: [("answer", r[1])],
    )
    return pairs.subset(kept) if hasattr(pairs, "subset") else [pairs[i] for i in kept]


SHOW_CHARS = 200  # characters of a printed prompt, completion or answer (then "..."): a 50 MB record prints short


def sample_line(s: dict) -> str:
    """One printed line for an evaluation sample, prompt/completion/answer escaped (untrusted text) and each cut to
    :data:`SHOW_CHARS` characters."""
    verdict = "ok" if s["correct"] else "want " + printable(s["answer"], SHOW_CHARS)
    return f"  {printable(s['prompt'], SHOW_CHARS)}{printable(s['completion'], SHOW_CHARS):<6} {verdict}"


def heldout_report(result: EvalResult, start: EvalResult | None = None) -> str:
    """What a trainer prints of its final held-out evaluation: the accuracy (from ``start``'s, when given) and the
    kept samples, one :func:`sample_line` each."""
    before = f"{start.accuracy:.3f} -> " if start is not None else ""
    head = f"held-out accuracy: {before}{result.accuracy:.3f} ({result.correct}/{result.n})"
    return "\n".join([head, *(sample_line(x) for x in result.samples)])


BEST_OF_RULES = ("max", "weighted")


@dataclass
class BestOfNResult:
    num_samples: int  # N
    n: int  # prompts
    rule: str  # max | weighted
    best_of_n_accuracy: float  # the scorer's pick is correct
    pass_at_n: float  # at least one of the N samples is correct (the oracle's best-of-N)
    sample_accuracy: float  # the fraction of all samples that are correct (one sample's expected accuracy)
    samples: list[dict] = field(default_factory=list)  # {"prompt", "answer", "completion", "score", "correct"}

    def summary(self) -> dict:
        return {
            "best_of": self.num_samples,
            "rule": self.rule,
            "n": self.n,
            "best_of_n_accuracy": self.best_of_n_accuracy,
            "pass_at_n": self.pass_at_n,
            "sample_accuracy": self.sample_accuracy,
        }


@torch.no_grad()
def accuracy_by(samples: Sequence[dict], key: Callable[[str], str]) -> dict[str, dict]:
    """Accuracy per group of prompts: ``{key(prompt): {"n", "correct", "accuracy"}}``, groups sorted by name.

    ``samples`` are :class:`EvalResult` samples (``evaluate(..., keep_samples=n)`` keeps all n of them)."""
    groups: dict[str, list[int]] = {}
    for s in samples:
        g = groups.setdefault(key(s["prompt"]), [0, 0])
        g[0] += 1
        g[1] += bool(s["correct"])
    return {k: {"n": n, "correct": c, "accuracy": c / n} for k, (n, c) in sorted(groups.items())}


def best_of_n_evaluate(
    model,
    tokenizer,
    prompts: Sequence[str],
    answers: Sequence[str],
    *,
    scorer: Callable[..., list[float]],
    num_samples: int,
    max_new_tokens: int = 8,
    temperature: float = 1.0,
    batch_size: int = 256,
    verifier: Callable[[str, str], bool] = exact_verify,
    generator: torch.Generator | None = None,
    keep_samples: int = 0,
    max_prompt_tokens: int | None = None,
    rule: str = "max",
) -> BestOfNResult:
    """Best-of-``num_samples`` accuracy with ``scorer(prompts, completions, answer=...) -> list[float]`` choosing.

    The scorer sees each prompt repeated N times (prompt-major) and the ``answer`` column (an RM ignores it; a
    verifier-as-scorer is the oracle). ``batch_size`` prompts are sampled per call, as :func:`evaluate` does, so with
    N = 1 and the same generator the samples are those of ``evaluate(temperature=...)``.
    """
    from posttrain.models.heads import best_of_n, weighted_best_of_n

    if len(prompts) != len(answers):
        raise ValueError("prompts and answers differ in length")
    if rule not in BEST_OF_RULES:
        raise ValueError(f"rule must be one of {BEST_OF_RULES}, got {rule!r}")
    N = num_samples
    cfg = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, num_samples=N)
    best_ok = any_ok = all_ok = 0
    samples: list[dict] = []
    for start in range(0, len(prompts), batch_size):
        ps, ans = list(prompts[start : start + batch_size]), list(answers[start : start + batch_size])
        gen = generate(
            model,
            [encode_prompt(tokenizer, p, max_prompt_tokens) for p in ps],
            pad_id=tokenizer.pad_id,
            eos_id=tokenizer.eos_id,
            cfg=cfg,
            generator=generator,
        )
        texts = decode_completions(tokenizer, gen)  # prompt-major: N rows per prompt
        rep_p, rep_a = [p for p in ps for _ in range(N)], [a for a in ans for _ in range(N)]
        scores = [float(v) for v in scorer(rep_p, texts, answer=rep_a)]
        if len(scores) != len(texts) or not all(math.isfinite(v) for v in scores):
            raise UserError(
                f"the best-of-N scorer returned {len(scores)} values for {len(texts)} completions, or a non-finite one"
            )
        ok = torch.tensor([bool(verifier(c, a)) for c, a in zip(texts, rep_a)])
        r = torch.tensor(scores, dtype=torch.float64)
        if rule == "weighted":
            idx = weighted_best_of_n(r, texts, N)  # (B,) flat indices of the picks
        else:
            idx, _ = best_of_n(r, N)
        best_ok += int(ok[idx].sum())
        any_ok += int(ok.view(-1, N).any(1).sum())
        all_ok += int(ok.sum())
        for i in idx.tolist():
            if len(samples) < keep_samples:
                samples.append(
                    {
                        "prompt": rep_p[i],
                        "answer": rep_a[i],
                        "completion": texts[i],
                        "score": scores[i],
                        "correct": bool(ok[i]),
                    }
                )
    n = len(prompts)
    return BestOfNResult(
        num_samples=N,
        n=n,
        rule=rule,
        best_of_n_accuracy=best_ok / max(n, 1),
        pass_at_n=any_ok / max(n, 1),
        sample_accuracy=all_ok / max(n * N, 1),
        samples=samples,
    )


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
    max_prompt_tokens: int | None = None,
    verify_batch: Callable[[list[str], list, list[list[int]]], list[bool]] | None = None,
) -> EvalResult:
    """Accuracy of ``model`` on (prompt, answer) pairs; ``keep_samples`` completions are kept for display.
    ``max_prompt_tokens``: prompts longer are cut to their last tokens (BOS kept); :func:`fit_prompts`
    decides at load time whether any may be (``--long truncate``). ``verify_batch(completions, answers,
    completion_ids)``, when given, replaces ``verifier``: one call per batch of ``batch_size`` (a reward function
    scores a batch; ``completion_ids`` are each completion's sampled token ids)."""
    if len(prompts) != len(answers):
        raise ValueError("prompts and answers differ in length")
    cfg = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature)
    correct, truncated, samples = 0, 0, []
    for start in range(0, len(prompts), batch_size):
        ps, ans = prompts[start : start + batch_size], answers[start : start + batch_size]
        gen = generate(
            model,
            [encode_prompt(tokenizer, p, max_prompt_tokens) for p in ps],
            pad_id=tokenizer.pad_id,
            eos_id=tokenizer.eos_id,
            cfg=cfg,
            generator=generator,
        )
        texts = decode_completions(tokenizer, gen)
        truncated += int(gen.truncated.sum())
        if verify_batch is not None:
            ids = [
                [t for t, k in zip(r, m) if k]
                for r, m in zip(gen.completion_ids.tolist(), gen.completion_mask.tolist())
            ]
            oks = verify_batch(texts, list(ans), ids)
        else:
            oks = [verifier(c, a) for c, a in zip(texts, ans)]
        for p, a, c, ok in zip(ps, ans, texts, oks):
            ok = bool(ok)
            correct += ok
            if len(samples) < keep_samples:
                samples.append({"prompt": p, "answer": a, "completion": c, "correct": ok})
    n = len(prompts)
    return EvalResult(
        accuracy=correct / max(n, 1), n=n, correct=correct, samples=samples, truncated_fraction=truncated / max(n, 1)
    )


def evaluate_problems(model, tokenizer, problems, *, max_new_tokens: int, window: int | None, keep_samples: int = 0):
    """:func:`evaluate` on (prompt, answer) ``problems`` checked by :func:`fit_prompts`, prompts cut to ``window``
    (:func:`prompt_window`) tokens: a trainer's held-out or validation accuracy."""
    return evaluate(
        model,
        tokenizer,
        [p for p, _ in problems],
        [a for _, a in problems],
        max_new_tokens=max_new_tokens,
        keep_samples=keep_samples,
        max_prompt_tokens=window,
    )
