"""reward_anneal: the named reward terms fade linearly to 0; advantages use the faded reward, the logged
reward_mean (and the collapse guard) the full spec's."""

import pytest
import torch

from posttrain.errors import ConfigError
from posttrain.generate import decode_completions
from posttrain.models.gpt import GPTConfig
from posttrain.rewards.registry import build_reward
from posttrain.tasks.arithmetic import ArithmeticConfig
from posttrain.trainers import pg_rollout
from posttrain.trainers.policy_gradient import PolicyGradientConfig, PolicyGradientTrainer
from posttrain.trainers.sft import SFTConfig, train_sft

TASK = ArithmeticConfig(digits=2, num_demos=30, num_eval=8)


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft_anneal")
    train_sft(
        SFTConfig(
            out=str(out),
            steps=60,  # long enough that sampled answers have the right number of digits (partial credit)
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
        steps=10,
        prompts_per_step=4,
        num_generations=4,
        max_new_tokens=4,
        eval_every=0,
        save_every=0,
        progress=False,
        task=TASK,
        warmup_steps=0,
        temperature=2.0,
        reward_anneal="digits",
        reward_anneal_start=0.4,
    )
    base.update(kw)
    return PolicyGradientConfig(**base)


def test_anneal_factor_by_hand(sft_dir, tmp_path):
    c = cfg(sft_dir, tmp_path)  # 10 steps, fading from t0 = 4: f(t) = (10 - t) / 6 after it
    assert [c.anneal_factor(t) for t in (0, 4)] == [1.0, 1.0]
    for t in (5, 7, 9):
        assert c.anneal_factor(t) == pytest.approx((10 - t) / 6)


def test_unknown_or_missing_terms_are_config_errors(sft_dir, tmp_path):
    with pytest.raises(ConfigError, match="format not in reward"):
        cfg(sft_dir, tmp_path, reward_anneal="format")
    with pytest.raises(ConfigError, match="not in this reward"):
        build_reward("exact_match:1.0").reweighted({"digits": 1.0})


def test_reweighted_shares_functions():
    r = build_reward("exact_match:1.0,digits:0.5")
    half = r.reweighted({"digits": 0.25})
    assert list(half.terms) == ["digits"] and half.terms["digits"][0] is r.terms["digits"][0]
    p, c, a = ["1+1="] * 3, ["2", "3", "12"], ["2", "2", "12"]
    assert half(p, c, answer=a) == [0.25, 0.0, 0.25]


def test_rewards_follow_the_schedule_and_the_log_keeps_the_full_spec(sft_dir, tmp_path):
    t = PolicyGradientTrainer(cfg(sft_dir, tmp_path))
    exact, digits = build_reward("exact_match:1.0"), build_reward("digits:1.0")
    partial = 0.0
    for step, f in ((2, 1.0), (7, 0.5), (9, 1 / 6)):
        gen, rewards, correct, base = pg_rollout.draw(t, step, 0)
        texts = decode_completions(t.tokenizer, gen)
        idx = pg_rollout.batch_indices(len(t.prompts), 4, step, t.cfg.seed + 17)
        rows = [t.prompts[i] for i in idx.tolist() for _ in range(4)]
        answers, prompts = [r.answer for r in rows], [r.prompt for r in rows]
        e = torch.tensor(exact(prompts, texts, answer=answers))
        d = torch.tensor(digits(prompts, texts, answer=answers))
        torch.testing.assert_close(base, e + 0.5 * d)  # the spec's reward, unchanged
        torch.testing.assert_close(rewards, e + 0.5 * f * d, atol=1e-6, rtol=0)  # what the advantages see
        torch.testing.assert_close(correct, e)
        partial += float(d.sum())
    assert partial > 0  # the faded term was non-zero somewhere, so the schedule was really exercised


def test_metrics_log_factor_and_full_reward(sft_dir, tmp_path):
    t = PolicyGradientTrainer(cfg(sft_dir, tmp_path, dynamic_sampling=False))
    m = t.rollout(7).metrics
    assert m["reward_anneal_factor"] == pytest.approx(0.5)
    assert m["reward_optimised"] <= m["reward_mean"] + 1e-6
