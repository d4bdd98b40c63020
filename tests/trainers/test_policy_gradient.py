import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from posttrain.checkpoints.load import load_checkpoint
from posttrain.errors import ConfigError, UserError
from posttrain.models.gpt import GPTConfig
from posttrain.rewards.registry import REWARD_FUNCTIONS, register_reward
from posttrain.tasks.arithmetic import ArithmeticConfig
from posttrain.trainers import policy_gradient as pg
from posttrain.trainers.policy_gradient import PolicyGradientConfig, PolicyGradientTrainer, train_policy_gradient
from posttrain.trainers.sft import SFTConfig, train_sft

TASK = ArithmeticConfig(digits=1, num_demos=30, num_eval=8)


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft")
    train_sft(
        SFTConfig(
            out=str(out),
            steps=30,
            batch_size=16,
            eval_every=0,
            save_every=0,
            progress=False,
            task=TASK,
            model=GPTConfig(n_layer=1, n_head=2, d_model=32, max_seq_len=24),
        )
    )
    return out


def cfg(sft_dir, out, **kw):
    base = dict(
        init=str(sft_dir),
        out=str(out),
        steps=4,
        prompts_per_step=4,
        num_generations=4,
        max_new_tokens=4,
        eval_every=0,
        save_every=2,
        progress=False,
        task=TASK,
        warmup_steps=0,
    )
    base.update(kw)
    return PolicyGradientConfig(**base)


@pytest.mark.parametrize("algo", ["reinforce", "rloo", "grpo"])
def test_each_algorithm_runs_and_logs_one_vocabulary(sft_dir, tmp_path, algo):
    s = train_policy_gradient(cfg(sft_dir, tmp_path / algo, algo=algo, steps=2))
    assert 0 <= s["heldout_accuracy"] <= 1
    rows = [json.loads(ln) for ln in (tmp_path / algo / "metrics.jsonl").read_text().splitlines()]
    step_rows = [r for r in rows if r["step"] > 0]
    for key in (
        "reward_mean",
        "reward_std",
        "accuracy",
        "advantage_mean",
        "approx_kl",
        "clip_frac_low",
        "clip_frac_high",
        "ratio_mean",
        "ratio_max",
        "entropy",
        "completion_length",
        "truncated_frac",
        "zero_std_frac",
        "time_generate",
        "time_score",
        "time_update",
    ):
        assert key in step_rows[0], key


def test_beta_zero_never_builds_a_reference(sft_dir, tmp_path, monkeypatch):
    def boom(model):
        raise AssertionError("reference model built with beta=0")

    monkeypatch.setattr(pg.common, "frozen", boom)  # the one reference builder (trainers/common.py)
    t = PolicyGradientTrainer(cfg(sft_dir, tmp_path / "b0", steps=1))
    assert t.ref_model is None
    t.train()


@pytest.mark.parametrize("kl_in,estimator", [("loss", "k3"), ("reward", "k1"), ("loss", "k2")])
def test_kl_to_reference(sft_dir, tmp_path, kl_in, estimator):
    t = PolicyGradientTrainer(
        cfg(sft_dir, tmp_path / "kl", steps=3, beta=0.1, kl_in=kl_in, kl_estimator=estimator, lr=1e-2)
    )
    assert t.ref_model is not None and not any(p.requires_grad for p in t.ref_model.parameters())
    t.train()
    rows = [json.loads(ln) for ln in (tmp_path / "kl" / "metrics.jsonl").read_text().splitlines()]
    assert all("kl" in r for r in rows if r["step"] > 0)
    assert rows[1]["kl"] == pytest.approx(0.0, abs=1e-5)  # the first rollout is sampled from the reference itself


def test_adaptive_kl_state_is_checkpointed(sft_dir, tmp_path):
    out = tmp_path / "ad"
    train_policy_gradient(
        cfg(
            sft_dir, out, steps=2, save_every=1, beta=0.1, kl_control="adaptive", kl_target=1e-6, kl_horizon=10, lr=1e-2
        )
    )
    state = json.loads((out / "checkpoints" / "step-00000001" / "trainer_state.json").read_text())
    assert state["kl_controller"]["kind"] == "adaptive" and state["kl_controller"]["value"] != 0.1


def test_resume_reproduces_uninterrupted_run(sft_dir, tmp_path):

    full = tmp_path / "full"
    train_policy_gradient(cfg(sft_dir, full))
    resumed = tmp_path / "resumed"
    shutil.copytree(full / "checkpoints" / "step-00000002", resumed / "checkpoints" / "step-00000002")
    (resumed / "checkpoints" / "latest").write_text("step-00000002\n")
    train_policy_gradient(cfg(sft_dir, resumed), resume=str(resumed))
    a, b = load_checkpoint(full).model.state_dict(), load_checkpoint(resumed).model.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_grad_accum_and_prefix_sharing_do_not_change_the_update(sft_dir, tmp_path, assert_close_but_key_bias):
    # Adam's first step is lr * g / (|g| + eps): gradient entries at rounding-noise level (~1e-9) move by up to lr
    # whatever their rounding, so the weights are compared on a batch without such entries (prompt filter off), and
    # the gradient itself (its norm) on the default's batch, which merges three rounds of other prompts. Small entries
    # (~1e-7) still turn relative float noise into a few 1e-6 of weight: the floor is 1e-3 of a step (lr), where a
    # wrong update moves entries by ~lr.
    for pf in (False, True):
        runs, norms = {}, {}
        for name, kw in {"one": {}, "accum": {"grad_accum": 4}, "full_forward": {"share_prompt_prefix": False}}.items():
            out = tmp_path / f"{name}-{pf}"
            train_policy_gradient(cfg(sft_dir, out, steps=1, save_every=0, lr=1e-2, prompt_filter=pf, **kw))
            runs[name] = load_checkpoint(out).model.state_dict()
            rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
            norms[name] = next(r["grad_norm"] for r in rows if "grad_norm" in r)
        for other in ("accum", "full_forward"):
            assert norms[other] == pytest.approx(norms["one"], rel=1e-5, abs=1e-7)
            if not pf:  # the key bias left out: its exact gradient is 0, Adam turns its float noise into lr-sized steps
                assert_close_but_key_bias(runs[other], runs["one"])


