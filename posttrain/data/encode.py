"""Prompt and completion token ids: the one place that decides where BOS and EOS go and what a limit keeps.

    prompt      [BOS] + encode(prompt)          a limit keeps BOS and the prompt's *end* (what the answer follows)
    completion  encode(completion) + [EOS]      a limit keeps the completion's *start*

Every trainer, the sampler's prompts, evaluation and the reward model encode through these two functions, so
a prompt is the same token sequence in SFT, RL, DPO and evaluation.

Not handled: chat templates (``posttrain/chat.py`` renders a conversation to text first).
"""

from __future__ import annotations


def encode_prompt(tokenizer, prompt: str, max_tokens: int | None = None, add_bos: bool = True) -> list[int]:
    """BOS (if the tokenizer has one and ``add_bos``) + prompt tokens. With ``max_tokens`` a longer prompt keeps
    BOS and its last ``max_tokens - 1`` tokens. Example (BOS=1, "abcd" -> [5, 6, 7, 8]), max_tokens=3 -> [1, 7, 8]."""
    ids = [int(t) for t in tokenizer.encode(prompt)]
    bos = add_bos and tokenizer.bos_id is not None
    out = ([int(tokenizer.bos_id)] if bos else []) + ids
    if max_tokens is not None and len(out) > max_tokens:
        keep_bos = bos and max_tokens >= 2
        out = out[:1] + out[len(out) - (max_tokens - 1) :] if keep_bos else out[len(out) - max_tokens :]
    return out


def encode_completion(tokenizer, completion: str, add_eos: bool = True, max_tokens: int | None = None) -> list[int]:
    """encode(completion) + [EOS], keeping the first ``max_tokens`` tokens."""
    ids = [int(t) for t in tokenizer.encode(completion)]
    if add_eos and tokenizer.eos_id is not None:
        ids = ids + [int(tokenizer.eos_id)]
    return ids if max_tokens is None else ids[:max_tokens]
