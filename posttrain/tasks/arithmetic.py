"""The embedded default task: verifiable integer arithmetic, ``"37+48="`` -> ``"85"``.

Why this task: the answer is checkable exactly (a verifier, no reward model needed), problems are
free to generate, and a tiny model can learn it on 2 CPU cores in minutes.

The design leaves SFT an honest gap that RL and preference learning can close. Demonstrations are
expensive and prompts are cheap, so by default SFT sees only ``num_demos`` worked answers (a few
hundred), while RL may draw any number of *prompts* from the training split and learns from the
verifier's reward alone. Memorising a few hundred sums does not teach carrying; many verified
attempts can.

Three splits, train / dev / test, by one stable hash of the problem text (blake2b, not Python's salted
``hash``; :func:`posttrain.tasks.embedded.split_of`), so a problem is in exactly one split whatever the
sampling order, seed or machine. Demonstrations and RL prompts come from train; every choice (SFT restarts,
sweeps) is made on dev; test is the held-out split the results are reported on (1,051 problems by default,
the same since before dev existed). The problem space is enumerated (all operand pairs of the configured
size and every operator), so "held-out" means *never seen in any form* during training or selection.
"""

from __future__ import annotations

import random
from functools import cached_property

from posttrain.hashing import stable_fraction
from posttrain.tasks.embedded import Problem, TaskConfig, split_problems
from posttrain.tasks.embedded import operand_layout as layout  # noqa: F401  (imported from here: eval --by-layout)

ALPHABET = "0123456789+-="

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b}


ArithmeticConfig = TaskConfig  # the embedded task's settings (posttrain/tasks/embedded.py), under their old name


def is_heldout(prompt: str, fraction: float) -> bool:
    """In the test split (the held-out problems): the lowest ``fraction`` of the hash of :func:`split_of`."""
    return stable_fraction("arithmetic-split:" + prompt) < fraction


def verify(completion: str, answer: str) -> bool:
    """Exact match after stripping surrounding whitespace: "85" vs "85" -> True, "085" -> False."""
    return completion.strip() == answer.strip()


class ArithmeticTask:
    """All problems of the configured size, split by stable hash; sampling helpers for each stage. One
    implementation of :class:`posttrain.tasks.base.Task` (``demos``, ``prompts``, ``eval_set``, ``verify``)."""

    alphabet = ALPHABET
    name = "arithmetic"
    instruction = ""  # its documents in the pipeline corpus are "Q: 37+48= A: 85" (pipeline/corpus.py)
    note = None  # its held-out split is its own: nothing to say

    def __init__(self, cfg: ArithmeticConfig | None = None):
        self.cfg = cfg or ArithmeticConfig()

    @cached_property
    def _splits(self) -> tuple[list[Problem], list[Problem], list[Problem]]:
        n = 10**self.cfg.digits
        space = (
            Problem(f"{a}{op}{b}=", str(_OPS[op](a, b))) for op in self.cfg.ops for a in range(n) for b in range(n)
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
        """What the trainers evaluate on: every held-out problem (``num_eval=None``), or a fixed seeded sample of
        ``num_eval`` of them."""
        if self.cfg.num_eval is None:
            return list(self.heldout_problems)
        return random.Random(f"eval:{self.cfg.seed}").sample(self.heldout_problems, self.cfg.num_eval)

    def rl_prompts(self) -> list[Problem]:
        """Every problem of the train split (not dev, not test): RL sees the prompts and scores completions with
        the verifier."""
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
        return 2 * self.cfg.digits + 2

    @property
    def max_answer_len(self) -> int:
        return self.cfg.digits + 1
