"""The embedded default task: verifiable integer arithmetic, ``"37+48="`` -> ``"85"``.

Why this task: the answer is checkable exactly (a verifier, no reward model needed), problems are
free to generate, and a tiny model can learn it on 2 CPU cores in minutes.

The design leaves SFT an honest gap that RL and preference learning can close. Demonstrations are
expensive and prompts are cheap, so by default SFT sees only ``num_demos`` worked answers (a few
hundred), while RL may draw any number of *prompts* from the training split and learns from the
verifier's reward alone. Memorising a few hundred sums does not teach carrying; many verified
attempts can.

Train / held-out split: by a stable hash of the problem text (blake2b, not Python's salted ``hash``),
so a problem is in exactly one split whatever the sampling order, seed or machine; the split can never
overlap. The problem space is enumerated (all operand pairs of the configured size and every
operator), so "held-out" means *never seen in any form* during training.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import cached_property

from posttrain.config import check_fields, knob
from posttrain.errors import ConfigError
from posttrain.hashing import stable_fraction  # noqa: F401  (also imported from here)

ALPHABET = "0123456789+-="

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b}


@dataclass
class ArithmeticConfig:
    digits: int = knob(
        2, "operands are integers in [0, 10**digits) (at most 4: the problem space is enumerated)", ge=1, le=4
    )
    ops: str = knob("+", "operators to use, from '+-' (default: two-digit addition)")
    heldout_fraction: float = knob(0.1, "fraction of the problem space held out (by stable hash)", gt=0, lt=1)
    num_demos: int = knob(320, "SFT demonstrations (prompt + answer) drawn from the train split", gt=0)
    num_eval: int | None = knob(
        None,
        "held-out problems the trainers evaluate on: None = the whole held-out split (1,051 problems by default); N = "
        "a fixed seeded sample of N (256 was the default until 2026-12-03: ~0.03 of binomial sd of its own)",
        gt=0,
    )
    seed: int = knob(0, "seed for choosing demonstrations and evaluation problems")

    def __post_init__(self):
        check_fields(self, "task.")  # bounds and finiteness, from the knobs above
        if not self.ops or any(o not in _OPS for o in self.ops) or len(set(self.ops)) != len(self.ops):
            raise ConfigError(f"task.ops={self.ops!r}: use a non-empty subset of '+-'")


@dataclass(frozen=True)
class Problem:
    prompt: str  # "37+48="
    answer: str  # "85"

    def to_dict(self) -> dict:
        return {"prompt": self.prompt, "answer": self.answer}


def is_heldout(prompt: str, fraction: float) -> bool:
    return stable_fraction("arithmetic-split:" + prompt) < fraction


_LAYOUT = re.compile(r"(\d+)([+-])(\d+)=")


def layout(prompt: str) -> str:
    """The operands' digit counts around the operator: ``"37+4="`` -> ``"2+1"``; ``"other"`` for any other text.

    The layout decides where each digit sits in the sequence. With learned absolute positions a model that has
    learned ``"ab+cd="`` (81 % of two-digit problems) does not get the shifted ``"a+cd="`` for free:
    ``posttrain eval --by-layout`` shows it (docs/outcomes.md).
    """
    m = _LAYOUT.fullmatch(prompt)
    return f"{len(m[1])}{m[2]}{len(m[3])}" if m else "other"


def verify(completion: str, answer: str) -> bool:
    """Exact match after stripping surrounding whitespace: "85" vs "85" -> True, "085" -> False."""
    return completion.strip() == answer.strip()


class ArithmeticTask:
    """All problems of the configured size, split by stable hash; sampling helpers for each stage. One
    implementation of :class:`posttrain.tasks.base.Task` (``demos``, ``prompts``, ``eval_set``, ``verify``)."""

    alphabet = ALPHABET
    name = "arithmetic"
    note = None  # its held-out split is its own: nothing to say

    def __init__(self, cfg: ArithmeticConfig | None = None):
        self.cfg = cfg or ArithmeticConfig()

    @cached_property
    def _splits(self) -> tuple[list[Problem], list[Problem]]:
        n = 10**self.cfg.digits
        train, heldout = [], []
        for op in self.cfg.ops:
            f = _OPS[op]
            for a in range(n):
                for b in range(n):
                    p = Problem(f"{a}{op}{b}=", str(f(a, b)))
                    (heldout if is_heldout(p.prompt, self.cfg.heldout_fraction) else train).append(p)
        if self.cfg.num_eval is not None and len(heldout) < self.cfg.num_eval:
            raise ConfigError(f"task.num_eval={self.cfg.num_eval} exceeds the {len(heldout)} held-out problems")
        if len(train) < self.cfg.num_demos:
            raise ConfigError(f"task.num_demos={self.cfg.num_demos} exceeds the {len(train)} training problems")
        return train, heldout

    @property
    def train_problems(self) -> list[Problem]:
        return self._splits[0]

    @property
    def heldout_problems(self) -> list[Problem]:
        return self._splits[1]

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
        """Every training problem: RL sees the prompts and scores completions with the verifier."""
        return list(self.train_problems)

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
