"""Reward-model evaluation: held-out pairwise accuracy, per margin bucket, and ``posttrain rm --eval-only``.

    accuracy = mean over pairs of [r(x, y_w) > r(x, y_l)]        (ties count as wrong)

Pairs are scored in eval mode in chunks (``pair_rewards``); the Bradley-Terry loss and margin statistics come
from ``losses/ranking.py``, and accuracy is also split by the pair's margin (its ``margin`` field, else the
numeric distance |chosen - rejected| of the answers), so "the RM only tells far-apart answers apart" shows.
:func:`eval_reward_model` scores any RM checkpoint on a user's ``{prompt, chosen, rejected}`` file and writes
``summary.json`` (``pairwise_accuracy``, ``n``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from posttrain.data.checks import model_window
from posttrain.data.preference import PreferencePair, collate_preference, fit_pairs, load_preference_pairs
from posttrain.data.preference_pairs import answer_distance
from posttrain.errors import UserError
from posttrain.losses.ranking import accuracy_by_margin_bucket, bradley_terry_loss
from posttrain.models.heads import RewardModel
from posttrain.rewards.reward_model import load_reward_model
from posttrain.trainers import common


def bucket_values(pairs: Sequence[PreferencePair]) -> torch.Tensor:
    """Per-pair bucketing quantity: the pairs' margins when all have one, else |chosen - rejected| as numbers."""
    if all(p.margin is not None for p in pairs):
        return torch.tensor([p.margin for p in pairs], dtype=torch.float64)
    return torch.tensor([answer_distance(p.chosen, p.rejected) for p in pairs], dtype=torch.float64)


@torch.no_grad()
def pair_rewards(rm: RewardModel, pairs: Sequence[PreferencePair], tokenizer, cfg, chunk: int = 256):
    """(chosen rewards (N,), rejected rewards (N,)) in eval mode."""
    was = rm.training
    rm.eval()
    ch, rj = [], []
    for s in range(0, len(pairs), chunk):
        b = collate_preference(
            pairs[s : s + chunk],
            tokenizer,
            max_prompt_length=cfg.max_prompt_length,
            max_completion_length=cfg.max_completion_length,
        )
        r = rm(b["input_ids"], b["attention_mask"])  # (2n,)
        c, x = r.chunk(2)
        ch.append(c)
        rj.append(x)
    rm.train(was)
    return torch.cat(ch), torch.cat(rj)


def evaluate_pairs(rm, pairs, tokenizer, cfg) -> dict[str, float]:
    """Held-out pairwise accuracy, reward mean/std, and accuracy per margin bucket."""
    c, r = pair_rewards(rm, pairs, tokenizer, cfg)
    loss, m = bradley_terry_loss(c, r)
    out = {"heldout/loss": loss.item(), **{f"heldout/{k}": v.item() for k, v in m.items()}}
    buckets = accuracy_by_margin_bucket(c.double(), r.double(), bucket_values(pairs), tuple(cfg.bucket_edges))
    out.update({f"heldout/{k}": v.item() for k, v in buckets.items()})
    return out


def eval_reward_model(cfg, overwrite: bool = False) -> dict:
    """``posttrain rm --eval-only``: pairwise accuracy of the RM ``cfg.init`` on the pairs file ``cfg.eval_data``.

    Writes ``summary.json`` (``pairwise_accuracy``, ``n``, loss, margin, per-bucket accuracy) to ``cfg.out``, a new
    run directory (``--overwrite`` to replace one). A policy checkpoint as ``--init`` is a one-line error.
    """
    if not cfg.init or not cfg.eval_data:
        raise UserError("--eval-only needs --init RM_CHECKPOINT and --eval-data pairs.jsonl")
    common.set_threads(cfg.threads)
    run = common.open_run(cfg, "rm_eval", overwrite=overwrite)
    loaded = load_reward_model(cfg.init)  # a policy (no reward head) -> UserError naming the checkpoint
    pairs = fit_pairs(
        load_preference_pairs(cfg.eval_data),
        loaded.tokenizer,
        window=model_window(loaded.model),
        long=cfg.long,
        what="evaluation",
        max_prompt_length=cfg.max_prompt_length,
        max_completion_length=cfg.max_completion_length,
    )
    if not pairs:
        raise UserError(f"{cfg.eval_data}: no pairs to evaluate")
    common.begin_run(run, cfg)
    m = {k.removeprefix("heldout/"): v for k, v in evaluate_pairs(loaded.model, pairs, loaded.tokenizer, cfg).items()}
    summary = {
        "trainer": "rm_eval",
        "pairwise_accuracy": m["accuracy"],
        "n": len(pairs),
        **m,
        "checkpoint": str(loaded.path),
        "eval_data": str(cfg.eval_data),
    }
    path = common.write_summary(run.dir, summary)
    print(f"pairwise accuracy: {m['accuracy']:.4f} on {len(pairs)} pairs of {cfg.eval_data} with {loaded.path}")
    print(f"summary: {path}")
    return summary


def heldout_report(metrics: dict[str, float], n: int) -> str:
    """What a reward-model run prints of its final held-out evaluation (:func:`evaluate_pairs`' ``metrics`` on ``n``
    pairs): the pairwise accuracy, then one line per margin bucket."""
    lines = [f"held-out pairwise accuracy: {metrics['heldout/accuracy']:.3f} on {n} pairs"]
    for k, v in metrics.items():
        if k.startswith("heldout/accuracy/bucket_"):
            name = k.rsplit("/", 1)[-1]
            lines.append(
                f"  |chosen - rejected| in {name[7:]}: {v:.3f} ({int(metrics['heldout/count/' + name])} pairs)"
            )
    return "\n".join(lines)
