"""Verifiers and the reward registry: hand cases, a property oracle for the math parser, math_verify agreement."""

from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.errors import ConfigError, UserError
from posttrain.rewards import REWARD_FUNCTIONS, WeightedReward, build_reward, get_reward, parse_reward_spec
from posttrain.rewards.isolation import bwrap_problem
from posttrain.rewards.verifiers import (
    builtin_math_equal,
    exact_match_reward,
    extract_answer,
    extract_code,
    last_boxed,
    make_code_reward,
    make_format_reward,
    make_overlength_penalty,
    math_answer_reward,
    parse_math,
)


def test_exact_match():
    got = exact_match_reward(["p"] * 4, [" 42\n", "42.", "042", "41"], answer=[42, "42", "42", "42"])
    assert got == [1.0, 0.0, 0.0, 0.0]
    with pytest.raises(UserError, match="answer"):
        exact_match_reward(["p"], ["1"])


@pytest.mark.parametrize(
    "text,value",
    [
        ("42", Fraction(42)),
        ("-7", Fraction(-7)),
        ("+3", Fraction(3)),
        ("0.25", Fraction(1, 4)),
        (".5", Fraction(1, 2)),
        ("3.", Fraction(3)),
        ("1,234,567", Fraction(1234567)),
        ("3/4", Fraction(3, 4)),
        ("-6/8", Fraction(-3, 4)),
        ("\\frac{3}{6}", Fraction(1, 2)),
        ("\\dfrac{-3}{4}", Fraction(-3, 4)),
        ("-\\frac{1}{2}", Fraction(-1, 2)),
        ("\\frac12", Fraction(1, 2)),
        ("\\frac{\\frac{1}{2}}{3}", Fraction(1, 6)),
        ("$0.5$", Fraction(1, 2)),
        ("\\(\\frac{1}{3}\\)", Fraction(1, 3)),
        ("\\text{7}", Fraction(7)),
        ("7.", Fraction(7)),
        ("$7$.", Fraction(7)),
        ("2^{10}", Fraction(1024)),
        ("2^-2", Fraction(1, 4)),
        ("(1+2)*3", Fraction(9)),
        ("3 \\cdot 4", Fraction(12)),
        ("6 \\div 4", Fraction(3, 2)),
        ("\\left(2\\right)", Fraction(2)),
        ("\u22125", Fraction(-5)),
    ],
)
def test_parse_math_values(text, value):
    assert parse_math(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "",
        "x+1",
        "1/0",
        "2(3)",
        "\\sqrt{2}",
        "50\\%",
        "10^10^10",
        "2^{1/2}",
        "1,2",
        "__import__('os')",
        "1" * 400,
        "(1+2",
        None,
    ],
)
def test_parse_math_refuses(text):
    assert parse_math(text) is None


@settings(max_examples=200, deadline=None)
@given(st.integers(-(10**6), 10**6), st.integers(1, 10**4), st.sampled_from(["frac", "slash", "decimal", "boxed"]))
def test_parse_math_roundtrip_property(num, den, form):
    """Oracle: Fraction itself. Any rational written in any supported notation parses back to its exact value."""
    f = Fraction(num, den)
    if form == "decimal":  # num / 1000 written with 3 decimals, e.g. -1234 -> "-1.234"
        f, text = Fraction(num, 1000), str(Decimal(num).scaleb(-3))
    elif form == "frac":
        text = f"\\frac{{{num}}}{{{den}}}"
    elif form == "slash":
        text = f"{num}/{den}"
    else:
        text = f"The answer is $\\boxed{{\\dfrac{{{num}}}{{{den}}}}}$."
        assert builtin_math_equal(str(f), text)
        return
    assert parse_math(text) == f


