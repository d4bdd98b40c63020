"""The second embedded task: sort the digits of a short string, ``"3141="`` -> ``"1134"``.

Why this task: it is of another kind than arithmetic (a permutation of the input, no carrying, every output
digit depends on the whole input), every answer is checkable without a reference (a completion is right iff it is
non-decreasing and a permutation of the prompt's digits: :func:`is_sorted_permutation`), and problems are free to
generate. A tiny model learns it from a few hundred demonstrations almost alone, so SFT leaves little for RL to
gain: it is the easy end beside :mod:`posttrain.tasks.collatz` (the second task, a partial gap) and
:mod:`posttrain.tasks.octal` (a wide one), checking that the default recipes, tuned on arithmetic, do no harm where
SFT already succeeds (``--task sort``, the same flags otherwise).

Problem space: every string of 2 to ``sort_length`` digits (11,100 for the default 4), split train / dev / test by
the stable hash of :func:`posttrain.tasks.embedded.split_of` (key ``"sort-split:"``), as arithmetic is. Strings of
different lengths share the characters ``0123456789=`` with arithmetic's problems, so the tokenizer and model are
the same.

Not handled: strings longer than 5 digits (the space is enumerated), other orders (descending, by key).
"""

from __future__ import annotations

import random
from collections import Counter
from functools import cached_property
from itertools import product

from posttrain.tasks.arithmetic import ALPHABET
from posttrain.tasks.embedded import Problem, TaskConfig, split_problems


def sort_answer(digits: str) -> str:
    """The digits in ascending order: ``"3141"`` -> ``"1134"``; leading zeros kept: ``"90"`` -> ``"09"``."""
    return "".join(sorted(digits))


def is_sorted_permutation(prompt: str, completion: str) -> bool:
    """Whether ``completion`` (stripped) is the digits of ``prompt`` (less its ``=``) in ascending order, checked
    without computing the answer: non-decreasing, and the same multiset of digits.

    Examples, prompt ``"3141="``: ``"1134"`` -> True, ``"1143"`` -> False (not sorted), ``"1234"`` -> False (another
    multiset), ``"134"`` -> False (a digit lost)."""
    c, digits = completion.strip(), prompt.removesuffix("=")
    return c.isdigit() and c.isascii() and all(a <= b for a, b in zip(c, c[1:])) and Counter(c) == Counter(digits)


def verify(completion: str, answer: str) -> bool:
    """Exact match after stripping surrounding whitespace (the answer is the only sorted permutation)."""
    return completion.strip() == answer.strip()


class SortTask:
    """Every digit string of 2 to ``sort_length`` digits, split by stable hash; the same helpers as
    :class:`posttrain.tasks.arithmetic.ArithmeticTask` (one implementation of :class:`posttrain.tasks.base.Task`)."""

    alphabet = ALPHABET  # the same characters, tokenizer and model as arithmetic (sort uses 0-9 and '=')
    name = "sort"
    instruction = "sort the digits"  # before the prompt in the pipeline corpus's documents (pipeline/corpus.py)
    note = None  # its held-out split is its own: nothing to say

    def __init__(self, cfg: TaskConfig | None = None):
        self.cfg = cfg or TaskConfig(name="sort")

    @cached_property
    def _splits(self) -> tuple[list[Problem], list[Problem], list[Problem]]:
        space = (
            Problem(s + "=", sort_answer(s))
            for n in range(2, self.cfg.sort_length + 1)
            for s in map("".join, product("0123456789", repeat=n))
        )
        return split_problems(space, self.cfg)  # (train, dev, test): posttrain/tasks/embedded.py

    @property
    def train_problems(self) -> list[Problem]:
        """The train split: demonstrations and RL prompts come from here only."""
        return self._splits[0]

    @property
    def dev_problems(self) -> list[Problem]:
        """The dev split: what SFT restarts are ranked on and sweeps choose on; never trained on."""
        return self._splits[1]

    @property
    def heldout_problems(self) -> list[Problem]:
        """The test split (held out): reported, never used to choose."""
        return self._splits[2]

    def demonstrations(self) -> list[Problem]:
        """The ``num_demos`` SFT examples: a seeded sample of the train split (the only answers SFT sees)."""
        return random.Random(f"demos:{self.cfg.seed}").sample(self.train_problems, self.cfg.num_demos)

    def eval_problems(self) -> list[Problem]:
        """Every test problem (``num_eval=None``), or a fixed seeded sample of ``num_eval`` of them."""
        if self.cfg.num_eval is None:
            return list(self.heldout_problems)
        return random.Random(f"eval:{self.cfg.seed}").sample(self.heldout_problems, self.cfg.num_eval)

    def rl_prompts(self) -> list[Problem]:
        """Every problem of the train split: RL sees the prompts and scores completions with the verifier."""
        return list(self.train_problems)

    def dev_set(self) -> list[tuple[str, str]]:
        """The dev split's (prompt, answer) problems, in enumeration order."""
        return [(p.prompt, p.answer) for p in self.dev_problems]

    # the Task protocol (posttrain/tasks/base.py)
    def demos(self) -> list[tuple[str, str]]:
        return [(p.prompt, p.answer) for p in self.demonstrations()]

    def prompts(self) -> list[Problem]:
        return self.rl_prompts()

    def eval_set(self, chat=None) -> list[tuple[str, str]]:
        return [(p.prompt, p.answer) for p in self.eval_problems()]

    def hold_out(self, items, key=None, as_problem=None) -> list[int]:
        """Every item trains: the held-out problems are a split of the problem space, never of the demonstrations."""
        return list(range(len(items)))

    def verify(self, completion: str, answer: str) -> bool:
        return verify(completion, answer)

    @property
    def max_prompt_len(self) -> int:
        return self.cfg.sort_length + 1

    @property
    def max_answer_len(self) -> int:
        return self.cfg.sort_length
