"""LoRA through peft: only adapters train, the reference is the base model exactly (adapters off, no copy),
merged weights are W + (alpha / r) B A, and the saved directory is base + peft adapter that transformers applies."""

import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest
import torch

tf = pytest.importorskip("transformers")
pytest.importorskip("peft")

sys.path.insert(0, str(Path(__file__).parent))  # the suite runs with --import-mode=importlib
from _hfdirs import demos_file, make_model_dir, pairs_file  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from posttrain.checkpoints.load import load_checkpoint, load_policy  # noqa: E402
from posttrain.cli import main  # noqa: E402
from posttrain.models.gpt import GPT, GPTConfig  # noqa: E402
from posttrain.models.lora import BaseModelView, LoRAConfig, apply_lora, has_lora, merge_lora, reference_model  # noqa: E402
from posttrain.scoring import completion_logps  # noqa: E402

QUIET = dict(progress=False, eval_every=0, save_every=0)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    return {k: make_model_dir(root / k, k) for k in ("qwen2", "gpt2")}


def _model(kind, dirs):
    if kind == "gpt":
        torch.manual_seed(0)
        return GPT(GPTConfig(vocab_size=20, n_layer=2, n_head=2, d_model=16, max_seq_len=16))
    return load_policy(dirs[kind]).model


