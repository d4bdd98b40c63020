"""Reward-model step time by batch layout: pair rows with the full forward, pair rows with the prompt run once
(``--share-prompt-prefix``), and prompt batches (``--batch-by prompt``), on the same model and pairs, interleaved.

    .venv/bin/python benchmarks/bench_rm_step.py runs/demo/sft/model runs/demo/rm/pairs.jsonl [--steps 40]

Each layout runs forward + Bradley-Terry loss + backward on the same random draws of pairs (64 per step; prompt
batches draw prompts until they hold as many pairs), rotating the layouts every step so that machine noise hits all
alike; the table gives the median ms per step, ms per pair and the token positions the backbone runs per pair.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

import torch

from posttrain.checkpoints.load import load_policy
from posttrain.data.preference import collate_preference, fit_pairs, load_preference_pairs
from posttrain.losses.ranking import bradley_terry_loss
from posttrain.models.heads import RewardModel
from posttrain.trainers.reward_batches import batch_rewards, collate_prompt_groups, prompt_groups, row_rewards


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path, help="an SFT checkpoint (the RM backbone)")
    ap.add_argument("pairs", type=Path, help="a pairs.jsonl, e.g. a pipeline run's rm/pairs.jsonl")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=64, help="pairs per step")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    ck = load_policy(a.model)
    rm, tok = RewardModel(ck.model), ck.tokenizer
    pairs = fit_pairs(load_preference_pairs(a.pairs), tok, window=ck.model.config.max_seq_len)
    groups = prompt_groups(pairs)
    of_pair = {i: g for g, idx in enumerate(groups) for i in idx}
    rng = random.Random(0)

    def pair_batch(idx, share):
        b = collate_preference([pairs[i] for i in idx], tok)
        c, r = batch_rewards(rm, b, share).chunk(2)
        return c, r, b["input_ids"].numel() if not share else _shared_tokens(b)

    def prompt_batch(idx, share):
        gs = list(dict.fromkeys(of_pair[i] for i in idx))  # the prompts of the drawn pairs, with all their pairs
        b = collate_prompt_groups(pairs, [groups[g] for g in gs], tok)
        r = row_rewards(rm, b, share)
        return r[b["chosen_rows"]], r[b["rejected_rows"]], _shared_tokens(b), len(b["chosen_rows"])

    layouts = {
        "pairs, full forward (--share-prompt-prefix false)": lambda idx: (*pair_batch(idx, False), len(idx)),
        "pairs, prompt once (default)": lambda idx: (*pair_batch(idx, True), len(idx)),
        "prompt batches (--batch-by prompt)": lambda idx: prompt_batch(idx, True),
    }
    times = {k: [] for k in layouts}
    per_pair = {k: [] for k in layouts}
    tokens = {k: [] for k in layouts}
    for step in range(a.steps + 3):  # 3 warm-up steps
        idx = rng.sample(range(len(pairs)), a.batch)
        names = list(layouts)
        names = names[step % len(names) :] + names[: step % len(names)]
        for name in names:
            rm.zero_grad()
            t0 = time.perf_counter()
            c, r, n_tok, n_pairs = layouts[name](idx)
            loss, _ = bradley_terry_loss(c, r)
            loss.backward()
            dt = time.perf_counter() - t0
            if step >= 3:
                times[name].append(dt)
                per_pair[name].append(dt / n_pairs)
                tokens[name].append(n_tok / n_pairs)
    print(f"{len(pairs)} pairs over {len(groups)} prompts ({len(pairs) / len(groups):.2f} per prompt); {a.steps} steps")
    print("| layout | ms / step | ms / pair | token positions / pair | pair time vs full |")
    print("|---|---|---|---|---|")
    base = statistics.median(per_pair[next(iter(layouts))])
    for name in layouts:
        mp = statistics.median(per_pair[name])
        print(
            f"| {name} | {1000 * statistics.median(times[name]):.1f} | {1000 * mp:.2f} | "
            f"{statistics.mean(tokens[name]):.1f} | {mp / base:.2f}x |"
        )
    return 0


def _shared_tokens(b: dict) -> int:
    """Token positions (padding included) the shared-prompt forward runs: each distinct prompt's P, then every row's
    completion width (a full forward runs every row's P + C)."""
    N, T = b["input_ids"].shape
    P = b["completion_start"]
    index = b.get("prompt_index")
    n_prompts = len(torch.unique(index)) if index is not None else N // 2
    return n_prompts * P + N * (T - P)


if __name__ == "__main__":
    raise SystemExit(main())
