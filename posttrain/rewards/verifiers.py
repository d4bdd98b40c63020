"""Verifiable rewards: exact match, partial credit for integer digits, a math-answer checker, format and over-length shaping, and a code runner.

Key insight: for tasks with a checkable answer the reward is a *verifier*, not a learned model, so it
cannot be flattered — but it must be exact about equivalence (``0.5 == \\frac{1}{2} == 2/4``) and it
must never execute model text in the trainer. Every function has the reward API

    fn(prompts: list[str], completions: list[str], **columns) -> list[float]

where ``columns`` are the dataset's other fields, one value per completion (``answer``, ``tests``, ...).

Math answers are compared as exact rationals: :func:`parse_math` is a small recursive-descent parser over
``fractions.Fraction`` (numbers, + - * / ^, parentheses, ``\\frac{a}{b}``, ``\\cdot``, ``\\times``,
``\\div``, thousands separators, ``$...$`` and ``\\text{}`` wrappers); it never calls ``eval``. The
final answer is the last ``\\boxed{...}``, else the text after "answer is" / "Answer:" / "####", else the
last number in the completion. ``math_verify`` (sympy-based, wider coverage) is used when installed and
we are on the main thread (its timeout uses ``signal.alarm``); our parser is the fallback and the tested path.

Not handled by our parser: symbols and expressions with variables, roots, intervals, sets, percentages,
mixed numbers ("2 1/2"), units, scientific notation.
"""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

from posttrain.errors import UserError
from posttrain.rewards.code_tests import check_tests, run_assert_tests
from posttrain.rewards.isolation import resolve_isolation
from posttrain.rewards.sandbox import run_python


def _column(columns: dict, name: str, n: int, fn: str) -> list:
    if name not in columns or columns[name] is None:
        raise UserError(f"the {fn} reward needs a {name!r} column in the dataset (one value per completion)")
    values = list(columns[name])
    if len(values) != n:
        raise UserError(f"the {name!r} column has {len(values)} values for {n} completions")
    return values


# ------------------------------------------------------------------------------------------- exact match


def exact_match_reward(prompts: list[str], completions: list[str], answer=None, **_) -> list[float]:
    """1.0 when the completion, stripped of surrounding whitespace, equals ``str(answer).strip()``.

    Example: completion " 42\\n", answer 42 -> 1.0; completion "42." -> 0.0.
    """
    answers = _column({"answer": answer}, "answer", len(completions), "exact_match")
    return [1.0 if c.strip() == str(a).strip() else 0.0 for c, a in zip(completions, answers)]


_INTEGER = re.compile(r"(-?)(\d+)")


def digits_reward(prompts: list[str], completions: list[str], answer=None, **_) -> list[float]:
    """Partial credit for integer answers: the fraction of digit positions that are right.

    With c = completion.strip() and a = str(answer).strip(), both of the form ``-?[0-9]+``:

        digits(c, a) = #{i : c_digits[i] == a_digits[i]} / len(a_digits)   if sign(c) == sign(a)
                                                                           and len(c_digits) == len(a_digits)
                     = 0                                                   otherwise

    (equal lengths, so aligning from the right is aligning from the left: position i is the same power of
    ten in both). A wrong sign, a wrong number of digits, or a completion that is not an integer scores 0;
    an exact match scores 1. Examples, answer 85: "85" -> 1.0, "84" -> 0.5, "75" -> 0.5, "58" -> 0.0,
    "085" -> 0.0, "8" -> 0.0, "-85" -> 0.0, "85." -> 0.0; answer 134: "124" -> 2/3.
    Meant as a shaping term next to ``exact_match`` (e.g. ``exact_match:1.0,digits:0.5``) so near misses
    carry signal. A gold answer that is not an integer ("1/2", "x+1") scores 0 for every completion, so
    next to ``exact_match`` on such a dataset the term is a constant 0 and changes nothing.
    """
    answers = _column({"answer": answer}, "answer", len(completions), "digits")
    out = []
    for c, a in zip(completions, answers):
        ma, mc = _INTEGER.fullmatch(str(a).strip()), _INTEGER.fullmatch(c.strip())
        if ma is None or mc is None or mc.group(1) != ma.group(1) or len(mc.group(2)) != len(ma.group(2)):
            out.append(0.0)
            continue
        da, dc = ma.group(2), mc.group(2)
        out.append(sum(x == y for x, y in zip(dc, da)) / len(da))
    return out


# ------------------------------------------------------------------------------------------- math parser

_MAX_LEN = 300  # longer candidate answers are not parsed (bounded work per completion)
_MAX_EXP = 64  # |exponent| bound for ^, so 10^10^10 cannot stall the trainer
_MAX_BITS = 4096

