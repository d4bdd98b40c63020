"""Rollout engines in the RL trainers: ours gives IS weights of exactly 1 and leaves a run bitwise as it was; the
skewed engine's samples get the reference TIS weights (pi_old by an independent scoring path) and change the loss;
the flags parse, and bad values (or vLLM where it cannot run) exit 2 with one line."""

import dataclasses

import pytest
import torch

from posttrain.cli import main
from posttrain.engines import VLLM_NEEDS
from posttrain.errors import UserError
from posttrain.models.gpt import GPTConfig
from posttrain.scoring import completion_logps
from posttrain.tasks.arithmetic import ArithmeticConfig
from posttrain.trainers.policy_gradient import PolicyGradientConfig, PolicyGradientTrainer
from posttrain.trainers.ppo import PPOConfig, PPOTrainer
from posttrain.trainers.rl import group, ppo_batch
from posttrain.trainers.rl.rollout import rollout
from posttrain.trainers.sft import SFTConfig, train_sft

TASK = ArithmeticConfig(digits=1, num_demos=30, num_eval=8)
IS_KEYS = ("sampling_logp_difference", "is_weight_mean", "is_weight_min", "is_weight_max", "is_clipped_frac")


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft")
    train_sft(
        SFTConfig(
            out=str(out),
            steps=20,
            batch_size=16,
            eval_every=0,
            save_every=0,
            progress=False,
            task=TASK,
            model=GPTConfig(n_layer=1, n_head=2, d_model=32, max_seq_len=24),
        )
    )
    return out


def _grpo(sft_dir, out, **kw):
    base = dict(
        init=str(sft_dir),
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
        mu=2,
        minibatches=2,
        beta=0.05,
        dynamic_sampling=False,
        lr=1e-3,
    )
    return PolicyGradientConfig(**{**base, **kw})


def _ppo(sft_dir, out, **kw):
    base = dict(
        init=str(sft_dir),
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
        lr=1e-3,
        mu=2,
        minibatches=2,
        missing_eos_penalty=-1.0,  # a reward that varies whatever the tiny SFT start samples: real updates
    )
    return PPOConfig(**{**base, **kw})


def _train(trainer_cls, cfg):
    tr = trainer_cls(cfg)
    mets = [tr.train_step(s) for s in range(cfg.steps)]
    return {k: v.detach().clone() for k, v in tr.model.state_dict().items()}, mets


@pytest.mark.parametrize("kind", ["grpo", "ppo"])
def test_native_engine_weights_are_exactly_one_and_the_run_is_bitwise_unchanged(sft_dir, tmp_path, monkeypatch, kind):
    cls, make = (PolicyGradientTrainer, _grpo) if kind == "grpo" else (PPOTrainer, _ppo)
    w1, m1 = _train(cls, make(sft_dir, tmp_path / "a"))
    for m in m1:
        assert (m["is_weight_min"], m["is_weight_max"], m["is_weight_mean"]) == (1.0, 1.0, 1.0)
        assert m["sampling_logp_difference"] == 0.0 and m["is_clipped_frac"] == 0.0
    # the oracle: the same run with no correction at all (the loss as it was before engines were wired in)
    if kind == "grpo":
        monkeypatch.setattr(group, "correct", lambda b, *a, **kw: b)
    else:
        monkeypatch.setattr(ppo_batch, "is_weights", lambda *a, **kw: (None, {}))
    w0, m0 = _train(cls, make(sft_dir, tmp_path / "b"))
    assert "is_weight_mean" not in m0[0]
    assert any(m["grad_norm"] > 1e-3 for m in m0)  # real updates
    for k in w0:
        assert torch.equal(w1[k], w0[k]), k
    assert [m["loss"] for m in m1] == [m["loss"] for m in m0]


