"""benchmarks/bench_lineage.py: curves read from metrics.jsonl, aggregation over seeds, the table and the PNG on
synthetic run records, and an end-to-end smoke of the real CLI runs on a micro budget."""

import importlib.util
import json
import statistics

import pytest

from benchmarks.bench_lineage import aggregate, main, plot, read_curve, samples_of, seed_table, table


def _curve(accs, dt):
    return [{"step": 10 * i, "train_seconds": dt * 10 * i, "heldout_accuracy": a} for i, a in enumerate(accs)]


def _runs():
    # two methods x three seeds; seed 1 of "ppo" failed
    rows = []
    for seed, sft in ((0, 0.2), (1, 0.1), (2, 0.3)):
        for m, final, dt in (("reinforce", [0.5, 0.25, 0.35][seed], 0.25), ("ppo", [0.6, None, 0.35][seed], 0.9)):
            if final is None:
                rows.append({"method": m, "seed": seed, "rc": 1})
                continue
            rows.append(
                {
                    "method": m,
                    "seed": seed,
                    "rc": 0,
                    "accuracy": final,
                    "gain": final - sft,
                    "wall_seconds": 100.0 + seed,
                    "cpu_seconds": 50.0 * dt + seed,
                    "max_rss_mb": 400.0 + 100 * dt,
                    "train_seconds": 20 * dt,
                    "steps": 20,
                    "batch": 256,
                    "samples_trained": 5120,
                    "samples_generated": 5120 + 256 * seed,
                    "curve": _curve([sft, (sft + final) / 2, final], dt),
                }
            )
    return rows


def test_read_curve_sums_step_times_up_to_each_evaluation(tmp_path):
    p = tmp_path / "metrics.jsonl"
    lines = [
        {"step": 0, "heldout_accuracy": 0.1},
        {"step": 1, "step_time": 0.5},
        {"step": 2, "step_time": 0.25, "heldout_accuracy": 0.3},
        {"step": 3, "step_time": 1.0},
        {"step": 4, "step_time": 2.0, "heldout_accuracy": 0.4},
    ]
    p.write_text("\n".join(json.dumps(r) for r in lines) + "\n\n")
    assert read_curve(p) == [
        {"step": 0, "train_seconds": 0.0, "heldout_accuracy": 0.1},
        {"step": 2, "train_seconds": 0.75, "heldout_accuracy": 0.3},
        {"step": 4, "train_seconds": 3.75, "heldout_accuracy": 0.4},
    ]
    # dynamic sampling: generated = groups actually drawn x G, trained = steps x prompts x G
    q = tmp_path / "pg.jsonl"
    q.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"step": 0, "heldout_accuracy": 0.0},
                {"step": 1, "step_time": 1, "groups_drawn": 64},
                {"step": 2, "step_time": 1, "groups_drawn": 32},
            ]
        )
    )
    assert samples_of(q, {"num_generations": 8, "prompts_per_step": 32}) == (2 * 256, 96 * 8)
    assert samples_of(q, {"num_generations": 4, "prompts_per_step": 64}) == (2 * 256, 96 * 4)


def test_aggregate_per_method_over_seeds():
    agg = aggregate(_runs(), ["reinforce", "ppo"])
    assert list(agg) == ["reinforce", "ppo"]
    r, p = agg["reinforce"], agg["ppo"]
    assert r["accuracy"]["mean"] == pytest.approx(statistics.fmean([0.5, 0.25, 0.35]))
    assert r["accuracy"]["sd"] == pytest.approx(statistics.stdev([0.5, 0.25, 0.35]))
    assert (r["accuracy"]["worst_seed"], r["gain"]["worst_seed"]) == (
        1,
        2,
    )  # gains 0.3, 0.15, 0.05: the worst accuracy is not the worst gain
    assert r["gain"]["min"] == pytest.approx(0.05)
    assert p["failed_seeds"] == [1] and p["accuracy"]["n"] == 2
    assert p["gain"]["mean"] == pytest.approx(statistics.fmean([0.4, 0.05]))
    assert p["max_rss_mb"] == {"mean": pytest.approx(490.0), "max": pytest.approx(490.0)}
    assert r["samples_generated"]["max"] == 5120 + 512
    # mean curve: per evaluation index over the seeds that finished, with the seeds' min and max
    c = p["curve"]
    assert [pt["step"] for pt in c] == [0, 10, 20] and all(pt["n"] == 2 for pt in c)
    assert c[2]["heldout_accuracy"] == pytest.approx(statistics.fmean([0.6, 0.35]))
    assert (c[2]["min"], c[2]["max"]) == (0.35, 0.6)
    assert c[1]["train_seconds"] == pytest.approx(9.0)


