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

Correct, for user data, means the reward spec's *first* term (its verifier: ``math`` in ``math:1.0,format:0.1``)
scores at least 1 on the completion: that is the ``accuracy`` metric of a rollout and the held-out
accuracy on ``--eval-data`` (greedy, as for the embedded task). Without ``--data`` the embedded task is
used as before (exact match against its answers).

:func:`rl_data` is the one entry point a policy-gradient or PPO trainer calls; it returns an object with
``train`` and ``evals`` (rows with ``.prompt`` and ``.answer``), ``score`` (rewards and correctness of a
rollout) and ``evaluate`` (held-out accuracy).

Not handled: per-row sampling weights, multi-turn rollouts (the prompt is rendered once).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from posttrain.chat import is_conversation
from posttrain.data.checks import Located, fit_sequences
from posttrain.data.io import BadLinePolicy, load_records
from posttrain.data.pairs import render_prompt
from posttrain.errors import ConfigError, UserError

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


class _Answer(str):
    """An evaluation 'answer' that is a row: prints as its answer column, carries the row for the verifier."""

    row: PromptRow

    def __new__(cls, row: PromptRow):
        s = super().__new__(cls, row.answer)
        s.row = row
        return s


class TaskData:
    """The embedded arithmetic task, as before: exact match against each problem's answer."""

    def __init__(self, task):
        self.task = task
        self.train, self.evals = task.rl_prompts(), task.eval_problems()

    def score(self, reward_fn, rows: Sequence, completions: list[str], G: int, completion_ids=None):
        from posttrain.tasks.arithmetic import verify

        answers = [r.answer for r in rows for _ in range(G)]
        prompts = [r.prompt for r in rows for _ in range(G)]
        rewards = reward_fn(prompts, completions, answer=answers)
        return rewards, [float(verify(c, a)) for c, a in zip(completions, answers)]

    def evaluate(self, model, tokenizer, *, max_new_tokens: int, keep_samples: int = 0):
        from posttrain.evaluation import evaluate

        return evaluate(
            model,
            tokenizer,
            [p.prompt for p in self.evals],
            [p.answer for p in self.evals],
            max_new_tokens=max_new_tokens,
            keep_samples=keep_samples,
        )


class FileData:
    """User prompt files: rewards from every column, correctness from the reward spec's first term."""

    def __init__(self, train: Located, evals: Located, reward_fn):
        self.train, self.evals, self.reward_fn = train, evals, reward_fn
        terms = getattr(reward_fn, "terms", None)
        if not terms:
            raise ConfigError(
                "user RL data needs a reward spec (e.g. --reward math): its first term decides correctness"
            )
        self.verifier = next(iter(terms))

    def _correct(self, parts: dict) -> list[float]:
        return [float(v >= 1.0 - 1e-9) for v in parts[self.verifier]]

    def score(self, reward_fn, rows: Sequence, completions: list[str], G: int, completion_ids=None):
        """(total rewards, correctness) of G completions per row; ``completion_ids`` (one id list per completion)
        reaches the rewards as a column, as TRL passes it."""
        prompts = [r.prompt for r in rows for _ in range(G)]
        columns = reward_columns(rows, G)
        if completion_ids is not None:
            columns["completion_ids"] = completion_ids
        total, parts = reward_fn.components(prompts, completions, chat_views(rows, completions, G), **columns)
        return total, self._correct(parts)

    def _verify_batch(self, completions: list[str], answers: Sequence[_Answer], completion_ids) -> list[bool]:
        """Correctness of a batch of held-out completions: one call of the reward for the whole batch."""
        rows = [a.row for a in answers]
        columns = {**reward_columns(rows, 1), "completion_ids": completion_ids}
        _, parts = self.reward_fn.components(
            [r.prompt for r in rows], completions, chat_views(rows, completions, 1), **columns
        )
        return [bool(c) for c in self._correct(parts)]

    def evaluate(self, model, tokenizer, *, max_new_tokens: int, keep_samples: int = 0):
        from posttrain.evaluation import evaluate

        return evaluate(
            model,
            tokenizer,
            [r.prompt for r in self.evals],
            [_Answer(r) for r in self.evals],
            max_new_tokens=max_new_tokens,
            keep_samples=keep_samples,
            verify_batch=self._verify_batch,
        )


def _fit(rows: Located, tokenizer, model, max_new_tokens: int, what: str) -> Located:
    """Prompts checked against the tokenizer (unknown characters) and max_seq_len - max_new_tokens (an error)."""
    from posttrain.evaluation import prompt_window

    kept, _ = fit_sequences(
        tokenizer,
        rows,
        lambda r: (r.prompt, []),
        window=prompt_window(model, max_new_tokens),
        long="error",
        what=what,
        generate=max_new_tokens,
        add_eos=False,
    )
    return rows.subset(kept)


def rl_data(
    *,
    task,
    data: str | None,
    eval_data: str | None,
    reward_fn,
    tokenizer,
    model,
    max_new_tokens: int,
    prompt_field: str = "prompt",
    chat=None,
    on_bad_line: BadLinePolicy = "error",
):
    """What an RL trainer samples from and scores with: the embedded ``task`` without ``data``, else the
    user's prompt files (``eval_data`` required: held-out accuracy needs held-out prompts)."""
    if not data and not eval_data:
        return TaskData(task)
    if not (data and eval_data):
        raise UserError(
            "pass both --data (training prompts) and --eval-data (held-out prompts with the columns the "
            "reward reads), or neither for the embedded task"
        )
    loaded = [
        _fit(
            load_prompt_rows(path, prompt_field=prompt_field, chat=chat, on_bad_line=on_bad_line, what=what),
            tokenizer,
            model,
            max_new_tokens,
            what,
        )
        for path, what in ((data, "training"), (eval_data, "evaluation"))
    ]
    return FileData(*loaded, reward_fn)
