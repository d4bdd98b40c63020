"""Preference data: JSONL loaders for pairs and for KTO's labelled completions, and their collate functions.

Key insight: one tensor layout serves the reward model and every DPO-family loss. Each sequence is
``[left-padded prompt | right-padded completion]`` with the completion starting at one column P for the
whole batch, and chosen rows stacked on top of rejected rows:

    input_ids       (2B, P + C)   rows 0..B-1 = prompt_i + chosen_i, rows B..2B-1 = prompt_i + rejected_i
    attention_mask  (2B, P + C)   1 on real tokens
    completion_mask (2B, C)       1 on completion tokens (the ones whose log-probs count), 0 on padding
    completion_start = P

so ``completion_logps(model, input_ids, attention_mask, P, completion_mask=...)`` then
``sequence_logps(lp, completion_mask)`` gives per-sequence log-probs that exclude prompt and padding,
``completion_mask.sum(-1)`` gives |y| for SimPO/R-DPO/IPO, and a reward model reads the last real
token (the completion's EOS). One forward pass covers chosen and rejected.

Files (JSONL or Parquet):
    pairs: {"prompt": str, "chosen": str, "rejected": str, "margin": float (optional)}
    KTO:   {"prompt": str, "completion": str, "label": true | false (or 1 | 0)}
Each of prompt/chosen/rejected/completion may instead be a list of messages (TRL's conversational
preference format: ``prompt`` the conversation so far, ``chosen``/``rejected`` the assistant reply as a list
holding its message). They are rendered with the chat template (``chat``, :mod:`posttrain.chat`): the prompt
with its generation prompt, a reply as the text that follows it (its end marker becomes the EOS the
encoders append). ``on_bad_line="skip"`` sends bad records to ``FILE.rejects.jsonl``.
Errors name the file, the line and the field. Loaded records remember their lines (a ``Located``
list); :func:`fit_pairs` / :func:`fit_kto` encode them once, check unknown characters and the model's
window (:mod:`posttrain.data.checks`) and store the tokens the collate functions then use. Not handled here:
rankings of k > 2 responses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from posttrain.chat import check_messages, is_conversation
from posttrain.data.checks import Located, fit_sequences
from posttrain.data.encode import encode_completion as _encode_completion
from posttrain.data.encode import encode_prompt as _encode_prompt
from posttrain.data.io import BadLinePolicy, ReadStats, load_records
from posttrain.errors import ConfigError, DataError

PAIR_FIELDS = ("prompt", "chosen", "rejected")
KTO_FIELDS = ("prompt", "completion", "label")


@dataclass(frozen=True)
class PreferencePair:
    prompt: str
    chosen: str
    rejected: str
    margin: float | None = None
    # (prompt ids, chosen ids, rejected ids) once checked by fit_pairs; collate then uses them as they are
    tokens: tuple | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class KTOExample:
    prompt: str
    completion: str
    label: bool  # True = desirable
    tokens: tuple | None = field(default=None, compare=False, repr=False)  # (prompt ids, completion ids), see fit_kto


# ---------------------------------------------------------------------------------------------
# loading


def _check_str(rec: dict, fields: Sequence[str]) -> str | None:
    for f in fields:
        if not isinstance(rec[f], str):
            return f"field {f!r} must be a string, got {type(rec[f]).__name__}"
    return None


def _render(rec: dict, chat, prompt_field: str, reply_fields: Sequence[str]):
    """(prompt text, [reply texts], None) of a record whose fields are strings or conversations, or
    (None, None, reason). Plain strings without a template for everything pass through unchanged."""
    if not any(is_conversation(rec[f]) for f in (prompt_field, *reply_fields)) and (
        chat is None or not chat.wrap_strings
    ):
        reason = _check_str(rec, (prompt_field, *reply_fields))
        return (None, None, reason) if reason else (rec[prompt_field], [rec[f] for f in reply_fields], None)
    if chat is None:
        raise ConfigError(
            "a conversation, but there is no chat template: the tokenizer has none (no chat_template in "
            "its tokenizer_config.json); pass --chat-template chatml"
        )
    raw_prompt, reason = rec[prompt_field], None
    if is_conversation(raw_prompt):
        raw_prompt, reason = check_messages(raw_prompt, prompt_field)
    elif not isinstance(raw_prompt, str):
        reason = f"field {prompt_field!r} must be a string or a list of messages, got {type(raw_prompt).__name__}"
    if reason:
        return None, None, reason
    prompt = chat.render(chat.as_messages(raw_prompt, "user"), add_generation_prompt=True)  # a string: one user turn
    replies = []
    for f in reply_fields:
        v = rec[f]
        if is_conversation(v):
            v, reason = check_messages(v, f, last="assistant")
        elif not isinstance(v, str):
            reason = f"field {f!r} must be a string or a list of messages, got {type(v).__name__}"
        if reason:
            return None, None, reason
        replies.append(chat.completion_text(raw_prompt, v))
    return prompt, replies, None


def _load(path, fields, validate, on_bad_line: BadLinePolicy, stats: ReadStats | None, allow_empty: bool):
    items, lines = load_records(
        path, validate, required=fields, on_bad_line=on_bad_line, stats=stats, what="preference", allow_empty=True
    )
    out = Located(items, str(path), lines)
    if not out and not allow_empty:
        raise DataError(f"{path}: no usable records (needs fields {', '.join(fields)})")
    return out


def _finite_float32(x: int | float) -> bool:
    """True when ``x`` stays finite as a float32 (|x| < 3.4e38; NaN and inf are not)."""
    try:
        return abs(float(x)) < 3.4e38
    except OverflowError:  # an int too large for a float
        return False


def _validate_pair(rec, chat=None):
    prompt, replies, reason = _render(rec, chat, "prompt", ("chosen", "rejected"))
    if reason is not None:
        return None, reason
    if replies[0] == replies[1]:
        return None, "'chosen' and 'rejected' are identical (the pair carries no preference)"
    margin = rec.get("margin")
    if margin is not None and (isinstance(margin, bool) or not isinstance(margin, (int, float))):
        return None, f"field 'margin' must be a number, got {type(margin).__name__}"
    if margin is not None and not _finite_float32(margin):  # NaN, Infinity, 1e999, 10**400 (batches are float32)
        return None, f"field 'margin' must be a finite number, got {margin!r:.24}"
    return PreferencePair(prompt, *replies, None if margin is None else float(margin)), None


def _validate_kto(rec, chat=None):
    prompt, replies, reason = _render(rec, chat, "prompt", ("completion",))
    if reason is not None:
        return None, reason
    label = rec["label"]
    if label in (True, False) or (isinstance(label, int) and label in (0, 1)):
        return KTOExample(prompt, replies[0], bool(label)), None
    return None, f"field 'label' must be true/false (or 1/0), got {label!r}"


def load_preference_pairs(
    path: str | Path,
    *,
    on_bad_line: BadLinePolicy = "error",
    stats: ReadStats | None = None,
    allow_empty: bool = False,
    chat=None,
) -> list[PreferencePair]:
    """Read ``{"prompt", "chosen", "rejected"[, "margin"]}`` lines (strings or conversations, rendered with
    ``chat``). A bad line raises a DataError naming ``file:line`` and the field (or, with
    ``on_bad_line="skip"``, goes to ``FILE.rejects.jsonl`` and is counted in ``stats.bad_lines``)."""
    return _load(path, PAIR_FIELDS, lambda rec: _validate_pair(rec, chat), on_bad_line, stats, allow_empty)


def load_kto_examples(
    path: str | Path,
    *,
    on_bad_line: BadLinePolicy = "error",
    stats: ReadStats | None = None,
    allow_empty: bool = False,
    chat=None,
) -> list[KTOExample]:
    """Read ``{"prompt", "completion", "label"}`` lines (label true = desirable); errors as for pairs."""
    return _load(path, KTO_FIELDS, lambda rec: _validate_kto(rec, chat), on_bad_line, stats, allow_empty)


def pairs_to_kto(pairs: Sequence[PreferencePair]) -> list[KTOExample]:
    """Each pair becomes a desirable and an undesirable example: [(p, c, True), (p, r, False), ...]."""
    out = [ex for p in pairs for ex in (KTOExample(p.prompt, p.chosen, True), KTOExample(p.prompt, p.rejected, False))]
    if isinstance(pairs, Located):
        return pairs.subset([i for i in range(len(pairs)) for _ in (0, 1)], out)
    return out


def fit_pairs(
    pairs: Sequence[PreferencePair],
    tokenizer,
    *,
    window: int | None,
    long: str = "error",
    what: str = "preference",
    max_prompt_length: int | None = None,
    max_completion_length: int | None = None,
) -> list[PreferencePair]:
    """Encode pairs once and check them (unknown characters, identical encodings, the model's window;
    see :mod:`posttrain.data.checks`); the returned pairs carry their ``tokens`` for the collate functions."""
    kept, fitted = fit_sequences(
        tokenizer,
        pairs,
        lambda p: (p.prompt, [("chosen", p.chosen), ("rejected", p.rejected)]),
        window=window,
        long=long,
        what=what,
        max_prompt_length=max_prompt_length,
        max_completion_length=max_completion_length,
        distinct=True,
    )
    items = [dataclasses.replace(pairs[i], tokens=(f.prompt, *f.completions)) for i, f in zip(kept, fitted)]
    return pairs.subset(kept, items) if isinstance(pairs, Located) else items


def fit_kto(
    examples: Sequence[KTOExample],
    tokenizer,
    *,
    window: int | None,
    long: str = "error",
    what: str = "preference",
    max_prompt_length: int | None = None,
    max_completion_length: int | None = None,
) -> list[KTOExample]:
    """As :func:`fit_pairs`, for KTO's labelled completions."""
    kept, fitted = fit_sequences(
        tokenizer,
        examples,
        lambda e: (e.prompt, [("completion", e.completion)]),
        window=window,
        long=long,
        what=what,
        max_prompt_length=max_prompt_length,
        max_completion_length=max_completion_length,
    )
    items = [dataclasses.replace(examples[i], tokens=(f.prompt, f.completions[0])) for i, f in zip(kept, fitted)]
    return examples.subset(kept, items) if isinstance(examples, Located) else items


