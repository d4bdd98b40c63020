"""The evaluation stage: every checkpoint on the same held-out prompts, three ways, plus RM best-of-N.

For each policy checkpoint (SFT, raw-corpus SFT, DPO, GRPO, PPO) and the n held-out (prompt, answer) pairs:

    greedy accuracy = (1/n) sum_i [verify(greedy_i, a_i)]                 (posttrain.evaluation.evaluate)
    pass@1          = (1/(n k)) sum_i sum_j [verify(y_ij, a_i)]           y_ij ~ pi(. | x_i) at temperature T
    pass@k          = (1/n) sum_i [any_j verify(y_ij, a_i)]               (the k samples drawn; unbiased for k of k)

RM best-of-N (N = k) re-ranks SFT's k samples of each prompt by the reward model's score and keeps the top
one: ``(1/n) sum_i [verify(y_i,argmax_j r(x_i, y_ij), a_i)]`` (ties: the first sample). The reward-model scores
of correct and incorrect samples are kept for the report's histogram. Samples come from one generator
seeded by (seed, checkpoint name), so a re-run gives the same numbers.

Correct is exact match against the ``answer`` column, or, with the pipeline's ``reward`` spec, that spec's first
term scoring >= 1 on the completion and the held-out record's columns (as GRPO/PPO count it on user files).

On the embedded corpus the raw-corpus SFT is also scored on the leaked items and on the rest separately:
the difference is what contamination inflates. On the embedded task (``eval.heldout_all``) every policy is also
scored greedily on the whole held-out split and per operand layout (``tasks.arithmetic.layout``): the sample of
``num_eval`` prompts carries binomial noise, and a model's errors gather in the one-digit-operand layouts.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import torch

from posttrain.data.io import atomic_write_json, iter_jsonl
from posttrain.evaluation import accuracy_by, encode_prompt, evaluate
from posttrain.generate import SamplingConfig, decode_completions, generate
from posttrain.pipeline.base import POLICY_STAGES
from posttrain.tasks.arithmetic import verify as exact_verify
from posttrain.tasks.embedded import embedded_task, layout


def heldout_pairs(ctx) -> list[tuple[str, str]]:
    if ctx.cfg.eval_file:
        return [(r["prompt"], _Row(r)) for _, r in iter_jsonl(ctx.dir("dedup") / "eval.jsonl")]
    return [(p.prompt, p.answer) for p in embedded_task(ctx.cfg.task).eval_problems()]


def heldout_all_pairs(ctx) -> list[tuple[str, str]] | None:
    """Every problem of the embedded task's held-out split (None with the user's own eval_file)."""
    if ctx.cfg.eval_file:
        return None
    return [(p.prompt, p.answer) for p in embedded_task(ctx.cfg.task).heldout_problems]


def layout_line(r: dict) -> str:
    """``all 1051 0.412 (2+2 0.47, 1+2 0.05, ...)``: a ``heldout_all`` result on one line."""
    parts = ", ".join(f"{k} {v['accuracy']:.2f}" for k, v in r["by_layout"].items())
    return f"all {r['n']} {r['greedy_accuracy']:.3f} ({parts})"


class _Row(str):
    """A held-out answer that carries its record's other columns (for a user reward spec's verifier)."""

    def __new__(cls, rec: dict):
        s = super().__new__(cls, str(rec.get("answer", "")))
        s.prompt, s.columns = rec["prompt"], {k: v for k, v in rec.items() if k != "prompt"}
        return s


def make_verifier(spec: str | None):
    """(completion, answer) -> correct: exact match, or with a reward ``spec`` its first term scoring >= 1 on the
    completion with the record's columns (what the grpo/ppo trainers call correct on user prompt files)."""
    if not spec:
        return exact_verify
    from posttrain.rewards.registry import build_reward

    fn = build_reward(spec)
    first = next(iter(fn.terms))

    def verify(completion: str, answer) -> bool:
        cols = getattr(answer, "columns", None) or {"answer": str(answer)}
        _, parts = fn.components([getattr(answer, "prompt", "")], [completion], **{k: [v] for k, v in cols.items()})
        return parts[first][0] >= 1.0 - 1e-9

    return verify


@torch.no_grad()
def sample_k(
    model, tok, prompts: list[str], k: int, temperature: float, max_new_tokens: int, seed: int, batch: int = 64
) -> list[list[str]]:
    """k completions per prompt at ``temperature`` (rows prompt-major), from a generator seeded by ``seed``."""
    g = torch.Generator().manual_seed(seed)
    cfg = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, num_samples=k)
    out: list[list[str]] = []
    for s in range(0, len(prompts), batch):
        ps = prompts[s : s + batch]
        gen = generate(
            model, [encode_prompt(tok, p) for p in ps], pad_id=tok.pad_id, eos_id=tok.eos_id, cfg=cfg, generator=g
        )
        texts = decode_completions(tok, gen)
        out += [texts[i * k : (i + 1) * k] for i in range(len(ps))]
    return out


