import json

import pytest
import torch

from posttrain.checkpoints.load import load_checkpoint, resolve_checkpoint
from posttrain.data.batches import batch_indices
from posttrain.errors import UserError
from posttrain.models.gpt import GPTConfig
from posttrain.tasks.arithmetic import ArithmeticConfig
from posttrain.trainers.common import lr_at
from posttrain.trainers.sft import SFTConfig, sft_loss, train_sft


def tiny_cfg(out, **kw):
    base = dict(
        out=str(out),
        steps=6,
        batch_size=8,
        eval_every=0,
        save_every=3,
        warmup_steps=2,
        progress=False,
        model=GPTConfig(n_layer=1, n_head=2, d_model=32, max_seq_len=24),
        task=ArithmeticConfig(digits=1, num_demos=20, num_eval=8),
    )
    base.update(kw)
    return SFTConfig(**base)


def test_loss_is_invariant_to_micro_batching(tiny_gpt):
    torch.manual_seed(0)
    ids = torch.randint(3, 17, (6, 9))
    mask = torch.zeros_like(ids)
    for i, start in enumerate([3, 4, 5, 6, 3, 7]):  # uneven completion lengths
        mask[i, start:] = 1
    n_tok = int(mask[:, 1:].sum())

    def grads(splits):
        tiny_gpt.zero_grad()
        total = 0.0
        for sl in splits:
            loss = sft_loss(tiny_gpt, ids[sl], mask[sl], n_tok)
            loss.backward()
            total += loss.item()
        return total, [p.grad.clone() for p in tiny_gpt.parameters()]

    full, g_full = grads([slice(0, 6)])
    parts, g_parts = grads([slice(0, 1), slice(1, 4), slice(4, 6)])
    assert abs(full - parts) < 1e-5
    for a, b in zip(g_full, g_parts):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_batches_are_a_function_of_step():
    a = [batch_indices(10, 4, s, seed=3).tolist() for s in range(6)]
    b = [batch_indices(10, 4, s, seed=3).tolist() for s in range(6)]
    assert a == b
    flat = sum(a, [])
    assert sorted(flat[:10]) == list(range(10))  # the first epoch visits every example once
    assert batch_indices(10, 4, 0, seed=4).tolist() != a[0]


def test_lr_schedule():
    assert lr_at(0, 1.0, 4, 100) == 0.25 and lr_at(3, 1.0, 4, 100) == 1.0
    assert abs(lr_at(100, 1.0, 4, 100, 0.1) - 0.1) < 1e-9
    assert lr_at(50, 1.0, 4, 100) < lr_at(10, 1.0, 4, 100)


