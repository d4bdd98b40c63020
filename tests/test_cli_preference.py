"""CLI smoke runs for `posttrain rm` and `posttrain dpo`, and their one-line user errors."""

import json

import pytest

from posttrain.cli import main

TASK = ["--task.digits", "1", "--task.num-demos", "20", "--task.num-eval", "8", "--progress", "false"]
TINY_MODEL = ["--model.n-layer", "1", "--model.d-model", "32", "--model.n-head", "2"]
PAIRS = ["--pairs.num-prompts", "16", "--pairs.samples-per-prompt", "4", "--pairs.gold-chosen", "true"]


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft")
    assert (
        main(
            [
                "sft",
                "--out",
                str(out),
                "--steps",
                "4",
                "--batch-size",
                "8",
                "--eval-every",
                "0",
                "--save-every",
                "0",
                *TINY_MODEL,
                *TASK,
            ]
        )
        == 0
    )
    return str(out)


def test_rm_then_dpo_from_sft(tmp_path, sft, capsys):
    rm = tmp_path / "rm"
    assert (
        main(
            [
                "rm",
                "--preset",
                "tiny",
                "--out",
                str(rm),
                "--init",
                sft,
                "--steps",
                "2",
                "--batch-size",
                "4",
                "--eval-prompts",
                "8",
                *PAIRS,
                *TASK,
            ]
        )
        == 0
    )
    s = json.loads((rm / "summary.json").read_text())
    assert 0 <= s["heldout_pairwise_accuracy"] <= 1 and (rm / "model" / "reward_stats.json").is_file()
    assert "held-out pairwise accuracy" in capsys.readouterr().out

    for loss in ("dpo", "simpo", "kto"):
        out = tmp_path / loss
        assert (
            main(
                [
                    "dpo",
                    "--preset",
                    "tiny",
                    "--loss",
                    loss,
                    "--init",
                    sft,
                    "--out",
                    str(out),
                    "--steps",
                    "2",
                    "--batch-size",
                    "4",
                    "--eval-every",
                    "0",
                    "--save-every",
                    "0",
                    *PAIRS,
                    *TASK,
                ]
            )
            == 0
        )
        s = json.loads((out / "summary.json").read_text())
        assert s["loss"] == loss and "heldout_accuracy_init" in s and (out / "pairs.jsonl").is_file()
    assert "held-out accuracy:" in capsys.readouterr().out


def test_dpo_loss_kwargs_flag(tmp_path, sft):
    out = tmp_path / "c"
    assert (
        main(
            [
                "dpo",
                "--loss",
                "cdpo",
                "--loss-kwargs",
                '{"label_smoothing": 0.2}',
                "--init",
                sft,
                "--out",
                str(out),
                "--steps",
                "1",
                "--batch-size",
                "4",
                "--eval-every",
                "0",
                "--save-every",
                "0",
                *PAIRS,
                *TASK,
            ]
        )
        == 0
    )
    assert json.loads((out / "config.resolved.json").read_text())["loss_kwargs"] == {"label_smoothing": 0.2}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["dpo"], "dpo needs --init SFT_CHECKPOINT"),
        (["dpo", "--loss", "nope"], "loss='nope' is not valid"),
        (["dpo", "--loss", "dpo", "--loss-kwargs", '{"gamma": 1}'], "not accepted by loss 'dpo'"),
        (["dpo", "--loss", "dpo,sft", "--loss-weights", "1"], "loss_weights='1' has 1 weights for 2 loss"),
        (["dpo", "--loss", "dpo,kto"], "kto is unpaired and cannot be combined"),
        (["dpo", "--init", "/nonexistent"], "checkpoint not found"),
        (["rm", "--source", "policy"], "--source policy samples the --init model"),
        (["rm", "--bucket-edges", "3,1"], "bucket_edges must be increasing"),
    ],
)
def test_user_errors_are_one_line(argv, message, capsys, tmp_path):
    assert main([*argv, "--out", str(tmp_path / "o"), *TASK]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_bad_pairs_file_names_the_line(tmp_path, sft, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"prompt": "1+1=", "chosen": "2", "rejected": "3"}\n{"prompt": "1+2=", "chosen": 3, "rejected": "4"}\n'
    )
    assert main(["dpo", "--init", sft, "--data", str(bad), "--out", str(tmp_path / "o"), *TASK]) == 2
    assert "bad.jsonl:2: field 'chosen' must be a string, got int" in capsys.readouterr().err


def test_rm_eval_only(tmp_path, sft, capsys):
    rm = tmp_path / "rm"
    assert (
        main(
            [
                "rm",
                "--out",
                str(rm),
                "--steps",
                "2",
                "--batch-size",
                "4",
                "--eval-prompts",
                "8",
                "--eval-every",
                "0",
                "--save-every",
                "0",
                *TINY_MODEL,
                *TASK,
            ]
        )
        == 0
    )
    capsys.readouterr()
    ev = tmp_path / "ev"
    assert (
        main(
            [
                "rm",
                "--eval-only",
                "--init",
                str(rm),
                "--eval-data",
                str(rm / "eval_pairs.jsonl"),
                "--out",
                str(ev),
                *TASK,
            ]
        )
        == 0
    )
    s = json.loads((ev / "summary.json").read_text())
    n = len((rm / "eval_pairs.jsonl").read_text().splitlines())
    assert s["n"] == n and f"pairwise accuracy: {s['pairwise_accuracy']:.4f} on {n} pairs" in capsys.readouterr().out
    # the RM's own held-out evaluation of the same pairs agrees
    assert s["pairwise_accuracy"] == pytest.approx(json.loads((rm / "summary.json").read_text())["heldout/accuracy"])
    # a policy checkpoint is not a reward model: one line, exit 2
    assert (
        main(
            [
                "rm",
                "--eval-only",
                "--init",
                sft,
                "--eval-data",
                str(rm / "eval_pairs.jsonl"),
                "--out",
                str(tmp_path / "ev2"),
                *TASK,
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert (
        f"{sft}/model is not a reward-model checkpoint (no reward_head.safetensors); train one with `posttrain rm`"
        in err
        and len(err.splitlines()) == 1
    )
    assert main(["rm", "--eval-only", "--init", str(rm), "--out", str(tmp_path / "ev3"), *TASK]) == 2
    assert "--eval-only needs --init RM_CHECKPOINT and --eval-data pairs.jsonl" in capsys.readouterr().err
