"""The Collatz-step embedded task: its verifier against brute force (halving by search, tripling by repeated addition),
its three splits disjoint and fixed by the prompt alone, and `--task collatz` through sft, grpo and the pipeline."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.cli import main
from posttrain.errors import ConfigError
from posttrain.hashing import stable_fraction
from posttrain.tasks.arithmetic import ALPHABET
from posttrain.tasks.base import Task
from posttrain.tasks.collatz import CollatzTask, collatz_step, is_collatz_step
from posttrain.tasks.embedded import TaskConfig, embedded_task, split_of


def brute_force_step(n: int) -> str:
    """Even: the c with c + c = n, found by search; odd: n + n + n + 1, by repeated addition."""
    if n % 2 == 0:
        return str(next(c for c in range(n + 1) if c + c == n))
    total = 1
    for _ in range(3):
        total += n
    return str(total)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 9999))
def test_answer_against_brute_force(n):
    assert str(collatz_step(n)) == brute_force_step(n)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 9999), st.text(alphabet="0123456789 -=", max_size=7))
def test_verifier_against_brute_force(n, completion):
    """A completion passes the answer-free check exactly when it is the brute-force answer (whitespace aside)."""
    assert is_collatz_step(f"{n}=", completion) == (completion.strip() == brute_force_step(n))


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 9999))
def test_near_misses_fail(n):
    right = brute_force_step(n)
    assert is_collatz_step(f"{n}=", f" {right}\n") and not is_collatz_step(f"{n}=", "0" + right)
    wrong_branch = str(3 * n + 1) if n % 2 == 0 else str(n // 2)  # the other branch's answer
    assert not is_collatz_step(f"{n}=", wrong_branch)


def test_every_problem_is_answered_right_and_the_task_is_a_task():
    t = CollatzTask()
    assert isinstance(t, Task) and t.name == "collatz"
    assert set("".join(p.prompt + p.answer for p in t.train_problems)) <= set(ALPHABET)
    for p in t.train_problems + t.dev_problems + t.heldout_problems:
        assert is_collatz_step(p.prompt, p.answer)
    assert embedded_task(TaskConfig(name="collatz")).name == "collatz"


def test_splits_partition_the_numbers_below_10000():
    t = CollatzTask()
    splits = [{p.prompt for p in s} for s in (t.train_problems, t.dev_problems, t.heldout_problems)]
    assert sum(map(len, splits)) == 10000 == len(set().union(*splits))  # disjoint, everything
    assert all(0.08 < len(s) / 10000 < 0.12 for s in splits[1:])
    demos, rl = {p.prompt for p in t.demonstrations()}, {p.prompt for p in t.rl_prompts()}
    assert len(demos) == 320 and demos <= splits[0] and rl == splits[0]  # demonstrations and RL: train only
    assert {p for p, _ in t.eval_set()} == splits[2] and {p for p, _ in t.dev_set()} == splits[1]


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 9999), st.floats(0.01, 0.5), st.floats(0.01, 0.45))
def test_split_is_the_hash_of_the_prompt_alone(n, heldout, dev):
    cfg = TaskConfig(name="collatz", heldout_fraction=heldout, dev_fraction=dev)
    h = stable_fraction(f"collatz-split:{n}=")
    assert split_of(f"{n}=", cfg) == ("test" if h < heldout else "dev" if h < heldout + dev else "train")
    other_seed = TaskConfig(name="collatz", heldout_fraction=heldout, dev_fraction=dev, seed=3)
    assert split_of(f"{n}=", other_seed) == split_of(f"{n}=", cfg)


def test_too_many_numbers_is_a_config_error():
    with pytest.raises(ConfigError, match="task.digits=4 with task.name=collatz"):
        TaskConfig(name="collatz", digits=4)


def test_sft_then_grpo_then_the_pipeline_on_collatz(tmp_path):
    small = ["--model.n-layer", "1", "--model.d-model", "32", "--model.n-head", "2", "--progress", "false"]
    task = ["--task", "collatz", "--task.digits", "1", "--task.num-demos", "40", "--task.num-eval", "8"]
    sft = tmp_path / "sft"
    assert main(["sft", "--out", str(sft), "--steps", "4", "--batch-size", "8", "--restarts", "1", *small, *task]) == 0
    rl = ["--init", str(sft), "--steps", "1", "--eval-every", "0", "--save-every", "0", "--progress", "false", *task]
    assert (
        main(["grpo", "--out", str(tmp_path / "grpo"), *rl, "--prompts-per-step", "2", "--num-generations", "2"]) == 0
    )
    held = {p.prompt for p in CollatzTask(TaskConfig(name="collatz", digits=1, num_demos=40)).heldout_problems}
    summary = json.loads((tmp_path / "grpo" / "summary.json").read_text())
    assert summary["samples"] and all(s["prompt"] in held for s in summary["samples"])
    out = tmp_path / "p"
    assert main(["pipeline", "--preset", "micro", "--task", "collatz", "--out", str(out), "--quiet"]) == 0
    cfg = TaskConfig(name="collatz")
    for name, split in (("sft.jsonl", "train"), ("val.jsonl", "dev"), ("eval.jsonl", "test")):
        rows = [json.loads(ln) for ln in (out / "dedup" / name).read_text().splitlines()]
        assert rows and {split_of(r["prompt"], cfg) for r in rows} == {split}, name
        assert all(is_collatz_step(r["prompt"], r["answer"]) for r in rows)
