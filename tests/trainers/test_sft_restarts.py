"""SFT restarts: R runs, ranked by greedy accuracy on training-split problems that are not demonstrations;
model/ is the best one's, bit for bit; an interrupted restarts run resumes to the uninterrupted result."""

import json
import shutil

import pytest
import torch

from posttrain.checkpoints.load import load_checkpoint
from posttrain.cli import main
from posttrain.errors import UserError
from posttrain.evaluation import evaluate
from posttrain.models.gpt import GPTConfig
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask
from posttrain.trainers.sft import SFTConfig, train_sft
from posttrain.trainers.sft_restarts import restart_seed, validation_problems

TASK = ArithmeticConfig(digits=1, num_demos=20, num_eval=8)


def cfg(out, **kw):
    base = dict(
        out=str(out),
        steps=6,
        batch_size=8,
        eval_every=0,
        save_every=3,
        warmup_steps=2,
        progress=False,
        lr=1e-2,
        restarts=3,
        val_problems=24,
        model=GPTConfig(n_layer=1, n_head=2, d_model=32, max_seq_len=24),
        task=TASK,
    )
    base.update(kw)
    return SFTConfig(**base)


def weights(path):
    return load_checkpoint(path).model.state_dict()


def test_restart_seeds_are_distinct_and_restart_zero_is_the_seed():
    seeds = {(s, k): restart_seed(s, k) for s in range(5) for k in range(4)}
    assert all(restart_seed(s, 0) == s for s in range(5))
    assert len(set(seeds.values())) == len(seeds)  # no seed's restart is another seed's run


def test_validation_problems_are_the_dev_split():
    c = SFTConfig(task=ArithmeticConfig(num_demos=320), val_problems=256)
    task = ArithmeticTask(c.task)
    val = validation_problems(c)
    dev = {p.prompt for p in task.dev_problems}
    trained = {p.prompt for p in task.demonstrations()} | {p.prompt for p in task.rl_prompts()}
    evals = {p.prompt for p in task.heldout_problems}
    prompts = {p for p, _ in val}
    assert len(val) == 256 == len(prompts) and prompts <= dev and not prompts & trained and not prompts & evals
    whole = validation_problems(SFTConfig(task=c.task))  # the default 1,024: all of the 992 dev problems
    assert sorted(whole) == sorted(task.dev_set()) and len(whole) == 992
    assert validation_problems(SFTConfig(task=c.task, val_problems=256, seed=7)) == val  # the same on every seed
    assert all(str(eval(p[:-1])) == a for p, a in val)  # noqa: S307  (our own generated "a+b=" text)


def test_keeps_the_best_by_validation_and_copies_its_model(tmp_path):
    s = train_sft(cfg(tmp_path / "r"))
    c = s["candidates"]
    assert [x["restart"] for x in c] == [0, 1, 2] and [x["seed"] for x in c] == [restart_seed(0, k) for k in range(3)]
    val = validation_problems(cfg(tmp_path / "x"))
    for x in c:  # each candidate's score, recomputed independently
        ck = load_checkpoint(f"{x['dir']}/model")
        acc = evaluate(ck.model, ck.tokenizer, [p for p, _ in val], [a for _, a in val], max_new_tokens=8).accuracy
        assert acc == x["val_accuracy"]
    best = max(c, key=lambda x: (x["val_accuracy"], -x["restart"]))
    assert s["selected_restart"] == best["restart"] and s["heldout_accuracy"] == best["heldout_accuracy"]
    a, b = weights(tmp_path / "r" / "model"), weights(best["dir"] + "/model")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert load_checkpoint(tmp_path / "r").path.name == "model"  # the run directory opens (eval, --init) at model/
    plain = train_sft(cfg(tmp_path / "plain", restarts=1))  # restart 0 is exactly the plain run
    a, b = weights(tmp_path / "plain"), weights(c[0]["dir"] + "/model")
    assert all(torch.equal(a[k], b[k]) for k in a) and plain["heldout_accuracy"] == c[0]["heldout_accuracy"]


