"""Turn an external engine's output (token lists and per-token log-probs) into posttrain's :class:`Generation`.

Key insight: every engine returns ragged lists; the trainer wants the padded layout our own sampler produces
(prompts left-padded to P, completions right-padded to T, masks, EOS-based truncation flags), so one pure
function assembles it, and it is tested against our sampler's own output (lists in, the same tensors out).

Not handled: completions longer than ``max_new_tokens`` (an engine must respect its own limit: an error).
"""

from __future__ import annotations

import torch

from posttrain.generate import Generation, left_pad


def assemble(
    prompt_ids: list[list[int]],
    completions: list[list[int]],
    logps: list[list[float]],
    n: int,
    *,
    pad_id: int,
    eos_id: int | None,
    max_new_tokens: int,
) -> Generation:
    """``completions``/``logps``: ``len(prompt_ids) * n`` rows, prompt-major, each up to and including EOS.

    Example: prompts [[1, 5]], n=2, completions [[7, 2], [8]] with eos 2, max 3 -> completion_ids
    [[7, 2, pad], [8, pad, pad]], completion_mask [[1, 1, 0], [1, 0, 0]], truncated [False, True].
    """
    N = len(prompt_ids) * n
    if len(completions) != N or len(logps) != N:
        raise ValueError(f"expected {N} completions and log-prob rows, got {len(completions)} and {len(logps)}")
    ids, mask = left_pad(prompt_ids, pad_id)  # (B, P)
    expand = torch.arange(len(prompt_ids)).repeat_interleave(n)
    ids, mask = ids[expand], mask[expand]  # (N, P)
    T = max_new_tokens
    out_ids = torch.full((N, T), pad_id, dtype=torch.long)
    out_mask = torch.zeros((N, T), dtype=torch.long)
    out_lp = torch.zeros((N, T), dtype=torch.float32)
    for i, (c, lp) in enumerate(zip(completions, logps)):
        if len(c) > T or len(lp) != len(c):
            raise ValueError(f"row {i}: {len(c)} tokens and {len(lp)} log-probs for max_new_tokens={T}")
        if eos_id is not None and eos_id in c[:-1]:
            raise ValueError(f"row {i}: tokens after EOS")
        out_ids[i, : len(c)] = torch.tensor(c, dtype=torch.long)
        out_mask[i, : len(c)] = 1
        out_lp[i, : len(c)] = torch.tensor(lp, dtype=torch.float32)
    ended = torch.tensor([eos_id is not None and len(c) > 0 and c[-1] == eos_id for c in completions])
    return Generation(
        sequences=torch.cat([ids, out_ids], 1),
        attention_mask=torch.cat([mask, out_mask], 1),
        completion_ids=out_ids,
        completion_mask=out_mask,
        logps=out_lp,
        raw_logps=out_lp.clone(),
        truncated=~ended,
        prompt_index=expand,
        prompt_length=ids.shape[1],
    )
