"""The embedded tasks' settings, their three splits, and which task a name gives.

Two embedded tasks, each a whole problem space that is enumerated and split by a stable hash of the prompt
(blake2b, not Python's salted ``hash``), so a problem lies in exactly one split whatever the seed, the order or the
machine:

    h = stable_fraction(f"{name}-split:{prompt}")
    test  if h < heldout_fraction                       reported, never used to choose anything
    dev   if h < heldout_fraction + dev_fraction        every choice: ranking SFT restarts, picking a checkpoint,
                                                        the prompt filter's thresholds, a sweep's recipe
    train otherwise                                     SFT demonstrations (a seeded sample) and RL prompts (all)

Worked numbers (two-digit addition, the defaults 0.1 / 0.1): 10,000 problems -> test 1,051 (the held-out split the
results have always been reported on: the test range of the hash is unchanged), dev 992, train 7,957, of which
320 are SFT's demonstrations.

The tasks: ``arithmetic`` (:mod:`posttrain.tasks.arithmetic`, ``"37+48="`` -> ``"85"``), ``collatz``
(:mod:`posttrain.tasks.collatz`, ``"27="`` -> ``"82"``: a branch and two procedures, the second task the defaults are
measured on), ``octal`` (:mod:`posttrain.tasks.octal`, ``"1234="`` -> ``"2322"``: a procedure SFT barely starts) and
``sort`` (:mod:`posttrain.tasks.sort`, ``"3141="`` -> ``"1134"``: one SFT learns almost alone); ``--task NAME``
(the ``task.name`` field) chooses, for
sft, rm, dpo, grpo, ppo and the pipeline alike, with the same recipes. Both write their problems with the characters
``0123456789+-=``, so the tokenizer and the model are the same whichever task is trained.

Not handled: a split by anything but the prompt (e.g. by answer), tasks outside the enumerated space.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass

from posttrain.config import check_fields, knob
from posttrain.errors import ConfigError
from posttrain.hashing import stable_fraction

TASK_NAMES = ("arithmetic", "collatz", "octal", "sort")
SPLITS = ("train", "dev", "test")
_OPS = "+-"


@dataclass
class TaskConfig:
    """The embedded task: which one, its size, its splits and how many demonstrations SFT sees."""

    name: str = knob(
        "arithmetic",
        "the embedded task: arithmetic (integer sums, '37+48=' -> '85'), collatz (one step of the Collatz map, "
        "'27=' -> '82'), octal (a number in base 8, '1234=' -> '2322') or sort (the digits of a string in "
        "ascending order, '3141=' -> '1134')",
        choices=TASK_NAMES,
        flag="--task",
    )
    digits: int = knob(
        2,
        "arithmetic: operands are integers in [0, 10**digits) (at most 4: the problem space is enumerated); "
        "collatz and octal: the numbers in [0, 10**(2 * digits)) (at most 3)",
        ge=1,
        le=4,
    )
    ops: str = knob("+", "arithmetic: operators to use, from '+-' (default: two-digit addition)")
    sort_length: int = knob(
        4, "sort: the longest digit string (every string of 2 to sort_length digits is a problem)", ge=2, le=5
    )
    heldout_fraction: float = knob(
        0.1, "fraction of the problem space in the test split (held out, reported only; by stable hash)", gt=0, lt=1
    )
    dev_fraction: float = knob(
        0.1,
        "fraction of the problem space in the dev split (by the same hash; what every choice is made on: SFT "
        "restarts, checkpoints, sweeps); never trained on",
        gt=0,
        lt=1,
    )
    num_demos: int = knob(320, "SFT demonstrations (prompt + answer) drawn from the train split", gt=0)
    num_eval: int | None = knob(
        None,
        "test problems the trainers evaluate on: None = the whole test split (1,051 problems by default); N = "
        "a fixed seeded sample of N (256 was the default until 2026-12-03: ~0.03 of binomial sd of its own)",
        gt=0,
    )
    seed: int = knob(0, "seed for choosing demonstrations and evaluation problems")

    def __post_init__(self):
        check_fields(self, "task.")  # bounds and finiteness, from the knobs above
        if self.name not in TASK_NAMES:  # the Python API is checked like the CLI
            raise ConfigError(f"task.name={self.name!r}: use one of {', '.join(TASK_NAMES)}")
        if not self.ops or any(o not in _OPS for o in self.ops) or len(set(self.ops)) != len(self.ops):
            raise ConfigError(f"task.ops={self.ops!r}: use a non-empty subset of '+-'")
        if self.name in ("collatz", "octal") and self.digits > 3:
            raise ConfigError(
                f"task.digits={self.digits} with task.name={self.name}: at most 3 (10**6 numbers, enumerated)"
            )
        if self.heldout_fraction + self.dev_fraction >= 1:
            raise ConfigError(
                f"task.heldout_fraction + task.dev_fraction = {self.heldout_fraction + self.dev_fraction:g} "
                "leaves no training problems; keep the sum below 1"
            )


def split_of(prompt: str, cfg: TaskConfig) -> str:
    """``"train"``, ``"dev"`` or ``"test"``: where ``prompt`` of task ``cfg.name`` lies (see the module docstring).

    Example: arithmetic ``"37+48="`` hashes to 0.7017 -> "train" (above 0.1 + 0.1)."""
    h = stable_fraction(f"{cfg.name}-split:{prompt}")
    if h < cfg.heldout_fraction:
        return "test"
    return "dev" if h < cfg.heldout_fraction + cfg.dev_fraction else "train"


@dataclass(frozen=True)
class Problem:
    prompt: str  # "37+48="
    answer: str  # "85"

    def to_dict(self) -> dict:
        return {"prompt": self.prompt, "answer": self.answer}


def split_problems(problems, cfg: TaskConfig) -> tuple[list[Problem], list[Problem], list[Problem]]:
    """(train, dev, test) of an enumerated problem space by :func:`split_of`, in enumeration order; a ConfigError
    when the test split has fewer than ``num_eval`` problems or the train split fewer than ``num_demos``."""
    out: dict[str, list[Problem]] = {s: [] for s in SPLITS}
    for p in problems:
        out[split_of(p.prompt, cfg)].append(p)
    train, dev, test = out["train"], out["dev"], out["test"]
    if cfg.num_eval is not None and len(test) < cfg.num_eval:
        raise ConfigError(f"task.num_eval={cfg.num_eval} exceeds the {len(test)} held-out problems")
    if len(train) < cfg.num_demos:
        raise ConfigError(f"task.num_demos={cfg.num_demos} exceeds the {len(train)} training problems")
    return train, dev, test


_OPERANDS = re.compile(r"(\d+)([+-])(\d+)=")


def operand_layout(prompt: str) -> str:
    """The operands' digit counts around the operator: ``"37+4="`` -> ``"2+1"``; ``"other"`` for any other text
    (``posttrain.tasks.arithmetic.layout``).

    The layout decides where each digit sits in the sequence. With learned absolute positions a model that has
    learned ``"ab+cd="`` (81 % of two-digit problems) does not get the shifted ``"a+cd="`` for free:
    ``posttrain eval --by-layout`` shows it (docs/outcomes.md).
    """
    m = _OPERANDS.fullmatch(prompt)
    return f"{len(m[1])}{m[2]}{len(m[3])}" if m else "other"


def layout(prompt: str) -> str:
    """The shape of an embedded-task prompt, for accuracy per shape (``eval --by-layout``): arithmetic's operand digit
    counts (``"37+4="`` -> ``"2+1"``, :func:`operand_layout`), sort's string length (``"3141="`` ->
    ``"4 digits"``); ``"other"`` for any other text."""
    shape, digits = operand_layout(prompt), prompt.removesuffix("=")
    if shape == "other" and prompt.endswith("=") and digits.isdigit() and digits.isascii():
        return f"{len(digits)} digits"
    return shape


# which class each task name gives, by module path: the task modules import this one (its settings and splits),
# so it names them rather than importing them
_TASK_CLASSES = {
    "arithmetic": ("posttrain.tasks.arithmetic", "ArithmeticTask"),
    "collatz": ("posttrain.tasks.collatz", "CollatzTask"),
    "octal": ("posttrain.tasks.octal", "OctalTask"),
    "sort": ("posttrain.tasks.sort", "SortTask"),
}


def embedded_task(cfg: TaskConfig | None = None):
    """The embedded task ``cfg.name`` names (default: arithmetic with the default settings)."""
    cfg = cfg or TaskConfig()
    module, cls = _TASK_CLASSES[cfg.name]
    return getattr(importlib.import_module(module), cls)(cfg)
