"""The reward-collapse guard: detection on a scripted reward trace, and the trainer restoring its snapshot."""

import json

import pytest
import torch

from posttrain.checkpoints.load import load_checkpoint
from posttrain.models.gpt import GPTConfig
from posttrain.rewards.registry import REWARD_FUNCTIONS, register_reward
from posttrain.tasks.arithmetic import ArithmeticConfig
from posttrain.trainers.alarms import AlarmConfig, CollapseGuard
from posttrain.trainers.policy_gradient import PolicyGradientConfig, train_policy_gradient
from posttrain.trainers.sft import SFTConfig, train_sft

TASK = ArithmeticConfig(digits=1, num_demos=30, num_eval=8)


def test_guard_on_a_scripted_trace():
    g = CollapseGuard(
        AlarmConfig(
            collapse_fraction=0.5,
            collapse_patience=2,
            collapse_smoothing=0.0,
            max_restores=2,
            restore_lr_factor=0.5,
            collapse_min_reward=0.1,
        )
    )
    trace = [0.4, 0.6, 0.5, 0.2, 0.2, 0.6, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]
    actions = [g.update(i + 1, r) for i, r in enumerate(trace)]
    assert actions == ["snapshot", "snapshot", None, None, "restore", None, None, "restore", None, "warn", None, "warn"]
    assert g.restores == 2 and g.lr_scale == 0.25 and g.best_step == 2
    quiet = CollapseGuard(AlarmConfig(collapse_smoothing=0.0, collapse_patience=1, collapse_min_reward=0.1))
    assert [quiet.update(i, r) for i, r in enumerate([0.05, 0.0, 0.0])] == ["snapshot", None, None]  # below the floor
    off = CollapseGuard(AlarmConfig(collapse_fraction=0.0, collapse_smoothing=0.0, collapse_patience=1))
    assert [off.update(i, r) for i, r in enumerate([0.9, 0.0, 0.0])] == ["snapshot", None, None]
    g2 = CollapseGuard(g.config)
    g2.load_state_dict(json.loads(json.dumps(g.state_dict())))
    assert g2.state_dict() == g.state_dict()


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft_collapse")
    train_sft(
        SFTConfig(
            out=str(out),
            steps=10,
            batch_size=16,
            eval_every=0,
            save_every=0,
            progress=False,
            task=TASK,
            val_fraction=0,
            model=GPTConfig(n_layer=1, n_head=2, d_model=32, max_seq_len=24),
        )
    )
    return out


def scripted():
    """Mixed rewards on the first call (a real update), then all zero: a collapse."""
    calls = []

    def fn(prompts, completions, **_):
        calls.append(1)
        return [float(i % 2 == 0) if len(calls) == 1 else 0.0 for i in range(len(completions))]

    return fn


def test_trainer_restores_the_snapshot(sft_dir, tmp_path):
    if "collapse_script" not in REWARD_FUNCTIONS:
        register_reward("collapse_script", lambda **_: scripted())
    alarms = AlarmConfig(collapse_fraction=0.5, collapse_patience=2, collapse_smoothing=0.0, collapse_min_reward=0.1)

    def cfg(out, steps):
        return PolicyGradientConfig(
            init=str(sft_dir),
            out=str(out),
            steps=steps,
            prompts_per_step=4,
            num_generations=4,
            max_new_tokens=4,
            eval_every=0,
            save_every=0,
            progress=False,
            task=TASK,
            warmup_steps=0,
            lr=1e-2,
            reward="collapse_script",
            alarms=alarms,
        )

    one = train_policy_gradient(cfg(tmp_path / "one", 1))
    s = train_policy_gradient(cfg(tmp_path / "three", 3))  # step 1 snapshot; steps 2, 3 collapsed -> restore at 3
    assert one["restores"] == 0 and s["restores"] == 1
    rows = [json.loads(ln) for ln in (tmp_path / "three" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["restored_from"] == 1 and any("reward collapse" in a for a in rows[-1]["alarms"])
    a, b = load_checkpoint(tmp_path / "one").model.state_dict(), load_checkpoint(tmp_path / "three").model.state_dict()
    start = load_checkpoint(sft_dir).model.state_dict()
    assert any(not torch.equal(a[k], start[k]) for k in a)  # step 1 did move the weights
    for k in a:
        assert torch.equal(a[k], b[k]), k  # steps 2-3 (Adam momentum on zero advantages) were undone


def test_resume_is_exact_with_the_snapshot_in_the_checkpoint(sft_dir, tmp_path):
    import shutil

    if "parity" not in REWARD_FUNCTIONS:  # a function of the completion: both runs see the same rewards
        register_reward(
            "parity", lambda **_: lambda prompts, completions, **c: [float(len(x) % 2) for x in completions]
        )
    alarms = AlarmConfig(
        collapse_fraction=0.99, collapse_patience=1, collapse_smoothing=0.0, collapse_min_reward=0.0, max_restores=50
    )

    def cfg(out):
        return PolicyGradientConfig(
            init=str(sft_dir),
            out=str(out),
            steps=8,
            prompts_per_step=4,
            num_generations=4,
            max_new_tokens=4,
            eval_every=0,
            save_every=4,
            progress=False,
            task=TASK,
            warmup_steps=0,
            lr=1e-2,
            temperature=2.0,
            reward="parity",
            alarms=alarms,
        )

    full = tmp_path / "full"
    train_policy_gradient(cfg(full))
    rows = [json.loads(ln) for ln in (full / "metrics.jsonl").read_text().splitlines()]
    assert any(
        r["step"] > 4 and r.get("restored_from", 99) <= 4 for r in rows
    )  # a restore to a pre-checkpoint snapshot
    resumed = tmp_path / "resumed"
    shutil.copytree(full / "checkpoints" / "step-00000004", resumed / "checkpoints" / "step-00000004")
    (resumed / "checkpoints" / "latest").write_text("step-00000004\n")
    train_policy_gradient(cfg(resumed), resume=str(resumed))
    a, b = load_checkpoint(full).model.state_dict(), load_checkpoint(resumed).model.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_ppo_restore_puts_the_critic_back_too(sft_dir, tmp_path):
    from safetensors.torch import load_file

    from posttrain.trainers.ppo import PPOConfig, train_ppo
    from posttrain.trainers.rl.critic import CRITIC_FILE

    if "collapse_script_ppo" not in REWARD_FUNCTIONS:
        register_reward("collapse_script_ppo", lambda **_: scripted())
    alarms = AlarmConfig(collapse_fraction=0.5, collapse_patience=2, collapse_smoothing=0.0, collapse_min_reward=0.1)

    def cfg(out, steps):
        return PPOConfig(
            init=str(sft_dir),
            out=str(out),
            steps=steps,
            prompts_per_step=4,
            num_generations=4,
            max_new_tokens=4,
            eval_every=0,
            save_every=0,
            progress=False,
            task=TASK,
            warmup_steps=0,
            lr=1e-2,
            reward="collapse_script_ppo",
            alarms=alarms,
        )

    one, two, three = (train_ppo(cfg(tmp_path / str(n), n)) for n in (1, 2, 3))
    assert one["restores"] == two["restores"] == 0 and three["restores"] == 1
    critic = {n: load_file(str(tmp_path / str(n) / "model" / CRITIC_FILE)) for n in (1, 2, 3)}
    assert any(not torch.equal(critic[1][k], critic[2][k]) for k in critic[1])  # step 2 moved the critic ...
    for k in critic[1]:
        assert torch.equal(critic[1][k], critic[3][k]), k  # ... and the restore at step 3 put it back with the policy
