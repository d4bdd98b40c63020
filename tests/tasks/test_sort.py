"""The second embedded task (sort the digits of a string): its verifier against brute force, its three splits
disjoint and fixed by the prompt alone, and `--task sort` through sft, grpo, dpo, rm and ppo (a few steps each)."""

import json
import subprocess
import sys
from itertools import permutations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.cli import main
from posttrain.errors import ConfigError
from posttrain.hashing import stable_fraction
from posttrain.tasks.arithmetic import ALPHABET
from posttrain.tasks.base import Task
from posttrain.tasks.embedded import TaskConfig, embedded_task, split_of
from posttrain.tasks.sort import SortTask, is_sorted_permutation, sort_answer

digit_strings = st.text(alphabet="0123456789", min_size=2, max_size=5)


def brute_force_sorted(s: str) -> str:
    """The one ordering of the digits that never decreases, found by trying every permutation."""
    return next("".join(p) for p in sorted(permutations(s)) if all(a <= b for a, b in zip(p, p[1:])))


@settings(max_examples=200, deadline=None)
@given(digit_strings)
def test_answer_against_brute_force(s):
    assert sort_answer(s) == brute_force_sorted(s)


@settings(max_examples=300, deadline=None)
@given(digit_strings, st.text(alphabet="0123456789 -=a", max_size=7))
def test_verifier_against_brute_force(s, completion):
    """A completion passes the answer-free check exactly when it is the brute-force answer (whitespace aside)."""
    assert is_sorted_permutation(s + "=", completion) == (completion.strip() == brute_force_sorted(s))


@settings(max_examples=100, deadline=None)
@given(digit_strings, st.permutations(range(5)))
def test_every_permutation_of_the_answer_but_itself_fails(s, order):
    wrong = "".join(s[i] for i in order if i < len(s))
    assert is_sorted_permutation(s + "=", wrong) == (wrong == brute_force_sorted(s))
    assert is_sorted_permutation(s + "=", " " + brute_force_sorted(s) + "\n")
    assert not is_sorted_permutation(s + "=", brute_force_sorted(s)[:-1])  # a digit lost


def test_every_problem_is_answered_right_and_the_task_is_a_task():
    t = SortTask()
    assert (
        isinstance(t, Task)
        and t.name == "sort"
        and set("".join(p.prompt + p.answer for p in t.train_problems)) <= set(ALPHABET)
    )
    for p in t.train_problems[:2000] + t.heldout_problems:
        assert is_sorted_permutation(p.prompt, p.answer) and t.verify(p.answer, p.answer)
    assert embedded_task(TaskConfig(name="sort")).name == "sort" and embedded_task().name == "arithmetic"


def test_splits_partition_the_space_of_2_to_4_digit_strings():
    t = SortTask()
    splits = [{p.prompt for p in s} for s in (t.train_problems, t.dev_problems, t.heldout_problems)]
    assert sum(map(len, splits)) == 100 + 1000 + 10000 == len(set().union(*splits))  # disjoint, everything
    assert all(0.08 < len(s) / 11100 < 0.12 for s in splits[1:])
    demos, rl = {p.prompt for p in t.demonstrations()}, {p.prompt for p in t.rl_prompts()}
    assert len(demos) == 320 and demos <= splits[0] and rl == splits[0]  # demonstrations and RL: train only
    assert {p for p, _ in t.eval_set()} == splits[2] and {p for p, _ in t.dev_set()} == splits[1]


@settings(max_examples=100, deadline=None)
@given(digit_strings, st.floats(0.01, 0.5), st.floats(0.01, 0.45))
def test_split_is_the_hash_of_the_prompt_alone(s, heldout, dev):
    cfg = TaskConfig(name="sort", heldout_fraction=heldout, dev_fraction=dev)
    h = stable_fraction(f"sort-split:{s}=")
    assert split_of(s + "=", cfg) == ("test" if h < heldout else "dev" if h < heldout + dev else "train")
    assert split_of(s + "=", TaskConfig(name="sort", heldout_fraction=heldout, dev_fraction=dev, seed=7)) == split_of(
        s + "=", cfg
    )  # no seed in it


