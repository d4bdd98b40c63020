"""benchmarks/bench_time_to_grpo.py: the commands it times (the runs themselves are replaced by stubs)."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_time_to_grpo as bt  # noqa: E402


def test_candidate_flags_go_to_the_measured_runs_and_the_baseline_is_the_defaults(tmp_path, monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(bt, "run", lambda cmd, log: ran.append(cmd) or 1.0)
    monkeypatch.setattr(bt, "heldout", lambda d: 0.5)
    monkeypatch.setattr(bt, "same_weights", lambda a, b: a.name == "sft")
    argv = [
        "--seeds",
        "3",
        "--baseline-seeds",
        "3",
        "--baseline-flags",
        "",
        "--work",
        str(tmp_path),
        "--task",
        "collatz",
    ]
    assert bt.main([*argv, "--sft-flags", "--restart-probe 0.3", "--grpo-flags", "--steps 750"]) == 0
    sft, grpo, sft_base, grpo_base = ran
    assert sft[-2:] == ["--restart-probe", "0.3"] and "--restart-probe" not in sft_base
    assert grpo[-3:] == ["--steps", "750", "--overwrite"] and "--steps" not in grpo_base
    assert grpo_base[grpo_base.index("--init") + 1] == str(tmp_path / "seed3" / "sft_base")
    assert all(cmd[cmd.index("--task") + 1] == "collatz" for cmd in ran)  # the task reaches the baseline too
    out = capsys.readouterr().out
    assert (
        "measured with sft --restart-probe 0.3 grpo --steps 750; in brackets: the defaults with no extra flags" in out
    )
    rec = json.loads((tmp_path / "time_to_grpo.json").read_text())["results"]["3"]
    assert rec["sft_baseline_same_weights"] and not rec["grpo_baseline_same_weights"]


def test_an_unbalanced_flags_string_is_a_usage_error_before_anything_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bt, "run", lambda *a: pytest.fail("a run started"))
    with pytest.raises(SystemExit) as e:
        bt.main(["--seeds", "0", "--work", str(tmp_path / "w"), "--sft-flags", "--data 'a b"])
    assert e.value.code == 2 and "No closing quotation" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()
