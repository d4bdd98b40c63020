"""The user's files as the task: ``--data`` to train on, ``--eval-data`` (or a held-out slice of ``--data``) to score.

One implementation of :class:`posttrain.tasks.base.Task`; the embedded arithmetic task is the other. Which one a
run gets is :func:`task_for`'s decision, the same for every trainer: ``--data`` (or ``--model``, which then needs
``--data``) -> :class:`FileTask`, nothing of the arithmetic task; neither -> the embedded task.

The held-out set follows the one rule of :mod:`posttrain.tasks.base`: ``--eval-data``'s problems; else
:meth:`FileTask.hold_out` sets aside the rows of ``--data`` whose prompt hashes below ``HELDOUT_FRACTION`` (they are
not trained on) and prints a note; else no held-out metric, with a note.

Example: ``sft --model mymodel --data chat.jsonl`` (40 conversations, no ``--eval-data``) ->
``FileTask("chat.jsonl")``: demos = the 40 conversations; after encoding, ``hold_out`` keeps ~36 to train on and
``eval_set()`` is the ~4 others as (generation prompt, last reply) problems, scored by exact match.

A fresh model (no ``--tokenizer``, ``--init`` or ``--model``) gets :func:`fresh_tokenizer`'s: on ``--data`` the 256 byte
values, so any text of the user's trains and is scored; the embedded task's characters only on the embedded task.

Not handled: several training files, sampling weights per file.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from posttrain.errors import UserError
from posttrain.tasks.base import exact_match, heldout_note, heldout_split


class FileTask:
    """``--data`` / ``--eval-data`` as a task: items from the file, the held-out set by the one rule, exact match."""

    def __init__(self, data: str, eval_data: str | None = None, *, on_bad_line: str = "error"):
        self.name, self.data, self.eval_data, self.on_bad_line = str(data), data, eval_data, on_bad_line
        self.note: str | None = None
        self._held: list = []

    def demos(self):
        """SFT demonstrations of ``--data``: (prompt, answer) pairs and conversations (a ``Located`` list)."""
        from posttrain.data.conversations import load_sft_data

        return load_sft_data(self.data, on_bad_line=self.on_bad_line)

    def prompts(self, chat=None, prompt_field: str = "prompt"):
        """RL prompt rows of ``--data`` with their other columns (what the rewards read; ``posttrain.tasks.rl``)."""
        from posttrain.data.prompts import load_prompt_rows

        return load_prompt_rows(self.data, prompt_field=prompt_field, chat=chat, on_bad_line=self.on_bad_line)

    def eval_set(self, chat=None) -> Sequence[tuple[str, str]]:
        """``--eval-data``'s (prompt, answer) problems; else what :meth:`hold_out` set aside (empty before it)."""
        if self.eval_data:
            from posttrain.data.pairs import load_pairs

            return load_pairs(self.eval_data, "evaluation", chat=chat, on_bad_line=self.on_bad_line)
        return [p for p in self._held if p is not None]

    def hold_out(self, items: Sequence, key: Callable = lambda x: x[0], as_problem: Callable = tuple) -> list[int]:
        """Indices of ``items`` to train on. Without ``--eval-data`` the held-out slice of them (by ``key``, the
        prompt) becomes :meth:`eval_set` (each through ``as_problem``) and :attr:`note` says so; with it, all."""
        if self.eval_data:
            return list(range(len(items)))
        train, held = heldout_split([str(key(x)) for x in items])
        self._held = [as_problem(items[i]) for i in held]
        self.note = heldout_note(len(held), len(items), self.name)
        return train

    def verify(self, completion: str, answer: str) -> bool:
        return exact_match(completion, answer)


class WithEvalFile:
    """A task whose held-out set is ``--eval-data``'s problems and everything else the wrapped task's (``--eval-data``
    without ``--data``: the embedded task's demonstrations, scored on the user's problems)."""

    def __init__(self, task, eval_data: str, *, on_bad_line: str = "error"):
        self.task, self.files = task, FileTask(eval_data, eval_data, on_bad_line=on_bad_line)
        self.name, self.note = task.name, None

    def demos(self):
        return self.task.demos()

    def prompts(self):
        return self.task.prompts()

    def eval_set(self, chat=None):
        return self.files.eval_set(chat)

    def hold_out(self, items, key=None, as_problem=None) -> list[int]:
        return self.task.hold_out(items, key, as_problem)

    def verify(self, completion: str, answer: str) -> bool:
        return self.task.verify(completion, answer)

    def __getattr__(self, name):  # the embedded task's own helpers (rl_prompts, alphabet, ...)
        return getattr(self.task, name)


def is_user_run(cfg) -> bool:
    """Whether ``cfg`` names the user's data or model (``data`` / ``model_path``): then no embedded task."""
    return bool(getattr(cfg, "data", None) or getattr(cfg, "model_path", None))


def task_for(cfg, what: str = "training data"):
    """The task a trainer config runs on: :class:`FileTask` for ``--data``, the embedded arithmetic task for
    neither ``--data`` nor ``--model`` (scored on ``--eval-data`` where given: :class:`WithEvalFile`); ``--model`` alone is refused (one line naming what to add; with ``--init``
    too, the starting policy's own check names the clash)."""
    if getattr(cfg, "model_path", None) and not getattr(cfg, "data", None) and not getattr(cfg, "init", None):
        raise UserError(
            f"--model {cfg.model_path} needs --data (your {what}): the embedded arithmetic task is for posttrain's "
            "own models (a fresh one, or --init CHECKPOINT)"
        )
    if getattr(cfg, "data", None):
        return FileTask(cfg.data, getattr(cfg, "eval_data", None), on_bad_line=getattr(cfg, "on_bad_line", "error"))
    from posttrain.tasks.embedded import embedded_task

    task, eval_data = embedded_task(cfg.task), getattr(cfg, "eval_data", None)  # arithmetic, or --task sort
    return WithEvalFile(task, eval_data, on_bad_line=getattr(cfg, "on_bad_line", "error")) if eval_data else task


def fresh_tokenizer(task):
    """The tokenizer of a fresh model (no ``--tokenizer``, ``--init`` or ``--model``): on the user's data
    (:class:`FileTask`) the byte-level tokenizer with no merges (259 ids: ``<pad>``, ``<bos>``, ``<eos>`` and the 256
    byte values), so every character of any file trains and is scored and nothing of the embedded task reaches the run;
    on the embedded task its character alphabet (13 characters + 4 specials).

    Example: ``fresh_tokenizer(FileTask("names.jsonl")).encode("Ab")`` -> ``[68, 101]``."""
    if isinstance(task, FileTask):
        from posttrain.tokenizers.bytelevel import byte_tokenizer

        return byte_tokenizer()
    from posttrain.tasks.arithmetic import ALPHABET
    from posttrain.tokenizers.char import CharTokenizer

    return CharTokenizer(ALPHABET)
