"""The non-finite guard shared by the trainers: a NaN/Inf step is skipped, repeats stop the run with exit 2,
and no checkpoint with a non-finite parameter is ever written."""

import functools
import json
import math

import pytest
import torch
from safetensors.torch import load_file

import posttrain.trainers.reward as reward_mod
import posttrain.trainers.sft as sft_mod
from posttrain.cli import main
from posttrain.errors import UserError
from posttrain.losses.preference import PREFERENCE_LOSSES
from posttrain.tokenizers.char import CharTokenizer
from posttrain.trainers.checkpoint import save_checkpoint
from posttrain.trainers.guards import NonFiniteGuard, finite_step, require_finite_parameters

TASK = ["--task.digits", "1", "--task.num-demos", "20", "--task.num-eval", "8", "--progress", "false"]
TINY_MODEL = ["--model.n-layer", "1", "--model.d-model", "32", "--model.n-head", "2"]


def test_finite_step_skips_and_zeroes():
    lin = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    before = [p.detach().clone() for p in lin.parameters()]
    lin(torch.ones(1, 3)).sum().backward()
    assert not finite_step(opt, math.nan, 1.0)
    assert all(torch.equal(a, p) for a, p in zip(before, lin.parameters())) and all(
        p.grad is None for p in lin.parameters()
    )
    lin(torch.ones(1, 3)).sum().backward()
    assert not finite_step(opt, 0.5, math.inf)
    assert all(torch.equal(a, p) for a, p in zip(before, lin.parameters()))
    lin(torch.ones(1, 3)).sum().backward()
    assert finite_step(opt, 0.5, 1.0)
    assert not torch.equal(before[1], lin.bias) and lin.bias.grad is None


def test_guard_streak_resets_and_stops():
    g = NonFiniteGuard(patience=2)
    assert g.update(loss=0.3, grad_norm=1.0) is None
    assert g.update(loss=math.nan, grad_norm=1.0) == "non-finite loss=nan: step skipped (1 in a row)"
    assert g.update(loss=0.3, grad_norm=1.0) is None and g.streak == 0 and not g.should_stop
    g.update(loss=1.0, grad_norm=math.inf)
    msg = g.update(loss=-math.inf, grad_norm=math.nan)
    assert msg == (
        "non-finite loss=-inf, grad_norm=nan: step skipped (2 in a row); "
        "2 in a row: stopping, the last good checkpoint is kept"
    )
    assert g.should_stop and g.skipped == 3
    h = NonFiniteGuard(2)
    h.load_state_dict(json.loads(json.dumps(g.state_dict())))
    assert h.state_dict() == g.state_dict()


def test_a_non_finite_model_is_never_saved(tmp_path, tiny_gpt):
    tok = CharTokenizer("0123456789+-=")
    good = save_checkpoint(tmp_path / "ck", tiny_gpt, tok, {"step": 1})
    before = (good / "model.safetensors").read_bytes()
    with torch.no_grad():
        next(tiny_gpt.parameters())[0, 0] = math.nan
    with pytest.raises(UserError) as e:
        save_checkpoint(tmp_path / "ck", tiny_gpt, tok, {"step": 2})
    n = sum(p.numel() for p in tiny_gpt.parameters())
    assert str(e.value) == (
        f"refusing to save {tmp_path / 'ck'}: 1 of {n} parameters are NaN/Inf at step 2 "
        "(the training diverged); the last good checkpoint is kept"
    )
    assert (good / "model.safetensors").read_bytes() == before  # the old checkpoint is untouched
    assert json.loads((good / "trainer_state.json").read_text())["step"] == 1
    with pytest.raises(UserError):
        require_finite_parameters(tiny_gpt, "x")


def _nan_from(call: int, fn):
    """Wrap a loss so that its result is NaN from the ``call``-th call (1-based) on."""
    calls = {"n": 0}

    @functools.wraps(fn)
    def wrapped(*a, **k):
        calls["n"] += 1
        out = fn(*a, **k)
        loss, rest = (out[0], out[1:]) if isinstance(out, tuple) else (out, None)
        if calls["n"] >= call:
            loss = loss * math.nan  # NaN loss and NaN gradients, as a diverged step gives
        return (loss, *rest) if rest is not None else loss

    return wrapped, calls


def _finite_checkpoint(path) -> None:
    for k, v in load_file(str(path / "model.safetensors")).items():
        assert torch.isfinite(v).all(), k


