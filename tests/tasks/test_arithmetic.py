import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from posttrain.errors import ConfigError
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask, stable_fraction, verify


def test_split_is_a_partition_of_the_problem_space():
    t = ArithmeticTask(ArithmeticConfig(digits=2, ops="+-"))
    train = {p.prompt for p in t.train_problems}
    held = {p.prompt for p in t.heldout_problems}
    assert not train & held
    assert len(train) + len(held) == 2 * 100 * 100
    assert 0.08 < len(held) / 20000 < 0.12
    assert {p.prompt for p in t.demonstrations()} <= train
    assert {p.prompt for p in t.eval_problems()} <= held


def test_eval_problems_are_the_whole_heldout_split_by_default():
    t = ArithmeticTask(ArithmeticConfig())
    assert t.eval_problems() == t.heldout_problems and len(t.heldout_problems) == 1051
    sample = ArithmeticTask(ArithmeticConfig(num_eval=256)).eval_problems()
    assert len(sample) == len(set(sample)) == 256 and set(sample) <= set(t.heldout_problems)
    assert sample == ArithmeticTask(ArithmeticConfig(num_eval=256)).eval_problems()  # a fixed sample
    with pytest.raises(ConfigError, match="exceeds the 1051 held-out problems"):
        ArithmeticTask(ArithmeticConfig(num_eval=1052)).eval_problems()


def test_answers_are_correct():
    t = ArithmeticTask(ArithmeticConfig(digits=2, ops="+-", num_demos=50))
    for p in t.demonstrations():
        a, op, b = p.prompt[:-1].partition("+") if "+" in p.prompt else p.prompt[:-1].partition("-")
        assert int(p.answer) == (int(a) + int(b) if op == "+" else int(a) - int(b))


def test_split_is_stable_across_processes():
    code = "from posttrain.tasks.arithmetic import stable_fraction; print(stable_fraction('37+48='))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert float(out) == stable_fraction("37+48=")


def test_demos_depend_on_seed_only():
    a = ArithmeticTask(ArithmeticConfig(seed=1)).demonstrations()
    b = ArithmeticTask(ArithmeticConfig(seed=1)).demonstrations()
    c = ArithmeticTask(ArithmeticConfig(seed=2)).demonstrations()
    assert a == b and a != c


def test_verify():
    assert verify(" 85 ", "85") and not verify("085", "85") and not verify("8", "85")


@pytest.mark.parametrize(
    "kw", [{"digits": 0}, {"ops": "*"}, {"heldout_fraction": 1.5}, {"num_demos": 0}, {"num_eval": 0}]
)
def test_bad_config(kw):
    with pytest.raises(ConfigError):
        ArithmeticConfig(**kw)


@given(a=st.integers(0, 9999), b=st.integers(0, 9999), op=st.sampled_from("+-"))
def test_layout_is_the_operands_digit_counts(a, b, op):
    from posttrain.tasks.arithmetic import layout

    assert layout(f"{a}{op}{b}=") == f"{len(str(a))}{op}{len(str(b))}"


@pytest.mark.parametrize("text", ["", "37+48", "37+48=5", "+4=", "3*4=", "-3+4=", "3 + 4=", "Q: 3+4="])
def test_layout_of_anything_else_is_other(text):
    from posttrain.tasks.arithmetic import layout

    assert layout(text) == "other"


def test_layouts_partition_the_heldout_split():
    from posttrain.tasks.arithmetic import layout

    held = ArithmeticTask().heldout_problems
    counts = {}
    for p in held:
        counts[layout(p.prompt)] = counts.get(layout(p.prompt), 0) + 1
    assert set(counts) == {"1+1", "1+2", "2+1", "2+2"} and sum(counts.values()) == len(held)
    assert 0.75 < counts["2+2"] / len(held) < 0.87  # 90 x 90 of the 100 x 100 operand pairs, give or take the hash
