"""An embedded task of another kind: write a decimal number in base 8, ``"1234="`` -> ``"2322"``.

Why this task: converting between number bases is a multi-step procedure (repeated division by 8, the remainders
read backwards) in which every output digit depends on the whole input, unlike addition's column-by-column sums or
sorting's counts. Every answer is checkable without a reference (:func:`is_octal_of`: the completion read in base 8
is the prompt's number, written without leading zeros), problems are free to generate, and from a few hundred
demonstrations a tiny model barely learns the procedure: SFT leaves a wide gap, one that a short GRPO run did not
start to close (docs/log/2026-12-05-a-second-embedded-task.md). It is the hard end of the embedded tasks the default
recipes, tuned on addition, are measured on (``--task octal``, the same flags otherwise); the second task proper is
:mod:`posttrain.tasks.collatz`.

Problem space: the numbers 0 to ``10**(2 * digits) - 1`` (``digits`` as arithmetic's operands: 10,000 numbers by
default, as many as two-digit addition has problems; answers of up to 5 octal digits), split train / dev / test by
the stable hash of :func:`posttrain.tasks.embedded.split_of` (key ``"octal-split:"``). Prompts and answers use the
characters ``0123456789=``, so the tokenizer and model are arithmetic's.

Not handled: negative numbers, other bases.
"""

from __future__ import annotations

import random
from functools import cached_property

from posttrain.tasks.arithmetic import ALPHABET
from posttrain.tasks.embedded import Problem, TaskConfig, split_problems


def to_octal(n: int) -> str:
    """``n`` >= 0 in base 8 without leading zeros: 1234 -> "2322", 8 -> "10", 0 -> "0"."""
    return format(n, "o")


def is_octal_of(prompt: str, completion: str) -> bool:
    """Whether ``completion`` (stripped) is the prompt's number (``"1234="``) in base 8, checked by reading it back:
    only digits 0-7, no leading zero (but "0" itself), and its value in base 8 is the number.

    Examples, prompt ``"1234="``: ``"2322"`` -> True, ``"02322"`` -> False (a leading zero), ``"2323"`` -> False,
    ``"1234"`` -> False."""
    c = completion.strip()
    if not c or any(ch not in "01234567" for ch in c) or (len(c) > 1 and c[0] == "0"):
        return False
    return int(c, 8) == int(prompt.removesuffix("="))


def verify(completion: str, answer: str) -> bool:
    """Exact match after stripping surrounding whitespace (the answer is the only canonical base-8 form)."""
    return completion.strip() == answer.strip()


class OctalTask:
    """The numbers 0 to 10**(2 * digits) - 1, split by stable hash; the same helpers as
    :class:`posttrain.tasks.arithmetic.ArithmeticTask` (one implementation of :class:`posttrain.tasks.base.Task`)."""

    alphabet = ALPHABET  # the same characters, tokenizer and model as arithmetic (octal uses 0-9 and '=')
    name = "octal"
    instruction = "in base 8"  # before the prompt in the pipeline corpus's documents (pipeline/corpus.py)
    note = None  # its held-out split is its own: nothing to say

    def __init__(self, cfg: TaskConfig | None = None):
        self.cfg = cfg or TaskConfig(name="octal")

    @cached_property
    def _splits(self) -> tuple[list[Problem], list[Problem], list[Problem]]:
        space = (Problem(f"{n}=", to_octal(n)) for n in range(10 ** (2 * self.cfg.digits)))
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
        return len(to_octal(10 ** (2 * self.cfg.digits) - 1))
