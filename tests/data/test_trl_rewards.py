"""Reward functions written for TRL run unchanged: conversational prompts reach a Python reward as message lists
and completions as ``[{"role": "assistant", "content": ...}]`` (plain prompts as text), arguments by keyword,
``completion_ids`` and the file's other columns beside them; held-out scoring calls the reward per batch.

The oracle is the input file itself (the messages a reward receives are the row's, the ids decode to the text)
and TRL's own documented example reward, copied verbatim into a file and run by ``posttrain grpo``.
"""

import json

from posttrain.cli import main
from posttrain.data.prompts import PromptRow, chat_views
from posttrain.rewards import build_reward
from posttrain.tokenizers import load

# TRL's GRPOTrainer documentation, "Example 2: Reward completions with a specific format" (verbatim)
TRL_FORMAT_REWARD = """
import re


def format_reward_func(completions, **kwargs):
    "Reward function that checks if the completion has a specific format."
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]
"""

RECORDER = """
import json
import os


def record(prompts, completions, completion_ids, **kwargs):
    with open(os.environ["REWARD_LOG"], "a") as f:
        f.write(json.dumps({"prompts": prompts, "completions": completions, "ids": completion_ids,
                            "columns": sorted(kwargs), "level": kwargs.get("level")}) + "\\n")
    return [float(len(c[0]["content"]) if isinstance(c, list) else len(c)) for c in completions]
"""


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_chat_views_follow_trl_per_row():
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    rows = [PromptRow("rendered chat", {}, conv), PromptRow("plain text", {})]
    prompts, outs = chat_views(rows, ["a", "b", "c", "d"], 2)
    assert prompts == [conv, conv, "plain text", "plain text"]
    assert outs == [[{"role": "assistant", "content": "a"}], [{"role": "assistant", "content": "b"}], "c", "d"]
    assert chat_views([PromptRow("x", {})], ["y"], 1) is None  # no conversation: text only


def test_trl_style_reward_gets_keywords_and_builtins_get_text(tmp_path, monkeypatch):
    (tmp_path / "trl_rewards.py").write_text(TRL_FORMAT_REWARD)
    monkeypatch.chdir(tmp_path)
    r = build_reward("exact_match:1.0,trl_rewards.py:format_reward_func:1.0")
    conv = [{"role": "user", "content": "2+2?"}]
    rows = [PromptRow("<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n", {"answer": "4"}, conv)]
    texts = ["<think>easy</think><answer>4</answer>", "4"]
    total, parts = r.components([rows[0].prompt] * 2, texts, chat_views(rows, texts, 2), answer=["4", "4"])
    assert parts["trl_rewards.py:format_reward_func"] == [1.0, 0.0]  # read completion[0]["content"]
    assert parts["exact_match"] == [0.0, 1.0]  # the built-in verifier parsed the text
    assert total == [1.0, 1.0]


def test_trl_format_reward_runs_unchanged_under_grpo(tmp_path, chat_helpers, monkeypatch):
    tok_dir = chat_helpers.build_tokenizer(tmp_path / "tok")
    init = chat_helpers.init_checkpoint(tmp_path / "init", tok_dir)
    tok = load(tok_dir / "tokenizer.json")
    (tmp_path / "trl_rewards.py").write_text(TRL_FORMAT_REWARD)
    (tmp_path / "recorder.py").write_text(RECORDER)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("REWARD_LOG", str(log))
    monkeypatch.chdir(tmp_path)
    rows = [
        {"prompt": [{"role": "system", "content": "Add."}, {"role": "user", "content": f"{a}+2?"}], "level": a}
        for a in range(4)
    ]
    data = write_jsonl(tmp_path / "train.jsonl", rows)
    held = write_jsonl(tmp_path / "held.jsonl", rows[:3])
    argv = ["grpo", "--init", init, "--data", data, "--eval-data", held, "--chat-template", "chatml"]
    argv += ["--reward", "trl_rewards.py:format_reward_func:1.0,recorder.py:record:0.001", "--out", "run"]
    argv += ["--steps", "2", "--prompts-per-step", "2", "--num-generations", "3", "--max-new-tokens", "5"]
    argv += ["--eval-every", "0", "--save-every", "0", "--progress", "false", "--dynamic-sampling", "false"]
    assert main(argv) == 0
    calls = [json.loads(x) for x in log.read_text().splitlines()]
    by_level = {r["level"]: r["prompt"] for r in rows}
    train = [c for c in calls if len(c["completions"]) == 6]  # 2 prompts x 3 samples
    assert len(train) == 2
    for c in train:
        assert c["columns"] == ["level"]
        for p, out, lv, ids in zip(c["prompts"], c["completions"], c["level"], c["ids"]):
            assert p == by_level[lv]  # the row's own messages, and the completion as one assistant message
            assert len(out) == 1 and out[0]["role"] == "assistant"
            text = out[0]["content"]
            assert len(ids) <= 5 and tok.decode([t for t in ids if t != tok.eos_id]) == text
    # held-out: every evaluation prompt scored in one call (3 rows), not one call per completion
    held_calls = [c for c in calls if len(c["completions"]) == 3]
    assert held_calls and all(sorted(c["level"]) == [0, 1, 2] for c in held_calls)
    assert not [c for c in calls if len(c["completions"]) == 1]
