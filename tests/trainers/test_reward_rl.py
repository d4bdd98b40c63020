"""RL against a trained reward model: ``PolicyGradientConfig.reward_model`` -> ``build_reward(..., rm_path=...)``."""

import json

import pytest
import torch

from posttrain.cli import main
from posttrain.models.gpt import GPTConfig
from posttrain.rewards import reward_model as rm_module
from posttrain.rewards.registry import WeightedReward
from posttrain.rewards.reward_model import load_reward_model
from posttrain.tasks.arithmetic import ArithmeticConfig
from posttrain.trainers.policy_gradient import PolicyGradientConfig, PolicyGradientTrainer
from posttrain.trainers.reward import RMConfig, train_reward_model
from posttrain.trainers.sft import SFTConfig, train_sft

TASK = ArithmeticConfig(digits=1, num_demos=20, num_eval=8)
MODEL = GPTConfig(n_layer=1, n_head=2, d_model=32, max_seq_len=24)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("rmrl")
    train_sft(
        SFTConfig(
            out=str(root / "sft"),
            steps=4,
            batch_size=8,
            eval_every=0,
            save_every=0,
            progress=False,
            model=MODEL,
            task=TASK,
        )
    )
    train_reward_model(
        RMConfig(
            out=str(root / "rm"),
            steps=3,
            batch_size=8,
            eval_every=0,
            save_every=0,
            warmup_steps=1,
            progress=False,
            eval_prompts=8,
            stats_pairs=16,
            model=MODEL,
            task=TASK,
        )
    )
    return root / "sft", root / "rm"


def pg_cfg(dirs, out, **kw):
    sft, rm = dirs
    base = dict(
        init=str(sft),
        out=str(out),
        steps=2,
        prompts_per_step=4,
        num_generations=4,
        max_new_tokens=4,
        eval_every=0,
        save_every=0,
        progress=False,
        task=TASK,
        warmup_steps=0,
        reward_model=str(rm),
    )
    return PolicyGradientConfig(**{**base, **kw})


def test_weighted_mix_with_the_rm_and_one_load_per_run(dirs, tmp_path, monkeypatch):
    loads = []
    real = rm_module.load_reward_model
    monkeypatch.setattr(rm_module, "load_reward_model", lambda *a, **k: loads.append(a) or real(*a, **k))
    t = PolicyGradientTrainer(pg_cfg(dirs, tmp_path / "mix", reward="reward_model:1.0,exact_match:0.5"))
    assert isinstance(t.reward_fn, WeightedReward) and set(t.reward_fn.terms) == {"reward_model", "exact_match"}
    # the trainer's reward is 1.0 * z-scored RM score + 0.5 * exact match, the RM scored independently here
    loaded = real(dirs[1])
    prompts, comps, answers = ["1+2=", "3+3=", "4+4="], ["3", "7", "8"], ["3", "6", "8"]
    z = ((loaded.score(prompts, comps) - loaded.stats.mean) / loaded.stats.std).tolist()
    want = [zi + 0.5 * (c == a) for zi, c, a in zip(z, comps, answers)]
    assert t.reward_fn(prompts, comps, answer=answers) == pytest.approx(want, abs=1e-5)
    t.train()
    assert len(loads) == 1  # loaded once per run, not per rollout or per call


def test_reward_model_alone_is_the_reward(dirs, tmp_path):
    t = PolicyGradientTrainer(pg_cfg(dirs, tmp_path / "alone"))
    assert t.cfg.reward == "reward_model:1.0" and set(t.reward_fn.terms) == {"reward_model"}
    loaded = load_reward_model(dirs[1])
    got = torch.tensor(t.reward_fn(["2+2="], ["4"], answer=["4"]))
    torch.testing.assert_close(got, loaded.stats.normalize(loaded.score(["2+2="], ["4"])).float(), atol=1e-5, rtol=0)


def test_grpo_cli_with_reward_model(dirs, tmp_path, capsys):
    sft, rm = dirs
    out = tmp_path / "cli"
    common = [
        "--init",
        str(sft),
        "--out",
        str(out),
        "--steps",
        "1",
        "--prompts-per-step",
        "2",
        "--num-generations",
        "2",
        "--max-new-tokens",
        "3",
        "--eval-every",
        "0",
        "--save-every",
        "0",
        "--progress",
        "false",
        "--task.digits",
        "1",
        "--task.num-demos",
        "20",
        "--task.num-eval",
        "8",
    ]
    assert main(["grpo", *common, "--reward-model", str(rm), "--reward", "reward_model:1.0,format:0.1"]) == 0
    assert json.loads((out / "config.resolved.json").read_text())["reward"] == "reward_model:1.0,format:0.1"
    capsys.readouterr()
    assert main(["grpo", *common, "--overwrite", "--reward", "reward_model"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.endswith(
            "--reward 'reward_model' uses reward_model: pass --reward-model RM_CHECKPOINT (a `posttrain rm` "
            "output directory)"
        )
        and "\n" not in err
    )
    assert main(["grpo", *common, "--overwrite", "--reward-model", str(sft)]) == 2  # a policy is not an RM
    assert "is not a reward-model checkpoint" in capsys.readouterr().err
