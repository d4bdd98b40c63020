"""The octal embedded task (a decimal number in base 8): its verifier against brute-force repeated division, its
three splits disjoint and fixed by the prompt alone, and `--task octal` through sft and grpo (a few steps)."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.cli import main
from posttrain.errors import ConfigError
from posttrain.hashing import stable_fraction
from posttrain.tasks.arithmetic import ALPHABET
from posttrain.tasks.base import Task
from posttrain.tasks.embedded import TaskConfig, embedded_task, split_of
from posttrain.tasks.octal import OctalTask, is_octal_of, to_octal


def brute_force_octal(n: int) -> str:
    """Repeated division by 8, the remainders read backwards (the schoolbook procedure)."""
    digits = []
    while True:
        n, r = divmod(n, 8)
        digits.append(str(r))
        if n == 0:
            return "".join(reversed(digits))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**6))
def test_answer_against_brute_force(n):
    assert to_octal(n) == brute_force_octal(n)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 9999), st.text(alphabet="0123456789 -=", max_size=7))
def test_verifier_against_brute_force(n, completion):
    """A completion passes the answer-free check exactly when it is the brute-force answer (whitespace aside)."""
    assert is_octal_of(f"{n}=", completion) == (completion.strip() == brute_force_octal(n))


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 9999))
def test_near_misses_fail(n):
    right = brute_force_octal(n)
    assert is_octal_of(f"{n}=", f" {right}\n") and not is_octal_of(f"{n}=", "0" + right)  # no leading zero
    assert not is_octal_of(f"{n}=", str(n)) or right == str(n)  # the decimal digits are not its base-8 form
    assert not is_octal_of(f"{n}=", right[:-1] or "8")


def test_every_problem_is_answered_right_and_the_task_is_a_task():
    t = OctalTask()
    assert isinstance(t, Task) and t.name == "octal"
    assert set("".join(p.prompt + p.answer for p in t.train_problems)) <= set(ALPHABET)
    for p in t.train_problems + t.dev_problems + t.heldout_problems:
        assert is_octal_of(p.prompt, p.answer)
    assert embedded_task(TaskConfig(name="octal")).name == "octal"


def test_splits_partition_the_numbers_below_10000():
    t = OctalTask()
    splits = [{p.prompt for p in s} for s in (t.train_problems, t.dev_problems, t.heldout_problems)]
    assert sum(map(len, splits)) == 10000 == len(set().union(*splits))  # disjoint, everything
    assert all(0.08 < len(s) / 10000 < 0.12 for s in splits[1:])
    demos, rl = {p.prompt for p in t.demonstrations()}, {p.prompt for p in t.rl_prompts()}
    assert len(demos) == 320 and demos <= splits[0] and rl == splits[0]  # demonstrations and RL: train only
    assert {p for p, _ in t.eval_set()} == splits[2] and {p for p, _ in t.dev_set()} == splits[1]


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 9999), st.floats(0.01, 0.5), st.floats(0.01, 0.45))
def test_split_is_the_hash_of_the_prompt_alone(n, heldout, dev):
    cfg = TaskConfig(name="octal", heldout_fraction=heldout, dev_fraction=dev)
    h = stable_fraction(f"octal-split:{n}=")
    assert split_of(f"{n}=", cfg) == ("test" if h < heldout else "dev" if h < heldout + dev else "train")
    other_seed = TaskConfig(name="octal", heldout_fraction=heldout, dev_fraction=dev, seed=3)
    assert split_of(f"{n}=", other_seed) == split_of(f"{n}=", cfg)


def test_too_many_numbers_is_a_config_error():
    with pytest.raises(ConfigError, match="task.digits=4 with task.name=octal"):
        TaskConfig(name="octal", digits=4)


def test_sft_then_grpo_on_octal(tmp_path):
    small = ["--model.n-layer", "1", "--model.d-model", "32", "--model.n-head", "2", "--progress", "false"]
    task = ["--task", "octal", "--task.digits", "1", "--task.num-demos", "40", "--task.num-eval", "8"]
    sft = tmp_path / "sft"
    assert main(["sft", "--out", str(sft), "--steps", "4", "--batch-size", "8", "--restarts", "1", *small, *task]) == 0
    rl = ["--init", str(sft), "--steps", "1", "--eval-every", "0", "--save-every", "0", "--progress", "false", *task]
    assert (
        main(["grpo", "--out", str(tmp_path / "grpo"), *rl, "--prompts-per-step", "2", "--num-generations", "2"]) == 0
    )
    held = {p.prompt for p in OctalTask(TaskConfig(name="octal", digits=1, num_demos=40, num_eval=8)).heldout_problems}
    summary = json.loads((tmp_path / "grpo" / "summary.json").read_text())
    assert summary["samples"] and all(s["prompt"] in held for s in summary["samples"])
    assert json.loads((tmp_path / "grpo" / "config.resolved.json").read_text())["task"]["name"] == "octal"
    dev = OctalTask(TaskConfig(name="octal", digits=1, num_demos=40, num_eval=8)).dev_set()
    assert main(["eval", str(tmp_path / "grpo"), "--heldout", "dev", "--out", str(tmp_path / "ev")]) == 0  # choices
    rows = [json.loads(x) for x in (tmp_path / "ev" / "completions.jsonl").read_text().splitlines()]
    assert sorted(r["prompt"] for r in rows) == sorted(p for p, _ in dev)  # the dev split, every problem of it


def test_the_pipeline_runs_every_stage_on_octal(tmp_path):
    """`posttrain pipeline --task octal` (micro preset): every stage runs on octal's own splits and corpus."""
    out = tmp_path / "p"
    assert main(["pipeline", "--preset", "micro", "--task", "octal", "--out", str(out), "--quiet"]) == 0
    assert all(v["status"] == "ran" for v in json.loads((out / "summary.json").read_text())["stages"].values())
    cfg = TaskConfig(name="octal")
    for name, split in (("sft.jsonl", "train"), ("val.jsonl", "dev"), ("eval.jsonl", "test")):
        rows = [json.loads(ln) for ln in (out / "dedup" / name).read_text().splitlines()]
        assert rows and {split_of(r["prompt"], cfg) for r in rows} == {split}, name
        assert all(is_octal_of(r["prompt"], r["answer"]) for r in rows)
