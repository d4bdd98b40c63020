"""PPO trainer: first-minibatch ratio exactly 1, A2C's gradient against the reference formula, exact resume,
grad-accumulation invariance, critic warm-up, target-KL stop, skipped non-finite steps, RM init, CLI errors."""

import dataclasses
import json
import shutil

import pytest
import torch

from posttrain.checkpoints.load import load_checkpoint
from posttrain.cli import main
from posttrain.errors import ConfigError, UserError
from posttrain.models.gpt import GPTConfig
from posttrain.models.heads import RewardModel, RewardStats
from posttrain.rewards.reward_model import load_reward_model
from posttrain.scoring import completion_logps
from posttrain.tasks.arithmetic import ArithmeticConfig
from posttrain.trainers import ppo as ppo_mod
from posttrain.trainers.checkpoint import save_reward_checkpoint
from posttrain.trainers.ppo import PRESETS, PPOConfig, PPOTrainer, train_ppo
from posttrain.trainers.rl import ppo_batch
from posttrain.trainers.rl.critic import CRITIC_FILE, CRITIC_OPTIMIZER_FILE
from posttrain.trainers.sft import SFTConfig, train_sft

TASK = ArithmeticConfig(digits=1, num_demos=30, num_eval=8)


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft")
    train_sft(
        SFTConfig(
            out=str(out),
            steps=60,  # a policy whose samples differ in reward (non-zero advantages at step 0)
            batch_size=16,
            eval_every=0,
            save_every=0,
            progress=False,
            task=TASK,
            model=GPTConfig(n_layer=1, n_head=2, d_model=32, max_seq_len=24),
        )
    )
    return out


def _rollout(t, step):
    """The trainer's batch of ``step`` at its current KL coefficient, as ``train_step`` makes it."""
    return t.rollout(step, t.kl_ctl.value)


def cfg(sft_dir, out, preset=None, **kw):
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
        lr=1e-2,
        mu=2,
        minibatches=2,
    )
    base.update(PRESETS.get(preset, {}))
    base.update(kw)
    return PPOConfig(**base)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"value_model": "shared", "grad_accum": 2},
        {"minibatches": 1, "grad_accum": 4},
        {"policy_objective": "kl_penalty"},
    ],
)
def test_first_minibatch_ratio_is_exactly_one(sft_dir, tmp_path, kw):
    t = PPOTrainer(cfg(sft_dir, tmp_path / "r", **kw))
    t.update(_rollout(t, 0), 0, train_policy=True)
    first, later = t.minibatch_metrics[0], t.minibatch_metrics[-1]
    assert first["ratio_max"] == first["ratio_min"] == 1.0  # bit for bit: pi_old is recomputed by the same forward
    assert first["approx_kl"] == 0.0 and first["clip_frac_low"] == first["clip_frac_high"] == 0.0
    assert later["ratio_max"] != 1.0  # the later minibatches do see a moved policy


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"value_model": "shared", "critic_warmup": 1},
        {"beta": 0.0, "target_kl": 1e-4},  # no reference model; the target-KL stop fires in the second epoch
        {"lora_r": 4},  # the reference is the policy with its adapters off
    ],
)
def test_folding_the_first_forward_into_the_rollout_changes_nothing(sft_dir, tmp_path, monkeypatch, kw):
    """minibatches = grad_accum = 1: the pi_old pass is the first update's forward (its graph kept); the run ends
    bitwise equal to one that runs that forward again, metrics and all."""
    if kw.get("lora_r"):
        pytest.importorskip("peft")
    runs = {}
    for fold in (True, False):
        monkeypatch.setattr(ppo_batch, "folds_first_forward", lambda cfg, fsdp, f=fold: f)
        out = tmp_path / f"fold{int(fold)}"
        t = PPOTrainer(cfg(sft_dir, out, minibatches=1, steps=3, save_every=0, **kw))
        before, folded = {k: v.clone() for k, v in t.model.state_dict().items()}, []
        for step in range(3):
            ro = _rollout(t, step)
            folded.append(ro.first_forward is not None)
            upd = t.update(ro, step, train_policy=step >= t.cfg.critic_warmup)
            assert ro.first_forward is None  # the graph is freed by the update
        assert any(not torch.equal(v, t.model.state_dict()[k]) for k, v in before.items())  # the policy moved
        runs[fold] = (t, upd, folded)
    (a, upd_a, folded_a), (b, upd_b, folded_b) = runs[True], runs[False]
    assert folded_a == [True] * 3 and folded_b == [False] * 3
    assert upd_a == upd_b
    for mod_a, mod_b in ((a.model, b.model), (a.critic_module, b.critic_module)):
        sa, sb = mod_a.state_dict(), mod_b.state_dict()
        assert all(torch.equal(v, sb[k]) for k, v in sa.items())