def test_table_and_plot_on_synthetic_runs(tmp_path):
    pytest.importorskip("matplotlib")
    runs = _runs()
    agg = aggregate(runs, ["reinforce", "ppo"])
    rows = table(agg)
    assert rows[0].startswith("| method | held-out (mean ± sd) | worst seed | gain over SFT")
    ppo = next(r for r in rows if r.startswith("| ppo"))
    assert "(failed seeds [1])" in ppo and "| 0.475 ± 0.177 |" in ppo and "| 2: 0.350 |" in ppo
    assert "| +22.5 ± 24.7 |" in ppo and "| 490 |" in ppo and "20 × 256" in ppo
    per_seed = seed_table(
        runs, {0: {"accuracy": 0.2}, 1: {"accuracy": 0.1}, 2: {"accuracy": 0.3}, 3: {"rc": 1}}, ["reinforce", "ppo"]
    )
    assert per_seed[2:] == [
        "| 0 | 0.200 | 0.500 (+30.0) | 0.600 (+40.0) |",
        "| 1 | 0.100 | 0.250 (+15.0) | failed |",
        "| 2 | 0.300 | 0.350 (+5.0) | 0.350 (+5.0) |",
        "| 3 | failed | — | — |",
    ]
    png = plot(runs, agg, tmp_path / "sub" / "lineage.png")
    import matplotlib.image

    img = matplotlib.image.imread(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and img.shape[0] > 100 and img.shape[1] > 100


@pytest.mark.slow
def test_end_to_end_micro_budget(tmp_path, capsys):
    """One seed, one method of each trainer (the policy-gradient and the PPO CLI), 2 steps, 8 held-out problems."""
    work = tmp_path / "lin"
    assert (
        main(
            [
                "--seeds",
                "0",
                "--methods",
                "reinforce",
                "a2c",
                "--budget",
                "2",
                "--eval-every",
                "1",
                "--work",
                str(work),
                "--sft-args",
                "--steps 2 --eval-every 0 --task.num-eval 8",
                "--extra-args",
                "--task.num-eval 8",
            ]
        )
        == 0
    )
    rep = json.loads((work / "lineage.json").read_text())
    assert [r["method"] for r in rep["runs"]] == ["reinforce", "a2c"]
    for r in rep["runs"]:
        assert (
            r["rc"] == 0
            and 0 <= r["accuracy"] <= 1
            and r["gain"] == pytest.approx(r["accuracy"] - rep["sft"]["0"]["accuracy"])
        )
        assert [p["step"] for p in r["curve"]] == [0, 1, 2] and r["curve"][-1]["heldout_accuracy"] == r["accuracy"]
        assert r["max_rss_mb"] > 50 and r["cpu_seconds"] > 0 and r["steps"] == 2 and r["batch"] == 256
        assert "--steps 2" in r["cmd"] and "--threads 1" in r["cmd"]
    if importlib.util.find_spec("matplotlib"):
        assert (work / "lineage.png").stat().st_size > 0 and rep["png"] == str(work / "lineage.png")
    out = capsys.readouterr().out
    assert "| reinforce |" in out and "| a2c |" in out
