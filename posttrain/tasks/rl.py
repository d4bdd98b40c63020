"""What grpo and ppo sample from and score with: the embedded task's prompts, or the user's prompt rows.

:func:`rl_data` is the one entry point an RL trainer calls; it returns an object with ``train`` and ``evals``
(rows with ``.prompt`` and ``.answer``), ``score`` (rewards and correctness of a rollout) and ``evaluate``
(held-out accuracy). Which one follows the rule of :mod:`posttrain.tasks.base`:

- no ``--data``: :class:`TaskData`, the embedded arithmetic task (its training prompts, its held-out problems,
  exact match against each problem's answer);
- ``--data``: :class:`FileData`, the user's rows (:mod:`posttrain.data.prompts` reads them); held out are
  ``--eval-data``'s rows, else a held-out slice of ``--data``'s (not trained on, with a note), else none.

Correct, for user data, means the reward spec's *first* term (its verifier: ``math`` in ``math:1.0,format:0.1``)
scores at least 1 on the completion: that is the ``accuracy`` metric of a rollout and the held-out accuracy
(greedy, as for the embedded task).

Not handled: per-row sampling weights, multi-turn rollouts (the prompt is rendered once).
"""

from __future__ import annotations

from collections.abc import Sequence

from posttrain.data.checks import Located, fit_sequences
from posttrain.data.prompts import PromptRow, chat_views, load_prompt_rows, reward_columns
from posttrain.errors import ConfigError, UserError
from posttrain.tasks.base import heldout_note, heldout_split


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
    on_bad_line: str = "error",
):
    """What an RL trainer (grpo, ppo) samples from and scores with: the embedded ``task`` without ``data``; else the
    user's prompt rows (``posttrain.data.prompts``), held out by the one rule: ``eval_data``'s rows, else a
    held-out slice of ``data``'s (not trained on, with a note), else none (a note says so). Correct = the reward
    spec's first term scores >= 1, on the training rollouts and the held-out prompts alike."""
    if not data:
        if eval_data:
            raise UserError("--eval-data needs --data (the training prompts), or neither for the embedded task")
        return TaskData(task)

    def load(path, what):
        rows = load_prompt_rows(path, prompt_field=prompt_field, chat=chat, on_bad_line=on_bad_line, what=what)
        return _fit(rows, tokenizer, model, max_new_tokens, what)

    train = load(data, "training")
    if eval_data:
        return FileData(train, load(eval_data, "evaluation"), reward_fn)
    keep, held = heldout_split([r.prompt for r in train])
    print(heldout_note(len(held), len(train), str(data)))
    return FileData(train.subset(keep), train.subset(held), reward_fn)
