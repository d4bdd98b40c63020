"""An embedded task of another kind: one step of the Collatz map, ``"27="`` -> ``"82"``, ``"82="`` -> ``"41"``.

    next(n) = n / 2       if n is even
            = 3n + 1      if n is odd

Why this task: the answer is a branch on the last digit followed by one of two procedures (halving, whose digits
depend on the parity of the digit before each, or tripling with carries of up to 2 and adding one), where addition
is one procedure throughout. Every answer is checkable without a reference (:func:`is_collatz_step`: twice the
completion is the number, or the completion less one is three times it), problems are free to generate, and from a
few hundred demonstrations a tiny model learns it partly, so SFT leaves a gap that verified attempts close in part
(docs/log/2026-12-05-a-second-embedded-task.md). It is the second task the default recipes, tuned on addition, are measured on (``--task
collatz``, the same flags otherwise).

Problem space: the numbers 0 to ``10**(2 * digits) - 1`` (``digits`` as arithmetic's operands: 10,000 numbers by
default, as many as two-digit addition has problems; answers up to 29,998), split train / dev / test by the stable
hash of :func:`posttrain.tasks.embedded.split_of` (key ``"collatz-split:"``). Prompts and answers use the characters
``0123456789=``, so the tokenizer and model are arithmetic's.

Not handled: whole sequences (one step only), negative numbers.
"""

from __future__ import annotations

import random
from functools import cached_property

from posttrain.tasks.arithmetic import ALPHABET
from posttrain.tasks.embedded import Problem, TaskConfig, split_problems


def collatz_step(n: int) -> int:
    """n / 2 for an even n, 3n + 1 for an odd one: 27 -> 82, 82 -> 41, 0 -> 0, 1 -> 4."""
    return n // 2 if n % 2 == 0 else 3 * n + 1


def is_collatz_step(prompt: str, completion: str) -> bool:
    """Whether ``completion`` (stripped) is the Collatz step of the prompt's number (``"27="``), checked backwards
    without computing the step: a canonical decimal c (no sign, no leading zero) with 2c = n for an even n, or
    c - 1 = 3n for an odd one.

    Examples, prompt ``"27="``: ``"82"`` -> True, ``"082"`` -> False, ``"13"`` -> False (27 is odd), ``"81"`` -> False."""
    c, n = completion.strip(), int(prompt.removesuffix("="))
    if not (c.isdigit() and c.isascii()) or (len(c) > 1 and c[0] == "0"):
        return False
    return 2 * int(c) == n if n % 2 == 0 else int(c) - 1 == 3 * n


def verify(completion: str, answer: str) -> bool:
    """Exact match after stripping surrounding whitespace (the answer is the only canonical form)."""
    return completion.strip() == answer.strip()


class CollatzTask:
    """The numbers 0 to 10**(2 * digits) - 1, split by stable hash; the same helpers as
    :class:`posttrain.tasks.arithmetic.ArithmeticTask` (one implementation of :class:`posttrain.tasks.base.Task`)."""

    alphabet = ALPHABET  # the same characters, tokenizer and model as arithmetic (0-9 and '=')
    name = "collatz"
    instruction = "the collatz step of"  # before the prompt in the pipeline corpus's documents (pipeline/corpus.py)
    note = None  # its held-out split is its own: nothing to say

    def __init__(self, cfg: TaskConfig | None = None):
        self.cfg = cfg or TaskConfig(name="collatz")

    @cached_property
    def _splits(self) -> tuple[list[Problem], list[Problem], list[Problem]]:
        space = (Problem(f"{n}=", str(collatz_step(n))) for n in range(10 ** (2 * self.cfg.digits)))
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
        return 2 * self.cfg.digits + 1

    @property
    def max_answer_len(self) -> int:
        return len(str(collatz_step(10 ** (2 * self.cfg.digits) - 1)))
