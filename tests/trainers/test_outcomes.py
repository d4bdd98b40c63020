"""benchmarks/bench_outcomes.py's aggregation over seeds: mean, sample sd, worst seed, gain over each seed's own SFT."""

import json
import re
import statistics
from pathlib import Path

import pytest

import benchmarks.bench_outcomes as bo
from benchmarks._outcomes_combine import spell_retired
from benchmarks.bench_outcomes import aggregate, describe


def test_describe_names_the_worst_and_best_seed():
    d = describe({0: 0.5, 1: 0.2, 2: 0.8})
    assert d["mean"] == pytest.approx(0.5) and d["sd"] == pytest.approx(0.3)  # sample sd (n - 1)
    assert (d["worst_seed"], d["min"], d["best_seed"], d["max"]) == (1, 0.2, 2, 0.8)
    assert describe({3: 0.4}) == {
        "n": 1,
        "mean": 0.4,
        "sd": 0.0,
        "min": 0.4,
        "worst_seed": 3,
        "max": 0.4,
        "best_seed": 3,
    }
    assert describe({1: 0.3, 0: 0.3})["worst_seed"] == 0  # ties: the lowest seed, deterministically


def test_gain_is_per_seed_against_its_own_sft_and_failures_are_listed():
    results = {
        0: {"sft": {"accuracy": 0.2}, "grpo": {"accuracy": 0.6}, "dpo": {"accuracy": 0.25}},
        1: {"sft": {"accuracy": 0.1}, "grpo": {"accuracy": 0.3}, "dpo": {"rc": 2}},  # dpo failed on seed 1
        2: {"sft": {"accuracy": 0.3}, "grpo": {"accuracy": 0.45}, "dpo": {"accuracy": 0.29}},
    }
    agg = aggregate(results)
    assert list(agg) == ["sft", "grpo", "dpo"]
    g = agg["grpo"]["gain"]
    assert g["mean"] == pytest.approx(statistics.fmean([0.4, 0.2, 0.15]))
    assert (g["worst_seed"], g["min"]) == (
        2,
        pytest.approx(0.15),
    )  # seed 1 has the lowest accuracy, not the lowest gain
    assert agg["grpo"]["accuracy"]["worst_seed"] == 1
    assert agg["dpo"]["failed_seeds"] == [1] and agg["dpo"]["accuracy"]["n"] == 2
    assert agg["dpo"]["gain"]["worst_seed"] == 2 and agg["dpo"]["gain"]["min"] == pytest.approx(-0.01)
    assert "gain" not in agg["sft"]


def test_extra_flags_take_per_seed_paths(tmp_path):
    cmd = bo.command("rm", 3, tmp_path / "w", "--init {sft} --tag s{seed} --x {work}/y", sft_root=tmp_path / "s")
    i = cmd.index("--init")
    assert cmd[i + 1] == str(tmp_path / "s" / "seed3" / "sft") and "s3" in cmd and str(tmp_path / "w" / "y") in cmd
    assert "--init" not in bo.command("rm", 0, tmp_path, "")  # rm has no SFT start unless asked


def test_a_record_shows_commands_without_this_machines_paths(tmp_path):
    work, sft = tmp_path / "w", tmp_path / "w2"
    shown = bo.portable(bo.command("grpo", 1, work, "--x {work}/y", sft_root=sft), {work: "WORK", sft: "SFT_FROM"})
    assert shown.startswith("python -m posttrain grpo") and str(tmp_path) not in shown
    assert "--out WORK/seed1/grpo" in shown and "--init SFT_FROM/seed1/sft" in shown and "--x WORK/y" in shown
    assert bo.portable(["py", str(work) + "x"], {work: "WORK"}) == f"python {work}x"  # a sibling is not under it


def test_a_recorded_sft_run_is_reused_whatever_its_restarts_share_of_the_cores(tmp_path):
    cmd = bo.command("sft", 0, tmp_path, "--steps 10")[1:]
    before = cmd[: cmd.index("--restart-jobs")] + cmd[cmd.index("--restart-jobs") + 2 :]  # a record from before it
    assert bo.same_run(before, cmd) and bo.same_run(cmd, cmd)
    assert not bo.same_run(before + ["--lr", "1"], cmd)


def test_heldout_all_gain_and_layouts_are_per_seed():
    results = {
        0: {
            "sft": {"accuracy": 0.2, "heldout_all": 0.25, "by_layout": {"1+2": 0.1, "2+2": 0.3}},
            "grpo": {"accuracy": 0.6, "heldout_all": 0.65, "by_layout": {"1+2": 0.2, "2+2": 0.8}},
        },
        1: {
            "sft": {"accuracy": 0.1, "heldout_all": 0.15, "by_layout": {"1+2": 0.0, "2+2": 0.2}},
            "grpo": {"accuracy": 0.3, "heldout_all": 0.5, "by_layout": {"1+2": 0.3, "2+2": 0.6, "1+1": 1.0}},
        },
    }
    agg = aggregate(results)
    g = agg["grpo"]["gain_heldout_all"]
    assert g["mean"] == pytest.approx(statistics.fmean([0.4, 0.35])) and g["worst_seed"] == 1
    assert agg["grpo"]["heldout_all"]["mean"] == pytest.approx(0.575)
    lay = agg["grpo"]["by_layout"]
    assert list(lay) == ["1+1", "1+2", "2+2"] and lay["1+1"]["n"] == 1  # a layout only one seed's run saw
    assert lay["2+2"]["mean"] == pytest.approx(0.7) and lay["1+2"]["worst_seed"] == 0
    assert (
        "gain_heldout_all" not in agg["sft"] and "heldout_all" not in aggregate({0: {"sft": {"accuracy": 0.1}}})["sft"]
    )


