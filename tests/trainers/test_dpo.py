import json
import math
import random
import shutil

import pytest
import torch

from posttrain.checkpoints.load import load_checkpoint
from posttrain.data.preference import PreferencePair, collate_preference
from posttrain.data.preference_pairs import PairDataConfig, answer_distance, cached_pairs, label_pairs, synthetic_pairs
from posttrain.errors import ConfigError, DataError, UserError
from posttrain.losses.preference import PREFERENCE_LOSSES
from posttrain.models.gpt import GPTConfig
from posttrain.on_policy_pairs import on_policy_pairs
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask, verify
from posttrain.trainers.common import frozen
from posttrain.trainers.dpo import DPOConfig, train_dpo
from posttrain.trainers.preference_data import PairedData, seq_logps
from posttrain.trainers.sft import SFTConfig, train_sft

TASK = ArithmeticConfig(digits=1, num_demos=20, num_eval=8)


@pytest.fixture(scope="module")
def sft_ckpt(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft")
    train_sft(
        SFTConfig(
            out=str(out),
            steps=8,
            batch_size=8,
            eval_every=0,
            save_every=0,
            progress=False,
            model=GPTConfig(n_layer=1, n_head=2, d_model=32, max_seq_len=24),
            task=TASK,
        )
    )
    return str(out)


@pytest.fixture(scope="module")
def pair_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "pairs.jsonl"
    rng = random.Random(0)
    lines = []
    for a in range(6):
        b = rng.randrange(10)
        lines.append(json.dumps({"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1)}))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def cfg(out, init, **kw):
    base = dict(
        out=str(out),
        init=init,
        loss="dpo",
        steps=3,
        batch_size=4,
        eval_every=0,
        save_every=0,
        warmup_steps=1,
        progress=False,
        task=TASK,
        pairs=PairDataConfig(num_prompts=16, samples_per_prompt=4, gold_chosen=True),
    )
    base.update(kw)
    return DPOConfig(**base)


def metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("loss", sorted(PREFERENCE_LOSSES))
def test_every_loss_trains_and_logs(tmp_path, sft_ckpt, pair_file, loss):
    s = train_dpo(cfg(tmp_path, sft_ckpt, loss=loss, data=pair_file, steps=2))
    rows = metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert math.isfinite(r["loss"]) and {"rewards/chosen", "rewards/rejected", "logps/chosen", "lr"} <= r.keys()
    assert "heldout_accuracy" in rows[-1] and 0 <= s["heldout_accuracy_init"] <= 1
    assert s["reference"] == ("none" if loss in ("simpo", "sft") else "precomputed")  # REFERENCE_FREE_LOSSES
    if loss == "beta_dpo":
        assert "beta_dpo/beta" in rows[0]
    if loss == "rdpo":
        assert "rdpo/length_term" in rows[0]
    if loss == "kto":
        assert "kl" in rows[0]


def test_first_step_is_dpo_at_the_reference(tmp_path, sft_ckpt, pair_file):
    # policy == reference at step 0: h = 0, so loss = log 2, implicit rewards 0, margin 0
    train_dpo(cfg(tmp_path, sft_ckpt, data=pair_file, steps=2))
    first = metrics(tmp_path)[0]
    assert abs(first["loss"] - math.log(2)) < 1e-6
    assert abs(first["rewards/chosen"]) < 1e-6 and abs(first["rewards/margins"]) < 1e-6
    assert first["logps/chosen"] < 0


def test_implicit_reward_is_beta_log_ratio(sft_ckpt, pair_file):
    from posttrain.data.preference import load_preference_pairs

    init = load_checkpoint(sft_ckpt)
    ref = frozen(load_checkpoint(sft_ckpt).model)
    with torch.no_grad():  # move the policy away from the reference
        for p in init.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    c = cfg("unused", sft_ckpt, beta=0.3)
    data = PairedData(load_preference_pairs(pair_file), init.tokenizer, c)
    batch = data.collate([0, 1, 2])
    kw = data.loss_inputs(init.model, ref, batch, None)
    _, m = PREFERENCE_LOSSES["dpo"](**kw, beta=0.3)
    # independent oracle: each (prompt + completion) scored alone, without padding
    want = []
    for i in range(3):
        one = collate_preference([data.examples[i]], init.tokenizer)
        pol, _ = seq_logps(init.model, one)
        with torch.no_grad():
            rf, _ = seq_logps(ref, one)
        want.append(0.3 * (pol[0] - rf[0]).item())
    assert abs(m["rewards/chosen"].item() - sum(want) / 3) < 1e-5
    # the reference is frozen: eval mode, no gradients
    sum(kw["policy_chosen_logps"]).backward()
    assert not ref.training and all(p.grad is None and not p.requires_grad for p in ref.parameters())


def test_precomputed_reference_matches_live_reference(tmp_path, sft_ckpt, pair_file):
    train_dpo(cfg(tmp_path / "pre", sft_ckpt, data=pair_file, precompute_ref=True))
    train_dpo(cfg(tmp_path / "live", sft_ckpt, data=pair_file, precompute_ref=False))
    a = load_checkpoint(tmp_path / "pre").model.state_dict()
    b = load_checkpoint(tmp_path / "live").model.state_dict()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=1e-5)
    ma, mb = metrics(tmp_path / "pre"), metrics(tmp_path / "live")
    for ra, rb in zip(ma, mb):
        assert abs(ra["loss"] - rb["loss"]) < 1e-5


def test_dpo_moves_the_margin(tmp_path, sft_ckpt, pair_file):
    train_dpo(cfg(tmp_path, sft_ckpt, data=pair_file, steps=12, lr=3e-3, beta=0.5))
    rows = metrics(tmp_path)
    assert rows[-1]["rewards/margins"] > 0.5 and rows[-1]["rewards/accuracies"] == 1.0
    assert rows[-1]["loss"] < rows[0]["loss"]


@pytest.mark.parametrize(
    "loss,extra,key",
    [
        ("beta_dpo", {"loss_kwargs": {"filter_ratio": 0.5}}, "beta_dpo/beta"),
        ("dpo,bco_pair,sft", {"loss_weights": "0.8,0.2,1.0"}, "bco/delta"),  # BCO's running shift, inside a combination
    ],
)
def test_resume_is_bitwise_with_loss_state(tmp_path, sft_ckpt, pair_file, loss, extra, key):
    # beta-DPO carries running statistics and samples its filter, BCO a running reward mean: restored exactly
    kw = dict(loss=loss, data=pair_file, steps=4, **extra)
    train_dpo(cfg(tmp_path / "full", sft_ckpt, **kw))
    train_dpo(cfg(tmp_path / "part", sft_ckpt, save_every=2, **kw))
    resumed = tmp_path / "resumed"
    shutil.copytree(tmp_path / "part" / "checkpoints" / "step-00000002", resumed / "checkpoints" / "step-00000002")
    (resumed / "checkpoints" / "latest").write_text("step-00000002\n")
    train_dpo(cfg(resumed, sft_ckpt, **kw), resume=str(resumed))
    a = load_checkpoint(tmp_path / "full").model.state_dict()
    b = load_checkpoint(resumed).model.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    full, res = metrics(tmp_path / "full"), metrics(resumed)
    assert [r["step"] for r in res] == [3, 4]
    assert res[-1][key] == full[-1][key]


def test_embedded_on_policy_pairs_are_cached(tmp_path, sft_ckpt):
    s = train_dpo(cfg(tmp_path, sft_ckpt, steps=1))
    lines = (tmp_path / "pairs.jsonl").read_text().splitlines()
    assert len(lines) == s["num_examples"] == s["pairs"]["pairs"] > 0
    task = ArithmeticTask(TASK)
    answers = {p.prompt: p.answer for p in task.train_problems}
    for line in lines:
        rec = json.loads(line)
        assert rec["prompt"] in answers  # training split only
        assert verify(rec["chosen"], answers[rec["prompt"]]) and not verify(rec["rejected"], answers[rec["prompt"]])
    mtime = (tmp_path / "pairs.jsonl").stat().st_mtime_ns
    train_dpo(cfg(tmp_path, sft_ckpt, steps=1), resume=str(tmp_path))  # a run in the directory again: resume
    assert (tmp_path / "pairs.jsonl").stat().st_mtime_ns == mtime  # same settings: reused, not resampled


def test_kto_reads_labelled_files(tmp_path, sft_ckpt):
    f = tmp_path / "kto.jsonl"
    f.write_text(
        "".join(
            json.dumps({"prompt": f"{a}+1=", "completion": str(a + 1 + (a % 2)), "label": a % 2 == 0}) + "\n"
            for a in range(6)
        )
    )
    e = tmp_path / "e.jsonl"
    e.write_text(json.dumps({"prompt": "7+1=", "answer": "8"}) + "\n")
    s = train_dpo(cfg(tmp_path / "o", sft_ckpt, loss="kto", data=str(f), eval_data=str(e), steps=2))
    assert s["num_examples"] == 6  # with --eval-data every row trains (without, a held-out slice would not)


def test_user_errors(tmp_path, sft_ckpt):
    with pytest.raises(UserError, match="needs --init"):
        train_dpo(cfg(tmp_path, None))
    with pytest.raises(ConfigError, match=r"loss_kwargs \['gamma'\] not accepted by loss 'dpo'"):
        cfg(tmp_path, sft_ckpt, loss="dpo", loss_kwargs={"gamma": 1.0})
    with pytest.raises(ConfigError, match="loss='nope' is not valid"):
        cfg(tmp_path, sft_ckpt, loss="nope")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1=", "chosen": "2"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:1: missing field 'rejected'"):
        train_dpo(cfg(tmp_path / "o", sft_ckpt, data=str(bad)))


# ---------------------------------------------------------------------------------------------
# pair building


def test_label_pairs_hand_example():
    pairs = label_pairs(["2+2="], ["4"], [["4", "5", "4", "3"]], max_pairs_per_prompt=5)
    assert sorted((p.chosen, p.rejected) for p in pairs) == [("4", "3"), ("4", "5")]
    assert label_pairs(["2+2="], ["4"], [["5", "3"]]) == []  # no correct sample, no pair
    gold = label_pairs(["2+2="], ["4"], [["5", "5"]], gold_chosen=True)
    assert [(p.chosen, p.rejected) for p in gold] == [("4", "5")]
    assert label_pairs(["2+2="], ["4"], [["4", "4"]], gold_chosen=True) == []  # nothing wrong to reject


def test_on_policy_pairs_label_the_model_samples(sft_ckpt):
    init = load_checkpoint(sft_ckpt)
    task = ArithmeticTask(TASK)
    pc = PairDataConfig(num_prompts=20, samples_per_prompt=6, max_pairs_per_prompt=3)
    pairs, st = on_policy_pairs(init.model, init.tokenizer, task.train_problems, pc)
    again, _ = on_policy_pairs(init.model, init.tokenizer, task.train_problems, pc)
    assert pairs == again  # seeded
    assert st.prompts == 20 and st.samples == 120 and st.pairs == len(pairs)
    ans = {p.prompt: p.answer for p in task.train_problems}
    assert all(verify(p.chosen, ans[p.prompt]) and not verify(p.rejected, ans[p.prompt]) for p in pairs)


def test_synthetic_pairs_and_distance():
    task = ArithmeticTask(ArithmeticConfig(digits=2, num_demos=8, num_eval=8))
    pairs = synthetic_pairs(task.train_problems[:50], per_prompt=3, seed=1)
    assert len(pairs) == 150 and pairs == synthetic_pairs(task.train_problems[:50], per_prompt=3, seed=1)
    ans = {p.prompt: p.answer for p in task.train_problems}
    assert all(p.chosen == ans[p.prompt] and p.rejected != p.chosen for p in pairs)
    assert answer_distance("15", "16") == 1.0 and answer_distance("-3", "3") == 6.0
    assert answer_distance("15", "") == math.inf


def test_cached_pairs_rebuilds_on_new_settings(tmp_path):
    calls = []

    def build():
        calls.append(1)
        return [PreferencePair("1+1=", "2", "3")], {"n": 1}

    p = tmp_path / "pairs.jsonl"
    assert cached_pairs(p, {"a": 1}, build)[0] == [PreferencePair("1+1=", "2", "3")]
    cached_pairs(p, {"a": 1}, build)
    assert len(calls) == 1
    cached_pairs(p, {"a": 2}, build)
    assert len(calls) == 2
    with pytest.raises(DataError, match="no preference pairs"):
        cached_pairs(tmp_path / "e.jsonl", {}, lambda: ([], {}))


def test_epoch_cap_is_min_of_steps_and_passes_over_the_pairs():
    from posttrain.trainers.dpo import epoch_capped_steps

    for steps, n, per, e in [(250, 84, 32, 3.0), (250, 4000, 32, 3.0), (10, 1, 4, 0.5), (7, 6, 4, 2.0)]:
        passes = [k for k in range(1, steps + 1) if (k - 1) * per < e * n]  # steps that start before e passes end
        assert epoch_capped_steps(steps, n, per, e) == max(1, len(passes))
    assert epoch_capped_steps(250, 84, 32, None) == 250
    assert epoch_capped_steps(250, 84, 32, 3.0) == 8


def test_max_epochs_runs_the_capped_steps_exactly(tmp_path, sft_ckpt, pair_file):
    """6 pairs, 4 a step, 2 epochs: 3 steps instead of 20, bitwise the run asked for 3 steps (same LR schedule)."""
    capped = train_dpo(cfg(tmp_path / "cap", sft_ckpt, data=pair_file, steps=20, max_epochs=2.0))
    plain = train_dpo(cfg(tmp_path / "plain", sft_ckpt, data=pair_file, steps=3))
    assert capped["steps"] == 3 and [r["step"] for r in metrics(tmp_path / "cap")] == [1, 2, 3]
    a = load_checkpoint(tmp_path / "cap").model.state_dict()
    b = load_checkpoint(tmp_path / "plain").model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert plain["heldout_accuracy"] == capped["heldout_accuracy"]