def test_skewed_engine_grpo_rollout_gets_the_reference_tis_weights(sft_dir, tmp_path):
    cfg = _grpo(sft_dir, tmp_path / "s", engine="skewed", tis_cap=1.05, tis_level="token")
    tr = PolicyGradientTrainer(cfg)
    sampled = rollout(tr.model, tr.engine, tr.tokenizer, tr.data, tr.reward_fn, tr.settings, 0)
    raw = group.group_batch(sampled, 0, cfg, ref_model=tr.ref_model, beta=tr.kl_ctl.value)  # the engine's log-probs
    ro = group.correct(raw, tr.model, cfg, matched=False, share_prefix=tr.share_prefix)  # (sampled at 1.3 x the T)
    m = raw.completion_mask.float()
    with torch.no_grad():  # pi_old by an independent path: a plain full forward (the trainer shares prompt prefixes)
        want_old = completion_logps(
            tr.model,
            raw.sequences,
            raw.attention_mask,
            raw.prompt_length,
            temperature=cfg.temperature,
            completion_mask=raw.completion_mask,
        )
    torch.testing.assert_close(ro.old_logps, want_old * m, atol=1e-5, rtol=0)
    want_w = torch.exp(ro.old_logps - raw.old_logps).clamp(max=1.05) * m
    torch.testing.assert_close(ro.is_weights, want_w, atol=1e-6, rtol=1e-6)
    assert ro.metrics["sampling_logp_difference"] > 0.01 and ro.metrics["is_weight_min"] < 1.0
    assert 0 < ro.metrics["is_clipped_frac"] < 1 and ro.metrics["is_weight_max"] == pytest.approx(1.05)
    per_seq_cfg = dataclasses.replace(cfg, tis_level="sequence")
    seq = group.correct(raw, tr.model, per_seq_cfg, matched=False, share_prefix=tr.share_prefix)
    per_seq = torch.exp(((ro.old_logps - raw.old_logps) * m).sum(-1, keepdim=True)).clamp(max=1.05) * m
    torch.testing.assert_close(seq.is_weights, per_seq, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("kind", ["grpo", "ppo"])
def test_skewed_engine_weights_multiply_the_policy_loss(sft_dir, tmp_path, kind):
    """On the rollout's first update (ratio 1 up to float) the policy term is -sum_t w_t A_t / N_tokens (token mean),
    with w the rollout's TIS weights: different from the unweighted loss, and logged as non-trivial."""
    from posttrain.losses.policy import batch_normalizers

    if kind == "grpo":
        tr = PolicyGradientTrainer(_grpo(sft_dir, tmp_path / "g", engine="skewed", beta=0.0, loss_agg="token_mean"))
        ro = tr.rollout(0)  # advantages of both signs (the SFT start may give a group equal rewards)
        ro = dataclasses.replace(
            ro, advantages=torch.randn(ro.sequences.shape[0], generator=torch.Generator().manual_seed(0))
        )
        adv = ro.advantages[:, None]
        loss = lambda r: tr._micro_loss(r, torch.arange(r.sequences.shape[0]), batch_normalizers(r.completion_mask))  # noqa: E731
    else:
        tr = PPOTrainer(_ppo(sft_dir, tmp_path / "p", engine="skewed", minibatches=1))
        ro = tr.rollout(0, tr.kl_ctl.value)  # advantages of both signs (they are 0 where every reward and value is)
        ro = dataclasses.replace(
            ro, advantages=torch.randn(ro.advantages.shape, generator=torch.Generator().manual_seed(0))
        )
        adv = ro.advantages
        loss = lambda r: tr._micro_loss(
            r,
            torch.arange(r.sequences.shape[0]),
            batch_normalizers(r.completion_mask),  # noqa: E731
            train_policy=True,
        )
    m = ro.metrics
    assert m["sampling_logp_difference"] > 0.01 and m["is_weight_min"] < 1.0 < m["is_weight_max"] <= 2.0
    mask = ro.completion_mask.float()
    with torch.no_grad():
        _, weighted = loss(ro)
        _, plain = loss(dataclasses.replace(ro, is_weights=None))
    want = -(ro.is_weights * adv * mask).sum() / mask.sum()
    assert weighted["pg_loss"] == pytest.approx(want.item(), abs=1e-5)
    assert plain["pg_loss"] == pytest.approx((-(adv * mask).sum() / mask.sum()).item(), abs=1e-5)
    assert abs(weighted["pg_loss"] - plain["pg_loss"]) > 1e-3


def test_engine_flags_parse_and_bad_values_exit_2(sft_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["grpo", "--engine", "bogus", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == "posttrain grpo: error: engine='bogus' is not valid; choose one of: native, skewed, vllm\n"
    assert main(["ppo", "--tis-level", "word", "--out", str(out)]) == 2
    assert "tis_level='word' is not valid" in capsys.readouterr().err
    assert main(["ppo", "--tis-cap", "0.5", "--out", str(out)]) == 2
    assert capsys.readouterr().err == "posttrain ppo: error: tis_cap=0.5 must be >= 1\n"
    assert not out.exists()
    cfg = PPOConfig(init=str(sft_dir), engine="skewed", tis_cap=3.0, tis_level="sequence")
    assert (cfg.engine, cfg.tis_cap, cfg.tis_level) == ("skewed", 3.0, "sequence")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where vLLM cannot run")
def test_vllm_engine_is_refused_with_one_line_where_it_cannot_run(sft_dir, tmp_path, capsys):
    for cmd in ("grpo", "ppo"):
        out = tmp_path / cmd
        assert main([cmd, "--init", str(sft_dir), "--engine", "vllm", "--out", str(out), "--steps", "1"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"posttrain {cmd}: error: {VLLM_NEEDS} (") and err.count("\n") == 1, err
        assert not (out / "run.json").exists()
    with pytest.raises(UserError, match=VLLM_NEEDS):
        PolicyGradientTrainer(_grpo(sft_dir, tmp_path / "api", engine="vllm"))


@pytest.mark.parametrize("kind", ["grpo", "ppo"])
def test_a_diverged_policy_is_refused_by_the_sampler_naming_the_training_step(sft_dir, tmp_path, kind):
    """NaN weights: the engine's sampler refuses the NaN logits with one line that names the step being sampled."""
    from posttrain.errors import NonFiniteError

    tr = (
        PolicyGradientTrainer(_grpo(sft_dir, tmp_path / "g")) if kind == "grpo" else PPOTrainer(_ppo(sft_dir, tmp_path))
    )
    with torch.no_grad():
        for p in tr.model.parameters():
            p.fill_(float("nan"))
    with pytest.raises(NonFiniteError, match=r"^sampling at step 7: the next-token logits of row 0 are NaN/Inf") as e:
        tr.rollout(7) if kind == "grpo" else tr.rollout(7, tr.kl_ctl.value)
    assert "\n" not in str(e.value)
