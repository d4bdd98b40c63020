"""SFT data: ``{prompt, completion}`` / ``{prompt, answer}`` pairs and ``{messages: [...]}`` conversations.

One JSONL or Parquet file may hold any of these records (each line is read by its own fields):

    {"prompt": "2+3=", "answer": "5"}                                   plain strings (the answer may be a number)
    {"prompt": "2+3=", "completion": "5"}                               the same, TRL's field name
    {"messages": [{"role": "user", "content": "2+3="},
                  {"role": "assistant", "content": "5"}]}               a conversation: loss on every assistant turn
    {"prompt": [{"role": "user", ...}], "completion": [{"role": "assistant", ...}]}
                                                                        conversational prompt-completion: loss on
                                                                        the completion's turns only

Key insight: a conversation's loss mask is the chat template's (:meth:`posttrain.chat.Chat.encode`, rendered
prefix by prefix), so only the tokens of assistant replies (and their end markers) are trained on. Plain
string pairs keep posttrain's layout ``[BOS] prompt | answer [EOS]`` unless the template is applied to
everything (``--chat-template chatml``/``tokenizer``/FILE), when a pair is one user turn and one reply.

Bad records (a missing field, a wrong type, an empty conversation, an unknown role, no assistant turn, a
conversation whose last turn is the user's) are ``FILE:LINE: ...`` errors, or with ``--on-bad-line skip`` go to ``FILE.rejects.jsonl``
(:func:`posttrain.data.io.load_records`). Conversations are checked against the model's window like pairs
(``--long``: ``truncate`` keeps a conversation's first tokens).

Not handled: packing several conversations into one sequence, per-turn loss weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posttrain.chat import check_messages, is_conversation
from posttrain.data.checks import FieldEncoder, LengthPolicy, Located, where
from posttrain.data.io import BadLinePolicy, load_records
from posttrain.errors import ConfigError


@dataclass(frozen=True)
class ChatDemo:
    """A conversation to train on; assistant messages from index ``train_from`` on carry the loss."""

    messages: list
    train_from: int = 0


def _answer_value(v, field: str):
    if isinstance(v, str):
        return v, None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return str(v), None
    return None, f"field {field!r} must be a string or a number, got {type(v).__name__}"


def validate_sft(rec: dict):
    """One SFT record -> ((prompt, answer) strings | ChatDemo, None), or (None, why it is bad)."""
    if "messages" in rec:
        msgs, reason = check_messages(rec["messages"], "messages", need_assistant=True)
        if reason is None and msgs[-1]["role"] == "user":
            reason = "the conversation ends with a user turn, which nothing answers (end it with the assistant's reply)"
        return (None, reason) if reason else (ChatDemo(msgs, 0), None)
    if "prompt" not in rec:
        return None, "needs a 'messages' conversation, or 'prompt' and 'completion' (or 'answer')"
    field = "completion" if "completion" in rec else "answer" if "answer" in rec else None
    if field is None:
        return None, "missing field 'answer' (needs prompt, answer)"
    p, c = rec["prompt"], rec[field]
    if not is_conversation(p) and not is_conversation(c):
        if not isinstance(p, str):
            return None, f"field 'prompt' must be a string or a list of messages, got {type(p).__name__}"
        a, reason = _answer_value(c, field)
        return (None, reason) if reason else ((p, a), None)
    prompt, reason = check_messages(p, "prompt") if is_conversation(p) else (None, None)
    if reason:
        return None, reason
    if prompt is None:
        if not isinstance(p, str):
            return None, f"field 'prompt' must be a string or a list of messages, got {type(p).__name__}"
        prompt = [{"role": "user", "content": p}]
    if is_conversation(c):
        comp, reason = check_messages(c, field, need_assistant=True, last="assistant")
    else:
        a, reason = _answer_value(c, field)
        comp = [{"role": "assistant", "content": a}] if reason is None else None
    return (None, reason) if reason else (ChatDemo(prompt + comp, len(prompt)), None)


def load_sft_data(path: str, what: str = "training", *, on_bad_line: BadLinePolicy = "error") -> Located:
    """SFT records of a JSONL/Parquet file: (prompt, answer) string pairs and :class:`ChatDemo` conversations,
    in a ``Located`` list (each remembers its line)."""
    items, lines = load_records(path, validate_sft, on_bad_line=on_bad_line, what=what)
    return Located(items, str(path), lines)


def needs_chat(demos, chat) -> bool:
    """Whether the demonstrations go through the chat path (a conversation, or a template for everything)."""
    return any(isinstance(d, ChatDemo) for d in demos) or (chat is not None and chat.wrap_strings)


def _need_template(loc: str):
    return ConfigError(
        f"{loc}: a conversation, but no chat template: the tokenizer has none (no chat_template in "
        f"its tokenizer_config.json); pass --chat-template chatml (or a .jinja file)"
    )


def encode_demo(tokenizer, chat, demo, loc: str) -> tuple[list[int], list[int], tuple[str, str]]:
    """(ids, loss mask, (generation prompt, last reply)) of one demonstration."""
    if isinstance(demo, tuple) and (chat is None or not chat.wrap_strings):
        p, a = demo
        bos = [int(tokenizer.bos_id)] if tokenizer.bos_id is not None else []
        eos = [int(tokenizer.eos_id)] if tokenizer.eos_id is not None else []
        pi, ai = bos + list(tokenizer.encode(p)), list(tokenizer.encode(a)) + eos
        return pi + ai, [0] * len(pi) + [1] * len(ai), (p, a)
    if chat is None:
        raise _need_template(loc)
    if isinstance(demo, tuple):
        demo = ChatDemo([{"role": "user", "content": demo[0]}, {"role": "assistant", "content": demo[1]}], 1)
    ids, mask = chat.encode(demo.messages, demo.train_from)
    last = max(k for k, m in enumerate(demo.messages) if m["role"] == "assistant")
    return ids, mask, (chat.render(demo.messages[:last], add_generation_prompt=True), demo.messages[last]["content"])


def fit_chat_demos(tokenizer, demos, chat, *, window: int | None, long: str = "error", what: str = "training"):
    """Encode and check demonstrations on the chat path -> (kept (prompt, answer) pairs for validation, a
    ``Located`` list; ids (n, L) right-padded; loss mask (n, L)). Unknown characters as in
    :mod:`posttrain.data.checks`; longer than ``window``: the ``long`` policy (truncate keeps the start)."""
    source = getattr(demos, "source", None)
    enc, pol = FieldEncoder(tokenizer, what, source), LengthPolicy(long, window, what, source)
    kept, seqs = [], []
    for i, demo in enumerate(demos):
        loc = where(demos, i)
        ids, mask, pair = encode_demo(tokenizer, chat, demo, loc)
        enc._count(pair[1] or " ", ids, "messages" if isinstance(demo, ChatDemo) else "answer", i, loc)
        if window is not None and len(ids) > window:
            pol.too_long(loc, f"the sequence is {len(ids)} tokens")
            if long == "skip":
                continue
            ids, mask = ids[:window], mask[:window]
        if not any(mask[1:]):
            pol.skipped.append(loc)  # nothing left to learn from once cut (or an empty reply)
            continue
        kept.append(i)
        seqs.append((ids, mask, pair))
    enc.finish()
    pol.finish(len(kept))
    width = max(len(s[0]) for s in seqs)
    pad = tokenizer.pad_id if tokenizer.pad_id is not None else 0
    ids_t = torch.full((len(seqs), width), int(pad), dtype=torch.long)
    mask_t = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, (ids, mask, _) in enumerate(seqs):
        ids_t[r, : len(ids)] = torch.tensor(ids)
        mask_t[r, : len(mask)] = torch.tensor(mask)
    lines = [demos.lines[i] for i in kept] if isinstance(demos, Located) and demos.lines is not None else None
    return Located([s[2] for s in seqs], source, lines), ids_t, mask_t


CHAT_TEMPLATE_HELP = (
    "chat template for conversation data: auto (the tokenizer's own, conversations only) | tokenizer "
    "(its own, for string prompts too) | chatml | none | a .jinja file (docs/your_data.md)"
)
BAD_LINE_HELP = "a malformed data record: error (FILE:LINE, exit 2) or skip (to FILE.rejects.jsonl, counted)"
