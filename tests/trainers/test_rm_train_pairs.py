"""posttrain rm --train-pairs.*: extra training-pair sources, held-out pairs unchanged (on_policy_pairs.training_pairs)."""

import dataclasses
import json
import random
import shutil

import pytest

from posttrain.checkpoints.load import load_checkpoint
from posttrain.data.preference import load_preference_pairs
from posttrain.data.preference_pairs import PairDataConfig, synthetic_pairs
from posttrain.errors import ConfigError, UserError
from posttrain.models.gpt import GPTConfig
from posttrain.on_policy_pairs import TrainPairsConfig, on_policy_pairs, restart_models, training_pairs
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask
from posttrain.trainers.reward import RMConfig, train_reward_model
from posttrain.trainers.sft import SFTConfig, train_sft

TASK = ArithmeticConfig(digits=1, num_demos=20, num_eval=8)
MODEL = GPTConfig(n_layer=1, n_head=2, d_model=32, max_seq_len=24)
PAIRS = PairDataConfig(num_prompts=40, samples_per_prompt=4, max_pairs_per_prompt=3, gold_chosen=True)


def sft(out, seed):
    train_sft(
        SFTConfig(
            out=str(out), steps=3, batch_size=8, eval_every=0, save_every=0, progress=False, model=MODEL, task=TASK,
            seed=seed, restarts=1,
        )
    )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def restarts_run(tmp_path_factory):
    """A directory laid out as an `sft --restarts 3` run that kept restart 1: model/ = restarts/1/model."""
    root = tmp_path_factory.mktemp("restarts")
    for k in range(3):
        sft(root / "restarts" / str(k), seed=10 + k)
    shutil.copytree(root / "restarts" / "1" / "model", root / "model")
    (root / "summary.json").write_text(json.dumps({"trainer": "sft", "restarts": 3, "selected_restart": 1}))
    return root


def keys(pairs):
    return [(p.prompt, p.chosen, p.rejected) for p in pairs]


def dedup(*sources):  # the oracle: the first occurrence of each (prompt, chosen, rejected), in order
    return list(dict.fromkeys(k for src in sources for k in keys(src)))


def test_defaults_are_exactly_on_policy_pairs(restarts_run):
    ck = load_checkpoint(restarts_run)
    problems = ArithmeticTask(TASK).train_problems
    want, _ = on_policy_pairs(ck.model, ck.tokenizer, problems, PAIRS, num_prompts=len(problems))
    got, info = training_pairs(ck.model, ck.tokenizer, problems, PAIRS, TrainPairsConfig())
    assert keys(got) == keys(want) and info["pairs"] == info["policy_pairs"] == len(want) > 0


def test_sources_concatenate_in_order_without_duplicates(restarts_run):
    ck = load_checkpoint(restarts_run)
    other = load_checkpoint(restarts_run / "restarts" / "0" / "model")
    problems = ArithmeticTask(TASK).train_problems
    extra = TrainPairsConfig(temperature=1.7, samples_per_prompt=6, synthetic_per_prompt=2)
    hot = dataclasses.replace(PAIRS, temperature=1.7, samples_per_prompt=6)
    a, _ = on_policy_pairs(ck.model, ck.tokenizer, problems, hot, num_prompts=len(problems))
    b, _ = on_policy_pairs(other.model, other.tokenizer, problems, hot, num_prompts=len(problems))
    c = synthetic_pairs(problems, per_prompt=2, seed=PAIRS.seed)
    got, info = training_pairs(ck.model, ck.tokenizer, problems, PAIRS, extra, [("r0", other.model, other.tokenizer)])
    want = dedup(a, b, c)
    assert keys(got) == want
    assert len(want) < len(a) + len(b) + len(c)  # some pair came twice (synthetic off-by-ones the model also makes)
    assert info["policy_pairs"] == len(a) and info["pairs"] == len(want) and info["others"]["r0"]["pairs"] == len(b)