def test_first_forward_is_folded_only_when_the_first_minibatch_is_one_micro_batch(sft_dir, tmp_path):
    for kw, want in (
        ({"minibatches": 1}, True),
        ({"minibatches": 2}, False),
        ({"minibatches": 1, "grad_accum": 2}, False),
    ):
        t = PPOTrainer(cfg(sft_dir, tmp_path / f"f{len(kw)}{want}", **kw))
        assert ppo_batch.folds_first_forward(t.cfg, t.fsdp) is want
        assert (_rollout(t, 0).first_forward is not None) is want


def test_a2c_gradient_is_the_policy_gradient_with_gae_advantages(sft_dir, tmp_path):
    """Preset a2c: one update on the rollout; its policy gradient equals grad of -sum_t A_t log pi_t / N_tokens with
    log pi from an independent scoring path (posttrain.scoring) and A the rollout's GAE advantages."""
    t = PPOTrainer(cfg(sft_dir, tmp_path / "a2c", preset="a2c"))
    ro = _rollout(t, 0)
    rows = torch.arange(ro.sequences.shape[0])
    from posttrain.losses.policy import batch_normalizers

    loss, _ = t._micro_loss(ro, rows, batch_normalizers(ro.completion_mask), train_policy=True)
    got = torch.autograd.grad(loss, list(t.model.parameters()), allow_unused=True)
    lp = completion_logps(
        t.model, ro.sequences, ro.attention_mask, ro.prompt_length, completion_mask=ro.completion_mask
    )
    m = ro.completion_mask.float()
    ref = -(ro.advantages * lp * m).sum() / m.sum()
    want = torch.autograd.grad(ref, list(t.model.parameters()), allow_unused=True)
    assert any(g is not None and g.abs().max() > 0 for g in want)
    for g, w in zip(got, want):
        if w is None:
            assert g is None or g.abs().max() == 0
        else:
            torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-5)


def _state(out):
    return load_checkpoint(out, with_training_state=True)