def test_interrupted_run_resumes_to_the_same_end(tmp_path):
    full = train_sft(cfg(tmp_path / "full", restarts=2))
    part = tmp_path / "part"  # restart 0 finished, restart 1 stopped after its step-3 checkpoint
    part.mkdir()
    for f in ("run.json", "config.resolved.json"):
        shutil.copy(tmp_path / "full" / f, part / f)
    shutil.copytree(tmp_path / "full" / "restarts" / "0", part / "restarts" / "0")
    ck = part / "restarts" / "1" / "checkpoints"
    shutil.copytree(tmp_path / "full" / "restarts" / "1" / "checkpoints" / "step-00000003", ck / "step-00000003")
    (ck / "latest").write_text("step-00000003\n")
    resumed = train_sft(cfg(part, restarts=2), resume=str(part))
    assert resumed["selected_restart"] == full["selected_restart"]
    assert [x["val_accuracy"] for x in resumed["candidates"]] == [x["val_accuracy"] for x in full["candidates"]]
    a, b = weights(tmp_path / "full" / "model"), weights(part / "model")
    assert all(torch.equal(a[k], b[k]) for k in a)
    steps = [json.loads(ln)["step"] for ln in (part / "restarts" / "1" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [4, 5, 6]  # restart 1 continued from its checkpoint, restart 0 was not re-run


def test_changed_config_is_refused_and_user_data_runs_once(tmp_path, capsys):
    train_sft(cfg(tmp_path / "r", restarts=2, steps=2, save_every=0))
    with pytest.raises(UserError, match="differs from the run's in lr"):
        train_sft(cfg(tmp_path / "r", restarts=2, steps=2, save_every=0, lr=2e-2), resume=str(tmp_path / "r"))
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(9)))
    assert (
        main(
            [
                "sft",
                "--data",
                str(data),
                "--eval-data",
                str(data),
                "--restarts",
                "2",
                "--out",
                str(tmp_path / "u"),
                "--steps",
                "1",
                "--progress",
                "false",
                "--model.n-layer",
                "1",
                "--model.d-model",
                "32",
                "--model.n-head",
                "2",
            ]
        )
        == 0
    )
    assert "restarts=2 applies to a fresh model on the embedded task" in capsys.readouterr().out
    summary = json.loads((tmp_path / "u" / "summary.json").read_text())
    assert not (tmp_path / "u" / "restarts").exists() and "restarts" not in summary  # one plain run


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_val_data_ranks_restarts_of_a_data_run(tmp_path, capsys):
    task = ArithmeticTask(TASK)
    demos = [{"prompt": p.prompt, "answer": p.answer} for p in task.demonstrations()]
    held = {p.prompt for p in task.heldout_problems}
    extra = [{"prompt": p.prompt, "answer": p.answer} for p in task.train_problems if p.prompt not in held]
    extra = [r for r in extra if r not in demos][:12]
    data, val = _jsonl(tmp_path / "d.jsonl", demos), _jsonl(tmp_path / "v.jsonl", extra)
    s = train_sft(cfg(tmp_path / "r", restarts=2, data=data, val_data=val))
    assert [x["val_n"] for x in s["candidates"]] == [12, 12]
    for x in s["candidates"]:  # ranked on the file's problems, recomputed independently
        ck = load_checkpoint(f"{x['dir']}/model")
        acc = evaluate(
            ck.model, ck.tokenizer, [r["prompt"] for r in extra], [r["answer"] for r in extra], max_new_tokens=8
        ).accuracy
        assert acc == x["val_accuracy"]
    bad = _jsonl(tmp_path / "bad.jsonl", extra[:2] + demos[:1])  # line 3 is a demonstration
    args = ["sft", "--data", data, "--val-data", bad, "--restarts", "2", "--out", str(tmp_path / "b")]
    assert main([*args, "--progress", "false"]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:3: prompt {demos[0]['prompt']!r} is also a training demonstration" in err
    assert not (tmp_path / "b").exists()  # checked before the run directory is written


def test_val_data_of_heldout_problems_is_refused_on_the_embedded_task(tmp_path, capsys):
    """Ranking restarts on the held-out (test) split would select on the reported numbers: a one-line error."""
    task = ArithmeticTask(ArithmeticConfig())
    rows = [{"prompt": p.prompt, "answer": p.answer} for p in task.dev_problems[:2] + task.heldout_problems[:1]]
    bad = _jsonl(tmp_path / "v.jsonl", rows)  # line 3 is a held-out problem
    args = ["sft", "--val-data", bad, "--restarts", "2", "--out", str(tmp_path / "b"), "--progress", "false"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"{bad}:3: prompt {rows[2]['prompt']!r} is one of the embedded task's held-out (test) problems" in err
    assert not (tmp_path / "b").exists()


def test_successive_halving_finishes_the_best_probe_only(tmp_path):
    c = cfg(tmp_path / "h", restart_probe=0.5, restart_keep=1, keep_checkpoints=4)
    s = train_sft(c)
    val, cands = validation_problems(c), s["candidates"]
    prompts, answers = [p for p, _ in val], [a for _, a in val]
    scores = {}
    for x in cands:  # each probe score, recomputed from the restart's step-3 checkpoint
        ck = load_checkpoint(f"{x['dir']}/checkpoints/step-00000003")
        scores[x["restart"]] = evaluate(ck.model, ck.tokenizer, prompts, answers, max_new_tokens=8).accuracy
        assert x["probe"]["val_accuracy"] == scores[x["restart"]] and x["probe"]["step"] == 3
    kept = max(scores, key=lambda k: (scores[k], -k))
    assert [x["finished"] for x in cands] == [k == kept for k in range(3)] and s["selected_restart"] == kept
    for x in cands:  # the others stopped at the probe: no model/, no summary
        assert (tmp_path / "h" / "restarts" / str(x["restart"]) / "summary.json").is_file() == (x["restart"] == kept)
    plain = train_sft(cfg(tmp_path / "plain", restarts=1, seed=restart_seed(0, kept)))  # paused + resumed = one run
    a, b = weights(tmp_path / "plain"), weights(tmp_path / "h" / "model")
    assert all(torch.equal(a[k], b[k]) for k in a) and plain["heldout_accuracy"] == s["heldout_accuracy"]
    again = train_sft(c, resume=str(tmp_path / "h"))  # a finished run resumes to the same result, training nothing
    assert again["selected_restart"] == kept and again["candidates"] == cands


def test_halving_with_keep_2_finishes_the_two_best_probes_and_keeps_the_better_at_the_end(tmp_path):
    c = cfg(tmp_path / "h2", restarts=4, restart_probe=0.5, restart_keep=2, keep_checkpoints=4)
    s = train_sft(c)
    val, cands = validation_problems(c), s["candidates"]
    prompts, answers = [p for p, _ in val], [a for _, a in val]

    def acc(path):  # greedy validation accuracy, recomputed independently of the trainer
        ck = load_checkpoint(path)
        return evaluate(ck.model, ck.tokenizer, prompts, answers, max_new_tokens=8).accuracy

    probe = {x["restart"]: acc(f"{x['dir']}/checkpoints/step-00000003") for x in cands}
    finalists = sorted(sorted(probe, key=lambda k: (-probe[k], k))[:2])
    assert [x["restart"] for x in cands if x["finished"]] == finalists
    final = {k: acc(f"{cands[k]['dir']}/model") for k in finalists}
    kept = max(finalists, key=lambda k: (final[k], -k))
    assert s["selected_restart"] == kept and s["restart_val_accuracy"] == final[kept]
    a, b = weights(f"{cands[kept]['dir']}/model"), weights(tmp_path / "h2" / "model")
    assert all(torch.equal(a[k], b[k]) for k in a)
    sub = json.loads((tmp_path / "h2" / "restarts" / str(kept) / "config.resolved.json").read_text())
    assert sub["restarts"] == 1 and sub["seed"] == restart_seed(0, kept)  # each restart is one plain run


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"restart_probe": 1.0}, "restart_probe=1.0"),
        ({"restart_probe": 0.5, "restart_keep": 4}, "restart_keep=4 is more than restarts=3"),
    ],
)
def test_bad_probe_settings_are_config_errors(tmp_path, kw, message):
    from posttrain.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        cfg(tmp_path / "x", **kw)


