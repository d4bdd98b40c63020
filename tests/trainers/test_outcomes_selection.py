"""benchmarks/bench_outcomes.py records which split chose what, chooses recipes on dev only, and refuses a sweep that
would choose on the test (held-out) split."""

import json
from pathlib import Path

import pytest

import benchmarks.bench_outcomes as bo
from benchmarks._outcomes_selection import SelectionError, choose, selection
from posttrain.tasks.arithmetic import ArithmeticTask


def _jsonl(path: Path, problems) -> str:
    path.write_text("".join(json.dumps({"prompt": p.prompt, "answer": p.answer}) + "\n" for p in problems))
    return str(path)


def test_the_default_recipes_choose_on_dev_and_report_test():
    sft = selection("sft", bo.resolved_recipe("sft", ""))
    assert sft["chose"]["restart"] == "dev" and sft["chose"]["checkpoint"].startswith("none")  # tiny: 4 restarts
    assert sft["selection_split"] == "dev" and sft["reported_split"] == "test"
    for stage in ("grpo", "dpo", "ppo", "rm"):
        rec = selection(stage, bo.resolved_recipe(stage, ""))
        assert rec["selection_split"] == "dev" and rec["chose"]["recipe"] == "dev", stage
        assert rec["chose"]["checkpoint"].startswith("none"), stage  # the final model is not chosen on any split
    assert selection("sft", bo.resolved_recipe("sft", "--val-fraction 0.1 --restarts 1"))["chose"] == {
        "recipe": "dev",
        "checkpoint": "dev",
    }


def test_val_data_is_recorded_by_the_split_its_problems_lie_in(tmp_path):
    task = ArithmeticTask()
    dev = _jsonl(tmp_path / "dev.jsonl", task.dev_problems[:5])
    test = _jsonl(tmp_path / "test.jsonl", task.dev_problems[:4] + task.heldout_problems[:1])
    assert selection("sft", bo.resolved_recipe("sft", f"--val-data {dev}"))["chose"]["restart"] == "dev"
    rec = selection("sft", bo.resolved_recipe("sft", f"--val-data {test}"))
    assert rec["chose"]["restart"] == "test" and rec["selection_split"] == "test"