def test_alarm_on_identical_rewards(sft_dir, tmp_path, capsys):
    if "always_zero" not in REWARD_FUNCTIONS:
        register_reward("always_zero", lambda **_: lambda prompts, completions, **c: [0.0] * len(completions))
    c = cfg(sft_dir, tmp_path / "z", steps=3, save_every=0, reward="always_zero")
    c.alarms.reward_patience = 2
    train_policy_gradient(c)
    assert "ALARM" in capsys.readouterr().out
    rows = [json.loads(ln) for ln in (tmp_path / "z" / "metrics.jsonl").read_text().splitlines()]
    assert any("alarms" in r for r in rows)


def test_errors(sft_dir, tmp_path):
    with pytest.raises(UserError, match="--init"):
        PolicyGradientTrainer(PolicyGradientConfig(out=str(tmp_path / "x"), progress=False))
    with pytest.raises(ConfigError, match="split evenly"):
        cfg(sft_dir, tmp_path / "x", minibatches=3)
    with pytest.raises(ConfigError, match="rloo"):
        cfg(sft_dir, tmp_path / "x", algo="rloo", num_generations=1)
    with pytest.raises(ConfigError, match="unknown reward"):
        PolicyGradientTrainer(cfg(sft_dir, tmp_path / "x", reward="nope"))


def test_resume_past_the_configured_steps_is_refused_like_every_trainer(sft_dir, tmp_path):
    out = tmp_path / "done"
    train_policy_gradient(cfg(sft_dir, out, steps=2, save_every=0))
    with pytest.raises(UserError, match=r"is at step 2, beyond steps=1$"):
        PolicyGradientTrainer(cfg(sft_dir, out, steps=1), resume=str(out))


def test_grpo_final_model_is_the_mean_of_the_weights_at_the_averaged_steps(sft_dir, tmp_path):
    plain, avg = tmp_path / "plain", tmp_path / "avg"
    kw = dict(steps=6, save_every=2, keep_checkpoints=10, lr=1e-2, eval_every=0)
    s_plain = train_policy_gradient(cfg(sft_dir, plain, average_last=1, **kw))
    s_avg = train_policy_gradient(cfg(sft_dir, avg, average_last=3, average_every=2, **kw))
    # the oracle: the un-averaged run's own checkpoints at steps 2 and 4 and its final weights (the same trajectory)
    ws = [load_file(str(plain / "checkpoints" / f"step-0000000{s}" / "model.safetensors")) for s in (2, 4)]
    ws.append(load_file(str(plain / "model" / "model.safetensors")))
    got = load_file(str(avg / "model" / "model.safetensors"))
    assert any(not torch.equal(ws[0][k], ws[2][k]) for k in got)  # the weights moved between the steps
    for k, v in got.items():
        torch.testing.assert_close(v, (ws[0][k] + ws[1][k] + ws[2][k]) / 3, atol=1e-7, rtol=0)
    assert s_avg["weight_average_steps"] == [2, 4, 6] and s_plain["weight_average_steps"] == [6]
    assert s_avg["heldout_accuracy_last_weights"] == s_plain["heldout_accuracy"]
    assert load_checkpoint(avg / "model").state["heldout_accuracy"] == s_avg["heldout_accuracy"]


def test_resumed_run_averages_what_an_uninterrupted_one_does(sft_dir, tmp_path):
    kw = dict(steps=6, save_every=2, keep_checkpoints=10, lr=1e-2, average_last=3, average_every=2)
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    train_policy_gradient(cfg(sft_dir, full, **kw))
    step4 = full / "checkpoints" / "step-00000004"
    assert load_checkpoint(step4, with_training_state=True).state["weight_average"]["added"] == [2, 4]
    shutil.copytree(step4, resumed / "checkpoints" / "step-00000004")
    (resumed / "checkpoints" / "latest").write_text("step-00000004\n")
    train_policy_gradient(cfg(sft_dir, resumed, **kw), resume=str(resumed))
    a, b = (load_file(str(d / "model" / "model.safetensors")) for d in (full, resumed))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_knob_errors(sft_dir, tmp_path):
    with pytest.raises(ConfigError, match="average_last"):
        cfg(sft_dir, tmp_path / "x", average_last=0)
    cfg(sft_dir, tmp_path / "x", average_last=2, average_every=2, fsdp=True)  # sharded averaging: test_distributed
