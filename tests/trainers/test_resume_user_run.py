"""``--resume DIR`` alone continues a user's run as it was started: the user's model directory, chat file and
flags come from the run's saved config, never from presets or the embedded task, and the resumed run ends
bitwise equal to an uninterrupted one.

Oracle: the same command run without interruption (its final weights, tensor by tensor, and its metrics).
The user's model is a random 2-layer Qwen2 saved with ``save_pretrained``; the data a chat file."""

import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parents[1] / "models"))  # the suite runs with --import-mode=importlib
from _hfdirs import make_model_dir  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from posttrain.cli import main  # noqa: E402
from posttrain.trainers.checkpoint import CheckpointManager  # noqa: E402


def _chat(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in rows))
    return path


def _jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    d = tmp_path_factory.mktemp("user")
    words = ["red", "blue", "green", "gold", "grey", "pink", "teal", "navy"]
    turns = [
        [{"role": "user", "content": f"colour {i}?"}, {"role": "assistant", "content": w}]
        for i, w in enumerate(words * 2)
    ]
    return {
        "model": make_model_dir(d / "mymodel", "qwen2"),
        "data": _chat(d / "chat_sft.jsonl", turns),
        "eval": _jsonl(d / "e.jsonl", [{"prompt": m[:1], "answer": m[1]["content"]} for m in turns[:4]]),
    }


def _argv(user, out: Path) -> list[str]:
    return [
        "sft",
        "--model",
        str(user["model"]),
        "--data",
        str(user["data"]),
        "--eval-data",
        str(user["eval"]),
        "--batch-size",
        "4",
        "--steps",
        "6",
        "--save-every",
        "2",
        "--eval-every",
        "0",
        "--max-new-tokens",
        "2",
        "--lr",
        "0.01",
        "--progress",
        "false",
        "--out",
        str(out),
    ]


def _weights(run: Path) -> dict:
    return load_file(str(run / "model" / "model.safetensors"))


def test_resume_alone_continues_the_users_run_bitwise(user, tmp_path, capsys, monkeypatch):
    run, full = tmp_path / "R", tmp_path / "full"
    real_save = CheckpointManager.save

    def save_then_die(self, step, **kw):  # killed right after the step-4 checkpoint
        real_save(self, step, **kw)
        if step == 4:
            raise KeyboardInterrupt

    monkeypatch.setattr(CheckpointManager, "save", save_then_die)
    assert main(_argv(user, run)) == 130
    monkeypatch.undo()
    assert not (run / "model").exists()
    capsys.readouterr()

    assert main(["sft", "--resume", str(run)]) == 0  # nothing but the run directory
    out, err = capsys.readouterr()
    assert "warning" not in err and "note: resuming" not in out  # nothing changed, nothing to report
    assert "preset" not in out
    cfg = json.loads((run / "config.resolved.json").read_text())
    assert (cfg["model_path"], cfg["data"], cfg["eval_data"]) == (
        str(user["model"]),
        str(user["data"]),
        str(user["eval"]),
    )
    assert (cfg["batch_size"], cfg["steps"], cfg["restarts"]) == (4, 6, 1)
    steps = [json.loads(ln)["step"] for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]

    assert main(_argv(user, full)) == 0  # the same run, uninterrupted
    got, want = _weights(run), _weights(full)
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)
    losses = [json.loads(ln)["loss"] for ln in (run / "metrics.jsonl").read_text().splitlines()]
    want_losses = [json.loads(ln)["loss"] for ln in (full / "metrics.jsonl").read_text().splitlines()]
    assert losses == want_losses


def test_resume_refuses_a_flag_that_changes_the_users_run(user, tmp_path, capsys, monkeypatch):
    run = tmp_path / "R"
    assert main([*_argv(user, run), "--steps", "2"]) == 0
    capsys.readouterr()
    assert main(["sft", "--resume", str(run), "--batch-size", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"posttrain sft: error: --resume {run} continues the run with its own configuration")
    assert "batch_size 4 -> 8" in err and "\n" not in err
    assert main(["sft", "--resume", str(run), "--steps", "4"]) == 0  # a longer run: allowed, and said
    assert "note: resuming with changed settings: steps 2 -> 4" in capsys.readouterr().out
    assert json.loads((run / "config.resolved.json").read_text())["data"] == str(user["data"])