_TOKEN = re.compile(r"\s*(?:(\d+\.\d*|\.\d+|\d+)|(\\frac|\\cdot|\\times|\\div)|([-+*/^(){}]))")


def _normalise(s: str) -> str:
    s = s.strip().replace("\u2212", "-").replace("\u00d7", "*").replace("\u00f7", "/")
    for a, b in (
        ("\\dfrac", "\\frac"),
        ("\\tfrac", "\\frac"),
        ("\\left", ""),
        ("\\right", ""),
        ("\\displaystyle", ""),
        ("\\!", ""),
        ("\\,", ""),
        ("\\;", ""),
        ("\\:", ""),
        ("\\ ", ""),
        ("~", ""),
        ("\\$", ""),
    ):
        s = s.replace(a, b)
    s = re.sub(r"\\(?:text|mathrm|mathbf|textbf)\{([^{}]*)\}", r"\1", s)
    s = s.strip().rstrip(".").strip()
    while len(s) >= 2 and ((s[0] == s[-1] == "$") or (s[:2] in ("\\(", "\\[") and s[-2:] in ("\\)", "\\]"))):
        s = s[1:-1].strip() if s[0] == "$" else s[2:-2].strip()
    s = s.rstrip(".").strip()
    if re.fullmatch(r"[-+]?\d{1,3}(,\d{3})+(\.\d+)?", s):  # 1,234,567.5 -> 1234567.5
        s = s.replace(",", "")
    return s


def _tokenise(s: str) -> list[str] | None:
    out, pos = [], 0
    s = s.rstrip()
    while pos < len(s):
        m = _TOKEN.match(s, pos)
        if not m:
            return None  # a letter, a comma, \sqrt, ...: not a plain rational expression
        out.append(next(g for g in m.groups() if g is not None))
        pos = m.end()
    return out


class _Parser:
    """expr := term (+|- term)* ; term := unary (*|/|\\cdot|\\times|\\div unary)* ; unary := (+|-) unary | power
    power := atom (^ unary)? ; atom := NUMBER | ( expr ) | { expr } | \\frac ARG ARG ; ARG := { expr } | DIGIT."""

    def __init__(self, tokens: list[str]):
        self.t, self.i = tokens, 0

    def peek(self):
        return self.t[self.i] if self.i < len(self.t) else None

    def take(self, expected=None):
        tok = self.peek()
        if tok is None or (expected is not None and tok != expected):
            raise ValueError(f"expected {expected!r}, got {tok!r}")
        self.i += 1
        return tok

    def parse(self) -> Fraction:
        value = self.expr()
        if self.peek() is not None:
            raise ValueError("trailing tokens")  # e.g. implicit multiplication "2(3)": ambiguous, refused
        return value

    def expr(self):
        v = self.term()
        while self.peek() in ("+", "-"):
            v = v + self.term() if self.take() == "+" else v - self.term()
        return v

    def term(self):
        v = self.unary()
        while self.peek() in ("*", "/", "\\cdot", "\\times", "\\div"):
            op = self.take()
            rhs = self.unary()
            v = v * rhs if op in ("*", "\\cdot", "\\times") else v / rhs  # ZeroDivisionError -> no answer
        return v

    def unary(self):
        if self.peek() in ("+", "-"):
            return self.unary() if self.take() == "+" else -self.unary()
        return self.power()

    def power(self):
        base = self.atom()
        if self.peek() == "^":
            self.take()
            exp = self.unary()
            if exp.denominator != 1 or abs(exp) > _MAX_EXP:
                raise ValueError("only small integer exponents")
            base = base ** int(exp)
            if max(base.numerator.bit_length(), base.denominator.bit_length()) > _MAX_BITS:
                raise ValueError("number too large")
        return base

    def atom(self):
        tok = self.take()
        if tok in ("(", "{"):
            v = self.expr()
            self.take(")" if tok == "(" else "}")
            return v
        if tok == "\\frac":
            return self.frac_arg() / self.frac_arg()
        if tok[0].isdigit() or tok[0] == ".":
            return Fraction(tok)
        raise ValueError(f"unexpected {tok!r}")

    def frac_arg(self):
        if self.peek() == "{":
            self.take()
            v = self.expr()
            self.take("}")
            return v
        tok = self.take()  # \frac12: single-digit arguments
        if not tok.isdigit():
            raise ValueError("bad \\frac argument")
        if len(tok) > 1:  # "\frac12" tokenises as "12": split into 1 and the rest as the denominator
            self.t.insert(self.i, tok[1:])
            tok = tok[0]
        return Fraction(tok)