def _sweep_file(path, seeds, sft_flags="", cpu="kernels A", commit="c1", whole=True, recipes=None):
    results = {
        str(s): {
            "sft": {"accuracy": 0.3 + s / 100, "heldout_all": 0.3 + s / 100 if whole else 0.31, "by_layout": {}},
            "grpo": {"accuracy": 0.7 + s / 100, "heldout_all": 0.7 + s / 100 if whole else 0.69, "by_layout": {}},
        }
        for s in seeds
    }
    report = {
        "results": results,
        "extra_args": {"sft": sft_flags, "grpo": ""},
        "versions": {"cpu": cpu, "git_commit": commit},
        **({"recipes": recipes} if recipes is not None else {}),
    }
    path.write_text(json.dumps(report))
    return str(path)


def test_combine_reports_over_the_union_of_the_sweeps_seeds(tmp_path, capsys):
    a = _sweep_file(tmp_path / "a.json", [0, 1, 2])
    b = _sweep_file(tmp_path / "b.json", [2, 3], commit="c2", whole=False)  # seed 2 again, other numbers
    with pytest.raises(bo.CombineError, match="seed 2's sft differs"):
        bo.combine([a, b])
    b = _sweep_file(tmp_path / "b.json", [3, 4], commit="c2", whole=False)
    results, notes = bo.combine([a, b])
    assert sorted(results) == [0, 1, 2, 3, 4]
    assert aggregate(results)["grpo"]["gain"]["n"] == 5
    assert any("different commits" in n for n in notes)
    assert any("a sample of the held-out split in " + b in n for n in notes)  # the trainers' measures differ
    assert bo.main(["--combine", a, b]) == 0
    assert "5 seeds from 2 sweeps: 0, 1, 2, 3, 4" in capsys.readouterr().out


