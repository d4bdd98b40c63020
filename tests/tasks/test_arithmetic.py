import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.errors import ConfigError
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask, is_heldout, stable_fraction, verify


def test_split_is_a_partition_of_the_problem_space():
    t = ArithmeticTask(ArithmeticConfig(digits=2, ops="+-"))
    train = {p.prompt for p in t.train_problems}
    dev = {p.prompt for p in t.dev_problems}
    held = {p.prompt for p in t.heldout_problems}
    assert not train & held and not train & dev and not dev & held
    assert len(train) + len(dev) + len(held) == 2 * 100 * 100
    assert 0.08 < len(held) / 20000 < 0.12 and 0.08 < len(dev) / 20000 < 0.12
    assert {p.prompt for p in t.demonstrations()} <= train
    assert {p.prompt for p in t.rl_prompts()} == train  # RL prompts: the train split, never dev
    assert {p.prompt for p in t.eval_problems()} <= held


def test_the_test_split_is_the_heldout_set_it_always_was():
    """Adding dev took from the training problems only: the 1,051 held-out problems are those of the hash rule the
    results were always reported on (recounted here from the hash, not from the task)."""
    held = {p.prompt for p in ArithmeticTask().heldout_problems}
    recount = {
        f"{a}+{b}=" for a in range(100) for b in range(100) if stable_fraction(f"arithmetic-split:{a}+{b}=") < 0.1
    }
    assert held == recount and len(held) == 1051


@settings(max_examples=40, deadline=None)
@given(heldout=st.floats(0.01, 0.5), dev=st.floats(0.01, 0.45), a=st.integers(0, 99), b=st.integers(0, 99))
def test_three_splits_are_disjoint_and_fixed_by_the_prompt(heldout, dev, a, b):
    from posttrain.tasks.embedded import split_of

    cfg = ArithmeticConfig(heldout_fraction=heldout, dev_fraction=dev, num_demos=1)
    prompt, h = f"{a}+{b}=", stable_fraction(f"arithmetic-split:{a}+{b}=")
    want = "test" if h < heldout else "dev" if h < heldout + dev else "train"  # recount from the hash
    assert split_of(prompt, cfg) == want
    assert is_heldout(prompt, heldout) == (want == "test")
    t = ArithmeticTask(ArithmeticConfig(digits=1, heldout_fraction=heldout, dev_fraction=dev, num_demos=1))
    splits = [{p.prompt for p in s} for s in (t.train_problems, t.dev_problems, t.heldout_problems)]
    assert sum(map(len, splits)) == 100 == len(set().union(*splits))  # a partition of the 1-digit space
    # the test split never depends on dev_fraction: more dev takes only from train
    more = ArithmeticTask(ArithmeticConfig(digits=1, heldout_fraction=heldout, dev_fraction=dev / 2, num_demos=1))
    assert more.heldout_problems == t.heldout_problems
    assert set(more.dev_problems) <= set(t.dev_problems)


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
    "kw",
    [
        {"digits": 0},
        {"ops": "*"},
        {"heldout_fraction": 1.5},
        {"num_demos": 0},
        {"num_eval": 0},
        {"dev_fraction": 0},
        {"heldout_fraction": 0.5, "dev_fraction": 0.5},
        {"name": "multiply"},
    ],
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
