"""``posttrain lab``: the study notes' key insights, run on posttrain's own code and checked numerically.

Each lab is one module of this package with ``NAME``, ``CLAIM`` (the notes' claim, quoted and translated),
``FORMULA``, ``NOTES`` (where in the notes) and ``run(ctx)``; :mod:`._common` runs it, checks its claim
within a stated statistical tolerance and writes ``result.json`` plus PNG figures. The registry below is
plain data: ``posttrain lab --list`` imports no lab (no torch, no matplotlib).
"""

from __future__ import annotations

import importlib

# name -> (module, one-line summary); the order is the notes' order
LABS: dict[str, tuple[str, str]] = {
    "minhash-variance": ("minhash_variance", "MinHash's Jaccard estimate: mean J, s.d. sqrt(J(1-J)/K)"),
    "lsh-s-curve": ("lsh_s_curve", "LSH banding: Pr[candidate] = 1 - (1 - J^r)^b, threshold (1/b)^(1/r)"),
    "bpe-by-hand": ("bpe_by_hand", "BPE's first merges on low/lower/lowest, and why </w> matters"),
    "tokenizer-compare": ("tokenizer_compare", "BPE, byte-level BPE, WordPiece, Unigram: tokens/word, OOV, sampling"),
    "softmax-sqrt-d": ("softmax_sqrt_d", "logit variance D vs 1, and softmax saturation, without/with 1/sqrt(D)"),
    "attention-memory": (
        "attention_memory",
        "peak memory: naive attention O(N^2), FlashAttention O(N); online softmax",
    ),
    "baseline-variance": ("baseline_variance", "policy-gradient baselines: unbiased, lower variance (bandit)"),
    "gae-lambda": ("gae_lambda", "GAE: lambda=0 is one-step TD, lambda=1 Monte Carlo; bias vs variance"),
    "ppo-clip": ("ppo_clip", "PPO's clipped objective: the four cases of its gradient, ratio drift over epochs"),
    "kl-estimators": ("kl_estimators", "k1, k2, k3 estimators of KL: bias, variance, sign"),
    "dpo-logp-fall": ("dpo_logp_fall", "DPO: chosen and rejected log-probs both fall while the margin grows; RPO"),
    "dpo-length-bias": ("dpo_length_bias", "DPO learns length from longer chosen answers; SimPO less (R-DPO measured)"),
    "entropy-collapse": ("entropy_collapse", "GRPO without an entropy bonus collapses onto fewer answers"),
    "reward-hacking": ("reward_hacking", "RL on a flawed reward: reward up, accuracy down, KL grows without beta"),
}


def lab_module(name: str):
    """The module of lab ``name`` (imported on demand)."""
    return importlib.import_module(f"{__name__}.{LABS[name][0]}")


__all__ = ["LABS", "lab_module"]
