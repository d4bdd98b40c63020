"""Dynamic sampling (DAPO): kept groups carry signal, draws are a function of (seed, step), degrade gracefully."""

import dataclasses
import shutil

import pytest
import torch

from posttrain.checkpoints.load import load_checkpoint
from posttrain.generate import SamplingConfig, generate
from posttrain.models.gpt import GPTConfig
from posttrain.rewards.registry import REWARD_FUNCTIONS, register_reward
from posttrain.scoring import completion_logps
from posttrain.tasks.arithmetic import ArithmeticConfig
from posttrain.trainers.policy_gradient import PolicyGradientConfig, PolicyGradientTrainer, train_policy_gradient
from posttrain.trainers.rl.dynamic_sampling import group_rows, informative_groups, merge_rows
from posttrain.trainers.sft import SFTConfig, train_sft

TASK = ArithmeticConfig(digits=1, num_demos=30, num_eval=8)


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft_ds")
    train_sft(
        SFTConfig(
            out=str(out),
            steps=20,
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


def _draw(t, step, rnd):
    """Round ``rnd`` of ``step`` as the trainer's rollout draws it (its prompt filter's history updated)."""
    from posttrain.trainers.rl.rollout import draw

    return draw(t.model, t.engine, t.tokenizer, t.data, t.reward_fn, t.settings, step, rnd, history=t.prompt_history)


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
        dynamic_sampling=True,
        max_sample_rounds=3,
        lr=1e-2,
    )
    base.update(kw)
    return PolicyGradientConfig(**base)


def coin_reward():
    """1 for completions of even length, else 0: groups of a sampling policy are mixed and sometimes uniform."""
    return lambda prompts, completions, **_: [float(len(c) % 2 == 0) for c in completions]


def test_informative_groups_and_rows():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    assert informative_groups(r, 2).tolist() == [False, True, False]
    assert group_rows(torch.tensor([1, 2]), 2).tolist() == [2, 3, 4, 5]


def test_merged_rows_keep_their_own_log_probs(tiny_gpt):
    cfgs = SamplingConfig(max_new_tokens=5, temperature=1.0, num_samples=2)
    g1 = generate(
        tiny_gpt, [[1, 4, 5], [1, 6]], pad_id=0, eos_id=2, cfg=cfgs, generator=torch.Generator().manual_seed(1)
    )
    g2 = generate(
        tiny_gpt,
        [[1, 4, 5, 7, 8]],
        pad_id=0,
        eos_id=2,
        cfg=SamplingConfig(max_new_tokens=3, num_samples=2),
        generator=torch.Generator().manual_seed(2),
    )
    parts = [(g1, group_rows(torch.tensor([1]), 2)), (g2, group_rows(torch.tensor([0]), 2))]
    m = merge_rows(parts, pad_id=0, group_size=2)
    assert m["prompt_index"].tolist() == [0, 0, 1, 1]
    with torch.no_grad():
        merged = completion_logps(
            tiny_gpt, m["sequences"], m["attention_mask"], m["prompt_length"], completion_mask=m["completion_mask"]
        )
        row = 0
        for g, rows in parts:
            own = completion_logps(
                tiny_gpt, g.sequences, g.attention_mask, g.prompt_length, completion_mask=g.completion_mask
            )[rows]
            t = own.shape[1]
            torch.testing.assert_close(merged[row : row + len(rows), :t], own, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(m["logps"][row : row + len(rows), :t], g.logps[rows])
            assert not merged[row : row + len(rows), t:].any()  # padding carries nothing
            row += len(rows)


def test_kept_groups_all_carry_signal_and_draws_are_a_function_of_step(sft_dir, tmp_path):
    if "coin" not in REWARD_FUNCTIONS:
        register_reward("coin", lambda **_: coin_reward())
    t = PolicyGradientTrainer(cfg(sft_dir, tmp_path / "a", reward="coin", temperature=2.0))
    ro = t.rollout(3)
    kept = ro.metrics["groups_kept"]
    assert 0 < kept <= 4 and ro.metrics["groups_drawn"] in (4, 8, 12)
    adv = ro.advantages.view(kept, 4)
    assert (adv.abs().sum(1) > 0).all()  # no uniform group was kept
    again = PolicyGradientTrainer(cfg(sft_dir, tmp_path / "b", reward="coin", temperature=2.0)).rollout(3)
    assert torch.equal(ro.sequences, again.sequences) and torch.equal(ro.advantages, again.advantages)


def test_resume_is_bitwise_with_dynamic_sampling(sft_dir, tmp_path):
    if "coin" not in REWARD_FUNCTIONS:
        register_reward("coin", lambda **_: coin_reward())
    full = tmp_path / "full"
    train_policy_gradient(cfg(sft_dir, full, reward="coin", temperature=2.0))
    resumed = tmp_path / "resumed"
    shutil.copytree(full / "checkpoints" / "step-00000002", resumed / "checkpoints" / "step-00000002")
    (resumed / "checkpoints" / "latest").write_text("step-00000002\n")
    train_policy_gradient(cfg(sft_dir, resumed, reward="coin", temperature=2.0), resume=str(resumed))
    a, b = load_checkpoint(full).model.state_dict(), load_checkpoint(resumed).model.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_all_uniform_groups_make_no_update(sft_dir, tmp_path):
    if "always_zero" not in REWARD_FUNCTIONS:
        register_reward("always_zero", lambda **_: lambda prompts, completions, **c: [0.0] * len(completions))
    out = tmp_path / "z"
    s = train_policy_gradient(cfg(sft_dir, out, steps=2, save_every=0, reward="always_zero"))
    assert s["heldout_accuracy"] >= 0
    before, after = load_checkpoint(sft_dir).model.state_dict(), load_checkpoint(out).model.state_dict()
    for k in before:
        assert torch.equal(before[k], after[k]), k  # not even Adam's momentum moved the weights
    import json

    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if '"groups_kept"' in ln]
    assert [r["groups_kept"] for r in rows] == [0, 0] and [r["groups_drawn"] for r in rows] == [12, 12]
    assert all(r["no_signal_step"] == 1 for r in rows)


def test_prompt_filter_refills_with_prompts_that_had_signal_first(sft_dir, tmp_path):
    from posttrain.data.batches import batch_indices

    if "always_zero" not in REWARD_FUNCTIONS:
        register_reward("always_zero", lambda **_: lambda prompts, completions, **c: [0.0] * len(completions))
    c = cfg(sft_dir, tmp_path / "f", reward="always_zero", prompt_filter=True, prompt_filter_p=1e-9)
    t = PolicyGradientTrainer(c)
    n = len(t.prompts)
    fresh = torch.arange(n) % 2 == 0  # z = 0 on every other prompt, z = 5 elsewhere
    t.prompt_history.streak[:] = torch.where(fresh, 0, 5)
    before = t.prompt_history.streak.clone()
    _draw(t, 2, 1)  # a refill round: the filter applies
    pool = batch_indices(n, c.prompts_per_step * c.prompt_filter_pool, 2, c.seed + 17 + 2**32)
    expect = [int(i) for i in pool if fresh[i]][: c.prompts_per_step]
    assert len(expect) == c.prompts_per_step  # the pool holds enough fresh prompts for the test to mean something
    changed = (t.prompt_history.streak != before).nonzero().flatten().tolist()
    assert sorted(changed) == sorted(expect)  # exactly those were sampled (each now z = 1: all rewards 0)
    assert (t.prompt_history.streak[expect] == 1).all()
    before = t.prompt_history.streak.clone()
    _draw(t, 2, 0)  # round 0 is never filtered: the classic batch, whatever the prompts' history
    round0 = batch_indices(n, c.prompts_per_step, 2, c.seed + 17)
    assert sorted((t.prompt_history.streak != before).nonzero().flatten().tolist()) == sorted(set(round0.tolist()))


def test_prompt_filter_without_fill_samples_only_the_prompts_that_passed(sft_dir, tmp_path, monkeypatch):
    """prompt_filter_fill off: a refill round is the prompts that passed (none: nothing is sampled, the step goes on),
    and groups_drawn counts the groups actually drawn."""
    from posttrain.trainers.rl import rollout as rl_rollout

    if "always_zero" not in REWARD_FUNCTIONS:
        register_reward("always_zero", lambda **_: lambda prompts, completions, **c: [0.0] * len(completions))
    c = cfg(sft_dir, tmp_path / "nf", reward="always_zero", prompt_filter=True, prompt_filter_p=1e-9)
    t = PolicyGradientTrainer(dataclasses.replace(c, prompt_filter_fill=False))
    n = len(t.prompts)
    fresh = torch.arange(n) % 2 == 0
    t.prompt_history.streak[:] = torch.where(fresh, 0, 5)
    calls, real_sample = [], rl_rollout.sample
    monkeypatch.setattr(
        rl_rollout, "sample", lambda eng, pol, ps, *a: calls.append(len(ps)) or real_sample(eng, pol, ps, *a)
    )
    r = _draw(t, 2, 1)  # enough fresh prompts in the pool: a full round of them
    assert len(r.rewards) == c.prompts_per_step * c.num_generations
    t.prompt_history.streak[:] = 5  # now every prompt was uninformative 5 times in a row: none passes
    assert _draw(t, 3, 1) is None and calls == [c.prompts_per_step]  # nothing sampled
    calls.clear()
    args = (t.model, t.engine, t.tokenizer, t.data, t.reward_fn, t.settings, 4)
    ro = rl_rollout.rollout(
        *args, history=t.prompt_history
    )  # round 0 (all rewards 0: no signal), then rounds 1-2 pass nothing
    assert calls == [c.prompts_per_step]  # only round 0 was sampled
    assert ro.metrics["groups_drawn"] == c.prompts_per_step and ro.metrics["groups_kept"] == 0 and not ro.apply


def test_resume_is_bitwise_with_the_prompt_filter(sft_dir, tmp_path):
    if "coin" not in REWARD_FUNCTIONS:
        register_reward("coin", lambda **_: coin_reward())
    kw = dict(reward="coin", temperature=2.0, prompt_filter=True, prompt_filter_p=1e-3, steps=10, save_every=5)
    kw.update(num_generations=2)  # groups of 2 are often uniform: refill rounds, where the history acts
    full = tmp_path / "full"
    train_policy_gradient(cfg(sft_dir, full, **kw))
    state = load_checkpoint(full / "checkpoints" / "step-00000005", with_training_state=True).state
    assert state["prompt_history"]["index"]  # some prompts had uniform groups: the history is in the checkpoint
    resumed = tmp_path / "resumed"
    shutil.copytree(full / "checkpoints" / "step-00000005", resumed / "checkpoints" / "step-00000005")
    (resumed / "checkpoints" / "latest").write_text("step-00000005\n")
    train_policy_gradient(cfg(sft_dir, resumed, **kw), resume=str(resumed))
    a, b = load_checkpoint(full).model.state_dict(), load_checkpoint(resumed).model.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_prompt_filter_is_off_without_dynamic_sampling(sft_dir, tmp_path):
    t = PolicyGradientTrainer(cfg(sft_dir, tmp_path, prompt_filter=True, dynamic_sampling=False))
    assert t.prompt_history is None  # no refill rounds to filter


def test_a_full_batch_kept_from_a_refill_round_is_that_rounds_samples(sft_dir, tmp_path):
    """Round 0 has no signal, round 1 a full batch of it: the batch is round 1's rows (samples, log-probs and
    rewards of the same completions), not round 0's samples with round 1's rewards."""
    from posttrain.trainers.rl.rollout import draw, rollout

    calls = []

    def switch(prompts, completions, **c):  # round 0: all equal; later rounds: 0, 1, 0, 1, ... (every group informs)
        calls.append(len(completions))
        return [0.0 if len(calls) == 1 else float(i % 2) for i in range(len(completions))]

    if "round_switch" not in REWARD_FUNCTIONS:
        register_reward("round_switch", lambda **_: switch)
    t = PolicyGradientTrainer(cfg(sft_dir, tmp_path, reward="round_switch", prompt_filter=False))
    args = (t.model, t.engine, t.tokenizer, t.data, t.reward_fn, t.settings, 2)
    ro = rollout(*args)
    assert ro.apply and ro.metrics["groups_kept"] == t.cfg.prompts_per_step and len(calls) == 2
    want = draw(*args, 1)  # round 1 again: the same samples (a function of seed, step, round)
    assert torch.equal(ro.sequences, want.gen.sequences) and torch.equal(ro.sampler_logps, want.gen.logps)
    assert torch.equal(ro.rewards, want.rewards) and not torch.equal(ro.first.gen.sequences, want.gen.sequences)


def test_stuck_groups_are_the_uniform_ones_with_no_correct_sample():
    from posttrain.trainers.rl.dynamic_sampling import stuck_groups

    rewards = torch.tensor([0.0, 0.0, 0.5, 0.5, 1.0, 1.0, 0.0, 1.0])
    correct = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    want = [  # brute force: equal rewards and no correct sample
        len(set(rewards[i : i + 2].tolist())) == 1 and not correct[i : i + 2].any() for i in range(0, 8, 2)
    ]
    assert stuck_groups(rewards, correct, 2).tolist() == want == [True, True, False, False]


def test_retry_draws_the_stuck_groups_hot_and_weights_them_by_truncated_is(sft_dir, tmp_path):
    """Round 0 gives no signal: its stuck groups are drawn again at retry_temperature (the same samples as a direct
    draw of those prompts), kept as off-policy rows, weighted by min(pi_old / pi_hot, cap) against the trainer's
    own forward at the training temperature."""
    from posttrain.trainers.rl import group
    from posttrain.trainers.rl.dynamic_sampling import stuck_groups
    from posttrain.trainers.rl.rollout import draw, rollout

    calls = []

    def switch(prompts, completions, **c):  # round 0: its first 2 groups all 0; else 0, 1, 0, 1, ... (informs)
        calls.append(len(completions))
        return [0.0 if len(calls) == 1 and i < 8 else float(i % 2) for i in range(len(completions))]

    if "retry_switch" not in REWARD_FUNCTIONS:
        register_reward("retry_switch", lambda **_: switch)
    t = PolicyGradientTrainer(cfg(sft_dir, tmp_path, reward="retry_switch", prompt_filter=False, retry_temperature=3.0))
    args = (t.model, t.engine, t.tokenizer, t.data, t.reward_fn, t.settings, 2)
    ro = rollout(*args)
    stuck = stuck_groups(ro.first.rewards, ro.first.correct, 4)
    n = int(stuck.sum())
    assert n == 2 and ro.metrics["retry_groups_kept"] == n and len(calls) == 2  # round 0's 2 groups + the retry's
    hot = ro.off_policy.view(-1, 4)[:, 0]
    assert hot.sum() == n and ro.off_policy.view(-1, 4).all(1).eq(hot).all()  # whole groups
    again = draw(*args, 0, retry=ro.first.prompts[stuck])  # the retry alone: the same samples
    assert torch.equal(ro.sampler_logps[ro.off_policy], again.gen.logps)
    b = group.correct(
        group.group_batch(ro, 2, t.cfg, ref_model=None, beta=0.0), t.model, t.cfg, matched=True, share_prefix=True
    )
    old = group.trainer_logps(t.model, b, group.warp(t.cfg), share_prefix=False)  # at temperature 1
    torch.testing.assert_close(b.old_logps, old, atol=1e-5, rtol=1e-5)
    mask = b.completion_mask.bool()
    want = torch.clamp(torch.exp(old - ro.sampler_logps), max=t.cfg.tis_cap)[ro.off_policy]
    torch.testing.assert_close(b.is_weights[ro.off_policy][mask[ro.off_policy]], want[mask[ro.off_policy]])
    on = ~ro.off_policy
    assert (b.is_weights[on][mask[on]] == 1).all()  # the rows drawn from pi_old keep weight 1 exactly


def test_retry_without_is_keeps_every_row_at_weight_one(sft_dir, tmp_path):
    """retry_is off: the retry's rows (drawn hot, so pi_old / pi_hot is far from 1) are trained on with weight 1
    exactly, pi_old still the trainer's forward at the training temperature."""
    from posttrain.trainers.rl import group
    from posttrain.trainers.rl.rollout import rollout

    calls = []

    def switch(prompts, completions, **c):  # as above: round 0's first 2 groups stuck, the retry informs
        calls.append(len(completions))
        return [0.0 if len(calls) == 1 and i < 8 else float(i % 2) for i in range(len(completions))]

    if "retry_switch_guide" not in REWARD_FUNCTIONS:
        register_reward("retry_switch_guide", lambda **_: switch)
    kw = dict(reward="retry_switch_guide", prompt_filter=False, retry_temperature=3.0, retry_is=False)
    t = PolicyGradientTrainer(cfg(sft_dir, tmp_path, **kw))
    ro = rollout(t.model, t.engine, t.tokenizer, t.data, t.reward_fn, t.settings, 2)
    assert ro.off_policy is not None and ro.off_policy.sum() == 8
    b = group.correct(
        group.group_batch(ro, 2, t.cfg, ref_model=None, beta=0.0), t.model, t.cfg, matched=True, share_prefix=True
    )
    mask = b.completion_mask.bool()
    hot = ro.off_policy[:, None] & mask
    assert (b.is_weights[mask] == 1).all()
    assert (torch.exp(b.old_logps - ro.sampler_logps)[hot] - 1).abs().max() > 0.05  # IS would have moved them
    old = group.trainer_logps(t.model, b, group.warp(t.cfg), share_prefix=False)
    torch.testing.assert_close(b.old_logps, old, atol=1e-5, rtol=1e-5)


def test_retry_needs_dynamic_sampling(sft_dir, tmp_path):
    from posttrain.errors import ConfigError

    with pytest.raises(ConfigError, match="retry_temperature needs dynamic_sampling"):
        cfg(sft_dir, tmp_path, dynamic_sampling=False, retry_temperature=2.0)