def test_splits_are_stable_across_processes():
    code = (
        "from posttrain.tasks.sort import SortTask; t = SortTask(); "
        "print(sorted(p.prompt for p in t.heldout_problems)[:50], len(t.dev_problems))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    t = SortTask()
    assert out.strip() == f"{sorted(p.prompt for p in t.heldout_problems)[:50]} {len(t.dev_problems)}"


def test_demonstrations_depend_on_the_seed_only():
    a, b = SortTask(TaskConfig(name="sort", seed=1)), SortTask(TaskConfig(name="sort", seed=2))
    assert a.demonstrations() == SortTask(TaskConfig(name="sort", seed=1)).demonstrations() != b.demonstrations()


def test_bad_settings_are_config_errors():
    with pytest.raises(ConfigError, match="task.sort_length"):
        TaskConfig(name="sort", sort_length=9)
    with pytest.raises(ConfigError, match="exceeds the"):
        SortTask(TaskConfig(name="sort", sort_length=2, num_demos=95)).demonstrations()


SMALL = ["--model.n-layer", "1", "--model.d-model", "32", "--model.n-head", "2", "--progress", "false"]
SORT = ["--task", "sort", "--task.sort-length", "3", "--task.num-demos", "40", "--task.num-eval", "16"]


def test_sft_then_grpo_dpo_rm_ppo_on_sort(tmp_path, capsys):
    """`--task sort` reaches every trainer: each runs a few steps, evaluates on sort's own held-out problems, and
    records the task in its resolved config."""
    sft = tmp_path / "sft"
    assert main(["sft", "--out", str(sft), "--steps", "4", "--batch-size", "8", "--restarts", "1", *SMALL, *SORT]) == 0
    held = {
        p.prompt for p in SortTask(TaskConfig(name="sort", sort_length=3, num_demos=40, num_eval=16)).heldout_problems
    }
    rl = ["--init", str(sft), "--steps", "1", "--eval-every", "0", "--save-every", "0", "--progress", "false", *SORT]
    g = ["--prompts-per-step", "2", "--num-generations", "2"]
    assert main(["grpo", "--out", str(tmp_path / "grpo"), *rl, *g]) == 0
    assert main(["ppo", "--out", str(tmp_path / "ppo"), *rl, *g]) == 0
    pairs = ["--pairs.num-prompts", "8", "--pairs.gold-chosen", "true"]  # a 4-step SFT is never right
    assert main(["dpo", "--out", str(tmp_path / "dpo"), *rl, *pairs]) == 0
    assert main(["rm", "--out", str(tmp_path / "rm"), *rl, *pairs, "--eval-prompts", "8"]) == 0
    for stage in ("sft", "grpo", "ppo", "dpo", "rm"):
        cfg = json.loads((tmp_path / stage / "config.resolved.json").read_text())
        assert cfg["task"]["name"] == "sort", stage
    capsys.readouterr()
    rl_arith = [x for x in rl if x not in ("--task", "sort", "--task.sort-length", "3")]
    assert main(["grpo", "--out", str(tmp_path / "arith"), *rl_arith, *g]) == 0  # allowed, but said
    assert f"note: --init {sft} was trained on the sort task, this run is on arithmetic" in capsys.readouterr().out
    samples = json.loads((tmp_path / "grpo" / "summary.json").read_text()).get("samples", [])
    assert samples and all(x["prompt"] in held for x in samples)  # scored on sort's held-out problems


def test_the_pipeline_corpus_of_sort_is_its_own():
    """The pipeline's corpus is a function of the task: sort's demonstrations, and leaks of sort's held-out problems."""
    from posttrain.pipeline.corpus import CorpusConfig, build_corpus, eval_records

    cfg = TaskConfig(name="sort", num_demos=24)
    task = embedded_task(cfg)
    records, manifest = build_corpus(CorpusConfig(paragraphs=20, exact_dups=4, near_dups=4, leaks=6), task)
    demos = {(r["prompt"], r["answer"]) for r in records if r["kind"] == "demo"}
    assert demos == {(p.prompt, p.answer) for p in task.demonstrations()}
    assert all(split_of(p, cfg) == "test" for p in manifest["leaked_prompts"]) and len(manifest["leaked_prompts"]) == 6
    assert [r["prompt"] for r in eval_records(task)] == [p.prompt for p in task.heldout_problems]
    assert all(is_sorted_permutation(r["prompt"], r["answer"]) for r in records if "prompt" in r)


def test_the_pipeline_runs_every_stage_on_sort(tmp_path):
    """`posttrain pipeline --task sort` (the micro preset: a few steps a stage): every stage runs, SFT trains on sort's
    train split, restarts rank on its dev split, and the held-out items are its test split."""
    out = tmp_path / "p"
    assert main(["pipeline", "--preset", "micro", "--task", "sort", "--out", str(out), "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert all(v["status"] == "ran" for v in summary["stages"].values())
    cfg = TaskConfig(name="sort")

    def prompts(name):
        return {json.loads(ln)["prompt"] for ln in (out / "dedup" / name).read_text().splitlines()}

    assert {split_of(p, cfg) for p in prompts("sft.jsonl")} == {"train"}
    assert {split_of(p, cfg) for p in prompts("val.jsonl")} == {"dev"}
    assert {split_of(p, cfg) for p in prompts("eval.jsonl")} == {"test"}
    assert all("+" not in p for p in prompts("sft.jsonl") | prompts("eval.jsonl"))  # nothing of arithmetic


@settings(max_examples=100, deadline=None)
@given(digit_strings, st.integers(0, 99), st.integers(0, 99))
def test_layout_is_the_string_length_for_sort_and_the_operands_for_arithmetic(s, a, b):
    from posttrain.tasks.embedded import layout

    assert layout(s + "=") == f"{len(s)} digits"
    assert layout(f"{a}+{b}=") == f"{len(str(a))}+{len(str(b))}"
    assert layout(s) == "other" and layout(s + "=5") == "other"
