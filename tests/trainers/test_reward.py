import json
import shutil

import pytest
import torch

from posttrain.checkpoints.load import load_checkpoint
from posttrain.data.preference import load_preference_pairs
from posttrain.data.preference_pairs import PairDataConfig
from posttrain.errors import UserError
from posttrain.models.gpt import GPTConfig
from posttrain.models.heads import RewardStats
from posttrain.rewards.registry import get_reward
from posttrain.rewards.reward_model import load_reward_model
from posttrain.tasks.arithmetic import ArithmeticConfig
from posttrain.trainers.reward import RMConfig, train_reward_model
from posttrain.trainers.reward_eval import pair_rewards

TASK = ArithmeticConfig(digits=1, num_demos=20, num_eval=8)
MODEL = GPTConfig(n_layer=1, n_head=2, d_model=32, max_seq_len=24)


def cfg(out, **kw):
    base = dict(
        out=str(out),
        steps=4,
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
    base.update(kw)
    return RMConfig(**base)


@pytest.fixture(scope="module")
def rm_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("rm")
    return out, train_reward_model(cfg(out))


def test_summary_metrics_and_buckets(rm_run):
    out, s = rm_run
    assert 0 <= s["heldout_pairwise_accuracy"] <= 1 and s["heldout_pairs"] > 0
    counts = {k: v for k, v in s.items() if k.startswith("heldout/count/bucket_")}
    assert counts and sum(counts.values()) == s["heldout_pairs"]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert {"loss", "accuracy", "rewards/mean", "rewards/std"} <= rows[0].keys() and "heldout/accuracy" in rows[-1]
    # held-out pairs come from the held-out split only
    from posttrain.tasks.arithmetic import ArithmeticTask

    held = {p.prompt for p in ArithmeticTask(TASK).heldout_problems}
    assert all(p.prompt in held for p in load_preference_pairs(out / "eval_pairs.jsonl"))
    assert not held & {p.prompt for p in load_preference_pairs(out / "pairs.jsonl")}  # and training pairs never do


def test_checkpoint_loads_as_reward_model_and_as_lm(rm_run):
    out, s = rm_run
    loaded = load_reward_model(out)
    assert not loaded.model.training
    pairs = load_preference_pairs(out / "pairs.jsonl")
    c, r = pair_rewards(loaded.model, pairs, loaded.tokenizer, cfg(out))
    # the saved stats are the mean/std of the training completions' rewards (first stats_pairs pairs)
    c16, r16 = c[:16], r[:16]
    both = torch.cat([c16, r16]).double()
    assert abs(loaded.stats.mean - both.mean().item()) < 1e-5 and abs(loaded.stats.std - both.std().item()) < 1e-5
    assert RewardStats.load(out / "model") == loaded.stats
    # scoring text directly gives the same rewards as the collated pairs
    direct = loaded.score([p.prompt for p in pairs[:5]], [p.chosen for p in pairs[:5]])
    torch.testing.assert_close(direct, c[:5], atol=1e-5, rtol=1e-5)
    assert load_checkpoint(out).model.config.d_model == 32  # the backbone is an ordinary LM checkpoint


def test_registry_reward_is_z_scored(rm_run):
    out, _ = rm_run
    loaded = load_reward_model(out)
    fn = get_reward("reward_model", rm_path=str(out))
    prompts, comps = ["1+2=", "3+3="], ["3", "7"]
    raw = loaded.score(prompts, comps)
    got = fn(prompts, comps)
    want = ((raw - loaded.stats.mean) / loaded.stats.std).tolist()
    assert got == pytest.approx(want, abs=1e-5)
    raw_fn = get_reward("reward_model", rm_path=str(out), rm_normalize=False)
    assert raw_fn(prompts, comps) == pytest.approx(raw.tolist(), abs=1e-6)


def test_resume_is_bitwise(tmp_path):
    train_reward_model(cfg(tmp_path / "full", steps=4))
    train_reward_model(cfg(tmp_path / "part", steps=4, save_every=2))
    resumed = tmp_path / "resumed"
    shutil.copytree(tmp_path / "part" / "checkpoints" / "step-00000002", resumed / "checkpoints" / "step-00000002")
    (resumed / "checkpoints" / "latest").write_text("step-00000002\n")
    for f in ("pairs.jsonl", "pairs.meta.json", "eval_pairs.jsonl", "eval_pairs.meta.json"):
        shutil.copy(tmp_path / "part" / f, resumed / f)
    train_reward_model(cfg(resumed, steps=4), resume=str(resumed))
    a, b = load_reward_model(tmp_path / "full").model.state_dict(), load_reward_model(resumed).model.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_learns_a_separable_preference(tmp_path):
    # chosen answers end in "1", rejected in "2": a linear head on the EOS state separates them
    lines = [
        json.dumps({"prompt": f"{a}+{b}=", "chosen": f"{a}1", "rejected": f"{b}2"}) for a in range(10) for b in range(3)
    ]
    data = tmp_path / "p.jsonl"
    data.write_text("\n".join(lines[:24]) + "\n")
    held = tmp_path / "h.jsonl"
    held.write_text("\n".join(lines[24:]) + "\n")
    s = train_reward_model(cfg(tmp_path / "o", data=str(data), eval_data=str(held), steps=25, lr=1e-2))
    assert s["heldout_pairwise_accuracy"] == 1.0


def test_init_from_sft_samples_the_policy(tmp_path):
    from posttrain.trainers.sft import SFTConfig, train_sft

    sft = tmp_path / "sft"
    train_sft(
        SFTConfig(
            out=str(sft), steps=4, batch_size=8, eval_every=0, save_every=0, progress=False, model=MODEL, task=TASK
        )
    )
    s = train_reward_model(
        cfg(
            tmp_path / "rm",
            init=str(sft),
            steps=2,
            pairs=PairDataConfig(num_prompts=16, samples_per_prompt=4, gold_chosen=True),
        )
    )
    assert s["pairs"]["train"]["source"] == "policy" and s["train_pairs"] > 0
    from posttrain.tasks.arithmetic import ArithmeticTask

    held = {p.prompt for p in ArithmeticTask(TASK).heldout_problems}  # on-policy held-out pairs: held-out prompts only
    assert {p.prompt for p in load_preference_pairs(tmp_path / "rm" / "eval_pairs.jsonl")} <= held
    assert not held & {p.prompt for p in load_preference_pairs(tmp_path / "rm" / "pairs.jsonl")}


def test_user_errors(tmp_path):
    with pytest.raises(UserError, match="--source policy samples the --init model"):
        train_reward_model(cfg(tmp_path / "a", source="policy"))
    with pytest.raises(UserError, match="--eval-data needs --data"):
        train_reward_model(cfg(tmp_path / "b", eval_data=str(tmp_path / "x.jsonl")))
    with pytest.raises(UserError, match="not a reward-model checkpoint"):
        from posttrain.trainers.sft import SFTConfig, train_sft

        train_sft(
            SFTConfig(
                out=str(tmp_path / "s"),
                steps=1,
                batch_size=4,
                eval_every=0,
                save_every=0,
                progress=False,
                model=MODEL,
                task=TASK,
            )
        )
        load_reward_model(tmp_path / "s")


def test_eval_only_pairwise_accuracy_on_a_file(rm_run, tmp_path):
    from posttrain.trainers.reward_eval import eval_reward_model

    out, _ = rm_run
    pairs = load_preference_pairs(out / "eval_pairs.jsonl")
    loaded = load_reward_model(out)
    # the oracle: score chosen and rejected texts one call each, count wins
    c = loaded.score([p.prompt for p in pairs], [p.chosen for p in pairs])
    r = loaded.score([p.prompt for p in pairs], [p.rejected for p in pairs])
    want = (c > r).double().mean().item()
    s = eval_reward_model(cfg(tmp_path / "ev", init=str(out), eval_data=str(out / "eval_pairs.jsonl")))
    assert s["n"] == len(pairs) and s["pairwise_accuracy"] == pytest.approx(want, abs=1e-12)
    saved = json.loads((tmp_path / "ev" / "summary.json").read_text())
    assert saved["pairwise_accuracy"] == s["pairwise_accuracy"] and saved["n"] == len(pairs)


def test_eval_only_errors(rm_run, tmp_path):
    from posttrain.trainers.reward_eval import eval_reward_model
    from posttrain.trainers.sft import SFTConfig, train_sft

    out, _ = rm_run
    with pytest.raises(UserError, match="--eval-only needs --init RM_CHECKPOINT and --eval-data"):
        eval_reward_model(cfg(tmp_path / "a", init=str(out)))
    sft = tmp_path / "sft"
    train_sft(
        SFTConfig(
            out=str(sft), steps=1, batch_size=4, eval_every=0, save_every=0, progress=False, model=MODEL, task=TASK
        )
    )
    with pytest.raises(UserError, match=r"is not a reward-model checkpoint \(no reward_head.safetensors\)"):
        eval_reward_model(cfg(tmp_path / "b", init=str(sft), eval_data=str(out / "eval_pairs.jsonl")))
    assert not (tmp_path / "b").exists()  # nothing written before the inputs are checked
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1=", "chosen": "2", "rejected": "3"}\n{"prompt": "1+1=", "chosen": "2"}\n')
    with pytest.raises(UserError, match=r"bad.jsonl:2"):
        eval_reward_model(cfg(tmp_path / "c", init=str(out), eval_data=str(bad)))