def parse_math(text: str) -> Fraction | None:
    """The exact rational value of a simple math answer, or None. Never evaluates code.

    Examples: "\\frac{3}{6}" -> 1/2; "$-0.25$" -> -1/4; "1,000" -> 1000; "2^{10}" -> 1024;
    "\\frac12" -> 1/2; "x+1" -> None; "1/0" -> None.
    """
    if text is None:
        return None
    s = _normalise(str(text))
    if not s or len(s) > _MAX_LEN:
        return None
    tokens = _tokenise(s)
    if not tokens:
        return None
    try:
        return _Parser(tokens).parse()
    except (ValueError, ZeroDivisionError, IndexError, OverflowError):
        return None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced; None if absent/unclosed."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


_NUMBER = re.compile(
    r"\\[dt]?frac\s*\{[^{}]*\}\s*\{[^{}]*\}|[-\u2212]?\d{1,3}(?:,\d{3})+(?:\.\d+)?|[-\u2212]?(?:\d+\.?\d*|\.\d+)(?:\s*/\s*\d+)?"
)
_ANSWER_MARK = re.compile(r"(?:####|answer\s+is\s*:?|answer\s*:)\s*(.+)", re.IGNORECASE)


def extract_answer(completion: str) -> str | None:
    """The final-answer string of a completion: last \\boxed{}, else after 'answer is'/'Answer:'/'####',
    else the last number. Example: "so 3+4 = 7, answer: $7$." -> "$7$."; "I get 12 then 13" -> "13"."""
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed
    marks = _ANSWER_MARK.findall(completion)
    if marks:
        return marks[-1].splitlines()[0].strip()
    numbers = _NUMBER.findall(completion)
    return numbers[-1] if numbers else None


def builtin_math_equal(gold: str, completion: str) -> bool:
    """Our verifier: the completion's extracted answer equals the gold answer as exact rationals (or, when the
    gold is not a number, as whitespace-normalised strings)."""
    pred = extract_answer(completion)
    if pred is None:
        return False
    g = parse_math(gold)
    if g is None:
        g_str = re.sub(r"\s+", "", _normalise(str(gold)))
        return g_str != "" and re.sub(r"\s+", "", _normalise(pred)) == g_str
    p = parse_math(pred)
    if p is None:  # e.g. "the answer is 7 apples": fall back to the last number in the extracted span
        nums = _NUMBER.findall(pred)
        p = parse_math(nums[-1]) if nums else None
    return p is not None and p == g


def _math_verify_equal(gold: str, completion: str) -> bool:
    from math_verify import parse, verify  # optional dependency: posttrain[math]

    g = str(gold)
    gold_parsed = parse(g if "$" in g or "\\boxed" in g else f"${g}$")
    return bool(verify(gold_parsed, parse(completion)))


def _math_verify_available() -> bool:
    try:
        import math_verify  # noqa: F401
    except ImportError:
        return False
    return threading.current_thread() is threading.main_thread()


def gold_answer(answer) -> str:
    """The reference's final answer: a GSM8K-style worked solution ``"... so 48/2 = 24 ... #### 72"`` gives the
    text after its last ``####`` (``"72"``); any other reference is used whole."""
    a = str(answer)
    return a.rsplit("####", 1)[1].strip() if "####" in a else a


def math_answer_reward(
    prompts: list[str], completions: list[str], answer=None, backend: str = "auto", **_
) -> list[float]:
    """1.0 when the completion's final answer equals ``answer`` mathematically, else 0.0.

    A reference holding ``####`` (GSM8K's worked solutions) is compared by what follows its last ``####``
    (:func:`gold_answer`); the column read is ``answer`` (``math`` reward option ``answer_field`` for another).

    backend: "builtin" (our Fraction parser), "math_verify", or "auto" (math_verify when installed and on the
    main thread, else builtin; an exception inside math_verify falls back to builtin).
    Example: answer "0.5", completion "... so \\boxed{\\frac{2}{4}}" -> 1.0.
    """
    answers = _column({"answer": answer}, "answer", len(completions), "math")
    if backend not in ("auto", "builtin", "math_verify"):
        raise UserError(f"math backend {backend!r} is not valid; choose one of: auto, builtin, math_verify")
    use_mv = backend == "math_verify" or (backend == "auto" and _math_verify_available())
    out = []
    for c, a in zip(completions, map(gold_answer, answers)):
        ok = None
        if use_mv:
            try:
                ok = _math_verify_equal(a, c)
            except Exception:  # noqa: BLE001 - a verifier bug must not kill training; builtin decides
                ok = None
        out.append(1.0 if (builtin_math_equal(str(a), c) if ok is None else ok) else 0.0)
    return out


# ------------------------------------------------------------------------------------------- shaping

THINK_ANSWER_FORMAT = r"<think>.*?</think>\s*<answer>.*?</answer>"


