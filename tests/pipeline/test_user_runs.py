"""Users' own runs: a Hugging Face model directory, their corpus, RL prompts, reward and preference file.

One micro run (module fixture) on a random 2-layer GPT-2 saved with ``save_pretrained`` and small JSONL files in
tmp_path. Oracles: transformers itself (the tokenizer's size, the SFT output opens with ``from_pretrained`` and
has the HF model's shape), the files' own line counts, and a user reward function that records what it was
called with (the RL stages must have drawn their prompts, and the columns it reads, from the user's prompts
file; the eval stage must count correct with it). Config mistakes are one-line errors.
"""

import json
import sys
from pathlib import Path

import pytest

tf = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # one shared micro run (~10 s on a busy 2-core machine) and one without user files

sys.path.insert(0, str(Path(__file__).parents[1] / "models"))  # the suite runs with --import-mode=importlib
from _hfdirs import make_model_dir  # noqa: E402

from posttrain.config import build_config  # noqa: E402
from posttrain.errors import ConfigError  # noqa: E402
from posttrain.pipeline.config import PRESETS, PipelineConfig  # noqa: E402
from posttrain.pipeline.run import run_pipeline  # noqa: E402

REWARD_MODULE = """
CALLS = []

def score(prompts, completions, answer=None, **columns):
    CALLS.append((list(prompts), sorted(columns)))
    return [float(c.strip() == str(a).strip()) for c, a in zip(completions, answer)]
"""