def test_a_sweep_that_would_choose_on_test_is_refused_before_any_run(tmp_path, monkeypatch, capsys):
    task = ArithmeticTask()
    bad = _jsonl(tmp_path / "v.jsonl", task.dev_problems[:3] + task.heldout_problems[:2])
    monkeypatch.setattr(bo, "sweep", lambda *a, **k: pytest.fail("a run started"))
    work = tmp_path / "w"
    assert bo.main(["--stages", "sft", "--seeds", "0", "--work", str(work), "--sft-args", f"--val-data {bad}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: this sweep: sft's restart would be chosen on the test split") and "\n" == err[-1]
    assert not (work / "outcomes.json").exists()


def test_a_sweep_records_its_task_and_which_split_chose_what(tmp_path, monkeypatch):
    seen = {}

    def fake_sweep(seeds, stages, work, extras, *a, **k):
        seen.update(extras)
        return {s: {st: {"accuracy": 0.5, "dev_accuracy": 0.4} for st in stages} for s in seeds}

    monkeypatch.setattr(bo, "sweep", fake_sweep)
    monkeypatch.setattr(bo, "write_curves", lambda *a: [])
    work = tmp_path / "w"
    assert bo.main(["--stages", "sft", "grpo", "--seeds", "0", "1", "--work", str(work), "--task", "sort"]) == 0
    assert seen["sft"].startswith("--task sort") and seen["grpo"].startswith("--task sort")
    report = json.loads((work / "outcomes.json").read_text())
    assert report["task"] == "sort" and report["recipes"]["grpo"]["task"]["name"] == "sort"
    assert {st: r["selection_split"] for st, r in report["selection"].items()} == {"sft": "dev", "grpo": "dev"}
    assert report["aggregate"]["grpo"]["dev"]["mean"] == pytest.approx(0.4)


def _report(path: Path, dev: list | None, test: list, selection_record=None) -> str:
    results = {
        str(s): {"grpo": {"accuracy": t, **({"dev_accuracy": dev[s]} if dev else {})}} for s, t in enumerate(test)
    }
    rep = {"results": results, "extra_args": {"grpo": path.stem}, "selection": selection_record or {}}
    path.write_text(json.dumps(rep))
    return str(path)


def test_choose_picks_the_best_dev_mean_whatever_test_says(tmp_path, capsys):
    a = _report(tmp_path / "a.json", dev=[0.80, 0.82], test=[0.95, 0.97])  # the better test numbers ...
    b = _report(tmp_path / "b.json", dev=[0.85, 0.84], test=[0.90, 0.91])  # ... but b is better on dev
    picked = choose([a, b], "grpo")
    assert picked["chosen"]["path"] == b and picked["chosen"]["test_mean"] == pytest.approx(0.905)
    assert bo.main(["--choose", a, b, "--by-stage", "grpo"]) == 0
    assert f"chosen on dev: {b}" in capsys.readouterr().out


def test_choose_refuses_a_sweep_without_dev_scores_or_that_chose_on_test(tmp_path, capsys):
    a = _report(tmp_path / "a.json", dev=[0.8, 0.8], test=[0.9, 0.9])
    old = _report(tmp_path / "old.json", dev=None, test=[0.95, 0.96])  # before the dev split: test numbers only
    with pytest.raises(SelectionError, match="old.json: no dev-split scores for grpo"):
        choose([a, old], "grpo")
    assert bo.main(["--choose", a, old]) == 2
    assert "would select on the test split" in capsys.readouterr().err
    chose_test = {"sft": {"chose": {"restart": "test"}, "selection_split": "test"}}
    bad = _report(tmp_path / "bad.json", dev=[0.9, 0.9], test=[0.9, 0.9], selection_record=chose_test)
    with pytest.raises(SelectionError, match="bad.json: sft's restart would be chosen on the test split"):
        choose([a, bad], "grpo")
    with pytest.raises(bo.CombineError, match="bad.json: sft's restart would be chosen on the test split"):
        bo.combine([a, bad])


def test_choose_keeps_the_incumbent_when_the_paired_dev_gain_is_within_noise(tmp_path, capsys):
    inc = _report(tmp_path / "inc.json", dev=[0.80, 0.70, 0.75], test=[0.7, 0.7, 0.7])
    # +0.03 mean paired gain, but the per-seed differences (+0.09, -0.03, +0.03) have se 0.035: z 0.87
    noisy = _report(tmp_path / "noisy.json", dev=[0.89, 0.67, 0.78], test=[0.9, 0.9, 0.9])
    picked = choose([inc, noisy], "grpo")
    assert picked["chosen"]["path"] == inc and not picked["candidates"][1]["clears"]
    gain = picked["candidates"][1]["paired_gain"]
    diffs = [0.09, -0.03, 0.03]  # brute force: the mean and the standard error of the differences
    mean = sum(diffs) / 3
    se = (sum((d - mean) ** 2 for d in diffs) / 2) ** 0.5 / 3**0.5
    assert gain["seeds"] == 3 and gain["mean"] == pytest.approx(mean) and gain["se"] == pytest.approx(se)
    assert gain["z"] == pytest.approx(mean / se)
    assert choose([inc, noisy], "grpo", min_z=0)["chosen"]["path"] == noisy  # the plain best-mean rule
    assert bo.main(["--choose", inc, noisy]) == 0
    out = capsys.readouterr().out
    assert "within noise (needs z > 2)" in out and f"chosen on dev: {inc}" in out
    assert bo.main(["--choose", inc, noisy, "--min-z", "0.5"]) == 0
    assert f"chosen on dev: {noisy}" in capsys.readouterr().out


def test_choose_takes_a_consistent_gain_and_pairs_by_seed(tmp_path):
    inc = _report(tmp_path / "inc.json", dev=[0.75, 0.5, 0.625], test=[0.7, 0.7, 0.7])  # binary fractions: exact
    steady = _report(tmp_path / "steady.json", dev=[0.8125, 0.5625, 0.6875], test=[0.8, 0.8, 0.8])  # +1/16 each
    worse = _report(tmp_path / "worse.json", dev=[0.70, 0.60, 0.65], test=[0.99, 0.99, 0.99])
    picked = choose([inc, worse, steady], "grpo")
    assert picked["chosen"]["path"] == steady and picked["candidates"][2]["paired_gain"]["z"] == float("inf")
    # the same dev numbers in another seed order are another pairing: the per-seed gain is no longer steady
    shuffled = _report(tmp_path / "shuffled.json", dev=[0.5625, 0.6875, 0.8125], test=[0.8, 0.8, 0.8])
    assert choose([inc, shuffled], "grpo")["chosen"]["path"] == inc


def test_choose_needs_two_shared_seeds_to_judge_noise(tmp_path):
    inc = _report(tmp_path / "inc.json", dev=[0.80], test=[0.7])
    one = _report(tmp_path / "one.json", dev=[0.90], test=[0.8])
    with pytest.raises(SelectionError, match="one.json: 1 seed\\(s\\) shared with the incumbent"):
        choose([inc, one], "grpo")
    assert choose([inc, one], "grpo", min_z=0)["chosen"]["path"] == one


def test_choose_refuses_a_negative_min_z(tmp_path, capsys):
    inc = _report(tmp_path / "inc.json", dev=[0.8, 0.7], test=[0.7, 0.7])
    with pytest.raises(SystemExit) as e:
        bo.main(["--choose", inc, inc, "--min-z", "-1"])
    assert e.value.code == 2 and "--min-z -1: a number of standard errors, 0 or more" in capsys.readouterr().err


def _finished_sft_run(run: Path) -> None:
    """What a sweep leaves of a finished SFT run: its summary and the command that made it."""
    run.mkdir(parents=True)
    (run / "summary.json").write_text("{}")
    (run.parent / "sft.command.json").write_text(json.dumps({"cmd": ["-m", "posttrain", "sft"]}))


def _taken_sft_runs(root: Path, seeds, changes=None) -> None:
    """Fake SFT runs of an earlier sweep: each seed's run directory with the config it trained with."""
    for s in seeds:
        cfg = {**bo.resolved_recipe("sft", ""), "seed": s, "out": str(root / f"seed{s}" / "sft"), "threads": 1}
        cfg.update((changes or {}).get(s, {}))
        _finished_sft_run(root / f"seed{s}" / "sft")
        (root / f"seed{s}" / "sft" / "config.resolved.json").write_text(json.dumps(cfg))


def test_sft_runs_taken_from_another_sweep_record_what_chose_them(tmp_path, monkeypatch):
    _taken_sft_runs(tmp_path / "sft", [0, 1], {1: {"threads": 2}})  # how a run used the machine is not its recipe
    monkeypatch.setattr(bo, "sweep", lambda seeds, stages, *a, **k: {s: {"grpo": {"accuracy": 0.5}} for s in seeds})
    monkeypatch.setattr(bo, "write_curves", lambda *a: [])
    work = tmp_path / "w"
    argv = ["--stages", "grpo", "--seeds", "0", "1", "--work", str(work), "--sft-from", str(tmp_path / "sft")]
    assert bo.main(argv) == 0
    report = json.loads((work / "outcomes.json").read_text())
    assert (
        report["selection"]["sft"]["chose"]["restart"] == "dev"
        and report["selection"]["sft"]["selection_split"] == "dev"
    )
    assert report["recipes"]["sft"]["restarts"] == 4 and not {"seed", "out", "threads"} & set(report["recipes"]["sft"])


def test_sft_runs_taken_that_chose_on_test_or_mix_recipes_are_refused_before_any_run(tmp_path, monkeypatch, capsys):
    task = ArithmeticTask()
    bad = _jsonl(tmp_path / "v.jsonl", task.dev_problems[:3] + task.heldout_problems[:2])
    monkeypatch.setattr(bo, "sweep", lambda *a, **k: pytest.fail("a run started"))
    for name, changes, says in [
        ("on_test", {1: {"val_data": bad}}, "sft's restart would be chosen on the test split"),
        ("mixed", {1: {"weight_decay": 1.0}}, "another SFT recipe than"),
        (
            "nested",
            {1: {"model": {**bo.resolved_recipe("sft", "")["model"], "n_layer": 2}}},
            "(model.n_layer: 2 against 4)",
        ),
    ]:
        root = tmp_path / name
        _taken_sft_runs(root, [0, 1], changes)
        argv = ["--stages", "grpo", "--seeds", "0", "1", "--work", str(tmp_path / "w"), "--sft-from", str(root)]
        assert bo.main(argv) == 2, name
        err = capsys.readouterr().err
        assert err.startswith(f"error: {root / 'seed1' / 'sft'}") and says in err, err
    assert not (tmp_path / "w" / "outcomes.json").exists()


def test_sft_runs_without_their_config_are_recorded_as_unknown(tmp_path, monkeypatch):
    _finished_sft_run(tmp_path / "sft" / "seed0" / "sft")  # made before runs recorded their config
    monkeypatch.setattr(bo, "sweep", lambda seeds, stages, *a, **k: {s: {"grpo": {"accuracy": 0.5}} for s in seeds})
    monkeypatch.setattr(bo, "write_curves", lambda *a: [])
    argv = ["--stages", "grpo", "--seeds", "0", "--work", str(tmp_path / "w"), "--sft-from", str(tmp_path / "sft")]
    assert bo.main(argv) == 0
    report = json.loads((tmp_path / "w" / "outcomes.json").read_text())
    assert report["selection"]["sft"]["selection_split"] == "unknown" and report["recipes"]["sft"] is None


def test_a_seed_without_its_sft_run_is_refused_before_any_run(tmp_path, monkeypatch, capsys):
    _taken_sft_runs(tmp_path / "sft", [0])
    monkeypatch.setattr(bo, "sweep", lambda *a, **k: pytest.fail("a run started"))
    for sft_from in (tmp_path / "sft", tmp_path / "nowhere"):  # seed 1 missing; the whole directory missing
        argv = ["--stages", "grpo", "--seeds", "0", "1", "--work", str(tmp_path / "w"), "--sft-from", str(sft_from)]
        assert bo.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --sft-from {sft_from}: no finished SFT run at ") and "\n" == err[-1], err
    assert not (tmp_path / "w" / "outcomes.json").exists()
