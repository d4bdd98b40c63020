"""RL data (GRPO, PPO): a prompt per row, and every other column handed to the reward functions by name.

    {"question": "Natalia sold 48 clips ...", "answer": "... #### 72", "level": 2}
    --data train.jsonl --prompt-field question --reward math
    -> reward_fn(prompts, completions, answer=[...], level=[...])      one value per completion (G per prompt)

The prompt field (``--prompt-field``, default ``prompt``) is a string or a conversation; a conversation is
rendered with the chat template and its generation prompt (:mod:`posttrain.chat`), and with a template
applied to everything a string is one user turn. What the reward functions get follows TRL:

    conversational row  -> a Python reward (``file.py:fn``) gets prompts[i] = the row's message list and
                           completions[i] = [{"role": "assistant", "content": text}]
    plain-string row    -> prompts[i] = the prompt text the model saw, completions[i] = the completion text
    built-in rewards    -> always text (the verifiers parse it; the reward model scores what the policy saw)

plus ``completion_ids`` (each completion's token ids, EOS included when sampled) and the other columns as they
are in the file (JSON values, Parquet values), repeated for the G samples of each prompt; the prompt field itself
is not passed again. Columns named ``prompts``, ``completions`` or ``completion_ids`` would collide with the reward
API's arguments and are refused. Held-out scoring calls the reward once per batch of completions.

This module reads and shapes the rows; scoring and held-out evaluation (what is correct, which rows are held
out) are the task's: :mod:`posttrain.tasks.rl` (``rl_data``), so nothing here imports evaluation.

Not handled: per-row sampling weights, multi-turn rollouts (the prompt is rendered once).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from posttrain.chat import is_conversation
from posttrain.data.checks import Located
from posttrain.data.io import BadLinePolicy, load_records
from posttrain.data.pairs import render_prompt
from posttrain.errors import ConfigError

RESERVED_COLUMNS = ("prompts", "completions", "completion_ids")


@dataclass(frozen=True)
class PromptRow:
    """One RL prompt: the text the model is prompted with, the row's other columns by name, and the prompt's
    message list when the file gave a conversation (None for a plain string)."""

    prompt: str
    columns: dict = field(default_factory=dict)
    messages: list | None = None

    @property
    def answer(self) -> str:
        """What a printed sample shows as the reference: the ``answer`` column, if any."""
        a = self.columns.get("answer")
        return "" if a is None else str(a)


def load_prompt_rows(
    path: str, *, prompt_field: str = "prompt", chat=None, on_bad_line: BadLinePolicy = "error", what: str = "training"
) -> Located:
    """The rows of a JSONL/Parquet prompt file as :class:`PromptRow` (a ``Located`` list); a missing or
    malformed prompt is ``FILE:LINE: ...`` (or, with ``on_bad_line="skip"``, a line of FILE.rejects.jsonl)."""

    def validate(rec):
        clash = [k for k in RESERVED_COLUMNS if k in rec]
        if clash:
            raise ConfigError(
                f"column {clash[0]!r} collides with the reward functions' argument of that name; rename it"
            )
        text, reason = render_prompt(chat, rec[prompt_field], prompt_field)
        if reason:
            return None, reason
        if not text.strip():
            return None, f"field {prompt_field!r} is empty"
        msgs = rec[prompt_field] if is_conversation(rec[prompt_field]) else None
        return PromptRow(text, {k: v for k, v in rec.items() if k != prompt_field}, msgs), None

    items, lines = load_records(path, validate, required=(prompt_field,), on_bad_line=on_bad_line, what=what)
    return Located(items, str(path), lines)


def reward_columns(rows: Sequence, G: int) -> dict[str, list]:
    """{column: [value for each of the G samples of each row]} over the union of the rows' columns."""
    names = list(dict.fromkeys(k for r in rows for k in r.columns))
    return {k: [r.columns.get(k) for r in rows for _ in range(G)] for k in names}


def chat_views(rows: Sequence, completions: list[str], G: int) -> tuple[list, list] | None:
    """What a Python reward gets for the G samples of each row, as TRL hands them: a conversational row's
    prompt as its message list and each completion as ``[{"role": "assistant", "content": text}]``; a plain
    row's prompt and completion as text. None when no row is conversational (the text is all there is).

    Example: rows [PromptRow("<|im_start|>user\nHi...", messages=[{"role": "user", "content": "Hi"}])], G=1,
    completions ["Hello"] -> ([[{"role": "user", "content": "Hi"}]], [[{"role": "assistant", "content": "Hello"}]]).
    """
    if not any(r.messages is not None for r in rows):
        return None
    prompts = [r.messages if r.messages is not None else r.prompt for r in rows for _ in range(G)]
    chat_rows = [r.messages is not None for r in rows for _ in range(G)]
    outs = [[{"role": "assistant", "content": c}] if conv else c for c, conv in zip(completions, chat_rows)]
    return prompts, outs


def completion_id_lists(gen) -> list[list[int]]:
    """Each completion's token ids (the sampled ones: EOS included when it was drawn, padding dropped)."""
    return [
        [t for t, keep in zip(row, m) if keep]
        for row, m in zip(gen.completion_ids.tolist(), gen.completion_mask.tolist())
    ]
