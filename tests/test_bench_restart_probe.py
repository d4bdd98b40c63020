"""benchmarks/bench_restart_probe.py: every restart finished, each probe step's choice judged by what it became."""

import json
import sys
from pathlib import Path

import pytest

from posttrain.checkpoints.load import load_checkpoint
from posttrain.evaluation import evaluate_problems
from posttrain.models.gpt import GPTConfig
from posttrain.tasks.arithmetic import ArithmeticConfig
from posttrain.trainers.sft import SFTConfig, train_sft
from posttrain.trainers.sft_restarts import validation_problems

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_restart_probe as brp  # noqa: E402


def _scores(dev_by_restart: dict[str, dict[str, float]], test: dict[str, float]) -> dict:
    return {k: {"dev": d, "test": test[k]} for k, d in dev_by_restart.items()}


def test_rules_keep_the_best_at_their_step_the_earliest_on_ties_and_pair_against_the_runs_probe():
    s0 = _scores(
        {"0": {"2": 0.5, "4": 0.3, "final": 0.9}, "1": {"2": 0.5, "4": 0.6, "final": 0.4}}, {"0": 0.8, "1": 0.35}
    )
    s1 = _scores(
        {"0": {"2": 0.1, "4": 0.7, "final": 0.6}, "1": {"2": 0.2, "4": 0.1, "final": 0.7}}, {"0": 0.55, "1": 0.65}
    )
    rows = {r["rule"]: r for r in brp.table({"seed1": s1, "seed0": s0}, "4")}
    assert list(rows) == ["probe at step 2", "probe at step 4 (the run's)", "full (2 restarts)", "full, first 1"]
    assert rows["probe at step 2"]["picks"] == [0, 1]  # seed 0 ties at step 2: the earliest restart
    assert rows["probe at step 4 (the run's)"]["picks"] == [1, 0] and rows["probe at step 4 (the run's)"]["paired"] == [
        0,
        0,
    ]
    full = rows["full (2 restarts)"]
    assert full["picks"] == [0, 1] and full["test"] == [0.8, 0.65]
    assert full["paired"] == pytest.approx([0.9 - 0.4, 0.7 - 0.6])


def test_a_restarts_run_is_finished_and_rescored_as_it_ranked(tmp_path, capsys):
    task = ArithmeticConfig(digits=1, num_demos=20, num_eval=8)
    cfg = SFTConfig(
        out=str(tmp_path / "w" / "seed0" / "sft"),
        steps=8,
        batch_size=8,
        eval_every=0,
        save_every=2,
        keep_checkpoints=10,
        warmup_steps=2,
        progress=False,
        lr=1e-2,
        restarts=2,
        restart_probe=0.5,
        restart_jobs=1,
        val_problems=24,
        max_new_tokens=4,
        threads=1,
        model=GPTConfig(n_layer=1, n_head=2, d_model=32, max_seq_len=24),
        task=task,
    )
    train_sft(cfg)
    restarts = tmp_path / "w" / "seed0" / "sft" / "restarts"
    assert sum((restarts / k / "summary.json").is_file() for k in "01") == 1  # the probe left one unfinished
    assert brp.main(["--work", str(tmp_path / "w"), "--write", str(tmp_path / "r.json")]) == 0
    assert all((restarts / k / "summary.json").is_file() for k in "01")
    val = validation_problems(cfg)
    final = {}
    for k in "01":
        ck = load_checkpoint(restarts / k / "model")
        final[k] = evaluate_problems(ck.model, ck.tokenizer, val, max_new_tokens=4, window=None).accuracy
    rec = json.loads((tmp_path / "r.json").read_text())
    assert {k: rec["scores"]["seed0"][k]["dev"]["final"] for k in "01"} == final
    full = next(r for r in rec["table"] if r["rule"] == "full (2 restarts)")
    assert full["picks"] == [0 if final["0"] >= final["1"] else 1]
    assert "| probe at step 4 (the run's) |" in capsys.readouterr().out


def test_a_directory_without_a_restarts_run_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "seed0" / "sft").mkdir(parents=True)
    with pytest.raises(SystemExit) as e:
        brp.main(["--work", str(tmp_path)])
    assert e.value.code == 2 and "no SFT restarts run with a probe" in capsys.readouterr().err


def test_a_corrupt_probe_record_or_a_bad_jobs_count_is_a_usage_error_before_anything_trains(tmp_path, capsys):
    probe = tmp_path / "seed0" / "sft" / "restarts" / "0" / "probe.json"
    probe.parent.mkdir(parents=True)
    (tmp_path / "seed0" / "sft" / "config.resolved.json").write_text("{}")
    probe.write_text('{"step": "x"}')
    for argv, says in [(["--jobs", "0"], "--jobs 0: at least 1"), ([], "corrupt probe record")]:
        with pytest.raises(SystemExit) as e:
            brp.main(["--work", str(tmp_path), *argv])
        assert e.value.code == 2 and says in capsys.readouterr().err