# ---------------------------------------------------------------------------------------------
# tokenising and padding


def padding_id(tokenizer) -> int:
    """The id padding positions get: the tokenizer's pad, else its EOS, else 0 (they are masked out)."""
    for i in (tokenizer.pad_id, tokenizer.eos_id):
        if i is not None:
            return int(i)
    return 0  # padding positions are masked out, so any id works


def encode_prompt(tokenizer, prompt: str, add_bos: bool = True, max_prompt_length: int | None = None) -> list[int]:
    """[bos] + encode(prompt) through :func:`posttrain.data.encode.encode_prompt` (a limit keeps BOS and the end)."""
    return _encode_prompt(tokenizer, prompt, max_tokens=max_prompt_length, add_bos=add_bos)


def encode_completion(
    tokenizer, completion: str, add_eos: bool = True, max_completion_length: int | None = None
) -> list[int]:
    """encode(completion) + [eos] through :func:`posttrain.data.encode.encode_completion` (a limit keeps the start)."""
    return _encode_completion(tokenizer, completion, add_eos=add_eos, max_tokens=max_completion_length)


def pack_prompt_completion(
    prompts: Sequence[list[int]], completions: Sequence[list[int]], pad_id: int
) -> dict[str, torch.Tensor | int]:
    """Lay out [left-padded prompt | right-padded completion] rows (see the module docstring).

    Example: prompts [[1, 5], [1]], completions [[7, 2], [8, 9, 2]], pad 0 ->
    input_ids [[1, 5, 7, 2, 0], [0, 1, 8, 9, 2]], completion_mask [[1, 1, 0], [1, 1, 1]], completion_start 2.
    """
    if len(prompts) != len(completions) or not prompts:
        raise ValueError("need the same, non-zero number of prompts and completions")
    if any(len(c) == 0 for c in completions):
        raise DataError("a completion is empty after tokenisation (nothing to score)")
    if any(len(p) == 0 for p in prompts):
        raise DataError("a prompt is empty after tokenisation; add a BOS token or a prompt text")
    P = max(len(p) for p in prompts)
    C = max(len(c) for c in completions)
    n = len(prompts)
    input_ids = torch.full((n, P + C), pad_id, dtype=torch.long)  # (N, P+C)
    attention_mask = torch.zeros((n, P + C), dtype=torch.long)
    completion_mask = torch.zeros((n, C), dtype=torch.long)  # (N, C)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        input_ids[i, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
        input_ids[i, P : P + len(c)] = torch.tensor(c, dtype=torch.long)
        attention_mask[i, P - len(p) : P + len(c)] = 1
        completion_mask[i, : len(c)] = 1
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "completion_mask": completion_mask,
        "completion_start": P,
    }


