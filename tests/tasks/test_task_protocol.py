"""The Task protocol: both tasks implement it, the held-out rule (a stable hash of the prompt) is checked against
a brute-force recount, a user's files get their held-out set from --eval-data or a slice of --data, never from
the embedded task, and models/ imports no task."""

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.errors import UserError
from posttrain.hashing import stable_fraction
from posttrain.models.digit_slots import SLOT_ALPHABET
from posttrain.tasks.arithmetic import ALPHABET, ArithmeticConfig, ArithmeticTask
from posttrain.tasks.base import HELDOUT_FRACTION, MIN_TRAIN, Task, heldout_split
from posttrain.tasks.files import FileTask, task_for


def test_both_tasks_implement_the_protocol():
    assert isinstance(ArithmeticTask(), Task) and isinstance(FileTask("d.jsonl"), Task)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=6), max_size=40))
def test_heldout_split_against_a_recount(keys):
    train, held = heldout_split(keys)
    assert sorted(train + held) == list(range(len(keys)))  # a partition
    h = [stable_fraction("heldout:" + k) for k in keys]
    want = {i for i, x in enumerate(h) if x < HELDOUT_FRACTION} or ({h.index(min(h))} if keys else set())
    want = {i for i in range(len(keys)) if h[i] in {h[j] for j in want}}  # equal keys go together
    if len(keys) - len(want) < MIN_TRAIN:
        assert held == []
    else:
        assert set(held) == want
    for i in held:  # no prompt is both trained on and scored
        assert all(keys[j] != keys[i] for j in train)


def test_file_task_holds_out_a_slice_of_data_only_without_eval_data(tmp_path):
    demos = [(f"q{i}", f"a{i}") for i in range(40)]
    t = FileTask(str(tmp_path / "d.jsonl"))
    keep = t.hold_out(demos)
    held = [d for i, d in enumerate(demos) if i not in set(keep)]
    assert 0 < len(held) < 40 and t.eval_set() == held
    assert (
        t.note == f"note: no --eval-data: held-out accuracy on {len(held)} of the 40 rows of {t.name} (not trained on)"
    )
    e = tmp_path / "e.jsonl"
    e.write_text(json.dumps({"prompt": "x", "answer": "y"}) + "\n")
    t = FileTask(str(tmp_path / "d.jsonl"), str(e))
    assert t.hold_out(demos) == list(range(40)) and list(t.eval_set()) == [("x", "y")] and t.note is None
    t = FileTask("tiny.jsonl")
    assert t.hold_out(demos[:2]) == [0, 1] and t.eval_set() == []  # nothing to spare: no held-out metric
    assert t.note == "note: no --eval-data and tiny.jsonl has too few rows (2) to hold any out: no held-out accuracy"


def test_task_for_follows_one_rule():
    class Cfg:
        task = ArithmeticConfig()
        data = eval_data = model_path = None
        on_bad_line = "error"

    c = Cfg()
    assert isinstance(task_for(c), ArithmeticTask)
    c.data = "d.jsonl"
    assert isinstance(task_for(c), FileTask)
    c.data, c.eval_data = None, "e.jsonl"  # the embedded task's demonstrations, scored on the user's problems
    assert task_for(c).demos() == ArithmeticTask(c.task).demos()
    c.eval_data = None
    c.data, c.model_path = None, "mymodel"
    with pytest.raises(UserError, match=r"^--model mymodel needs --data \(your training data\)"):
        task_for(c)


def test_eval_data_without_data_scores_the_users_problems(tmp_path):
    e = tmp_path / "e.jsonl"
    e.write_text(json.dumps({"prompt": "12+3=", "answer": "15"}) + "\n")

    class Cfg:
        task, data, model_path, eval_data, on_bad_line = ArithmeticConfig(), None, None, str(e), "error"

    t = task_for(Cfg())
    assert isinstance(t, Task) and list(t.eval_set()) == [("12+3=", "15")]
    assert t.rl_prompts() == ArithmeticTask().rl_prompts()  # the rest is the embedded task's


def test_arithmetic_task_keeps_its_own_split():
    t = ArithmeticTask(ArithmeticConfig(digits=1, num_demos=20))
    assert t.demos() == [(p.prompt, p.answer) for p in t.demonstrations()]
    assert t.eval_set() == [(p.prompt, p.answer) for p in t.eval_problems()]
    assert t.hold_out(t.demos()) == list(range(20))  # demonstrations all train
    assert t.verify(" 7 ", "7") and not t.verify("07", "7")


def test_models_import_no_task():
    assert SLOT_ALPHABET == ALPHABET  # the digit slots read the embedded task's character ids
    code = (
        "import sys, pkgutil, importlib, posttrain.models as m\n"
        "for i in pkgutil.iter_modules(m.__path__): importlib.import_module('posttrain.models.' + i.name)\n"
        "print(sorted(k for k in sys.modules if k.startswith('posttrain.tasks')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_file_task_prompts_are_the_users_rows(tmp_path):
    d = tmp_path / "p.jsonl"
    d.write_text(
        "".join(json.dumps({"prompt": f"say {w}", "answer": w, "level": i}) + "\n" for i, w in enumerate("ab"))
    )
    rows = FileTask(str(d)).prompts()
    assert [(r.prompt, r.answer, r.columns["level"]) for r in rows] == [("say a", "a", 0), ("say b", "b", 1)]