def test_sft_skips_nan_steps_then_stops(tmp_path, capsys, monkeypatch):
    fn, _ = _nan_from(3, sft_mod.sft_loss)
    monkeypatch.setattr(sft_mod, "sft_loss", fn)
    out = tmp_path / "run"
    assert (
        main(
            [
                "sft",
                "--restarts",
                "1",
                "--out",
                str(out),
                "--steps",
                "10",
                "--batch-size",
                "8",
                "--eval-every",
                "0",
                "--save-every",
                "2",
                "--nan-patience",
                "3",
                *TINY_MODEL,
                *TASK,
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err == (
        f"posttrain sft: error: sft stopped at step 5: 3 steps in a row with a non-finite loss or gradient "
        f"norm (each skipped); no final model was written, the last good checkpoint (if any) is in "
        f"{out}/checkpoints; lower the learning rate or check the data\n"
    )
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5] and [r.get("skipped", 0) for r in rows] == [0, 0, 1, 1, 1]
    assert not (out / "model").exists() and not (out / "summary.json").exists()
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.is_dir()) == ["step-00000002", "step-00000004"]
    for step in ("step-00000002", "step-00000004"):
        _finite_checkpoint(out / "checkpoints" / step)
    # skipped steps change nothing: the step-4 weights equal the step-2 weights (steps 3 and 4 were NaN)
    a = load_file(str(out / "checkpoints" / "step-00000002" / "model.safetensors"))
    b = load_file(str(out / "checkpoints" / "step-00000004" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_sft_one_nan_step_is_skipped_and_the_run_finishes(tmp_path, capsys, monkeypatch):
    orig = sft_mod.sft_loss
    fn, calls = _nan_from(10**9, orig)

    def once(*a, **k):  # NaN at the 2nd call only
        loss = fn(*a, **k)
        return loss * math.nan if calls["n"] == 2 else loss

    monkeypatch.setattr(sft_mod, "sft_loss", once)
    out = tmp_path / "run"
    assert (
        main(
            [
                "sft",
                "--restarts",
                "1",
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
    assert "sft step 2: non-finite loss=nan, grad_norm=nan: step skipped (1 in a row)\n" in capsys.readouterr().out
    _finite_checkpoint(out / "model")
    opt = torch.load(out / "model" / "optimizer.pt", weights_only=True)
    assert {int(s["step"]) for s in opt["state"].values()} == {3}  # 4 steps, 1 skipped: AdamW stepped 3 times


def test_dpo_skips_nan_steps_then_stops(tmp_path, capsys, monkeypatch):
    init = tmp_path / "sft"
    assert (
        main(
            [
                "sft",
                "--restarts",
                "1",
                "--out",
                str(init),
                "--steps",
                "2",
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
    fn, _ = _nan_from(1, PREFERENCE_LOSSES["dpo"])
    monkeypatch.setitem(PREFERENCE_LOSSES, "dpo", fn)  # the registry the trainer looks the loss up in
    out = tmp_path / "dpo"
    capsys.readouterr()
    assert (
        main(
            [
                "dpo",
                "--loss",
                "dpo",
                "--init",
                str(init),
                "--out",
                str(out),
                "--steps",
                "6",
                "--batch-size",
                "4",
                "--eval-every",
                "0",
                "--save-every",
                "1",
                "--nan-patience",
                "2",
                "--pairs.num-prompts",
                "16",
                "--pairs.samples-per-prompt",
                "4",
                "--pairs.gold-chosen",
                "true",
                *TASK,
            ]
        )
        == 2
    )
    assert capsys.readouterr().err.startswith("posttrain dpo: error: dpo stopped at step 2: 2 steps in a row")
    assert not (out / "model").exists()
    for ck in (out / "checkpoints").glob("step-*"):
        _finite_checkpoint(ck)


def test_rm_skips_nan_steps_then_stops(tmp_path, capsys, monkeypatch):
    fn, _ = _nan_from(2, reward_mod.bradley_terry_loss)
    monkeypatch.setattr(reward_mod, "bradley_terry_loss", fn)
    out = tmp_path / "rm"
    assert (
        main(
            [
                "rm",
                "--out",
                str(out),
                "--steps",
                "6",
                "--batch-size",
                "4",
                "--eval-every",
                "0",
                "--save-every",
                "0",
                "--eval-prompts",
                "8",
                "--pairs.num-prompts",
                "16",
                *TINY_MODEL,
                *TASK,
            ]
        )
        == 2
    )
    assert capsys.readouterr().err.startswith("posttrain rm: error: rm stopped at step 4: 3 steps in a row")
    assert not (out / "model").exists()


def test_rm_data_with_a_nan_margin_is_refused_at_load(tmp_path, capsys):
    data = tmp_path / "pairs.jsonl"
    data.write_text(
        '{"prompt": "1+1=", "chosen": "2", "rejected": "3", "margin": 1.5}\n'
        '{"prompt": "1+2=", "chosen": "3", "rejected": "4", "margin": NaN}\n'
    )
    held = tmp_path / "held.jsonl"
    held.write_text('{"prompt": "2+2=", "chosen": "4", "rejected": "5", "margin": 1e999}\n')
    out = tmp_path / "rm"
    argv = [
        "rm",
        "--out",
        str(out),
        "--data",
        str(data),
        "--eval-data",
        str(held),
        "--use-margin",
        "true",
        "--steps",
        "2",
        "--batch-size",
        "2",
        *TINY_MODEL,
        *TASK,
    ]
    assert main(argv) == 2
    assert (
        capsys.readouterr().err == f"posttrain rm: error: {data}:2: field 'margin' must be a finite number, got nan\n"
    )
    data.write_text('{"prompt": "1+1=", "chosen": "2", "rejected": "3", "margin": 1.5}\n')
    assert main(argv) == 2
    assert (
        capsys.readouterr().err == f"posttrain rm: error: {held}:1: field 'margin' must be a finite number, got inf\n"
    )
    assert not (out / "model").exists()


def test_grpo_skips_nan_updates_then_stops(tmp_path, capsys, monkeypatch):
    import posttrain.trainers.policy_gradient as pg_mod

    init = tmp_path / "sft"
    assert (
        main(
            [
                "sft",
                "--restarts",
                "1",
                "--out",
                str(init),
                "--steps",
                "2",
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
    fn, _ = _nan_from(2, pg_mod.policy_loss)
    monkeypatch.setattr(pg_mod, "policy_loss", fn)
    out = tmp_path / "grpo"
    # classic sampling: with dynamic sampling this tiny policy (all rewards 0) would make no update at all
    assert (
        main(
            [
                "grpo",
                "--dynamic-sampling",
                "false",
                "--init",
                str(init),
                "--out",
                str(out),
                "--steps",
                "6",
                "--prompts-per-step",
                "2",
                "--num-generations",
                "2",
                "--max-new-tokens",
                "3",
                "--eval-every",
                "0",
                "--save-every",
                "1",
                "--nan-patience",
                "2",
                *TASK,
            ]
        )
        == 2
    )
    assert capsys.readouterr().err.startswith("posttrain grpo: error: grpo stopped at step 3: 2 steps in a row")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_early"] and summary["alarms"]["skipped_steps"] == 2 and not (out / "model").exists()
    for ck in (out / "checkpoints").glob("step-*"):
        _finite_checkpoint(ck)


@pytest.mark.parametrize(
    "patience, message",
    [
        (3, "sft stopped at step 4: 3 steps in a row"),  # the streak stops the run before the step-4 checkpoint
        (10, "refusing to save .*step-00000004: .* parameters are NaN/Inf"),  # else the checkpoint write is refused
    ],
)
def test_inf_lr_forced_past_validation_never_saves_a_nan_model(tmp_path, patience, message):
    from posttrain.errors import ConfigError
    from posttrain.models.gpt import GPTConfig
    from posttrain.tasks.arithmetic import ArithmeticConfig

    cfg = sft_mod.SFTConfig(
        out=str(tmp_path / "run"),
        steps=8,
        batch_size=8,
        eval_every=0,
        save_every=4,
        warmup_steps=0,
        progress=False,
        nan_patience=patience,
        model=GPTConfig(n_layer=1, n_head=2, d_model=32),
        task=ArithmeticConfig(digits=1, num_demos=20, num_eval=8),
    )
    with pytest.raises(ConfigError, match="lr=inf is not a finite number"):
        sft_mod.SFTConfig(lr=math.inf)
    cfg.lr = math.inf  # the first step is finite and turns every weight into NaN/Inf; later steps are skipped
    with pytest.raises(UserError, match=message):
        sft_mod.train_sft(cfg)
    assert not (tmp_path / "run" / "model").exists()
    assert not list((tmp_path / "run").glob("checkpoints/step-*"))
