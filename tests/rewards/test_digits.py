"""The ``digits`` partial-credit reward: hand-derived values and an arithmetic oracle over -120..199 x every 7th."""

from fractions import Fraction

import pytest

from posttrain.errors import UserError
from posttrain.rewards import build_reward, digits_reward


@pytest.mark.parametrize(
    "completion,answer,value",
    [
        ("85", "85", 1.0),
        (" 85\n", 85, 1.0),
        ("84", "85", 0.5),
        ("75", "85", 0.5),
        ("58", "85", 0.0),
        ("085", "85", 0.0),
        ("8", "85", 0.0),
        ("-85", "85", 0.0),
        ("85.", "85", 0.0),
        ("", "85", 0.0),
        ("8 5", "85", 0.0),
        ("x5", "85", 0.0),
        ("124", "134", 2 / 3),
        ("100", "199", 1 / 3),
        ("-13", "-12", 0.5),
        ("12", "-12", 0.0),
        ("0", "0", 1.0),
        ("1", "0", 0.0),
    ],
)
def test_digits_hand_values(completion, answer, value):
    assert digits_reward(["p"], [completion], answer=[answer]) == [value]


def _oracle(guess: int, gold: int) -> Fraction:
    """Numeric, not string, definition: same sign and digit count, then matching powers of ten."""
    if (guess < 0) != (gold < 0) or len(str(abs(guess))) != len(str(abs(gold))):
        return Fraction(0)
    n = len(str(abs(gold)))
    same = sum((abs(guess) // 10**k) % 10 == (abs(gold) // 10**k) % 10 for k in range(n))
    return Fraction(same, n)


def test_digits_matches_arithmetic_oracle_on_all_pairs():
    values = list(range(-120, 200))
    for gold in values[::7]:
        got = digits_reward(["p"] * len(values), [str(v) for v in values], answer=[gold] * len(values))
        want = [float(_oracle(v, gold)) for v in values]
        assert got == want, gold


def test_digits_errors_and_weighted_use():
    assert digits_reward(["p"] * 3, ["1/2", "1", "12"], answer=["1/2", "1/2", "x+1"]) == [0.0, 0.0, 0.0]
    with pytest.raises(UserError, match="answer"):
        digits_reward(["p"], ["1"])
    total, parts = build_reward("exact_match:1.0,digits:0.5").components(
        ["p"] * 3, ["85", "84", "9"], answer=["85"] * 3
    )
    assert parts == {"exact_match": [1.0, 0.0, 0.0], "digits": [1.0, 0.5, 0.0]}
    assert total == [1.5, 0.25, 0.0]
