"""On-policy preference pairs: sample a model G times per prompt and let the verifier label the samples.

The data side (``PairDataConfig``, ``label_pairs``, the JSONL cache) is :mod:`posttrain.data.preference_pairs`;
this module is the part that runs the model, beside :mod:`posttrain.generate` (the sampler it calls).
Example: prompt "2+2=", answer "4", samples ["4", "5", "4", "3"] -> pairs from {"4"} x {"5", "3"}.

Training pairs can draw on more than the one model (:class:`TrainPairsConfig`, ``posttrain rm --train-pairs.*``;
the held-out pairs never change with it, so the test stays the same): another sampling temperature or sample
count, the other restarts of an ``sft --restarts`` run (same data, other draws: more and more diverse wrong
answers), and synthetic corruptions of the reference answer (:func:`~posttrain.data.preference_pairs.synthetic_pairs`:
off by one or ten, a dropped or swapped digit, the negation; wrong answers the policy may drift to under RL).
:func:`training_pairs` concatenates the sources in that order (the ``--init`` model's pairs first) and drops a
pair that an earlier source already gave.

Not handled: tasks without a ``verify(completion, answer)`` function.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from posttrain.config import check_fields, knob
from posttrain.data.preference import PreferencePair, encode_prompt
from posttrain.data.preference_pairs import PairDataConfig, PairStats, label_pairs, stats_dict, synthetic_pairs
from posttrain.errors import UserError
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


# ---------------------------------------------------------------------------------------------
# training pairs from several sources (posttrain rm --train-pairs.*)


@dataclass
class TrainPairsConfig:
    """Settings of the reward model's *training* pairs only; the held-out pairs are always built with ``pairs``."""

    temperature: float | None = knob(
        None, "sampling temperature of the training pairs (None = --pairs.temperature)", gt=0
    )
    samples_per_prompt: int | None = knob(None, "samples per training prompt (None = --pairs.samples-per-prompt)", gt=0)
    restarts: str = knob(
        "off",
        "also sample the other restarts of an `sft --restarts` --init (INIT/restarts/K/model, K != the kept one; a "
        "restart successive halving stopped early: its probe checkpoint): on (--init must be such a run) | auto "
        "(when it is one) | off",
        choices=("off", "auto", "on"),
    )
    max_restarts: int = knob(2, "with restarts: at most this many other restarts, the best by validation first", ge=1)
    synthetic_per_prompt: int = knob(
        0, "synthetic pairs per training prompt: the reference vs a corrupted answer (off by one/ten, digits...)", ge=0
    )

    def __post_init__(self):
        check_fields(self, "train_pairs.")

    def requested(self) -> bool:
        """Whether a source beyond the ``--init`` model's own pairs is asked for unconditionally (``auto`` is not)."""
        return (
            dataclasses.replace(self, restarts="off" if self.restarts == "auto" else self.restarts)
            != TrainPairsConfig()
        )


def _probe_step(path: Path) -> int:
    """The step a restart's ``probe.json`` records; a corrupt file is a one-line UserError naming it."""
    try:
        step = json.loads(path.read_text(encoding="utf-8")).get("step")
    except (OSError, ValueError, AttributeError) as e:
        raise UserError(f"{path}: corrupt probe record ({type(e).__name__})") from None
    if not isinstance(step, int) or isinstance(step, bool):
        raise UserError(f"{path}: corrupt probe record ('step' is {step!r}, expected an integer)")
    return step


def restart_models(init_path: str | Path, required: bool = True, limit: int | None = None) -> list[Path]:
    """The models of the restarts of the ``sft --restarts`` run at ``init_path`` (the run or its ``model/``) but the
    kept one: a finished restart's ``model/``, one that successive halving stopped its probe checkpoint; with
    ``limit``, the best ``limit`` by validation accuracy (at the end, else at the probe), in restart order. Not such
    a run: a UserError if ``required``, else no models."""
    p = Path(init_path).resolve()
    run = next((d for d in (p, p.parent) if (d / "restarts").is_dir()), None)
    if run is None and not required:
        return []
    if run is None:
        raise UserError(f"--train-pairs.restarts: {init_path} is not an `sft --restarts` run (no restarts/ directory)")
    try:
        summary = json.loads((run / "summary.json").read_text())
    except (OSError, ValueError):
        summary = {}  # no (readable) summary: every restart is sampled
    summary = summary if isinstance(summary, dict) else {}
    kept = summary.get("selected_restart")
    score = {}
    candidates = summary.get("candidates")
    for c in candidates if isinstance(candidates, list) else []:  # malformed entries are ignored, like no summary
        if not isinstance(c, dict) or not isinstance(c.get("restart"), int):
            continue
        probe = c.get("probe") if isinstance(c.get("probe"), dict) else {}
        value = c.get("val_accuracy", probe.get("val_accuracy", 0.0))
        score[c["restart"]] = value if isinstance(value, (int, float)) else 0.0
    found = []
    for d in sorted((d for d in (run / "restarts").iterdir() if d.name.isdigit()), key=lambda d: int(d.name)):
        k = int(d.name)
        if k == kept:
            continue
        if (d / "model").is_dir():
            found.append((k, d / "model"))
        elif (d / "probe.json").is_file():
            step = _probe_step(d / "probe.json")
            if (d / "checkpoints" / f"step-{step:08d}").is_dir():
                found.append((k, d / "checkpoints" / f"step-{step:08d}"))
    if limit is not None:
        best = sorted(found, key=lambda x: (-score.get(x[0], 0.0), x[0]))[:limit]
        found = sorted(best)
    return [path for _, path in found]


def training_pairs(
    model,
    tokenizer,
    problems: Sequence[Problem],
    cfg: PairDataConfig,
    extra: TrainPairsConfig,
    others: Sequence[tuple[str, object, object]] = (),
) -> tuple[list[PreferencePair], dict]:
    """The RM's training pairs from ``model``, the ``others`` (name, model, tokenizer: the restarts) and synthetic
    corruptions, in that order, a pair an earlier source gave dropped; returns (pairs, info).

    With ``extra`` at its defaults and no ``others`` this is exactly ``on_policy_pairs(model, tokenizer, problems, cfg)``.
    """
    pc = dataclasses.replace(
        cfg,
        temperature=extra.temperature or cfg.temperature,
        samples_per_prompt=extra.samples_per_prompt or cfg.samples_per_prompt,
    )
    pairs, st = on_policy_pairs(model, tokenizer, problems, pc, num_prompts=len(problems))
    info: dict = {"source": "policy", **stats_dict(st)}
    sources = [pairs]
    for name, other, other_tok in others:
        p, s = on_policy_pairs(other, other_tok, problems, pc, num_prompts=len(problems))
        sources.append(p)
        info.setdefault("others", {})[name] = stats_dict(s)
    if extra.synthetic_per_prompt:
        sources.append(synthetic_pairs(problems, per_prompt=extra.synthetic_per_prompt, seed=cfg.seed))
    seen: set = set()
    out: list[PreferencePair] = []
    for src in sources:
        for p in src:
            key = (p.prompt, p.chosen, p.rejected)
            if key not in seen:
                seen.add(key)
                out.append(p)
    info.update(policy_pairs=len(pairs), pairs=len(out))
    return out, info
