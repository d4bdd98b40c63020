"""CLI smoke runs and user-error handling: a clear one-line error and exit status 2, never a traceback."""

import json
import subprocess
import sys

import pytest

from posttrain.cli import main

TASK = ["--task.digits", "1", "--task.num-demos", "20", "--task.num-eval", "8"]  # a small embedded task
TINY = [
    "--steps",
    "4",
    "--batch-size",
    "8",
    "--eval-every",
    "0",
    "--save-every",
    "2",
    "--progress",
    "false",
    "--restarts",
    "1",
    "--model.n-layer",
    "1",
    "--model.d-model",
    "32",
    "--model.n-head",
    "2",
    *TASK,
]


def test_help_lists_commands():
    out = subprocess.run(
        [sys.executable, "-m", "posttrain", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for cmd in ("sft", "eval", "demo"):
        assert cmd in out


def test_top_level_help_imports_no_torch_and_no_trainer():
    """``posttrain --help`` builds only the command list: no trainer module, so no torch (the flags of a
    command are built when the command line names it). The trainer registry (names as strings) is read."""
    code = (
        "import sys, contextlib, io\nfrom posttrain.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try: main(['--help'])\n    except SystemExit: pass\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('posttrain.trainers')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    registry = ["posttrain.trainers", "posttrain.trainers.engine", "posttrain.trainers.engine.registry"]
    assert out.strip() == str(registry)


def test_lazy_parser_builds_only_the_named_command():
    from posttrain.cli import build_parser, named_command

    assert named_command(["sft", "--steps", "3"]) == "sft" and named_command(["--help"]) is None

    def flags(parser):  # command -> its option strings
        sub = next(a for a in parser._actions if isinstance(a.choices, dict))
        return {name: {o for a in p._actions for o in a.option_strings} for name, p in sub.choices.items()}

    lazy, full = flags(build_parser(["dpo", "--steps", "2"])), flags(build_parser())
    assert "--steps" in lazy["dpo"] and lazy["sft"] == {"-h", "--help"}
    assert "--steps" in full["sft"] and "--steps" in full["dpo"] and lazy["dpo"] == full["dpo"]


def test_sft_then_eval(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["sft", "--preset", "tiny", "--out", str(run), *TINY]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert 0.0 <= summary["heldout_accuracy"] <= 1.0
    assert (run / "config.resolved.yaml").is_file()
    data = tmp_path / "e.jsonl"
    data.write_text('{"prompt": "1+2=", "answer": "3"}\n{"prompt": "4+4=", "answer": 8}\n')
    assert main(["eval", str(run), "--data", str(data), "--out", str(tmp_path / "ev")]) == 0
    s = json.loads((tmp_path / "ev" / "summary.json").read_text())
    assert s["n"] == 2 and 0 <= s["accuracy"] <= 1
    assert len((tmp_path / "ev" / "completions.jsonl").read_text().splitlines()) == 2
    assert "accuracy:" in capsys.readouterr().out


def test_config_file_overrides_preset(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("steps: 2\nmodel:\n  n_layer: 1\n")
    run = tmp_path / "r"
    assert main(["sft", "--config", str(cfg), "--out", str(run), *TINY[2:]]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (["sft", "--preset", "huge"], "unknown preset 'huge'"),
        (["sft", "--steps", "abc"], "steps='abc' is not a valid int"),
        (["sft", "--steps", "0"], "steps=0 must be > 0"),
        (["sft", "--model.attn-backend", "nope"], "model.attn_backend='nope' is not valid"),
        (["sft", "--config", "/nonexistent.yaml"], "config file not found"),
        (["eval", "/nonexistent", "--data", "x.jsonl"], "not found"),
    ],
)
def test_user_errors_are_one_line(argv, message, capsys, tmp_path):
    argv = [a if a != "x.jsonl" else str(tmp_path / "x.jsonl") for a in argv]
    if argv[0] == "sft":
        argv += ["--out", str(tmp_path / "o"), "--progress", "false"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_eval_bad_data_file(tmp_path, capsys):
    run = tmp_path / "run"
    main(["sft", "--out", str(run), *TINY])
    capsys.readouterr()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1=", "answer": "2"}\nnot json\n')
    assert main(["eval", str(run), "--data", str(bad)]) == 2
    assert "bad.jsonl:2: not valid JSON" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["eval", str(run), "--data", str(empty)]) == 2
    assert "empty" in capsys.readouterr().err


def test_eval_heldout_all_by_layout(tmp_path, capsys):
    """--heldout all scores every held-out problem; --by-layout splits the same verdicts by operand layout."""
    from posttrain.evaluation import accuracy_by
    from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask, layout

    run = tmp_path / "run"
    assert main(["sft", "--out", str(run), *TINY]) == 0
    assert main(["eval", str(run), "--heldout", "all", "--by-layout", "--out", str(tmp_path / "ev")]) == 0
    s = json.loads((tmp_path / "ev" / "summary.json").read_text())
    task = ArithmeticConfig(**json.loads((run / "config.resolved.json").read_text())["task"])  # TINY: 1 digit
    held = ArithmeticTask(task).heldout_problems
    assert s["n"] == len(held) > task.num_eval
    rows = [json.loads(x) for x in (tmp_path / "ev" / "completions.jsonl").read_text().splitlines()]
    assert sorted(r["prompt"] for r in rows) == sorted(p.prompt for p in held)
    by = s["by_layout"]
    assert sum(v["n"] for v in by.values()) == s["n"] and sum(v["correct"] for v in by.values()) == s["correct"]
    for name, v in by.items():  # brute force: recount each layout's verdicts from the completions
        mine = [r for r in rows if layout(r["prompt"]) == name]
        assert v["n"] == len(mine) and v["correct"] == sum(r["correct"] for r in mine)
    assert accuracy_by(rows, layout) == by
    assert "by operand layout:" in capsys.readouterr().out
    assert main(["eval", str(run), "--out", str(tmp_path / "ev2")]) == 0  # the default: the 256-problem sample
    assert json.loads((tmp_path / "ev2" / "summary.json").read_text())["n"] == task.num_eval


def test_eval_heldout_all_with_data_is_a_user_error(tmp_path, capsys):
    data = tmp_path / "e.jsonl"
    data.write_text('{"prompt": "1+2=", "answer": "3"}\n')
    assert main(["eval", str(tmp_path), "--data", str(data), "--heldout", "all"]) == 2
    assert "--heldout all" in capsys.readouterr().err


def test_digit_slots_travel_from_sft_to_grpo_and_block_export(tmp_path, capsys):
    """sft --model.digit-slots: the checkpoint carries them, grpo --init runs with them, export refuses the model,
    and options that would make them do nothing are one-line errors."""
    sft, grpo = tmp_path / "sft", tmp_path / "grpo"
    assert main(["sft", "--out", str(sft), *TINY, "--model.digit-slots", "1"]) == 0
    assert json.loads((sft / "model" / "config.json").read_text())["config"]["digit_slots"] == 1
    rl = ["--init", str(sft), "--out", str(grpo), "--steps", "1", "--prompts-per-step", "2", "--num-generations", "2"]
    rl += ["--eval-every", "0", "--save-every", "0", "--progress", "false", *TASK]
    assert main(["grpo", *rl]) == 0
    assert json.loads((grpo / "model" / "config.json").read_text())["config"]["digit_slots"] == 1
    capsys.readouterr()
    assert main(["export", str(grpo), "--out", str(tmp_path / "hf")]) == 2
    assert "digit_slots" in capsys.readouterr().err
    assert main(["sft", "--out", str(tmp_path / "x"), *TINY, "--model.digit-slots", "1", "--task.digits", "2"]) == 2
    assert "task.digits" in capsys.readouterr().err
