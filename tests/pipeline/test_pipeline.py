"""The pipeline end to end on the ``micro`` preset: one shared run (module fixture), then re-runs on copies.

Oracles: counts that must add up (dedup in = kept + removed; each accuracy a multiple of 1/n), the injected
manifest (what dedup must find), the declared schemas (every section and metric present), an uninterrupted
run (a killed-and-resumed SFT must end with the same weights), and the cache rules (a re-run does nothing; a
changed stage re-runs with exactly the stages after it).
"""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from posttrain.config import build_config
from posttrain.pipeline.config import PRESETS, PipelineConfig
from posttrain.pipeline.run import run_pipeline
from posttrain.pipeline.stages import STAGES, get

AFTER_SFT = ("sft_raw", "rm", "dpo", "grpo", "ppo", "eval", "report")


def micro(**overrides):
    return build_config(PipelineConfig, PRESETS["micro"], overrides=overrides)


def statuses(result) -> dict:
    return {k: v["status"] for k, v in result["stages"].items()}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipe") / "micro"
    result = run_pipeline(micro(), out, quiet=True, preset="micro")
    return out, result


def test_every_stage_ran_and_the_report_has_every_section(run):
    out, result = run
    st = statuses(result)
    assert {k for k, v in st.items() if v == "skipped"} == set()
    md = (out / "report" / "report.md").read_text()
    page = (out / "report" / "report.html").read_text()
    for stage in STAGES:
        if stage.name == "report":
            continue
        assert f"Stage {stage.name}:" in md and f"Stage {stage.name}:" in page
        if st[stage.name] == "skipped":
            continue
        done = json.loads((out / stage.name / "DONE.json").read_text())
        missing = [m.key for m in stage.schema if get(done["summary"], m.key) is None]
        assert missing == [], f"{stage.name} summary lacks {missing}"
        assert "missing" not in md.split(f"Stage {stage.name}:")[1].split("## Stage")[0]
    assert "<img" in page and "src='data:image/png;base64," in page and "src='http" not in page
    figures = {p.name for p in (out / "report").glob("*.png")}
    assert {
        "training_loss.png",
        "rl_curves.png",
        "dpo_logps.png",
        "rm.png",
        "lsh_s_curve.png",
        "tokens_per_word.png",
        "heldout_accuracy.png",
    } <= figures


def test_summaries_agree(run):
    out, result = run
    cfg = micro()
    d = json.loads((out / "dedup" / "DONE.json").read_text())["summary"]
    assert d["documents_in"] == d["kept"] + sum(d["removed"].values())
    assert d["documents_in"] == sum(1 for _ in open(out / "dedup" / "raw.jsonl"))
    c = cfg.corpus
    assert d["injected"] == {"exact": c.exact_dups, "near": c.near_dups, "leak": c.leaks}
    assert d["removed"]["exact"] == c.exact_dups and d["removed"]["contamination"] == c.leaks
    assert all(d["counts_match"].values()), d["counts_match"]
    n = cfg.task.num_eval
    for name, row in result["heldout"].items():
        assert row["n"] == n
        for k in ("greedy", "pass@1", "pass@k"):
            if row[k] is not None:
                denom = n * (cfg.eval.samples if k == "pass@1" else 1)
                assert 0 <= row[k] <= 1 and abs(row[k] * denom - round(row[k] * denom)) < 1e-9, (name, k, row[k])
        if name not in ("rm_best_of_n", "rm_weighted_best_of_n"):
            assert result["stages"][name]["heldout_accuracy"] == row["greedy"]
            assert (out / name / "model" / "model.safetensors").is_file()
    rm = result["stages"]["rm"]
    assert (rm["best_of_n_accuracy"], rm["weighted_best_of_n_accuracy"]) == (
        result["heldout"]["rm_best_of_n"]["greedy"],
        result["heldout"]["rm_weighted_best_of_n"]["greedy"],
    )
    trainer_acc = json.loads((out / "sft" / "summary.json").read_text())["heldout_accuracy"]
    assert result["heldout"]["sft"]["greedy"] == trainer_acc  # the eval stage agrees with the trainer's own eval
    assert json.loads((out / "summary.json").read_text())["heldout"] == result["heldout"]