def test_restart_models_skip_the_kept_one(restarts_run, tmp_path):
    want = [restarts_run / "restarts" / k / "model" for k in ("0", "2")]
    assert restart_models(restarts_run) == want
    assert restart_models(restarts_run / "model") == want  # --init RUN/model names the same run
    assert restart_models(tmp_path, required=False) == []  # restarts=auto on a plain run: no other models
    with pytest.raises(UserError) as e:
        restart_models(tmp_path)
    assert str(e.value) == (
        f"--train-pairs.restarts: {tmp_path} is not an `sft --restarts` run (no restarts/ directory)"
    )


def test_restart_models_of_a_halving_run_are_the_best_probe_checkpoints(tmp_path):
    run = tmp_path / "h"
    cfg = SFTConfig(
        out=str(run), steps=6, batch_size=8, eval_every=0, save_every=0, progress=False, model=MODEL, task=TASK,
        restarts=4, restart_probe=0.5, val_problems=24,
    )  # fmt: skip
    s = train_sft(cfg)
    kept = s["selected_restart"]
    probes = {c["restart"]: c["probe"]["val_accuracy"] for c in s["candidates"] if c["restart"] != kept}
    best = sorted(sorted(probes, key=lambda k: (-probes[k], k))[:2])
    want = [run / "restarts" / str(k) / "checkpoints" / "step-00000003" for k in best]
    assert restart_models(run, limit=2) == want  # stopped at the probe: their step-3 checkpoints, best two
    assert len(restart_models(run)) == 3 and all(load_checkpoint(p).step == 3 for p in want)


def rm_cfg(out, init, **kw):
    return RMConfig(
        out=str(out), init=str(init), steps=2, batch_size=8, eval_every=0, save_every=0, warmup_steps=1,
        progress=False, eval_prompts=8, stats_pairs=16, task=TASK, pairs=PAIRS, **kw,
    )  # fmt: skip


def test_rm_training_pairs_change_and_held_out_pairs_do_not(restarts_run, tmp_path):
    base = train_reward_model(rm_cfg(tmp_path / "base", restarts_run))
    extra = TrainPairsConfig(restarts="on", synthetic_per_prompt=1)
    more = train_reward_model(rm_cfg(tmp_path / "more", restarts_run, train_pairs=extra))
    held = [(tmp_path / d / "eval_pairs.jsonl").read_bytes() for d in ("base", "more")]
    assert held[0] == held[1] and more["heldout_pairs"] == base["heldout_pairs"]  # the test is the same
    # the training pairs are the oracle's: the kept model's, restarts 0 and 2's, then the corruptions
    ck, train = load_checkpoint(restarts_run), ArithmeticTask(TASK).train_problems
    problems = random.Random(f"rm-prompts:{PAIRS.seed}").sample(train, min(PAIRS.num_prompts, len(train)))
    srcs = [on_policy_pairs(ck.model, ck.tokenizer, problems, PAIRS, num_prompts=len(problems))[0]]
    for k in ("0", "2"):
        o = load_checkpoint(restarts_run / "restarts" / k / "model")
        srcs.append(on_policy_pairs(o.model, o.tokenizer, problems, PAIRS, num_prompts=len(problems))[0])
    srcs.append(synthetic_pairs(problems, per_prompt=1, seed=PAIRS.seed))
    assert keys(load_preference_pairs(tmp_path / "more" / "pairs.jsonl")) == dedup(*srcs)
    assert keys(load_preference_pairs(tmp_path / "base" / "pairs.jsonl")) == keys(srcs[0])
    assert more["train_pairs"] > base["train_pairs"] and len(more["pairs"]["train"]["others"]) == 2


def test_restarts_auto_without_init_trains_on_synthetic_pairs(tmp_path):
    # the tiny preset's restarts=auto asks for nothing when there is no --init: synthetic pairs as before
    s = train_reward_model(
        RMConfig(out=str(tmp_path / "o"), steps=1, batch_size=4, eval_every=0, save_every=0, progress=False,
                 eval_prompts=8, stats_pairs=8, task=TASK, model=MODEL, train_pairs=TrainPairsConfig(restarts="auto"))
    )  # fmt: skip
    assert s["pairs"]["train"]["source"] == "synthetic"
    assert not TrainPairsConfig(restarts="auto").requested() and TrainPairsConfig(restarts="on").requested()