def test_run_writes_outputs_and_resume_is_bitwise(tmp_path):
    full = train_sft(tiny_cfg(tmp_path / "full"))
    assert (tmp_path / "full" / "summary.json").is_file() and "heldout_accuracy" in full
    lines = (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(ln)["step"] for ln in lines] == [1, 2, 3, 4, 5, 6]

    # an interrupted run: stops after step 3's checkpoint (steps=3 then resume to 6 with the same schedule)
    part_dir = tmp_path / "part"
    train_sft(tiny_cfg(part_dir, steps=6, save_every=3), resume=None)
    ckpt3 = part_dir / "checkpoints" / "step-00000003"
    assert ckpt3.is_dir()
    resumed_dir = tmp_path / "resumed"
    import shutil

    shutil.copytree(ckpt3, resumed_dir / "checkpoints" / "step-00000003")
    (resumed_dir / "checkpoints" / "latest").write_text("step-00000003\n")
    train_sft(tiny_cfg(resumed_dir), resume=str(resumed_dir))
    a = load_checkpoint(tmp_path / "full").model.state_dict()
    b = load_checkpoint(resumed_dir).model.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    steps = [json.loads(ln)["step"] for ln in (resumed_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [4, 5, 6]


def test_checkpoint_contents_and_safe_loading(tmp_path):
    train_sft(tiny_cfg(tmp_path / "r", steps=3, save_every=0))
    d = resolve_checkpoint(tmp_path / "r")
    assert {p.name for p in d.iterdir()} >= {
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "trainer_state.json",
        "optimizer.pt",
        "rng.pt",
    }
    ck = load_checkpoint(d, with_training_state=True)
    assert ck.step == 3 and "state" in ck.optimizer_state


def test_resume_errors(tmp_path):
    with pytest.raises(UserError, match="not found"):
        train_sft(tiny_cfg(tmp_path / "x"), resume=str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="holds no checkpoint"):
        train_sft(tiny_cfg(tmp_path / "x"), resume=str(tmp_path / "empty"))


def test_user_data_files(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{a}=", "answer": str(2 * a)}) + "\n" for a in range(10)))
    s = train_sft(tiny_cfg(tmp_path / "u", steps=2, data=str(data), eval_data=str(data)))
    assert s["num_demos"] == 10 and s["heldout_n"] == 10
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1="}\n')
    with pytest.raises(UserError, match=r"bad.jsonl:1: missing field 'answer'"):
        train_sft(tiny_cfg(tmp_path / "u2", data=str(bad)))


# --------------------------------------------------------------------------- validation split, best model, early stop
from posttrain import evaluation  # noqa: E402  (the trainers evaluate through evaluation.evaluate)
from posttrain.evaluation import EvalResult  # noqa: E402
from posttrain.tasks.arithmetic import ArithmeticTask  # noqa: E402
from posttrain.trainers.selection import split_validation  # noqa: E402


def test_validation_split_is_stable_disjoint_and_never_the_eval_split():
    task = ArithmeticTask(ArithmeticConfig())
    demos = [(p.prompt, p.answer) for p in task.demonstrations()]
    train, val = split_validation(demos, 0.15)
    assert sorted(train + val) == list(range(len(demos))) and not set(train) & set(val)
    assert 0.05 * len(demos) < len(val) < 0.3 * len(demos)
    val_prompts = {demos[i][0] for i in val}
    assert not val_prompts & {p.prompt for p in task.eval_problems()}
    assert not val_prompts & {p.prompt for p in task.heldout_problems}
    shuffled = demos[::-1]  # membership depends on the prompt alone, not on the order or the seed
    assert {shuffled[i][0] for i in split_validation(shuffled, 0.15)[1]} == val_prompts
    assert split_validation(demos, 0.0) == (list(range(len(demos))), [])
    with pytest.raises(Exception, match="val_fraction"):
        split_validation(demos[:2], 0.99)


def scripted_validation(monkeypatch, scores):
    """Validation accuracies from ``scores`` (one per validation call, then the last); held-out calls are real."""
    real, calls = evaluation.evaluate, []

    def fake(model, tokenizer, prompts, answers, **kw):
        if kw.get("keep_samples"):  # the held-out evaluation (logged, never used for selection)
            return real(model, tokenizer, prompts, answers, **kw)
        calls.append(1)
        acc = scores[min(len(calls), len(scores)) - 1]
        return EvalResult(accuracy=acc, n=len(prompts), correct=round(acc * len(prompts)))

    monkeypatch.setattr(evaluation, "evaluate", fake)
    return calls


def test_model_is_the_best_validation_checkpoint_and_patience_stops(tmp_path, monkeypatch):
    calls = scripted_validation(monkeypatch, [0.2, 0.5, 0.4, 0.5, 0.3, 0.9])
    s = train_sft(tiny_cfg(tmp_path / "r", steps=20, eval_every=1, save_every=2, patience=3, val_fraction=0.3))
    assert len(calls) == 5 and s["stopped_early"] and s["steps_trained"] == 5  # 0.5 (step 2) never beaten in 3 evals
    assert s["best_step"] == 2 and s["best_val_accuracy"] == 0.5  # a tie (step 4) keeps the earlier weights
    best = load_checkpoint(tmp_path / "r" / "checkpoints" / "step-00000002").model.state_dict()
    final = load_checkpoint(tmp_path / "r").model.state_dict()
    assert all(torch.equal(best[k], final[k]) for k in best)
    rows = [json.loads(ln) for ln in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5] and [r["val_accuracy"] for r in rows] == [
        0.2,
        0.5,
        0.4,
        0.5,
        0.3,
    ]


def test_selection_on_the_embedded_task_looks_at_its_dev_split_only(tmp_path, monkeypatch, capsys):
    """val_fraction > 0 without --data: every demonstration trains, and the checkpoint is chosen on dev problems."""
    from posttrain.tasks.arithmetic import ArithmeticTask

    seen, real = [], evaluation.evaluate

    def spy(model, tokenizer, prompts, answers, **kw):
        if not kw.get("keep_samples"):  # validation (the held-out evaluation keeps samples)
            seen.append(list(prompts))
        return real(model, tokenizer, prompts, answers, **kw)

    monkeypatch.setattr(evaluation, "evaluate", spy)
    c = tiny_cfg(tmp_path / "r", eval_every=3, val_fraction=0.3)
    train_sft(c)
    task = ArithmeticTask(c.task)
    dev = {p.prompt for p in task.dev_problems}
    assert seen and all(set(s) == dev for s in seen)  # the whole (small) dev split, nothing else
    assert f"SFT: {c.task.num_demos} demonstrations" in capsys.readouterr().out  # none taken for validation


def test_resume_restores_the_best_so_far(tmp_path, monkeypatch):
    import shutil

    scripted_validation(monkeypatch, [1.0, 0.0])  # the best is step 1's weights, in every later checkpoint
    full = train_sft(tiny_cfg(tmp_path / "full", eval_every=1, val_fraction=0.3, patience=0))
    assert full["best_step"] == 1
    resumed = tmp_path / "resumed"
    shutil.copytree(tmp_path / "full" / "checkpoints" / "step-00000003", resumed / "checkpoints" / "step-00000003")
    (resumed / "checkpoints" / "latest").write_text("step-00000003\n")
    scripted_validation(monkeypatch, [1.0, 0.0])  # a fresh script: a lost best would be replaced at step 4
    again = train_sft(tiny_cfg(resumed, eval_every=1, val_fraction=0.3, patience=0), resume=str(resumed))
    assert again["best_step"] == 1
    a, b = load_checkpoint(tmp_path / "full").model.state_dict(), load_checkpoint(resumed).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_model_settings_a_loaded_start_cannot_take_are_named(tmp_path, capsys):
    from types import SimpleNamespace

    from posttrain.trainers.checkpoint import unapplied_model_settings

    train_sft(tiny_cfg(tmp_path / "a"))
    capsys.readouterr()
    train_sft(tiny_cfg(tmp_path / "b", steps=1, init=str(tmp_path / "a")))  # the same shape: nothing to say
    assert "note: model." not in capsys.readouterr().out
    shape = GPTConfig(n_layer=2, n_head=2, d_model=32, max_seq_len=24, digit_slots=1)
    train_sft(tiny_cfg(tmp_path / "c", steps=1, init=str(tmp_path / "a"), model=shape))
    out = capsys.readouterr().out
    assert "note: model.n_layer=2 (the model's: 1), model.digit_slots=1 (the model's: 0) not applied: --init" in out
    assert load_checkpoint(tmp_path / "c").model.config.n_layer == 1  # the start's own architecture
    # a model whose config is not ours (a Hugging Face one): the non-default settings, without the model's values
    assert unapplied_model_settings(GPTConfig(n_layer=2), SimpleNamespace(config=object())) == ["model.n_layer=2"]
    assert unapplied_model_settings(GPTConfig(), SimpleNamespace(config=object())) == []
