"""The reward contract at the boundary (posttrain/rewards/contract.py): whatever a user's reward returns, raises or
does to its inputs ends in the right values or in one line naming the function, the value and the batch; grpo
exits 2 with the run resumable."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import posttrain
from posttrain.cli import main
from posttrain.errors import UserError
from posttrain.rewards.contract import RewardContractError, call_reward, check_rewards
from posttrain.rewards.registry import WeightedReward

PROMPTS, COMPLETIONS = ["1+1=", "2+2=", "3+3=", "4+4="], ["2", "4", "x", ""]
LENGTHS = [float(len(c)) for c in COMPLETIONS]  # the oracle of the well-behaved reward below


def _bad(value):
    return lambda prompts, completions, **kw: value


BAD = {
    "none": (_bad(None), "returned None"),
    "dict": (_bad({c: 1.0 for c in COMPLETIONS}), "returned a dict"),
    "scalar": (_bad(1.0), "returned a float 1.0"),
    "string": (_bad("1234"), "returned a str"),
    "set": (_bad({1.0, 2.0, 3.0, 4.0}), "returned a set"),
    "nested": (_bad([[1.0]] * 4), "item 0 is a list [1.0], not a real number"),
    "complex": (_bad([1 + 2j] * 4), "item 0 is a complex (1+2j), not a real number"),
    "array_2d": (_bad(np.zeros((4, 1))), "returned a 2-D ndarray of shape (4, 1)"),
    "tensor_2d": (_bad(torch.zeros(4, 2)), "returned a 2-D Tensor of shape (4, 2)"),
    "huge_int": (_bad([10**400] * 4), "item 0 is an integer of 401 digits, too large for a float"),
    "huger_int": (_bad([10**5000] * 4), "item 0 is an integer of 5001 digits, too large for a float"),
    "nan": (_bad([0.0, float("nan"), 0.0, 0.0]), "item 1 is nan, a non-finite number"),
    "inf": (_bad([0.0, 0.0, float("-inf"), 0.0]), "item 2 is -inf, a non-finite number"),
    "short": (_bad([1.0]), "1 values, expected 4 numbers"),
    "long_generator": (lambda p, c, **kw: (float(i) for i in range(10**9)), "more than 4 values"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_each_broken_return_names_the_function_the_value_and_the_batch(name):
    fn, what = BAD[name]
    calls = {"n": 0}

    def sometimes(prompts, completions, **kw):  # well-behaved on batch 1, broken on batch 2
        calls["n"] += 1
        return [float(len(c)) for c in completions] if calls["n"] == 1 else fn(prompts, completions, **kw)

    r = WeightedReward({f"my.py:{name}": (sometimes, 1.0)})
    assert r(PROMPTS, COMPLETIONS) == LENGTHS
    with pytest.raises(RewardContractError) as e:
        r(PROMPTS, COMPLETIONS)
    msg = str(e.value)
    assert msg.startswith(f"reward 'my.py:{name}' returned ") and "for batch 2 (4 completions)" in msg, msg
    assert what in msg and "\n" not in msg and len(msg) < 400, msg


@pytest.mark.parametrize(
    "value",
    [LENGTHS, tuple(LENGTHS), np.array(LENGTHS), torch.tensor(LENGTHS), iter(LENGTHS), [np.float32(v) for v in LENGTHS]]
    + [[int(v) for v in LENGTHS], [torch.tensor(v) for v in LENGTHS], [True, True, True, False]],
    ids=["list", "tuple", "ndarray", "tensor", "iterator", "np_float32", "ints", "0d_tensors", "bools"],
)
def test_every_flat_sequence_of_reals_is_accepted(value):
    assert LENGTHS == [1.0, 1.0, 1.0, 0.0]  # so the bools case has the same oracle
    assert check_rewards("f", value, 4, 1) == LENGTHS


def test_a_reward_that_mutates_its_inputs_changes_nothing_the_trainer_holds():
    prompts, completions = list(PROMPTS), list(COMPLETIONS)
    answer = [["2"], ["4"], ["6"], ["8"]]

    def vandal(prompts, completions, answer):
        out = [float(len(c)) for c in completions]
        completions.clear()
        prompts[0] = "changed"
        answer[0].append("9")
        return out

    assert WeightedReward({"v": (vandal, 1.0)})(prompts, completions, answer=answer) == LENGTHS
    assert prompts == PROMPTS and completions == COMPLETIONS and answer[0] == ["2"]


def test_flat_columns_of_strings_and_numbers_are_copied_too():
    prompts, answers, scores = list(PROMPTS), ("2", "4", "6", "8"), [1, 2.5, None, True]

    def vandal(prompts, completions, answer, score):
        prompts[0] = "changed"
        score.append(3)
        return [float(a == "2") for a in answer]

    assert WeightedReward({"v": (vandal, 1.0)})(prompts, COMPLETIONS, answer=answers, score=scores) == [
        1.0,
        0.0,
        0.0,
        0.0,
    ]
    assert prompts == PROMPTS and scores == [1, 2.5, None, True]


@pytest.mark.parametrize(
    "exc, what",
    [
        (SystemExit(0), "called sys.exit(0) on batch 1 (4 completions)"),
        (SystemExit("bye"), "called sys.exit('bye')"),
        (ValueError("boom\nsecond line"), "raised ValueError: boom on batch 1 (4 completions)"),
        (GeneratorExit(), "raised GeneratorExit on batch 1"),
        (RecursionError("maximum recursion depth exceeded"), "raised RecursionError: maximum recursion"),
    ],
)
def test_a_raising_or_exiting_reward_is_one_line(exc, what):
    def fn(prompts, completions, **kw):
        raise exc

    with pytest.raises(RewardContractError) as e:
        call_reward("r.py:fn", fn, PROMPTS, COMPLETIONS, {}, 1)
    assert str(e.value).startswith("reward 'r.py:fn' ") and what in str(e.value) and "\n" not in str(e.value)


def test_keyboard_interrupt_and_user_errors_pass_through():
    def interrupted(prompts, completions, **kw):
        raise KeyboardInterrupt

    def refusing(prompts, completions, **kw):
        raise UserError("row 3: tests must be a list")

    with pytest.raises(KeyboardInterrupt):
        call_reward("f", interrupted, PROMPTS, COMPLETIONS, {}, 1)
    with pytest.raises(UserError, match="^row 3: tests must be a list$"):
        call_reward("f", refusing, PROMPTS, COMPLETIONS, {}, 1)


def test_an_overflowing_weighted_sum_is_refused():
    r = WeightedReward({"a": (_bad([1e308] * 4), 10.0)})
    with pytest.raises(UserError, match="weighted reward overflowed .* batch 1"):
        r(PROMPTS, COMPLETIONS)


# ------------------------------------------------------------------ grpo with a file reward

ROOT = str(Path(posttrain.__file__).resolve().parent.parent)
TASK = ["--task.digits", "1", "--task.num-demos", "8", "--task.num-eval", "4"]
RL = ["--prompts-per-step", "2", "--num-generations", "2", "--max-new-tokens", "4", "--eval-every", "0"]
RL += ["--progress", "false", *TASK]
REWARDS = """
import json, os, sys
from pathlib import Path