def pair_tokens(
    pairs: Sequence[PreferencePair],
    tokenizer,
    *,
    max_prompt_length: int | None = None,
    max_completion_length: int | None = None,
    add_bos: bool = True,
    add_eos: bool = True,
) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """(prompt, chosen, rejected) token lists of each pair: the ``tokens`` :func:`fit_pairs` checked and fitted
    when every pair carries them, else [bos] + prompt and completion + [eos] under the length caps."""
    if all(p.tokens is not None for p in pairs):  # checked and fitted once by fit_pairs
        prompts, chosen, rejected = (list(x) for x in zip(*(p.tokens for p in pairs)))
        return prompts, chosen, rejected
    prompts = [encode_prompt(tokenizer, p.prompt, add_bos, max_prompt_length) for p in pairs]
    chosen = [encode_completion(tokenizer, p.chosen, add_eos, max_completion_length) for p in pairs]
    rejected = [encode_completion(tokenizer, p.rejected, add_eos, max_completion_length) for p in pairs]
    return prompts, chosen, rejected


def collate_preference(
    pairs: Sequence[PreferencePair],
    tokenizer,
    *,
    max_prompt_length: int | None = None,
    max_completion_length: int | None = None,
    add_bos: bool = True,
    add_eos: bool = True,
) -> dict[str, torch.Tensor | int]:
    """Tokenise B pairs into one (2B, P + C) batch: chosen rows first, then rejected rows.

    Returns ``input_ids``, ``attention_mask``, ``completion_mask``, ``completion_start`` (see the module
    docstring), ``chosen_lengths`` and ``rejected_lengths`` (B,) completion token counts, and ``margin``
    (B,) when every pair has one. ``tokenizer`` follows ``posttrain.tokenizers.base.Tokenizer``. Pairs that
    carry ``tokens`` (from :func:`fit_pairs`, which applied the length caps) are used as they are.
    """
    if not pairs:
        raise ValueError("collate_preference needs at least one pair")
    prompts, chosen, rejected = pair_tokens(
        pairs,
        tokenizer,
        max_prompt_length=max_prompt_length,
        max_completion_length=max_completion_length,
        add_bos=add_bos,
        add_eos=add_eos,
    )
    batch = pack_prompt_completion(prompts + prompts, chosen + rejected, padding_id(tokenizer))
    lengths = batch["completion_mask"].sum(-1)  # (2B,)
    B = len(pairs)
    batch["chosen_lengths"], batch["rejected_lengths"] = lengths[:B], lengths[B:]
    margins = pair_margins(pairs)
    if margins is not None:
        batch["margin"] = margins
    return batch