def test_eval_scores_the_whole_heldout_split_by_layout(run):
    """Every policy greedily on all held-out problems, per operand layout; oracle: the layouts counted by brute
    force, and the SFT model decoded one prompt at a time by argmax over a full forward (no batch, no cache)."""
    from collections import Counter

    from posttrain.checkpoints.load import POLICY, load_checkpoint
    from posttrain.evaluation import encode_prompt
    from posttrain.tasks.arithmetic import ArithmeticTask, layout

    out, _ = run
    cfg = micro()
    ev = json.loads((out / "eval" / "DONE.json").read_text())["summary"]
    problems = ArithmeticTask(cfg.task).heldout_problems
    want = Counter(layout(p.prompt) for p in problems)
    assert set(ev["heldout_all"]) == {k for k in ev["models"] if k in ("sft", "sft_raw", "dpo", "grpo", "ppo")}
    for name, r in ev["heldout_all"].items():
        assert r["n"] == len(problems) and {k: g["n"] for k, g in r["by_layout"].items()} == want, name
        assert sum(g["correct"] for g in r["by_layout"].values()) == round(r["greedy_accuracy"] * r["n"]), name
    ckpt = load_checkpoint(out / "sft" / "model", accept_kinds=POLICY, role="test")
    model, tok = ckpt.model.eval(), ckpt.tokenizer
    right = Counter()
    with torch.no_grad():
        for p in problems:
            ids = encode_prompt(tok, p.prompt)
            n0 = len(ids)
            for _ in range(cfg.eval.max_new_tokens):
                nxt = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
                if nxt == tok.eos_id:
                    break
                ids.append(nxt)
            right[layout(p.prompt)] += tok.decode(ids[n0:]).strip() == p.answer
    assert {k: g["correct"] for k, g in ev["heldout_all"]["sft"]["by_layout"].items()} == {k: right[k] for k in want}
    md = (out / "report" / "report.md").read_text()
    assert f"all {len(problems)}" in md and "2+2 (n=" in md


def test_rerun_is_all_cached_even_after_moving_the_run(run, tmp_path):
    out, _ = run
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)  # keys hold no paths: a copied run is still complete
    again = run_pipeline(micro(), moved, quiet=True)
    assert {v for k, v in statuses(again).items() if k != "ppo"} == {"cached"}


def test_changed_stage_reruns_it_and_the_stages_after_it_only(run, tmp_path, capsys):
    out, _ = run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    cfg = micro(**{"dpo.steps": 5})
    plan = run_pipeline(cfg, copy, quiet=True, explain=True)["explain"]
    lines = capsys.readouterr().out
    assert "dpo: run (config.steps 6 -> 5)" in lines
    assert {k for k, v in plan.items() if v == "run"} == {"dpo", "eval", "report"}
    again = run_pipeline(cfg, copy, quiet=True)
    st = statuses(again)
    assert {k for k, v in st.items() if v == "ran"} == {"dpo", "eval", "report"}
    assert {k for k, v in st.items() if v == "cached"} == {"dedup", "tokenizer", "sft", "sft_raw", "rm", "grpo", "ppo"}
    assert json.loads((copy / "dpo" / "summary.json").read_text())["steps"] == 5


def test_killed_sft_resumes_from_its_checkpoint_and_ends_as_uninterrupted(run, tmp_path, monkeypatch, capsys):
    out, _ = run
    part = tmp_path / "part"
    part.mkdir()
    for name in ("dedup", "tokenizer"):
        shutil.copytree(out / name, part / name)
    import posttrain.trainers.sft as sft

    original = sft.save

    def save_then_die(s, done, metrics):
        original(s, done, metrics)
        raise RuntimeError("killed")  # right after the first periodic checkpoint

    monkeypatch.setattr(sft, "save", save_then_die)
    with pytest.raises(RuntimeError, match="killed"):
        run_pipeline(micro(), part, only=("dedup", "tokenizer", "sft"), quiet=True)
    assert not (part / "sft" / "DONE.json").exists() and (part / "sft" / "restarts" / "0" / "checkpoints").is_dir()
    monkeypatch.setattr(sft, "save", original)
    capsys.readouterr()
    assert run_pipeline(micro(), part, only=("sft",), quiet=True, explain=True)["explain"]["sft"] == "resumed"
    res = run_pipeline(micro(), part, only=("dedup", "tokenizer", "sft"), quiet=True)
    assert statuses(res)["sft"] == "resumed" and "resuming from its checkpoint" in capsys.readouterr().out
    got, want = (load_file(str(d / "sft" / "model" / "model.safetensors")) for d in (part, out))
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-7)
    assert (
        json.loads((part / "sft" / "DONE.json").read_text())["key"]
        == json.loads((out / "sft" / "DONE.json").read_text())["key"]
    )