def test_resume_ends_bitwise_equal_to_an_uninterrupted_run(sft_dir, tmp_path):
    kw = dict(kl_control="adaptive", beta=0.1, kl_target=1e-3, kl_horizon=10, critic_warmup=1)
    full = tmp_path / "full"
    train_ppo(cfg(sft_dir, full, **kw))
    resumed = tmp_path / "resumed"
    shutil.copytree(full / "checkpoints" / "step-00000002", resumed / "checkpoints" / "step-00000002")
    (resumed / "checkpoints" / "latest").write_text("step-00000002\n")
    train_ppo(cfg(sft_dir, resumed, **kw), resume=str(resumed))
    a, b = _state(full / "model"), _state(resumed / "model")
    for k, v in a.model.state_dict().items():
        assert torch.equal(v, b.model.state_dict()[k]), k
    for name in (CRITIC_FILE,):
        from safetensors.torch import load_file

        ca, cb = load_file(str(a.path / name)), load_file(str(b.path / name))
        assert ca.keys() == cb.keys() and all(torch.equal(ca[k], cb[k]) for k in ca)
    for oa, ob in (
        (a.optimizer_state, b.optimizer_state),
        (torch.load(a.path / CRITIC_OPTIMIZER_FILE), torch.load(b.path / CRITIC_OPTIMIZER_FILE)),
    ):
        for pid, st in oa["state"].items():
            for key, val in st.items():
                assert torch.equal(val, ob["state"][pid][key]), (pid, key)
    assert a.state["kl_controller"] == b.state["kl_controller"] and a.state["kl_controller"]["value"] != 0.1
    assert torch.equal(a.rng_state["torch"], b.rng_state["torch"])
    rows = lambda p: [json.loads(x) for x in (p / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    assert [r["beta"] for r in rows(full)[-2:]] == [r["beta"] for r in rows(resumed)[-2:]]  # steps 3, 4


def test_grad_accumulation_gives_the_minibatch_gradient(sft_dir, tmp_path):
    """Loss normalised by the minibatch's global token count: 4 micro-batches' gradients sum to the whole one's."""
    from posttrain.losses.policy import batch_normalizers

    t = PPOTrainer(cfg(sft_dir, tmp_path / "ga"))
    ro = _rollout(t, 0)
    rows = torch.arange(8)  # one minibatch of the 16 rows
    norms = batch_normalizers(ro.completion_mask[rows])
    params = list(t.model.parameters()) + list(t.critic.parameters())

    def grads(parts):
        for p in params:
            p.grad = None
        for part in parts:
            t._micro_loss(ro, part, norms, train_policy=True)[0].backward()
        return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params]

    whole, split = grads([rows]), grads(list(torch.tensor_split(rows, 4)))
    assert any(g.abs().max() > 0 for g in whole)
    for a, b in zip(whole, split):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_critic_warmup_moves_only_the_critic(sft_dir, tmp_path):
    t = PPOTrainer(cfg(sft_dir, tmp_path / "w", critic_warmup=2, steps=2))
    before = {k: v.clone() for k, v in t.model.state_dict().items()}
    c_before = {k: v.clone() for k, v in t.critic.state_dict().items()}
    m = t.train_step(0)
    assert m["critic_warmup"] == 1 and m["grad_norm"] == 0.0
    assert all(torch.equal(v, t.model.state_dict()[k]) for k, v in before.items())
    assert any(not torch.equal(v, t.critic.state_dict()[k]) for k, v in c_before.items())


def test_target_kl_stops_the_epochs(sft_dir, tmp_path):
    t = PPOTrainer(cfg(sft_dir, tmp_path / "kl", target_kl=1e-9, lr=5e-2))
    m = t.train_step(0)
    assert m["early_stopped"] == 1 and m["epochs_done"] < t.cfg.mu


def test_non_finite_gradient_norm_skips_the_step(sft_dir, tmp_path, monkeypatch):
    t = PPOTrainer(cfg(sft_dir, tmp_path / "nan"))
    before = {k: v.clone() for k, v in t.model.state_dict().items()}
    monkeypatch.setattr(ppo_mod.common, "grad_norm_and_clip", lambda model, max_norm: float("nan"))
    m = t.train_step(0)
    assert m["skipped_updates"] == m["optimizer_steps"] == 2 * 2
    assert all(torch.equal(v, t.model.state_dict()[k]) for k, v in before.items())


def test_reward_model_scores_and_initialises_the_critic(sft_dir, tmp_path):
    ck = load_checkpoint(sft_dir)
    rm = RewardModel(ck.model)
    torch.nn.init.normal_(rm.head.proj.weight)
    rm_dir = save_reward_checkpoint(
        tmp_path / "rm", rm, ck.tokenizer, {"trainer": "rm", "step": 0}, stats=RewardStats(0.5, 2.0, 10)
    )
    t = PPOTrainer(cfg(sft_dir, tmp_path / "p", reward_model=str(rm_dir), steps=1))
    assert t.cfg.reward_spec == "reward_model:1.0" and t.cfg.critic_source == "reward_model"
    # the critic starts in the reward's units: V = (RM - mean) / std with the RM's saved statistics (0.5, 2.0)
    h = torch.randn(5, rm.head.proj.in_features)
    with torch.no_grad():
        torch.testing.assert_close(t.critic.head(h), (rm.head.proj(h).squeeze(-1) - 0.5) / 2.0, atol=1e-6, rtol=1e-5)
        texts = (["1+1=", "2+3="], ["2", "7"])
        z = torch.tensor(t.reward_fn(*texts, answer=["2", "5"]))  # the reward the returns are made of
        torch.testing.assert_close(z, (torch.tensor(load_reward_model(rm_dir)(*texts, normalize=False)) - 0.5) / 2.0)
    m = t.train_step(0)
    assert m["reward_mean"] != 0.0
    # a weighted spec: V = w * (RM - mean) / std, w the RM's weight
    t2 = PPOTrainer(cfg(sft_dir, tmp_path / "p2", reward_model=str(rm_dir), reward="reward_model:3.0,format:0.1"))
    with torch.no_grad():
        torch.testing.assert_close(t2.critic.head(h), 3.0 * (rm.head.proj(h).squeeze(-1) - 0.5) / 2.0)
    # at weight 0 the RM only starts the critic: z-scored, w = 1 (not a zero head)
    t0 = PPOTrainer(cfg(sft_dir, tmp_path / "p0", reward_model=str(rm_dir), reward="reward_model:0.0,exact_match:1.0"))
    with torch.no_grad():
        torch.testing.assert_close(t0.critic.head(h), (rm.head.proj(h).squeeze(-1) - 0.5) / 2.0)


def test_value_init_path_starts_the_critic_from_an_rm_that_is_not_the_reward(sft_dir, tmp_path, monkeypatch):
    ck = load_checkpoint(sft_dir)
    rm = RewardModel(ck.model)
    torch.nn.init.normal_(rm.head.proj.weight)
    rm_dir = save_reward_checkpoint(tmp_path / "rm", rm, ck.tokenizer, {"trainer": "rm", "step": 0})
    loads = []
    import posttrain.rewards.reward_model as rm_mod

    real = rm_mod.load_reward_model
    monkeypatch.setattr(rm_mod, "load_reward_model", lambda p, *a, **k: loads.append(str(p)) or real(p, *a, **k))
    for value_init in ("auto", "reward_model"):
        c = cfg(sft_dir, tmp_path / value_init, reward="exact_match:1.0", value_init_path=str(rm_dir),
                value_init=value_init, steps=1)  # fmt: skip
        t = PPOTrainer(c)
        assert c.reward_spec == "exact_match:1.0" and c.critic_source == "reward_model"
        assert torch.equal(t.critic.head.proj.weight, rm.head.proj.weight)  # the RM's head and backbone
        rm_sd = rm.backbone.state_dict()
        assert all(torch.equal(v, rm_sd[k]) for k, v in t.critic.backbone.state_dict().items())
        rewards = t.reward_fn(["1+1="], ["2"], answer=["2"])
        assert rewards == [1.0]  # the verifier, not the RM
    assert loads == [str(rm_dir)] * 2  # loaded for the critic only, once per run
    # with saved statistics, an RM that only starts the critic is z-scored (w = 1)
    rm_z = save_reward_checkpoint(tmp_path / "rmz", rm, ck.tokenizer, {"trainer": "rm", "step": 0},
                                  stats=RewardStats(-1.0, 4.0, 10))  # fmt: skip
    t = PPOTrainer(cfg(sft_dir, tmp_path / "z", reward="exact_match:1.0", value_init_path=str(rm_z), steps=1))
    h = torch.randn(3, rm.head.proj.in_features)
    with torch.no_grad():
        torch.testing.assert_close(t.critic.head(h), (rm.head.proj(h).squeeze(-1) + 1.0) / 4.0)
    with pytest.raises(ConfigError, match="contradicts value_init=policy"):
        cfg(sft_dir, tmp_path / "x", value_init_path=str(rm_dir), value_init="policy")
    with pytest.raises(ConfigError, match="needs --value-init-path or --reward-model"):
        cfg(sft_dir, tmp_path / "x", value_init="reward_model")


def test_config_errors(sft_dir, tmp_path):
    with pytest.raises(UserError, match="--init"):
        PPOTrainer(PPOConfig(out=str(tmp_path / "x"), progress=False))
    with pytest.raises(ConfigError, match="split evenly"):
        cfg(sft_dir, tmp_path / "x", minibatches=3)
    with pytest.raises(ConfigError, match="--reward-model"):
        cfg(sft_dir, tmp_path / "x", reward="reward_model:1.0")
    with pytest.raises(ConfigError, match="kl_target=0"):
        cfg(sft_dir, tmp_path / "x", kl_target=0.0)


def test_cli_bad_flag_is_one_line_exit_2(sft_dir, tmp_path, capsys):
    assert (
        main(["ppo", "--init", str(sft_dir), "--out", str(tmp_path / "o"), "--kl-horizon", "0", "--progress", "false"])
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert "kl_horizon=0" in err and "Traceback" not in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("layout", ["separate", "shared"])
def test_prompt_prefix_sharing_is_exact(sft_dir, tmp_path, layout):
    from posttrain.trainers.rl.ppo_batch import forward

    t = PPOTrainer(cfg(sft_dir, tmp_path / "px", value_model=layout))
    torch.nn.init.normal_((t.shared_head if layout == "shared" else t.critic.head).proj.weight)
    ro = _rollout(t, 0)
    args = (t.model, t.critic, t.shared_head, ro.sequences, ro.attention_mask, ro.completion_mask, ro.prompt_length)
    kw = dict(temperature=1.0, top_k=None, top_p=None, need_entropy=True)
    full, shared = forward(*args, None, **kw), forward(*args, ro.prompt_index, **kw)
    for a, b in zip(full, shared):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert full[2].abs().max() > 0


def test_tiny_rm_preset_is_tiny_with_twice_the_kl_and_a_decaying_lr():
    from posttrain.config import build_config

    tiny, rm = (build_config(PPOConfig, PRESETS[p]) for p in ("tiny", "tiny_rm"))
    assert (tiny.beta, tiny.min_lr_ratio, rm.beta, rm.min_lr_ratio) == (0.05, 1.0, 0.1, 0.1)
    assert dataclasses.replace(rm, beta=tiny.beta, min_lr_ratio=tiny.min_lr_ratio) == tiny  # nothing else differs