def pair_margins(pairs: Sequence[PreferencePair]) -> torch.Tensor | None:
    """(B,) float32 margins when every pair has one, else None (a batch is trained with margins or without)."""
    if all(p.margin is not None for p in pairs):
        return torch.tensor([p.margin for p in pairs], dtype=torch.float32)
    return None


def collate_kto(
    examples: Sequence[KTOExample],
    tokenizer,
    *,
    max_prompt_length: int | None = None,
    max_completion_length: int | None = None,
    add_bos: bool = True,
    add_eos: bool = True,
) -> dict[str, torch.Tensor | int]:
    """Tokenise B labelled completions, plus the mismatched batch KTO's KL reference point needs.

    Returns ``input_ids``, ``attention_mask``, ``completion_mask``, ``completion_start``, ``labels`` (B,)
    bool, and the same four layout keys prefixed ``kl_`` for (prompt_i, completion_{(i+1) mod B}):
    pairs that are not answers to their prompts, whose log-ratio averages to an estimate of
    KL(pi || pi_ref) (Ethayarajh et al. 2024, Section 4). A batch of one has no mismatched pair, so its
    KL batch reuses the matched one.
    """
    if not examples:
        raise ValueError("collate_kto needs at least one example")
    if all(e.tokens is not None for e in examples):  # checked and fitted once by fit_kto
        prompts, comps = (list(x) for x in zip(*(e.tokens for e in examples)))
    else:
        prompts = [encode_prompt(tokenizer, e.prompt, add_bos, max_prompt_length) for e in examples]
        comps = [encode_completion(tokenizer, e.completion, add_eos, max_completion_length) for e in examples]
    pad = padding_id(tokenizer)
    batch = pack_prompt_completion(prompts, comps, pad)
    batch["labels"] = torch.tensor([e.label for e in examples], dtype=torch.bool)
    shifted = comps[1:] + comps[:1]
    kl = pack_prompt_completion(prompts, shifted, pad)
    batch.update({f"kl_{k}": v for k, v in kl.items()})
    return batch
