"""What a trainer needs from "the data": the :class:`Task` protocol, and the one rule for the held-out set.

A trainer asks its task for

- training items: ``demos()`` (SFT: ``(prompt, answer)`` pairs or conversations) or ``prompts()`` (RL: rows with
  ``.prompt`` and ``.answer``);
- ``eval_set(chat)``: the held-out ``(prompt, answer)`` problems scored by greedy generation, empty for none;
- ``hold_out(items, key)``: the indices of the (encoded) items to train on; a task without a held-out set of its
  own keeps the rest as its ``eval_set``;
- ``verify(completion, answer)``: whether a completion is right (exact match after stripping, for both tasks here);
- ``note``: one line to print at the start of a run about where the held-out set came from (None: nothing to say).

Two implementations, no base class: :class:`posttrain.tasks.arithmetic.ArithmeticTask` (the embedded task:
free problems, every answer checkable, a hashed held-out split of the whole problem space) and
:class:`posttrain.tasks.files.FileTask` (the user's ``--data`` / ``--eval-data``). Preference pairs are the
trainers' own (the embedded task's are sampled from the starting model; a user's come from ``--data``).

The one rule, the same for sft, rm, dpo, grpo and ppo: a run on the user's model or data (``--data`` or
``--model``) takes nothing from the embedded task. Its held-out set is ``--eval-data``; else a held-out slice of
``--data`` (:func:`heldout_split`: the rows whose prompt hashes below :data:`HELDOUT_FRACTION`, which are then not
trained on), with a note; else (too few rows to spare one) there is no held-out metric, with a note. ``--model``
without ``--data`` is refused: the embedded task's prompts are for posttrain's own small models.

Worked example: 40 demonstrations, no ``--eval-data`` -> the ~4 whose prompt hashes below 0.1 are held out (every
row with the same prompt goes the same way, so none is both trained on and scored), 36 are trained on, and the
run prints ``note: no --eval-data: held-out accuracy on 4 of the 40 rows of d.jsonl (not trained on)``.

Not handled: a held-out slice chosen by anything but the prompt (e.g. by topic), k-fold evaluation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from posttrain.hashing import stable_fraction

USER_FIELDS = ("data", "model_path")
"""Config fields that name the user's data or model: either set, nothing of the embedded task is read (its settings
are declared ``knob(..., unused_with=USER_FIELDS)`` and left out of the printed and saved config)."""
USER_REWARD = "exact_match:1.0"
"""grpo's and ppo's reward on ``--data`` unless ``--reward`` says otherwise: exact match with the answer column (the
embedded task's default adds ``digits:0.5``, partial credit per digit of an arithmetic answer)."""
HELDOUT_FRACTION = 0.1
"""Share of ``--data``'s rows held out for evaluation when no ``--eval-data`` is given (by a stable hash of the
prompt). The same 10 % the embedded task holds out of its problem space."""
MIN_TRAIN = 2
"""Rows that must remain to train on after the held-out slice; fewer, and nothing is held out."""


@runtime_checkable
class Task(Protocol):
    """What a trainer reads from its data; see the module docstring."""

    name: str
    note: str | None

    def demos(self) -> Sequence: ...

    def prompts(self) -> Sequence: ...

    def eval_set(self, chat=None) -> Sequence[tuple[str, str]]: ...

    def hold_out(self, items: Sequence, key=None, as_problem=None) -> list[int]: ...

    def verify(self, completion: str, answer: str) -> bool: ...


def exact_match(completion: str, answer: str) -> bool:
    """Exact match after stripping surrounding whitespace: ``"85 "`` vs ``"85"`` -> True, ``"085"`` -> False."""
    return completion.strip() == str(answer).strip()


def heldout_split(keys: Sequence[str], fraction: float = HELDOUT_FRACTION) -> tuple[list[int], list[int]]:
    """Indices (train, held out) of rows keyed by their prompt: held out are those with
    ``stable_fraction("heldout:" + key) < fraction``, or, where that picks none, the one row with the smallest hash
    (so that 10 rows still give one held-out problem); nothing when fewer than :data:`MIN_TRAIN` rows would remain.
    Rows with equal keys always fall on the same side.

    Example: keys ["a", "b", "a"] -> the two "a" rows together on one side, "b" on its own.
    """
    h = [stable_fraction("heldout:" + k) for k in keys]
    held = [i for i, x in enumerate(h) if x < fraction]
    if not held and keys:
        low = min(h)
        held = [i for i, x in enumerate(h) if x == low]
    if len(keys) - len(held) < MIN_TRAIN:
        return list(range(len(keys))), []
    chosen = set(held)
    return [i for i in range(len(keys)) if i not in chosen], held


def heldout_note(n_held: int, n_rows: int, data: str, metric: str = "held-out accuracy") -> str:
    """The line a run prints when its held-out set is a slice of ``--data`` (or when there is none)."""
    if n_held == 0:
        return f"note: no --eval-data and {data} has too few rows ({n_rows}) to hold any out: no {metric}"
    return f"note: no --eval-data: {metric} on {n_held} of the {n_rows} rows of {data} (not trained on)"
