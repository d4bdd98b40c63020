"""Embedded preference data: on-policy pairs labelled by the verifier, and synthetic pairs for reward models.

Key insight: on a verifiable task preferences come for free. Sample the SFT model G times on a
training-split prompt and let the verifier label each completion; any (correct, wrong) couple of
*different* completions for the same prompt is a preference pair

    chosen = y_i with verify(y_i, answer) = 1,   rejected = y_j with verify(y_j, answer) = 0

drawn from the model's own distribution (on-policy, as when a policy is sampled and humans rank
the samples). Only prompts the model sometimes gets right and sometimes wrong yield pairs; with
``gold_chosen`` a prompt with no correct sample uses the reference answer as ``chosen`` instead
(off-policy for that pair, more prompts covered).

For a reward model trained from scratch (no SFT model to sample) :func:`synthetic_pairs` pairs the
reference answer with a corrupted one (off by one, by ten, a dropped or swapped digit, ...).
:func:`answer_distance` |chosen - rejected| is the natural "margin" of an arithmetic pair: the RM
trainer reports its accuracy per distance bucket (an off-by-one answer is the hardest to reject).

Generated pairs are cached as JSONL (``pairs.jsonl`` + ``pairs.meta.json`` naming the settings) in the
run directory, so a resumed run trains on exactly the same data and users can inspect or reuse them
(the file is in the ``{"prompt", "chosen", "rejected"}`` format ``--data`` reads).

Sampling the model is :mod:`posttrain.on_policy_pairs` (``on_policy_pairs``): this module holds only data
(configs, labelling, corruptions, the JSONL cache) and never runs a model.

Not handled here: rankings of k > 2 responses, and tasks other than the embedded arithmetic one
(any task with a ``verify(completion, answer)`` function works with :func:`label_pairs`).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from posttrain.config import check_fields, knob
from posttrain.data.io import atomic_write_json, atomic_write_jsonl
from posttrain.data.preference import PreferencePair, load_preference_pairs
from posttrain.errors import DataError
from posttrain.tasks.arithmetic import Problem, verify

PAIRS_FILE = "pairs.jsonl"


@dataclass
class PairDataConfig:
    num_prompts: int = knob(4096, "training-split prompts sampled to build pairs", gt=0)
    samples_per_prompt: int = knob(8, "completions sampled per prompt (the G of the sampler)", gt=0)
    temperature: float = knob(
        1.0, "sampling temperature (1 = the model's own distribution; not 0: greedy samples are all identical)", gt=0
    )
    max_pairs_per_prompt: int = knob(2, "pairs kept per prompt at most (distinct chosen/rejected texts)", gt=0)
    gold_chosen: bool = knob(False, "when no sample of a prompt is correct, use the reference answer as chosen")
    max_new_tokens: int = knob(8, "generation length when sampling", gt=0)
    batch_prompts: int = knob(256, "prompts per sampler call", gt=0)
    seed: int = knob(0, "seed for prompt choice, sampling and pair choice", ge=0, lt=2**32)

    def __post_init__(self):
        check_fields(self, "pairs.")  # bounds and finiteness, from the knobs above


@dataclass
class PairStats:
    """What a pair-building pass produced (saved in ``pairs.meta.json`` and the run summary)."""

    prompts: int = 0
    samples: int = 0
    correct_samples: int = 0
    prompts_with_pairs: int = 0
    gold_pairs: int = 0
    pairs: int = 0

    @property
    def sample_accuracy(self) -> float:
        return self.correct_samples / max(self.samples, 1)


# ---------------------------------------------------------------------------------------------
# on-policy pairs: labelling (the sampling is posttrain.on_policy_pairs, which runs the model)


def label_pairs(
    prompts: Sequence[str],
    answers: Sequence[str],
    samples: Sequence[Sequence[str]],
    *,
    max_pairs_per_prompt: int = 2,
    gold_chosen: bool = False,
    rng: random.Random | None = None,
    verifier: Callable[[str, str], bool] = verify,
    stats: PairStats | None = None,
) -> list[PreferencePair]:
    """(correct, wrong) pairs of distinct sampled completions per prompt, labelled by ``verifier``.

    Each prompt gives up to ``max_pairs_per_prompt`` pairs, chosen at random (``rng``) from the
    product of its distinct correct and distinct wrong completions. With ``gold_chosen`` the
    reference answer stands in for a missing correct completion.
    Example: prompt "2+2=", answer "4", samples ["4", "5", "4", "3"] -> pairs from {"4"} x {"5", "3"}.
    """
    if not len(prompts) == len(answers) == len(samples):
        raise ValueError("prompts, answers and samples differ in length")
    rng = rng or random.Random(0)
    stats = stats if stats is not None else PairStats()
    pairs: list[PreferencePair] = []
    for prompt, answer, texts in zip(prompts, answers, samples):
        ok = [bool(verifier(t, answer)) for t in texts]
        stats.prompts += 1
        stats.samples += len(texts)
        stats.correct_samples += sum(ok)
        good = list(dict.fromkeys(t for t, k in zip(texts, ok) if k))  # distinct, first-seen order
        bad = list(dict.fromkeys(t for t, k in zip(texts, ok) if not k))
        gold = False
        if not good and gold_chosen and bad:
            good, gold = [answer], True
        combos = [(c, r) for c in good for r in bad if c != r]
        if not combos:
            continue
        picked = rng.sample(combos, min(max_pairs_per_prompt, len(combos)))
        stats.prompts_with_pairs += 1
        stats.gold_pairs += len(picked) if gold else 0
        pairs.extend(PreferencePair(prompt, c, r) for c, r in picked)
    stats.pairs = len(pairs)
    return pairs


# ---------------------------------------------------------------------------------------------
# synthetic pairs (reward models without an SFT model to sample)


def _corruptions(value: int, text: str) -> list[str]:
    """Plausible wrong answers for ``value``: the mistakes a model learning arithmetic makes."""
    cands = [value + 1, value - 1, value + 10, value - 10, value + 2, value - 2, value + 100, -value]
    out = [str(v) for v in cands]
    digits = text.lstrip("-")
    sign = text[: len(text) - len(digits)]
    if len(digits) > 1:
        out.append(sign + digits[:-1])  # dropped last digit
        out.append(sign + digits[1:])  # dropped first digit
        out.append(sign + digits[::-1])  # swapped digits
    out.append(text + text[-1])  # repeated last digit
    return [c for c in dict.fromkeys(out) if c != text]


def synthetic_pairs(problems: Sequence[Problem], *, per_prompt: int = 2, seed: int = 0) -> list[PreferencePair]:
    """Reference answer vs ``per_prompt`` distinct corrupted answers per problem (seeded).

    Example: "12+3=" -> chosen "15", rejected e.g. "16" (off by one) or "51" (digits swapped).
    """
    rng = random.Random(f"synthetic-pairs:{seed}")
    pairs = []
    for p in problems:
        wrong = _corruptions(int(p.answer), p.answer)
        pairs.extend(PreferencePair(p.prompt, p.answer, r) for r in rng.sample(wrong, min(per_prompt, len(wrong))))
    return pairs


def answer_distance(chosen: str, rejected: str) -> float:
    """|int(chosen) - int(rejected)|, or inf when either is not an integer ("15", "16" -> 1.0; "15", "" -> inf)."""
    try:
        return float(abs(int(chosen.strip()) - int(rejected.strip())))
    except ValueError:
        return math.inf


# ---------------------------------------------------------------------------------------------
# the JSONL cache


def save_pairs(path: str | Path, pairs: Sequence[PreferencePair]) -> Path:
    """Write pairs as ``{"prompt", "chosen", "rejected"[, "margin"]}`` JSONL (atomically)."""
    recs = []
    for p in pairs:
        rec = {"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected}
        if p.margin is not None:
            rec["margin"] = p.margin
        recs.append(rec)
    atomic_write_jsonl(path, recs)
    return Path(path)


def cached_pairs(
    path: str | Path, meta: dict, build: Callable[[], tuple[list[PreferencePair], dict]]
) -> tuple[list[PreferencePair], dict]:
    """Load ``path`` if it exists and its ``.meta.json`` matches ``meta``; else ``build()`` and save both.

    ``build`` returns (pairs, info); the saved meta file is ``{"settings": meta, "info": info}``, and
    (pairs, info) is returned either way. An empty result is an error: training needs pairs.
    """
    path = Path(path)
    meta_path = path.with_suffix(".meta.json")
    settings = json.loads(json.dumps(meta))  # normalise tuples etc. as JSON would
    if path.is_file() and meta_path.is_file():
        saved = json.loads(meta_path.read_text())
        if saved.get("settings") == settings:
            return load_preference_pairs(path), saved.get("info", {})
    pairs, info = build()
    if not pairs:
        raise DataError(
            f"no preference pairs could be built for {path.name} ({info}); the model may be always right or always "
            "wrong on these prompts: sample more per prompt (--pairs.samples-per-prompt), raise --pairs.temperature, "
            "or allow --pairs.gold-chosen true"
        )
    save_pairs(path, pairs)
    atomic_write_json(meta_path, {"settings": settings, "info": info})
    return pairs, info


def stats_dict(stats: PairStats) -> dict:
    return {**asdict(stats), "sample_accuracy": stats.sample_accuracy}
