"""Flags a TRL user types: booleans as switches, TRL's option names as spellings of ours, and one line of
configuration output unless --verbose.

The oracle for every alias is our own spelling: the TRL flag must resolve to the same config as ours.
"""

import pytest

from posttrain.cli import build_parser, main
from posttrain.cli._common import resolve
from posttrain.errors import ConfigError

SFT_TINY = ["--steps", "2", "--batch-size", "8", "--eval-every", "0", "--save-every", "0", "--progress", "false"]
SFT_TINY += ["--restarts", "1", "--model.n-layer", "1", "--model.d-model", "32", "--model.n-head", "2"]
SFT_TINY += ["--task.digits", "1", "--task.num-demos", "20", "--task.num-eval", "8"]


def resolved(cmd: str, *flags: str):
    from posttrain.trainers import dpo_config, pg_config, sft

    cls, presets = {
        "sft": (sft.SFTConfig, sft.PRESETS),
        "dpo": (dpo_config.DPOConfig, dpo_config.PRESETS),
        "grpo": (pg_config.PolicyGradientConfig, pg_config.PRESETS),
    }[cmd]
    args = build_parser([cmd]).parse_args([cmd, *flags])
    return resolve(cls, presets, args)


@pytest.mark.parametrize(
    "cmd,trl,ours",
    [
        ("sft", ["--learning-rate", "2e-4"], ["--lr", "2e-4"]),
        ("sft", ["--max-steps", "7"], ["--steps", "7"]),
        ("sft", ["--gradient-accumulation-steps", "4"], ["--grad-accum", "4"]),
        ("sft", ["--per-device-train-batch-size", "8", "--gradient-accumulation-steps", "4"], ["--batch-size", "32", "--grad-accum", "4"]),
        ("dpo", ["--per-device-train-batch-size", "6", "--init", "x"], ["--batch-size", "6", "--init", "x"]),
        ("dpo", ["--loss", "sigmoid", "--init", "x"], ["--loss", "dpo", "--init", "x"]),
        ("grpo", ["--max-completion-length", "12", "--num-generations", "4"], ["--max-new-tokens", "12", "--num-generations", "4"]),
        ("grpo", ["--learning_rate", "1e-5"], ["--lr", "1e-5"]),  # the underscore spelling too
    ],
)  # fmt: skip
def test_trl_spellings_resolve_like_ours(cmd, trl, ours):
    assert resolved(cmd, *trl) == resolved(cmd, *ours)
    assert resolved(cmd, *trl) != resolved(cmd)  # the flag did something


def test_per_device_batch_counts_processes(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert resolved("sft", "--per-device-train-batch-size", "4").batch_size == 8


def test_per_device_batch_with_batch_size_is_an_error():
    with pytest.raises(ConfigError, match="both given"):
        resolved("sft", "--per-device-train-batch-size", "4", "--batch-size", "8")


def test_dpo_keeps_its_own_max_completion_length():
    cfg = resolved("dpo", "--max-completion-length", "5", "--init", "x")
    assert cfg.max_completion_length == 5 and cfg.max_new_tokens == resolved("dpo", "--init", "x").max_new_tokens


@pytest.mark.parametrize(
    "flags,want",
    [
        ([], False),
        (["--merge-lora"], True),
        (["--merge-lora", "true"], True),
        (["--merge-lora", "false"], False),
        (["--merge-lora", "--no-merge-lora"], False),  # the last one wins
        (["--no-merge-lora", "--merge-lora"], True),
        (["--merge_lora"], True),
    ],
)
def test_booleans_are_switches_and_still_take_values(flags, want):
    assert resolved("sft", *flags).merge_lora is want


def test_a_switch_followed_by_another_flag_and_a_bad_value():
    assert resolved("sft", "--merge-lora", "--steps", "3").merge_lora is True
    with pytest.raises(ConfigError):
        resolved("sft", "--merge-lora", "maybe")


def test_help_names_the_switch_and_the_trl_spellings(capsys):
    with pytest.raises(SystemExit):
        main(["sft", "--help"])
    out = capsys.readouterr().out
    assert "--no-merge-lora" in out and "--learning-rate" in out and "--per-device-train-batch-size" in out


def test_one_line_of_config_unless_verbose(tmp_path, capsys):
    assert main(["sft", "--preset", "tiny", "--out", str(tmp_path / "a"), *SFT_TINY]) == 0
    out = capsys.readouterr().out
    assert "resolved config:" not in out and "weight_decay" not in out
    cfg_file = tmp_path / "a" / "config.resolved.yaml"
    assert cfg_file.is_file() and sum(str(cfg_file) in line for line in out.splitlines()) == 1
    assert main(["sft", "--preset", "tiny", "--out", str(tmp_path / "b"), "--verbose", *SFT_TINY]) == 0
    verbose = capsys.readouterr().out
    assert "resolved config:" in verbose and "weight_decay" in verbose
    assert len(verbose.splitlines()) > len(out.splitlines()) + 20