@pytest.mark.parametrize(
    "other, message",
    [
        ({"sft_flags": "--restarts 16"}, r"another recipe \(restarts: 16 against \d+\)"),
        ({"sft_flags": "--no-such-flag 3"}, "another recipe"),  # flags this tree cannot resolve are compared as text
        ({"cpu": "kernels B"}, "other kernels"),
    ],
)
def test_combine_refuses_sweeps_of_other_settings(tmp_path, capsys, other, message):
    a = _sweep_file(tmp_path / "a.json", [0, 1])
    b = _sweep_file(tmp_path / "b.json", [2, 3], **other)
    with pytest.raises(bo.CombineError, match=message):
        bo.combine([a, b])
    assert bo.main(["--combine", a, b]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: " + b) and re.search(message, err)


def test_combine_takes_other_flags_that_resolve_to_the_same_config(tmp_path, capsys):
    # the slots16 sweeps: seeds 0-9 ran `--preset slots --restarts 16`, seeds 10-14 `--preset slots16`
    a = _sweep_file(tmp_path / "a.json", [0, 1], sft_flags="--preset slots --restarts 16")
    b = _sweep_file(tmp_path / "b.json", [2, 3], sft_flags="--preset slots16")
    results, notes = bo.combine([a, b])
    assert sorted(results) == [0, 1, 2, 3]
    assert any("'--preset slots16' in " + b in n and "the same config" in n for n in notes)
    c = _sweep_file(tmp_path / "c.json", [4], sft_flags="--preset slots")  # 8 restarts: not the same
    with pytest.raises(bo.CombineError, match=r"restarts: 8 against 16"):
        bo.combine([a, c])


def test_combine_names_a_file_that_is_not_a_sweep(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("[1, 2]")
    with pytest.raises(bo.CombineError, match="x.json: not a bench_outcomes.py outcomes.json"):
        bo.combine([str(bad)])


def test_combine_refuses_a_preset_that_changed_between_sweeps_under_the_same_flags(tmp_path):
    # 2026-12-04 changed what `sft --preset tiny` is: two sweeps with no extra flags ran different recipes
    old = {"sft": {"steps": 600, "restarts": 8}, "grpo": {"steps": 500}}
    new = {"sft": {"steps": 2000, "restarts": 4}, "grpo": {"steps": 500}}
    a = _sweep_file(tmp_path / "a.json", [0, 1], recipes=old)
    b = _sweep_file(tmp_path / "b.json", [2, 3], recipes=new)
    with pytest.raises(bo.CombineError, match=r"sft .*another recipe \(restarts: 4 against 8\)"):
        bo.combine([a, b])
    c = _sweep_file(tmp_path / "c.json", [4], recipes=old)
    assert sorted(bo.combine([a, c])[0]) == [0, 1, 4]
    d = _sweep_file(tmp_path / "d.json", [5])  # recorded nothing (before 2026-12-04): the flags are all there is
    assert sorted(bo.combine([b, d])[0]) == [2, 3, 5]
    # a knob added since (its default the old behaviour) and how a run uses the machine are no other recipe
    later = {
        "sft": {**new["sft"], "restart_jobs": 2, "model": {"n_layer": 2}},
        "grpo": {"steps": 500, "retry_is": True},
    }
    e = _sweep_file(tmp_path / "e.json", [6], recipes=later)
    f = _sweep_file(tmp_path / "f.json", [7], recipes={**later, "sft": {**later["sft"], "model": {"n_layer": 3}}})
    assert sorted(bo.combine([b, e])[0]) == [2, 3, 6]
    with pytest.raises(bo.CombineError, match=r"another recipe \(model.n_layer: 3 against 2\)"):
        bo.combine([e, f])


def test_a_sweep_records_the_configs_its_stages_resolve_to():
    rec = bo.resolved_recipe("sft", "--restarts 3")
    assert rec["restarts"] == 3 and rec["steps"] == bo.resolved_recipe("sft", "")["steps"]
    assert bo.resolved_recipe("grpo", "--preset long_cosine")["steps"] == 1000
    assert bo.resolved_recipe("sft", "--no-such-flag") is None
    assert bo.resolved_recipe("sft", "--preset no_such_preset") is None  # a preset this tree does not have
    # a preset an old record names and this tree removed resolves to the flags it was
    assert bo.resolved_recipe("dpo", "--preset classic")["loss"] == "dpo"
    classic = bo.resolved_recipe("grpo", "--preset classic")
    assert (classic["lr"], classic["average_last"], classic["prompt_filter"], classic["reward"]) == (
        1e-4,
        1,
        False,
        "exact_match:1.0",
    )
    assert spell_retired("sft", ["--lr", "1", "--preset", "slots", "--seed", "3"])[:4] == [
        "--lr",
        "1",
        "--preset",
        "single",
    ]


def test_combine_leaves_borrowed_sft_runs_to_the_sweep_that_made_them(tmp_path):
    sft = _sweep_file(tmp_path / "sft.json", [0, 1], sft_flags="--restarts 4")
    rl = json.loads(Path(_sweep_file(tmp_path / "rl.json", [0, 1], sft_flags="--restarts 4")).read_text())
    rl["sft_from"], rl["extra_args"]["sft"] = "/runs/sft", ""  # --sft-from: its own sft flags say nothing
    (tmp_path / "rl.json").write_text(json.dumps(rl))
    more = _sweep_file(tmp_path / "more.json", [2], sft_flags="--restarts 4")
    results, notes = bo.combine([str(tmp_path / "rl.json"), sft, more])
    assert sorted(results) == [0, 1, 2] and any("took its SFT runs from /runs/sft" in n for n in notes)
    other = _sweep_file(tmp_path / "other.json", [3], sft_flags="--restarts 5")
    with pytest.raises(bo.CombineError, match="restarts: 5 against 4"):
        bo.combine([str(tmp_path / "rl.json"), sft, other])


def test_combine_writes_the_union_as_one_sweep(tmp_path, capsys):
    a = _sweep_file(tmp_path / "a.json", [0, 2])
    b = _sweep_file(tmp_path / "b.json", [1, 3, 4])
    out = tmp_path / "ab.json"
    assert bo.main(["--combine", a, b, "--write", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["seeds"] == [0, 1, 2, 3, 4] and written["combined_from"] == [a, b]
    assert written["extra_args"] == json.loads(Path(a).read_text())["extra_args"]
    results, _ = bo.combine([str(out)])  # read back as one sweep: the same runs, the same aggregate
    assert results == bo.combine([a, b])[0]
    assert written["aggregate"] == json.loads(json.dumps(aggregate(results)))
    assert written["aggregate"]["grpo"]["accuracy"]["mean"] == pytest.approx(
        statistics.mean(0.7 + s / 100 for s in range(5))
    )
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:  # --write without --combine: nothing to write
        bo.main(["--write", str(out)])
    assert e.value.code == 2 and "use it with --combine" in capsys.readouterr().err


def test_combine_refuses_flags_it_would_ignore(tmp_path, capsys):
    a = _sweep_file(tmp_path / "a.json", [0])
    with pytest.raises(SystemExit) as e:
        bo.main(["--combine", a, "--seeds", "1", "--grpo-args", "--steps 3"])
    assert e.value.code == 2 and "--seeds, --grpo-args would be ignored" in capsys.readouterr().err


def test_how_a_run_uses_the_machine_is_not_part_of_its_recipe():
    """--restart-jobs (and threads, the progress bar) change the wall time, not the run: the same recipe."""
    assert bo.resolved_recipe("sft", "--restart-jobs 2") == bo.resolved_recipe("sft", "")
    assert bo.resolved_recipe("sft", "--restart-jobs 0") == bo.resolved_recipe("sft", "")
    assert bo.resolved_recipe("sft", "--restarts 2") != bo.resolved_recipe("sft", "")