def _perturb(model, seed=1):
    """LoRA's B starts at zero (adapted = base); move every adapter so that the tests below can fail."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)


@pytest.mark.parametrize("kind", ["qwen2", "gpt2", "gpt"])
def test_only_adapters_train_and_the_reference_is_the_base_exactly(kind, dirs):
    model = _model(kind, dirs)
    base = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(3, 20, (3, 10))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        base_lp = completion_logps(model.eval(), ids, mask, 4)
    apply_lora(model, LoRAConfig(r=4, alpha=8))
    _perturb(model)
    model.train()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    lora_before = {k: v.clone() for k, v in model.state_dict().items() if "lora_" in k}
    for _ in range(2):
        opt.zero_grad()
        (-completion_logps(model, ids, mask, 4).sum()).backward()
        opt.step()
    sd = {k.replace(".base_layer.", "."): v for k, v in model.state_dict().items() if "lora_" not in k}
    assert sd.keys() == base.keys() and all(torch.equal(sd[k], base[k]) for k in base)  # the base never moved
    assert all(not torch.equal(v, lora_before[k]) for k, v in model.state_dict().items() if "lora_" in k)
    ref = reference_model(model, lambda: pytest.fail("with LoRA no copy of the policy is made"))
    assert isinstance(ref, BaseModelView) and ref.model is model
    with torch.no_grad():
        assert torch.equal(completion_logps(ref, ids, mask, 4), base_lp)
        assert not torch.allclose(completion_logps(model, ids, mask, 4), base_lp)
    assert model.training  # the reference put the policy back in train mode


@pytest.mark.parametrize("kind", ["qwen2", "gpt2", "gpt"])
def test_merged_weights_are_base_plus_scaled_BA(kind, dirs):
    model = _model(kind, dirs)
    apply_lora(model, LoRAConfig(r=2, alpha=6))
    _perturb(model)
    layers = {n: m for n, m in model.named_modules() if hasattr(m, "lora_A") and "default" in m.lora_A}
    assert layers
    expect = {}
    for n, m in layers.items():
        delta = (m.lora_B["default"].weight @ m.lora_A["default"].weight) * (6 / 2)  # (out, in)
        w = m.base_layer.weight
        expect[n] = w + (delta.T if kind == "gpt2" else delta)  # GPT-2's Conv1D stores (in, out)
    merged = merge_lora(model)
    assert not has_lora(merged)
    assert not any("lora_" in k for k in merged.state_dict())
    mods = dict(merged.named_modules())
    for n, w in expect.items():
        torch.testing.assert_close(mods[n].weight, w, atol=1e-6, rtol=1e-6)


def test_dpo_with_lora_saves_base_plus_adapter_transformers_applies(dirs, tmp_path):
    from posttrain.trainers.dpo import DPOConfig, setup, train_dpo

    d, pairs, evals = dirs["qwen2"], pairs_file(tmp_path / "p.jsonl"), demos_file(tmp_path / "e.jsonl", 4)
    cfg = dict(
        model_path=str(d),
        steps=3,
        batch_size=4,
        lr=5e-2,
        warmup_steps=0,
        data=str(pairs),
        eval_data=str(evals),
        max_new_tokens=2,
        loss="dpo",
        lora_r=4,
        precompute_ref=False,
        **QUIET,
    )
    s = setup(DPOConfig(out=str(tmp_path / "probe"), **cfg))
    assert isinstance(s.ref_model, BaseModelView) and s.ref_model.model is s.policy  # one model in memory
    out = tmp_path / "dpo"
    train_dpo(DPOConfig(out=str(out), **cfg))
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert losses[0] == pytest.approx(0.6931472, abs=1e-5)  # policy = reference at the start
    assert abs(losses[-1] - losses[0]) > 1e-4
    saved = out / "model"  # the adapter alone, pointing at its base (TRL's / peft's layout); no optimizer state
    names = {p.name for p in saved.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= names
    assert not names & {"model.safetensors", "optimizer.pt", "rng.pt", "config.json"}, names
    adapter_cfg = json.loads((saved / "adapter_config.json").read_text())
    assert adapter_cfg["base_model_name_or_path"] == str(Path(d).resolve())
    ours = load_checkpoint(saved)
    assert has_lora(ours.model)
    x = torch.tensor([ours.tokenizer.encode("1+2=3")])
    hf = tf.AutoModelForCausalLM.from_pretrained(saved)  # base + adapter (transformers' peft integration)
    torch.testing.assert_close(hf(x).logits, ours.model(x).logits, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(hf(x).logits, tf.AutoModelForCausalLM.from_pretrained(d)(x).logits, atol=1e-4)


def test_grpo_with_lora_and_beta_keeps_one_model_and_merges(dirs, tmp_path):
    from posttrain.trainers.policy_gradient import PolicyGradientConfig, PolicyGradientTrainer

    out = tmp_path / "grpo"
    t = PolicyGradientTrainer(
        PolicyGradientConfig(
            out=str(out),
            model_path=str(dirs["gpt2"]),
            data=str(demos_file(tmp_path / "prompts.jsonl")),  # a user's model trains on the user's prompts
            steps=2,
            prompts_per_step=2,
            num_generations=2,
            max_new_tokens=3,
            beta=0.1,
            entropy_coef=0.5,
            dynamic_sampling=False,
            lora_r=4,
            merge_lora=True,
            lr=5e-2,
            warmup_steps=0,
            **QUIET,
        )
    )
    assert isinstance(t.ref_model, BaseModelView) and t.ref_model.model is t.model
    t.train()
    saved = out / "model"
    assert not (saved / "adapter_config.json").exists()  # --merge-lora: full weights only
    merged = tf.AutoModelForCausalLM.from_pretrained(saved)
    base = tf.AutoModelForCausalLM.from_pretrained(dirs["gpt2"])
    x = torch.tensor([[5, 6, 7, 8]])
    assert not torch.allclose(merged(x).logits, base(x).logits, atol=1e-5)  # the adapters moved, then merged


def test_rm_with_lora_trains_adapters_and_head(dirs, tmp_path):
    from posttrain.rewards.reward_model import load_reward_model
    from posttrain.trainers.reward import RMConfig, train_reward_model

    pairs, out = pairs_file(tmp_path / "p.jsonl"), tmp_path / "rm"
    train_reward_model(
        RMConfig(
            out=str(out),
            model_path=str(dirs["gpt2"]),
            steps=3,
            batch_size=4,
            lr=5e-2,
            warmup_steps=0,
            data=str(pairs),
            eval_data=str(pairs),
            lora_r=2,
            **QUIET,
        )
    )
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert losses[-1] != pytest.approx(losses[0], abs=1e-4)
    rm = load_reward_model(out)
    assert has_lora(rm.model.backbone.model)
    r = rm(["1+2="], ["3"])
    assert len(r) == 1


def test_export_of_a_gpt_lora_checkpoint_needs_merge(tmp_path, capsys):
    from posttrain.trainers.sft import SFTConfig, train_sft

    train_sft(
        SFTConfig(
            out=str(tmp_path / "sft"),
            steps=2,
            batch_size=8,
            lora_r=2,
            model=GPTConfig(n_layer=1, d_model=32),
            max_new_tokens=2,
            **QUIET,
        )
    )
    capsys.readouterr()
    assert main(["export", str(tmp_path / "sft"), "--out", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"posttrain export: error: {tmp_path / 'sft' / 'model'} holds a LoRA adapter on posttrain's GPT: pass "
        f"--merge-lora (GPT-2 has no names for its adapted layers)"
    )
    assert main(["export", str(tmp_path / "sft"), "--out", str(tmp_path / "x"), "--merge-lora"]) == 0
    ours = merge_lora(load_checkpoint(tmp_path / "sft").model)
    hf = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "x")
    x = torch.tensor([[1, 5, 6, 14, 7, 16]])
    torch.testing.assert_close(hf(x).logits, ours(x).logits, atol=1e-5, rtol=1e-5)


def test_a_lora_checkpoint_starts_a_new_run_merged(dirs, tmp_path):
    """DPO after a LoRA SFT: the reference is the SFT policy (its adapter merged), not the SFT run's base."""
    from posttrain.trainers.dpo import DPOConfig, setup
    from posttrain.trainers.sft import SFTConfig, train_sft

    d, evals = dirs["qwen2"], demos_file(tmp_path / "e.jsonl", 4)
    train_sft(
        SFTConfig(
            out=str(tmp_path / "sft"),
            model_path=str(d),
            steps=2,
            batch_size=4,
            lr=5e-2,
            warmup_steps=0,
            data=str(demos_file(tmp_path / "d.jsonl")),
            eval_data=str(evals),
            max_new_tokens=2,
            lora_r=4,
            **QUIET,
        )
    )
    sft = load_checkpoint(tmp_path / "sft")
    assert has_lora(sft.model)
    s = setup(
        DPOConfig(
            out=str(tmp_path / "dpo"),
            model_path=str(tmp_path / "sft"),
            steps=1,
            batch_size=4,
            data=str(pairs_file(tmp_path / "p.jsonl")),
            eval_data=str(evals),
            max_new_tokens=2,
            loss="dpo",
            lora_r=4,
            precompute_ref=False,
            **QUIET,
        )
    )
    x = torch.tensor([sft.tokenizer.encode("1+2=3")])
    with torch.no_grad():
        want = sft.model.eval()(x).logits
        torch.testing.assert_close(s.ref_model(x).logits, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(s.policy(x).logits, want, atol=1e-5, rtol=1e-5)  # fresh adapter: B = 0
        assert not torch.allclose(load_policy(d).model(x).logits, want, atol=1e-4)  # the SFT adapter did move


def test_a_lora_run_resumed_ends_bitwise_equal(dirs, tmp_path):
    import shutil

    from posttrain.trainers.sft import SFTConfig, train_sft

    data = str(demos_file(tmp_path / "d.jsonl"))
    cfg = SFTConfig(
        out=str(tmp_path / "a"),
        model_path=str(dirs["gpt2"]),
        steps=4,
        batch_size=4,
        lr=2e-2,
        warmup_steps=0,
        data=data,
        eval_data=data,
        max_new_tokens=2,
        lora_r=4,
        progress=False,
        eval_every=0,
        save_every=2,
    )
    train_sft(cfg)
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(a, b)  # as if killed after the step-2 checkpoint
    shutil.rmtree(b / "model")
    train_sft(dataclasses.replace(cfg, out=str(b)), resume=str(b))
    A, B = (load_file(str(x / "model" / "adapter_model.safetensors")) for x in (a, b))
    assert A.keys() == B.keys() and all(torch.equal(A[k], B[k]) for k in A)


def test_ppo_with_model_dir_lora_and_user_prompts(dirs, tmp_path):
    """PPO takes --model DIR, LoRA (reference = adapters off, the critic a plain copy of the start) and a prompt file
    whose other columns reach the reward."""
    from posttrain.models.lora import BaseModelView
    from posttrain.trainers.ppo import PPOConfig, PPOTrainer

    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b), "level": a % 3} for a in range(6) for b in range(3)]
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "ppo_reward_mod.py").write_text(
        "SEEN = []\ndef reward(prompts, completions, level, **cols):\n"
        "    SEEN.append(list(level))\n    return [float(len(c) % 2) for c in completions]\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        import ppo_reward_mod

        out = tmp_path / "ppo"
        t = PPOTrainer(
            PPOConfig(
                out=str(out),
                model_path=str(dirs["gpt2"]),
                data=str(data),
                eval_data=str(data),
                reward="ppo_reward_mod:reward",
                steps=2,
                prompts_per_step=4,
                num_generations=2,
                max_new_tokens=3,
                beta=0.1,
                lora_r=4,
                lr=5e-2,
                warmup_steps=0,
                **QUIET,
            )
        )
        assert isinstance(t.ref_model, BaseModelView) and t.ref_model.model is t.model
        assert not any("lora_" in n for n, _ in t.critic.named_parameters())  # the critic copied the plain start
        t.train()
        seen = ppo_reward_mod.SEEN
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("ppo_reward_mod", None)
    # rollouts score 4 prompts x 2 samples at once (held-out scoring calls it per row); the column arrives whole
    assert sum(len(levels) == 8 for levels in seen) == 2 and all(set(levels) <= {0, 1, 2} for levels in seen)
    assert (out / "model" / "adapter_config.json").is_file()
    assert tf.AutoModelForCausalLM.from_pretrained(out / "model") is not None


def test_rm_sft_coef_on_a_hugging_face_causal_lm(dirs, tmp_path):
    """The GRM term on an HF backbone comes from a second forward of the causal LM over the chosen rows: it equals
    the chosen completions' mean NLL computed by hand from the LM's logits, and an RM run with it logs it."""
    from posttrain.data.preference import collate_preference, load_preference_pairs
    from posttrain.models.heads import RewardModel
    from posttrain.trainers.reward import RMConfig, train_reward_model
    from posttrain.trainers.reward_batches import batch_rewards, has_lm_head, shares_prompt

    ck = load_policy(dirs["gpt2"])
    rm = RewardModel(ck.model)
    assert has_lm_head(rm) and not shares_prompt(rm)
    pairs = pairs_file(tmp_path / "p.jsonl")
    batch = collate_preference(load_preference_pairs(pairs)[:3], ck.tokenizer)
    _, nll = batch_rewards(rm, batch, share_prompt=True, lm_rows=torch.arange(3))
    ids, attn, P, cm = (
        batch["input_ids"][:3],
        batch["attention_mask"][:3],
        batch["completion_start"],
        batch["completion_mask"][:3],
    )
    pos = (attn.cumsum(-1) - 1).clamp_min(0)
    logits = ck.model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, P - 1 : -1]
    lp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, P:, None]).squeeze(-1)
    torch.testing.assert_close(nll, -(lp * cm).sum() / cm.sum(), atol=1e-5, rtol=1e-5)
    out = tmp_path / "rm"
    train_reward_model(
        RMConfig(
            out=str(out),
            model_path=str(dirs["gpt2"]),
            steps=2,
            batch_size=4,
            warmup_steps=0,
            data=str(pairs),
            eval_data=str(pairs),
            sft_coef=1.0,
            **QUIET,
        )
    )
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["chosen_nll"]) for r in rows if "loss" in r)