def test_train_pairs_errors(tmp_path):
    with pytest.raises(ConfigError) as e:
        TrainPairsConfig(temperature=0.0)
    assert "train_pairs.temperature=0.0" in str(e.value)
    with pytest.raises(UserError) as e:  # without --init the pairs are synthetic: --train-pairs.* would do nothing
        train_reward_model(
            RMConfig(out=str(tmp_path / "o"), steps=1, progress=False, task=TASK, model=MODEL,
                     train_pairs=TrainPairsConfig(synthetic_per_prompt=2))
        )  # fmt: skip
    assert (
        str(e.value) == "--train-pairs.* shapes on-policy training pairs: pass --init SFT_CHECKPOINT (--source policy)"
    )
    with pytest.raises(ConfigError) as e:
        RMConfig(data="p.jsonl", eval_data="h.jsonl", train_pairs=TrainPairsConfig(synthetic_per_prompt=1))
    assert str(e.value) == "train_pairs.* shapes the embedded training pairs; with --data it would do nothing: drop it"
    RMConfig(data="p.jsonl", eval_data="h.jsonl", train_pairs=TrainPairsConfig(restarts="auto"))  # auto: fine
    # the tiny preset's own 32 samples per prompt are no request: `rm --preset tiny --data FILE` works
    from posttrain.config import build_config
    from posttrain.trainers.reward import PRESETS

    tiny = build_config(RMConfig, PRESETS["tiny"], overrides={"data": "p.jsonl", "eval_data": "h.jsonl"})
    assert tiny.train_pairs.samples_per_prompt == 32
    with pytest.raises(ConfigError, match="with --data it would do nothing"):
        RMConfig(data="p.jsonl", eval_data="h.jsonl", train_pairs=TrainPairsConfig(samples_per_prompt=8))


def test_restarts_auto(restarts_run, tmp_path):
    plain = restarts_run / "restarts" / "0"  # an ordinary `sft` run: auto samples it alone, on refuses it
    a = train_reward_model(rm_cfg(tmp_path / "a", plain, train_pairs=TrainPairsConfig(restarts="auto")))
    b = train_reward_model(rm_cfg(tmp_path / "b", plain))
    assert (tmp_path / "a" / "pairs.jsonl").read_bytes() == (tmp_path / "b" / "pairs.jsonl").read_bytes()
    assert a["train_pairs"] == b["train_pairs"] and "others" not in a["pairs"]["train"]
    with pytest.raises(UserError, match="is not an `sft --restarts` run"):
        train_reward_model(rm_cfg(tmp_path / "c", plain, train_pairs=TrainPairsConfig(restarts="on")))
    c = train_reward_model(rm_cfg(tmp_path / "d", restarts_run, train_pairs=TrainPairsConfig(restarts="auto")))
    assert len(c["pairs"]["train"]["others"]) == 2  # a restarts run: auto = on


def test_tiny_preset_is_the_measured_recipe():
    # docs/rm.md's 0.96-0.98 held-out pairwise on seeds 0-2: 32 samples of the --init model per training prompt, up to
    # 8 pairs each, 3000 steps of 64 pairs with the GRM term; held-out pairs from 16 samples per prompt
    from posttrain.config import build_config
    from posttrain.trainers.reward_config import PRESETS

    tiny = build_config(RMConfig, PRESETS["tiny"])
    measured = build_config(
        RMConfig,
        overrides={
            "steps": "3000",
            "batch_size": "64",
            "eval_every": "250",
            "save_every": "500",
            "eval_prompts": "1000",
            "sft_coef": "1",
            "pairs.num_prompts": "9000",
            "pairs.samples_per_prompt": "16",
            "pairs.max_pairs_per_prompt": "8",
            "pairs.gold_chosen": "true",
            "train_pairs.samples_per_prompt": "32",
        },
    )
    assert tiny == measured
    assert tiny.pairs == PairDataConfig(
        num_prompts=9000, samples_per_prompt=16, max_pairs_per_prompt=8, gold_chosen=True
    )
    assert tiny.train_pairs == TrainPairsConfig(restarts="off", samples_per_prompt=32)