def evaluate_policy(
    path: Path,
    pairs,
    k: int,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    verifier=exact_verify,
    all_pairs: list[tuple[str, str]] | None = None,
) -> dict:
    """Greedy accuracy, pass@1 and pass@k on ``pairs``; with ``all_pairs`` also greedy accuracy on them, overall and
    per operand layout (``heldout_all``)."""
    from posttrain.checkpoints.load import POLICY, load_checkpoint

    ckpt = load_checkpoint(path, accept_kinds=POLICY, role="pipeline eval")
    model, tok = ckpt.model.eval(), ckpt.tokenizer
    prompts, answers = [p for p, _ in pairs], [a for _, a in pairs]
    greedy = evaluate(
        model, tok, prompts, answers, max_new_tokens=max_new_tokens, keep_samples=len(prompts), verifier=verifier
    )
    samples = sample_k(model, tok, prompts, k, temperature, max_new_tokens, seed)
    correct = [[bool(verifier(c, a)) for c in row] for row, a in zip(samples, answers)]
    n = len(pairs)
    out = {
        "greedy_accuracy": greedy.accuracy,
        "pass@1": sum(map(sum, correct)) / (n * k),
        "pass@k": sum(any(r) for r in correct) / n,
        "n": n,
        "k": k,
        "greedy_correct": [s["correct"] for s in greedy.samples],
        "samples": samples,
        "correct": correct,
    }
    if all_pairs:
        full = evaluate(
            model,
            tok,
            [p for p, _ in all_pairs],
            [a for _, a in all_pairs],
            max_new_tokens=max_new_tokens,
            keep_samples=len(all_pairs),
            verifier=verifier,
        )
        out["heldout_all"] = {
            "greedy_accuracy": full.accuracy,
            "n": len(all_pairs),
            "by_layout": accuracy_by(full.samples, layout),
        }
    return out


def best_of_n(rm_path: Path, pairs, samples: list[list[str]], correct: list[list[bool]]) -> dict:
    from posttrain.models.heads import best_of_n as best_of_n_picks
    from posttrain.models.heads import weighted_best_of_n
    from posttrain.rewards.reward_model import load_reward_model

    rm = load_reward_model(rm_path)
    flat_p = [p for (p, _), row in zip(pairs, samples) for _ in row]
    flat_c = [c for row in samples for c in row]
    raw = rm.score(flat_p, flat_c).double()
    scores = raw.tolist()
    k = len(samples[0]) if samples else 0
    flat_ok = [ok for row in correct for ok in row]
    picks = best_of_n_picks(raw, k)[0].tolist() if k else []
    weighted = weighted_best_of_n(raw, flat_c, k).tolist() if k else []
    good = [round(s, 4) for s, ok in zip(scores, flat_ok) if ok]
    bad = [round(s, 4) for s, ok in zip(scores, flat_ok) if not ok]
    return {
        "accuracy": sum(flat_ok[i] for i in picks) / max(len(correct), 1),
        "weighted_accuracy": sum(flat_ok[i] for i in weighted) / max(len(correct), 1),
        "n": len(correct),
        "N": k,
        "scores_correct": good,
        "scores_incorrect": bad,
    }


def run_eval_stage(ctx, out: Path) -> dict:
    cfg = ctx.cfg
    e = cfg.eval
    pairs = heldout_pairs(ctx)
    out.mkdir(parents=True, exist_ok=True)
    results, details = {}, {}
    verifier = make_verifier(cfg.reward)
    all_pairs = heldout_all_pairs(ctx) if e.heldout_all else None
    heldout_all = {}
    for name in POLICY_STAGES:
        if name not in ctx.done or not ctx.model(name).is_dir():
            continue
        seed = zlib.crc32(f"{cfg.seed}:{name}".encode())
        r = evaluate_policy(
            ctx.model(name), pairs, e.samples, e.temperature, e.max_new_tokens, seed, verifier, all_pairs
        )
        details[name] = r
        results[name] = {k: r[k] for k in ("greedy_accuracy", "pass@1", "pass@k", "n", "k")}
        if "heldout_all" in r:
            heldout_all[name] = r["heldout_all"]
        if not ctx.quiet:
            print(
                f"eval {name:<8} greedy {r['greedy_accuracy']:.3f}  pass@1 {r['pass@1']:.3f}  "
                f"pass@{e.samples} {r['pass@k']:.3f}"
                + (f"  {layout_line(r['heldout_all'])}" if "heldout_all" in r else "")
            )
    summary = {"n": len(pairs), "samples": e.samples, "temperature": e.temperature, "models": results}
    if heldout_all:
        summary["heldout_all"] = heldout_all
    if "rm" in ctx.done and "sft" in details and ctx.model("rm").is_dir():
        b = best_of_n(ctx.model("rm"), pairs, details["sft"]["samples"], details["sft"]["correct"])
        results["rm_best_of_n"] = {"greedy_accuracy": b["accuracy"], "n": b["n"], "k": b["N"]}
        results["rm_weighted_best_of_n"] = {"greedy_accuracy": b["weighted_accuracy"], "n": b["n"], "k": b["N"]}
        summary["rm_scores"] = {"correct": b["scores_correct"], "incorrect": b["scores_incorrect"]}
        if not ctx.quiet:
            print(
                f"eval rm best-of-{b['N']} over SFT samples: {b['accuracy']:.3f}  (weighted: {b['weighted_accuracy']:.3f})"
            )
    leaked = set((ctx.summary("dedup") or {}).get("leaked_prompts") or [])
    if leaked:
        split = {}
        for name in ("sft", "sft_raw"):
            if name in details:
                flags = details[name]["greedy_correct"]
                on = [ok for (p, _), ok in zip(pairs, flags) if p in leaked]
                off = [ok for (p, _), ok in zip(pairs, flags) if p not in leaked]
                split[name] = {
                    "leaked": sum(on) / max(len(on), 1),
                    "clean": sum(off) / max(len(off), 1),
                    "n_leaked": len(on),
                    "n_clean": len(off),
                }
        summary["contamination"] = split
    with open(out / "samples.jsonl", "w", encoding="utf-8") as fh:
        for name, r in details.items():
            for (p, a), row, ok in zip(pairs[:32], r["samples"], r["correct"]):
                fh.write(json.dumps({"model": name, "prompt": p, "answer": a, "samples": row, "correct": ok}) + "\n")
    atomic_write_json(out / "summary.json", summary)
    return summary