def _files(root):
    """Every file of a run directory but its logs and timings: relative path -> bytes."""
    skip = ("run.json", "summary.json", "metrics.jsonl", "probe.json", "trainer_state.json", ".log", ".lock")
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.endswith(skip)
    }


def test_restarts_in_worker_processes_end_bit_for_bit_as_one_at_a_time(tmp_path):
    """restart_jobs 2: the probes, then the two finalists, trained two at a time in worker processes; every weight
    file (model/, each restart's checkpoints) and every score equals the one-at-a-time run's."""
    kw = dict(restarts=4, restart_probe=0.5, restart_keep=2, keep_checkpoints=4)
    one = train_sft(cfg(tmp_path / "one", **kw))
    two = train_sft(cfg(tmp_path / "two", restart_jobs=2, **kw))
    strip = ("dir", "train_seconds")
    assert [{k: v for k, v in c.items() if k not in strip and k != "probe"} for c in two["candidates"]] == [
        {k: v for k, v in c.items() if k not in strip and k != "probe"} for c in one["candidates"]
    ]
    assert [c["probe"]["val_accuracy"] for c in two["candidates"]] == [
        c["probe"]["val_accuracy"] for c in one["candidates"]
    ]
    a, b = _files(tmp_path / "one"), _files(tmp_path / "two")
    assert sorted(a) == sorted(b) and any(k.endswith(".safetensors") for k in a)
    assert [k for k in a if a[k] != b[k] and k.endswith(".safetensors")] == []
    assert (tmp_path / "two" / "restarts" / "0.log").read_text()  # each worker's output, beside its run


def test_a_restart_that_fails_in_its_worker_fails_the_run_and_names_its_log(tmp_path, capsys):
    """restart_jobs 2 on resume, restart 1's summary corrupt: the one-line error of its worker reaches the caller, the
    progress says which restart failed and where its output is, and model/ is not published again."""
    out = tmp_path / "bad"
    train_sft(cfg(out))
    shutil.rmtree(out / "model")
    (out / "restarts" / "1" / "summary.json").write_text("{not json")
    capsys.readouterr()
    with pytest.raises(UserError, match="summary.json"):
        train_sft(cfg(out, restart_jobs=2), resume=str(out))
    assert f"SFT restart 2 failed (its output: {out / 'restarts' / '1.log'})" in capsys.readouterr().out
    assert not (out / "model").exists()