def make_format_reward(pattern: str = THINK_ANSWER_FORMAT, value: float = 1.0, **_):
    """Reward ``value`` when the whole stripped completion matches ``pattern`` (re.fullmatch, DOTALL), else 0.

    Example with the default: "<think>2+2</think> <answer>4</answer>" -> 1.0; "4" -> 0.0.
    """
    rx = re.compile(pattern, re.DOTALL)

    def format_reward(prompts: list[str], completions: list[str], **_columns) -> list[float]:
        return [value if rx.fullmatch(c.strip()) else 0.0 for c in completions]

    return format_reward


def make_overlength_penalty(max_length: int = 512, buffer: int = 128, penalty: float = 1.0, **_):
    """DAPO's soft over-long punishment (Yu et al. 2025, eq. 13), L = completion length:

        0                                   L <= max_length - buffer
        penalty * ((max_length - buffer) - L) / buffer    in the buffer zone (linear 0 -> -penalty)
        -penalty                            L > max_length

    L is taken from a ``completion_lengths`` column (token counts, which the trainer passes) when present,
    else ``len(completion)`` in characters. Example: max 10, buffer 4, L=8 -> (6 - 8) / 4 = -0.5.
    """
    if buffer <= 0 or max_length <= buffer:
        raise UserError(
            f"overlength penalty needs 0 < buffer < max_length (got buffer={buffer}, max_length={max_length})"
        )

    def overlength_penalty(
        prompts: list[str], completions: list[str], completion_lengths=None, **_columns
    ) -> list[float]:
        lengths = completion_lengths if completion_lengths is not None else [len(c) for c in completions]
        free = max_length - buffer
        out = []
        for L in lengths:
            L = int(L)
            out.append(0.0 if L <= free else (-penalty if L > max_length else penalty * (free - L) / buffer))
        return out

    return overlength_penalty


# ------------------------------------------------------------------------------------------- code

_FENCE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(completion: str) -> str:
    """The last fenced code block (```python ... ```), else the whole completion."""
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else completion


def run_tests(code: str, tests: list, **sandbox) -> float:
    """Fraction of ``tests`` the code passes, run in the sandbox (see :func:`run_python`; ``sandbox`` are its options).

    tests: a list of Python statements (``"assert add(2, 3) == 5"``), run after the code in one child by a
    harness the code cannot patch, the comparisons with literal expected values done here, in the trainer
    (see posttrain.rewards.code_tests for what that defeats and what it does not) — passes are counted even
    if a later test hangs; or a list of ``{"input": stdin, "output": expected}`` dicts, one process each,
    passing when the trimmed stdout lines equal the expected ones (compared here: never seen by the child).
    """
    tests = check_tests(tests)  # one dict or one string is refused, never read as its keys or characters
    if not tests:
        return 0.0
    if all(isinstance(t, str) for t in tests):
        return run_assert_tests(code, tests, lambda program, stdin: run_python(program, stdin=stdin, **sandbox))
    norm = lambda s: [line.rstrip() for line in str(s).strip().splitlines()]  # noqa: E731
    passed = 0
    for t in tests:
        res = run_python(code, stdin=str(t["input"]), **sandbox)
        passed += res.ok and norm(res.stdout) == norm(t["output"])
    return passed / len(tests)


def make_code_reward(
    wall_timeout_s: float = 2.0,
    memory_mb: int = 256,
    max_output_bytes: int = 1 << 16,
    max_workers: int = 2,
    isolation: str | None = None,
    **_,
):
    """Reward = fraction of the row's ``tests`` column passed by the completion's code, run in the sandbox.

    Completions are checked concurrently in ``max_workers`` threads (each only waits on its subprocess).
    A completion that hangs, crashes, allocates too much or floods stdout scores 0 for the tests it fails.
    isolation: "auto" (bubblewrap, else refuse), "bwrap" or "rlimit" (the weaker opt-in); None reads
    ``$POSTTRAIN_SANDBOX`` (default "auto"). Checked here, when the reward is built: a machine without a
    working bwrap raises UserError naming the opt-in before any training starts.
    """
    mode = resolve_isolation(isolation)
    sandbox = dict(
        wall_timeout_s=wall_timeout_s, memory_mb=memory_mb, max_output_bytes=max_output_bytes, isolation=mode
    )

    def code_reward(prompts: list[str], completions: list[str], tests=None, **_columns) -> list[float]:
        all_tests = _column({"tests": tests}, "tests", len(completions), "code")
        jobs = [(extract_code(c), check_tests(t, row)) for row, (c, t) in enumerate(zip(completions, all_tests))]
        with ThreadPoolExecutor(max_workers=max(1, max_workers)) as pool:
            return list(pool.map(lambda job: run_tests(job[0], job[1], **sandbox), jobs))

    return code_reward