def exits(prompts, completions, **kw):
    sys.exit(0)

def as_dict(prompts, completions, **kw):
    return {c: 1.0 for c in completions}

def raises(prompts, completions, **kw):
    raise ValueError("boom")

def raises_until_fixed(prompts, completions, **kw):
    if not Path(os.environ["REWARD_FIXED"]).exists():
        raise ValueError("not fixed yet")
    return [float(len(c)) for c in completions]

def breaks_after_the_first_checkpoint(prompts, completions, **kw):
    saved = Path(os.environ["REWARD_RUN"]) / "checkpoints" / "step-00000001"
    if saved.is_dir() and not Path(os.environ["REWARD_FIXED"]).exists():
        return None
    return [float(len(c)) for c in completions]
"""


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft") / "run"
    args = ["sft", "--out", str(out), "--steps", "2", "--save-every", "0", "--restarts", "1", "--batch-size", "8"]
    args += ["--eval-every", "0", "--progress", "false", "--model.n-layer", "1", "--model.d-model", "32"]
    assert main([*args, "--model.n-head", "2", *TASK]) == 0
    return out


@pytest.fixture
def rewards(tmp_path, monkeypatch):
    path = tmp_path / "rewards.py"
    path.write_text(REWARDS)
    monkeypatch.setenv("REWARD_RUN", str(tmp_path / "g"))
    monkeypatch.setenv("REWARD_FIXED", str(tmp_path / "fixed"))
    return path


def test_grpo_with_a_reward_calling_sys_exit_0_exits_2_with_one_line(sft, rewards, tmp_path):
    """A real process: the exit status is the one a shell sees (it was 0, with no model and no message)."""
    out = tmp_path / "g"
    cmd = [sys.executable, "-m", "posttrain", "grpo", "--init", str(sft), "--out", str(out), "--steps", "2"]
    cmd += ["--reward", f"{rewards}:exits", *RL]
    env = {"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"posttrain grpo: error: reward '{rewards}:exits' called sys.exit(0) on batch 1 (4 completions): "
        f"a reward returns one number per completion"
    )
    assert "Traceback" not in proc.stderr and not (out / "model").exists()


@pytest.mark.parametrize("fn, what", [("as_dict", "returned a dict"), ("raises", "raised ValueError: boom")])
def test_grpo_with_a_broken_reward_exits_2_naming_it(sft, rewards, tmp_path, capsys, fn, what):
    out = tmp_path / "g"
    assert (
        main(["grpo", "--init", str(sft), "--out", str(out), "--steps", "2", "--reward", f"{rewards}:{fn}", *RL]) == 2
    )
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(f"posttrain grpo: error: reward '{rewards}:{fn}' {what}")
    assert not (out / "model").exists()


def test_a_run_stopped_by_a_broken_reward_resumes_once_it_is_fixed(sft, rewards, tmp_path, capsys):
    out = tmp_path / "g"
    args = ["grpo", "--init", str(sft), "--out", str(out), "--steps", "3", "--save-every", "1"]
    assert main([*args, "--reward", f"{rewards}:breaks_after_the_first_checkpoint", *RL]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "breaks_after_the_first_checkpoint' returned None for batch " in err
    assert (out / "checkpoints" / "step-00000001").is_dir() and not (out / "model").exists()
    (tmp_path / "fixed").touch()
    assert main(["grpo", "--resume", str(out)]) == 0
    assert json.loads((out / "model" / "trainer_state.json").read_text())["step"] == 3


def _trained(out: Path) -> tuple[dict, list[dict]]:
    """The final weights and the metrics less timings: what must not depend on a failed start before them."""
    from posttrain.checkpoints.load import load_checkpoint

    timed = ("time", "_per_s")
    lines = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    return load_checkpoint(out / "model").model.state_dict(), [
        {k: v for k, v in rec.items() if not any(t in k for t in timed)} for rec in lines
    ]


def test_a_run_stopped_by_a_broken_reward_before_any_checkpoint_starts_again_once_fixed(sft, rewards, tmp_path, capsys):
    """Nothing saved yet: the same command (or --resume) just works once the reward is fixed, with no --overwrite; the
    user's files in the directory stay, and the run is the one an empty directory gives."""
    args = ["grpo", "--init", str(sft), "--steps", "2", "--reward", f"{rewards}:raises_until_fixed", *RL]
    out, resumed, empty = tmp_path / "g", tmp_path / "resumed", tmp_path / "empty"
    for d in (out, resumed):
        assert main([*args, "--out", str(d)]) == 2
        err = capsys.readouterr().err.strip()
        assert (
            err == f"posttrain grpo: error: reward '{rewards}:raises_until_fixed' raised ValueError: not fixed yet on "
            "batch 1 (4 completions)"
        )
        assert (d / "run.json").is_file() and not (d / "checkpoints").exists()
        (d / "notes.txt").write_text("mine")
    (tmp_path / "fixed").touch()
    assert main([*args, "--out", str(out)]) == 0
    assert main(["grpo", "--resume", str(resumed)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert main([*args, "--out", str(empty)]) == 0
    want_weights, want_metrics = _trained(empty)
    assert [r["step"] for r in want_metrics] == [0, 1, 2]
    for d in (out, resumed):
        got_weights, got_metrics = _trained(d)
        assert got_metrics == want_metrics and (d / "notes.txt").read_text() == "mine"
        assert all(torch.equal(got_weights[k], want_weights[k]) for k in want_weights)


def test_a_reward_module_that_exits_while_importing_is_a_config_error(tmp_path):
    from posttrain.errors import ConfigError
    from posttrain.rewards.registry import load_python_reward

    path = tmp_path / "exits.py"
    path.write_text("import sys\nsys.exit(0)\ndef fn(prompts, completions):\n    return [0.0] * len(completions)\n")
    with pytest.raises(ConfigError, match=r"importing .*exits.py' failed: SystemExit"):
        load_python_reward(f"{path}:fn")