def _jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def user_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("user")
    model = make_model_dir(d / "hf", "gpt2")
    prose = [
        {"text": f"the {w} fox number {i} jumps over the lazy dog"} for i, w in enumerate(["quick", "brown", "red"] * 8)
    ]
    demos = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(6) for b in range(6)]
    corpus = _jsonl(d / "corpus.jsonl", prose + demos)
    evals = _jsonl(d / "eval.jsonl", [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in (7, 8) for b in (1, 2, 3)])
    prompts = _jsonl(
        d / "prompts.jsonl",
        [{"prompt": f"{a}+{b}=", "answer": str(a + b), "level": a % 3} for a in range(10, 16) for b in range(4)],
    )
    prefs = _jsonl(
        d / "prefs.jsonl",
        [{"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1)} for a in range(4) for b in range(3)],
    )
    held_prefs = _jsonl(
        d / "prefs_heldout.jsonl",
        [{"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b - 1)} for a in (7, 8) for b in (1, 2)],
    )
    (d / "pipe_user_reward.py").write_text(REWARD_MODULE)
    sys.path.insert(0, str(d))
    import pipe_user_reward

    cfg = build_config(
        PipelineConfig,
        PRESETS["micro"],
        overrides={
            "hf_model": str(model),
            "corpus_file": str(corpus),
            "eval_file": str(evals),
            "prompts_file": str(prompts),
            "preference_file": str(prefs),
            "preference_eval_file": str(held_prefs),
            "reward": "pipe_user_reward:score:1.0",
            "contamination_run": False,
        },
    )
    result = run_pipeline(cfg, d / "run", quiet=True, skip=("report",))
    yield {
        "d": d,
        "out": d / "run",
        "result": result,
        "cfg": cfg,
        "calls": pipe_user_reward.CALLS,
        "prompts": prompts,
        "evals": evals,
        "prefs": prefs,
        "model": model,
    }
    sys.path.remove(str(d))


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_the_stages_start_from_the_hf_model_with_its_own_tokenizer(user_run):
    out, model, st = user_run["out"], user_run["model"], user_run["result"]["stages"]
    assert {k for k, v in st.items() if v["status"] == "ran"} == {
        "dedup",
        "tokenizer",
        "sft",
        "rm",
        "dpo",
        "grpo",
        "ppo",
        "eval",
    }
    tok = json.loads((out / "tokenizer" / "DONE.json").read_text())["summary"]
    assert (
        tok["kind"] == "hf_model" and str(model) in tok["note"] and not (out / "tokenizer" / "tokenizer.json").exists()
    )
    assert tok["vocab_size"] == len(tf.AutoTokenizer.from_pretrained(model))
    sft_cfg = json.loads((out / "sft" / "config.resolved.json").read_text())
    assert sft_cfg["model_path"] == str(model) and sft_cfg["tokenizer"] is None
    trained = tf.AutoModelForCausalLM.from_pretrained(out / "sft" / "model")
    assert (trained.config.n_layer, trained.config.n_embd) == (2, 32)  # the HF model's shape, not [sft.model]'s
    for stage in ("rm", "dpo", "grpo", "ppo"):
        c = json.loads((out / stage / "config.resolved.json").read_text())
        assert c["init"] == str(out / "sft" / "model"), stage


def test_rl_stages_use_the_users_prompts_and_reward(user_run):
    out, calls = user_run["out"], user_run["calls"]
    train = {r["prompt"] for r in _lines(user_run["prompts"])}
    held = {r["prompt"] for r in _lines(user_run["evals"])}
    seen = {p for prompts, _ in calls for p in prompts}
    assert seen <= train | held and seen & train  # no task prompt: training prompts come from the user's file
    assert any(
        "level" in cols for prompts, cols in calls if set(prompts) <= train
    )  # its other columns reach the reward
    for stage in ("grpo", "ppo"):
        c = json.loads((out / stage / "config.resolved.json").read_text())
        assert c["reward"] == "pipe_user_reward:score:1.0" and c["data"] == str(user_run["prompts"]), stage
        s = json.loads((out / stage / "summary.json").read_text())
        assert s["heldout_n"] == len(held) and {x["prompt"] for x in s["samples"]} <= held, stage
    ev = user_run["result"]["heldout"]
    assert {m: r["n"] for m, r in ev.items()} == {
        m: len(held) for m in ("sft", "rm_best_of_n", "rm_weighted_best_of_n", "dpo", "grpo", "ppo")
    }


def test_the_eval_stage_counts_correct_with_the_users_reward(user_run, tmp_path):
    import dataclasses
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(user_run["out"], copy)
    cfg = user_run["cfg"]
    cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, samples=2))
    calls, held = user_run["calls"], [r["prompt"] for r in _lines(user_run["evals"])]
    calls.clear()
    result = run_pipeline(cfg, copy, quiet=True, skip=("report",))
    assert {k for k, v in result["stages"].items() if v["status"] == "ran"} == {"eval"}
    # each of the 4 policies: one call per held-out prompt for greedy decoding, one per sample
    assert sorted(p for prompts, _ in calls for p in prompts) == sorted(held * 4 * (1 + 2))


def test_rm_and_dpo_train_on_the_preference_file(user_run):
    out, n = user_run["out"], len(_lines(user_run["prefs"]))
    rm = json.loads((out / "rm" / "summary.json").read_text())
    assert (rm["train_pairs"], rm["heldout_pairs"]) == (n, len(_lines(user_run["d"] / "prefs_heldout.jsonl")))
    assert json.loads((out / "dpo" / "summary.json").read_text())["num_examples"] == n
    for stage in ("rm", "dpo"):
        assert json.loads((out / stage / "config.resolved.json").read_text())["data"] == str(user_run["prefs"])


def test_a_changed_prompts_file_reruns_grpo_and_ppo_only(user_run, capsys):
    prompts = user_run["prompts"]
    original = prompts.read_text()
    try:
        prompts.write_text(original + json.dumps({"prompt": "20+1=", "answer": "21", "level": 0}) + "\n")
        plan = run_pipeline(user_run["cfg"], user_run["out"], quiet=True, explain=True, skip=("report",))["explain"]
    finally:
        prompts.write_text(original)
    assert {k for k, v in plan.items() if v == "run"} == {"grpo", "ppo", "eval"}
    assert "grpo: run (inputs.data changed)" in capsys.readouterr().out


def test_an_edited_reward_function_reruns_the_stages_that_use_it(user_run, capsys):
    source = user_run["d"] / "pipe_user_reward.py"
    original = source.read_text()
    try:
        source.write_text(original + "\n# an edit: the reward's code is part of the key, not its name\n")
        plan = run_pipeline(user_run["cfg"], user_run["out"], quiet=True, explain=True, skip=("report",))["explain"]
    finally:
        source.write_text(original)
    assert {k for k, v in plan.items() if v == "run"} == {"grpo", "ppo", "eval"}
    assert "grpo: run (inputs.reward.pipe_user_reward:score changed)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"hf_model": "no/such/dir"},
            "hf_model='no/such/dir': not a directory (a local Hugging Face model directory, as "
            "save_pretrained writes it)",
        ),
        (
            {"preference_file": "p.jsonl"},
            "preference_file and preference_eval_file go together: the rm stage trains on "
            "the first and measures held-out pairwise accuracy on the second",
        ),
        ({"pad_token": "<pad>"}, "pad_token is for an hf_model's tokenizer; set hf_model or remove pad_token"),
        (
            {"reward": "exact_match:1.0", "grpo.reward": "digits:1.0"},
            "reward='exact_match:1.0' and grpo.reward='digits:1.0': the top-level reward is the grpo and ppo stages' reward; "
            "set one of them",
        ),
    ],
)
def test_config_mistakes_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError) as e:
        build_config(PipelineConfig, PRESETS["micro"], overrides=overrides)
    assert str(e.value) == message


def test_an_hf_model_on_the_embedded_default_runs_every_training_stage(user_run, tmp_path):
    cfg = build_config(PipelineConfig, PRESETS["micro"], overrides={"hf_model": str(user_run["model"])})
    result = run_pipeline(cfg, tmp_path / "run", quiet=True, skip=("sft_raw", "report"))
    assert {k for k, v in result["stages"].items() if v["status"] == "ran"} == {
        "dedup",
        "tokenizer",
        "sft",
        "rm",
        "dpo",
        "grpo",
        "ppo",
        "eval",
    }
    assert {m: r["n"] for m, r in result["heldout"].items()} == {
        m: cfg.task.num_eval for m in ("sft", "rm_best_of_n", "rm_weighted_best_of_n", "dpo", "grpo", "ppo")
    }
    for stage in ("sft", "dpo", "grpo", "ppo"):  # each a Hugging Face directory transformers opens
        assert tf.AutoModelForCausalLM.from_pretrained(tmp_path / "run" / stage / "model").config.n_embd == 32, stage