def test_cli_report_compares_two_runs_and_errors_are_one_line(run, tmp_path, capsys):
    from posttrain.cli import main

    out, _ = run
    assert main(["report", str(out), str(out)]) == 0
    text = capsys.readouterr().out
    assert "Held-out greedy accuracy" in text and "| SFT |" in text
    assert main(["report", str(tmp_path)]) == 2
    assert (
        capsys.readouterr().err.strip() == f"posttrain report: error: {tmp_path / 'summary.json'}: no run summary "
        f"(is {tmp_path} a `posttrain pipeline` output directory?)"
    )
    assert main(["pipeline", "--out", str(tmp_path / "x"), "--hf-model", "some/dir", "--explain"]) == 2
    err = capsys.readouterr().err
    assert (
        err == "posttrain pipeline: error: hf_model='some/dir': not a directory (a local Hugging Face model "
        "directory, as save_pretrained writes it)\n"
    )


def test_example_config_parses():
    from posttrain.config import load_config_file

    path = Path(__file__).resolve().parents[2] / "examples" / "pipeline.toml"
    cfg = build_config(PipelineConfig, PRESETS["tiny"], path)
    assert cfg.sft.steps == load_config_file(path)["sft"]["steps"]


def test_jobs_run_training_stages_in_workers_with_the_same_results(run, tmp_path):
    out, first = run
    par = tmp_path / "par"
    result = run_pipeline(micro(jobs=2), par, quiet=True)
    assert result["heldout"] == first["heldout"]  # the trainers are deterministic: jobs changes nothing
    for stage in ("sft", "dpo", "grpo"):
        a, b = (
            load_file(out / stage / "model" / "model.safetensors"),
            load_file(par / stage / "model" / "model.safetensors"),
        )
        assert all(torch.equal(a[k], b[k]) for k in a), stage
        assert (par / ".pipeline" / f"{stage}.log").read_text().strip()  # a worker's output went to its log
    again = run_pipeline(micro(jobs=2), par, quiet=True)  # and every stage is cached on a re-run
    assert {v["status"] for v in again["stages"].values()} <= {"cached", "skipped"}


