"""{prompt, answer} JSONL files: SFT demonstrations and the evaluation sets every trainer and ``posttrain eval`` read.

Each record needs a string ``prompt`` and an ``answer`` that is a string or a number (not a bool; numbers
become their ``str``). The result remembers each pair's line (:class:`~posttrain.data.checks.Located`) so
later checks (unknown characters, the model's window) can name ``file:line``. An empty file is an error.

The prompt may be a conversation (a list of messages, e.g. ending in the user's turn): it is then rendered
with the chat template and its generation prompt (``chat``, :mod:`posttrain.chat`); with a template applied
to everything a string prompt is one user turn. ``on_bad_line="skip"`` sends bad records to
``FILE.rejects.jsonl`` instead of failing (:func:`posttrain.data.io.load_records`).

Not handled: several reference answers per prompt.
"""

from __future__ import annotations

from posttrain.chat import check_messages, is_conversation
from posttrain.data.checks import Located
from posttrain.data.io import BadLinePolicy, load_records
from posttrain.errors import ConfigError, DataError


def render_prompt(chat, prompt, field: str = "prompt"):
    """A prompt field's generation text: a string as given (or a user turn, with a template for everything), a
    conversation rendered with the generation prompt. (text, None) or (None, why the value is bad)."""
    if is_conversation(prompt):
        msgs, reason = check_messages(prompt, field)
        if reason:
            return None, reason
        if chat is None:
            raise ConfigError(
                f"field {field!r} is a conversation, but there is no chat template: the tokenizer has "
                f"none (no chat_template in its tokenizer_config.json); pass --chat-template chatml"
            )
        return chat.prompt_text(msgs), None
    if not isinstance(prompt, str):
        return None, f"field {field!r} must be a string or a list of messages, got {type(prompt).__name__}"
    return (chat.prompt_text(prompt) if chat is not None else prompt), None


def load_pairs(path: str, what: str, *, chat=None, on_bad_line: BadLinePolicy = "error") -> Located:
    """{prompt, answer} JSONL/Parquet -> list of (prompt, answer) pairs that remembers each one's line, with
    file:line errors for bad records. The answer may be a string or a number (not a bool)."""

    def validate(rec):
        a = rec["answer"]
        if (
            not is_conversation(rec["prompt"])
            and not isinstance(rec["prompt"], str)
            or isinstance(a, bool)
            or not isinstance(a, (str, int, float))
        ):
            return None, "'prompt' must be a string (or a list of messages) and 'answer' a string or number"
        p, reason = render_prompt(chat, rec["prompt"])
        return (None, reason) if reason else ((p, str(a)), None)

    items, lines = load_records(
        path, validate, required=("prompt", "answer"), on_bad_line=on_bad_line, what=what, allow_empty=True
    )
    pairs = Located(items, str(path), lines)
    if not pairs:
        raise DataError(f"{path}: no {what} records (the file is empty)")
    return pairs