def test_extract_answer():
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{unclosed") is None
    assert extract_answer("so 3+4 = 7, answer: $7$.") == "$7$."
    assert extract_answer("I get 12 then 13") == "13"
    assert extract_answer("#### 1,000") == "1,000"
    assert extract_answer("nothing here") is None


@pytest.mark.parametrize(
    "gold,completion,ok",
    [
        ("0.5", "The answer is \\boxed{\\frac{2}{4}}", True),
        ("1/2", "so x = 0.5", True),
        ("7", "The answer is 7 apples.", True),
        ("7", "The answer is 8", False),
        ("-3", "\\boxed{-3}", True),
        ("1000", "#### 1,000", True),
        ("12", "I computed 12 first and then 13", False),
        ("12", "no idea", False),
        ("x+1", "\\boxed{x + 1}", True),  # non-numeric gold: normalised string comparison
    ],
)
def test_math_reward_builtin(gold, completion, ok):
    got = math_answer_reward(["p"], [completion], answer=[gold], backend="builtin")
    assert got == [1.0 if ok else 0.0]


@pytest.mark.parametrize(
    "gold,completion",
    [
        ("0.5", "The answer is \\boxed{\\frac{2}{4}}"),
        ("7", "The answer is 8"),
        ("-3", "\\boxed{-3}"),
        ("3/4", "$\\frac{6}{8}$"),
    ],
)
def test_math_verify_agrees_on_simple_cases(gold, completion):
    pytest.importorskip("math_verify")
    mv = math_answer_reward(["p"], [completion], answer=[gold], backend="math_verify")
    assert mv == math_answer_reward(["p"], [completion], answer=[gold], backend="builtin")


def test_format_reward():
    fn = make_format_reward()
    assert fn(["p"] * 3, ["<think>2+2</think> <answer>4</answer>", "4", "<think>x</think>"]) == [1.0, 0.0, 0.0]
    assert make_format_reward(r"\d+", value=0.5)(["p"] * 2, ["12", "12a"]) == [0.5, 0.0]


def test_overlength_penalty():
    fn = make_overlength_penalty(max_length=10, buffer=4)
    # free up to 6; L=8 -> (6-8)/4 = -.5; L=10 -> -1; L=11 -> -1
    assert fn(["p"] * 5, [""] * 5, completion_lengths=[3, 6, 8, 10, 11]) == [0.0, 0.0, -0.5, -1.0, -1.0]
    assert fn(["p"], ["x" * 7]) == [-0.25]  # characters when no token lengths are given
    with pytest.raises(UserError):
        make_overlength_penalty(max_length=4, buffer=4)


def test_extract_code():
    assert extract_code("text\n```python\na=1\n```\nmore\n```py\nb=2\n```") == "b=2\n"
    assert extract_code("print(1)") == "print(1)"


def test_code_reward_assert_tests_and_io_tests():
    fn = make_code_reward(wall_timeout_s=2.0, max_workers=2, isolation=None if bwrap_problem() is None else "rlimit")
    tests = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 5"]
    good = "Here:\n```python\ndef add(a, b):\n    return a + b\n```"
    hang = "```python\ndef add(a, b):\n    while True: pass\n```"
    cheat = "import sys\nsys.exit(0)"  # exiting before the tests must not count as passing
    got = fn(["p"] * 3, [good, hang, cheat], tests=[tests] * 3)
    assert got[0] == pytest.approx(2 / 3) and got[1] == 0.0 and got[2] == 0.0
    io = [{"input": "2 3", "output": "5"}, {"input": "10 -4", "output": "6\n"}]
    prog = "a, b = map(int, input().split())\nprint(a + b)"
    assert fn(["p"] * 2, [prog, "print(5)"], tests=[io, io]) == [1.0, 0.5]
    with pytest.raises(UserError, match="tests"):
        fn(["p"], [prog])


def test_registry_and_weighted_sum():
    assert set(REWARD_FUNCTIONS) >= {"exact_match", "math", "format", "overlength", "code"}
    assert parse_reward_spec("math:1.0, format:0.1,exact_match") == {"math": 1.0, "format": 0.1, "exact_match": 1.0}
    with pytest.raises(ConfigError):
        parse_reward_spec("mathh:1")
    with pytest.raises(ConfigError):
        parse_reward_spec("math:abc")
    with pytest.raises(ConfigError):
        get_reward("nope")
    r = build_reward("exact_match:1.0,overlength:0.5", max_length=10, buffer=4)
    total, parts = r.components(["p", "p"], ["5", "x" * 8], answer=["5", "5"])
    assert parts == {"exact_match": [1.0, 0.0], "overlength": [0.0, -0.5]}
    assert total == [1.0, -0.25] and r(["p", "p"], ["5", "x" * 8], answer=["5", "5"]) == total


def test_weighted_reward_checks_contract():
    bad_len = WeightedReward({"bad": (lambda p, c, **k: [1.0], 1.0)})
    with pytest.raises(UserError, match="bad"):
        bad_len(["a", "b"], ["x", "y"])
    nan = WeightedReward({"nan": (lambda p, c, **k: [float("nan")] * len(c), 1.0)})
    with pytest.raises(UserError, match="non-finite"):
        nan(["a"], ["x"])
