"""Dynamic sampling (DAPO, Yu et al. 2025): train only on groups whose G rewards are not all equal.

A group of G samples with identical rewards has zero advantage under GRPO/RLOO: it costs a forward and
backward pass and teaches nothing. With a confident SFT start most groups are like that (all right or all
wrong). Dynamic sampling draws prompts in rounds and keeps the informative groups:

    round 0: the step's usual prompt batch (the same prompts and samples as without dynamic sampling)
    round r: prompts_per_step more prompts (prompt stream r), sampled with generator (seed, step, round r)
    stop when prompts_per_step informative groups are kept, or after max_sample_rounds rounds
    retry (optional, before round 1): round 0's stuck groups (equal rewards, none correct) once more at a higher
            temperature (``rollout.py``)

Every draw is a pure function of (seed, step, round), so a resumed run reproduces an uninterrupted one.
If fewer than ``prompts_per_step`` informative groups are found the update uses those found (the loss
normalises by what it is given); if none, the step makes no update (no zero-gradient Adam step that would
still move the weights by its momentum) and says so in its metrics.

Here: :func:`informative_groups` (which groups to keep), :func:`stuck_groups` (which to retry), :func:`group_rows` and :func:`merge_rows` (the kept rows of
several generation rounds as one left-padded prompt | right-padded completion batch). The rounds' loop is
``rollout.py``'s; round r's generator is ``streams.round_generator``.
"""

from __future__ import annotations

import torch

from posttrain.losses.advantages import zero_std_groups


def informative_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B*G,) rewards -> (B,) bool: True where the group's rewards are not all equal."""
    return ~zero_std_groups(rewards, group_size)


def stuck_groups(rewards: torch.Tensor, correct: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B*G,) rewards and correctness -> (B,) bool: True where the group's rewards are all equal and no sample is
    correct -- a prompt the policy fails the same way every time, which no further draw at its temperature is likely
    to change (the retry's target, ``retry_temperature``)."""
    return zero_std_groups(rewards, group_size) & (correct.view(-1, group_size).sum(1) == 0)


def group_rows(groups: torch.Tensor, group_size: int) -> torch.Tensor:
    """Indices of the rows of groups ``groups`` (prompt-major: group i is rows iG..iG+G-1)."""
    return (groups[:, None] * group_size + torch.arange(group_size)).reshape(-1)


def merge_rows(parts: list[tuple[object, torch.Tensor]], pad_id: int, group_size: int) -> dict:
    """[(Generation, rows)] -> one batch of the selected rows: prompts left-padded to the longest prompt,
    completions right-padded to the longest completion; prompt_index renumbered group by group.

    Returns dict(sequences, attention_mask, completion_mask, logps, prompt_length, prompt_index). Padding is
    masked (attention 0, completion mask 0, logp 0) and positions come from the attention mask, so a row's
    log-probs are those of its own generation.
    """
    P = max(g.prompt_length for g, _ in parts)
    T = max(g.sequences.shape[1] - g.prompt_length for g, _ in parts)
    seqs, attn, cmask, logps = [], [], [], []
    for g, rows in parts:
        p, t, n = g.prompt_length, g.sequences.shape[1] - g.prompt_length, len(rows)
        s = torch.full((n, P + T), pad_id, dtype=g.sequences.dtype)
        a = torch.zeros((n, P + T), dtype=g.attention_mask.dtype)
        s[:, P - p : P + t] = g.sequences[rows]
        a[:, P - p : P + t] = g.attention_mask[rows]
        c = torch.zeros((n, T), dtype=g.completion_mask.dtype)
        c[:, :t] = g.completion_mask[rows]
        lp = torch.zeros((n, T), dtype=g.logps.dtype)
        lp[:, :t] = g.logps[rows]
        seqs.append(s), attn.append(a), cmask.append(c), logps.append(lp)
    n_rows = sum(len(r) for _, r in parts)
    return {
        "sequences": torch.cat(seqs),
        "attention_mask": torch.cat(attn),
        "completion_mask": torch.cat(cmask),
        "logps": torch.cat(logps),
        "prompt_length": P,
        "prompt_index": torch.arange(n_rows // group_size).repeat_interleave(group_size),
    }