def test_the_stages_are_the_trainers_tiny_recipes_and_a_section_changes_only_its_fields(tmp_path):
    import dataclasses

    from posttrain.trainers import dpo_config, pg_config, ppo_config, reward_config, sft

    def preset(module, cls, name="tiny"):
        return build_config(cls, module.PRESETS[name])

    tiny = build_config(PipelineConfig, PRESETS["tiny"])
    # sft and sft_raw: `posttrain sft --preset tiny` (2000 steps, weight decay 3.0, ranked at step 1000) with 2 of
    # its 4 restarts
    sft_tiny = preset(sft, sft.SFTConfig)
    assert tiny.sft == dataclasses.replace(sft_tiny, restarts=2)
    assert (tiny.sft.steps, tiny.sft.weight_decay, tiny.sft.restart_probe, tiny.sft.restart_keep) == (2000, 3.0, 0.5, 1)
    # rm: `posttrain rm --preset tiny` at 800 steps on 3000 prompts, training pairs from 16 samples per prompt
    rm = preset(reward_config, reward_config.RMConfig)
    short = dataclasses.replace(
        rm,
        steps=800,
        pairs=dataclasses.replace(rm.pairs, num_prompts=3000),
        train_pairs=dataclasses.replace(rm.train_pairs, samples_per_prompt=None),
    )
    assert tiny.rm == short == PipelineConfig().rm
    spelled = {"steps": 800, "batch_size": 64, "eval_every": 250, "save_every": 500, "eval_prompts": 1000}
    assert {k: getattr(tiny.rm, k) for k in spelled} == spelled and tiny.rm.sft_coef == 1.0
    assert (tiny.rm.pairs.num_prompts, tiny.rm.pairs.samples_per_prompt, tiny.rm.pairs.max_pairs_per_prompt) == (
        3000,
        16,
        8,
    )
    assert tiny.rm.pairs.gold_chosen and not tiny.rm.train_pairs.requested()  # 16 samples of the kept model
    # ppo: its tiny preset at 200 of its 300 steps, a PPOConfig like every other stage's config
    ppo = preset(ppo_config, ppo_config.PPOConfig)
    assert isinstance(tiny.ppo, ppo_config.PPOConfig) and tiny.ppo == dataclasses.replace(ppo, steps=200)
    assert tiny.ppo == PipelineConfig().ppo and ppo.steps == 300
    assert tiny.dpo == preset(dpo_config, dpo_config.DPOConfig) and tiny.dpo.loss == "rpo"
    assert tiny.grpo == preset(pg_config, pg_config.PolicyGradientConfig)
    (tmp_path / "p.toml").write_text("[rm]\nsteps = 10\n[dedup]\nnum_perm = 64\n[ppo]\nbeta = 0.1\n")
    cfg = build_config(PipelineConfig, PRESETS["tiny"], tmp_path / "p.toml")
    assert cfg.rm == dataclasses.replace(short, steps=10)
    assert cfg.ppo == dataclasses.replace(tiny.ppo, beta=0.1) and cfg.ppo.steps == 200
    assert cfg.dedup == dataclasses.replace(PipelineConfig().dedup, num_perm=64) and cfg.dedup.threshold == 0.7
    assert micro().rm.steps <= 10 and micro().rm.pairs.num_prompts <= 64  # the CI preset stays seconds


def test_the_pipeline_owns_the_ppo_stage_start_and_data_as_the_other_stages():
    from posttrain.errors import ConfigError

    for field, value in (("init", "runs/x"), ("data", "p.jsonl"), ("eval_data", "e.jsonl"), ("model_path", "m")):
        with pytest.raises(ConfigError, match=f"ppo.{field}="):
            micro(**{f"ppo.{field}": value})
    with pytest.raises(ConfigError, match="reward='exact_match:1.0' and ppo.reward='digits:1.0'"):
        micro(reward="exact_match:1.0", **{"ppo.reward": "digits:1.0"})


def test_sft_restarts_are_ranked_on_training_split_problems_only(run):
    out, _ = run
    rows = lambda name: [json.loads(ln) for ln in (out / "dedup" / name).read_text().splitlines()]  # noqa: E731
    val = {r["prompt"] for r in rows("val.jsonl")}
    assert len(val) == PRESETS["micro"]["sft"]["val_problems"]
    assert not val & {r["prompt"] for r in rows("sft_raw.jsonl")} and not val & {
        r["prompt"] for r in rows("eval.jsonl")
    }
    for stage in ("sft", "sft_raw"):  # both SFT runs: the same restarts, ranked on val.jsonl
        s = json.loads((out / stage / "summary.json").read_text())
        probes = [c["probe"] for c in s["candidates"]]
        assert [p["val_n"] for p in probes] == [len(val)] * PRESETS["micro"]["sft"]["restarts"]
        assert [c["restart"] for c in s["candidates"] if c["finished"]] == [
            max(range(len(probes)), key=lambda k: (probes[k]["val_accuracy"], -k))
        ]  # successive halving: the best at the probe step finishes
        best = next(c for c in s["candidates"] if c["finished"])
        from posttrain.pipeline.plots import metrics

        rows = metrics(out / stage)  # the report's training-loss curve: the kept restart's
        assert rows and rows == metrics(Path(best["dir"])) and rows[-1]["step"] == micro().sft.steps
        assert s["selected_restart"] == best["restart"] and s["heldout_accuracy"] == best["heldout_accuracy"]
