"""The user's own data in every trainer: SFT on conversations, DPO on conversational pairs, GRPO on a GSM8K-style
prompt file whose columns reach the reward functions, Python rewards, and bad rows (FILE:LINE, exit 2, or skip)."""

import json
import math

import pytest
import torch

from posttrain.chat import resolve_chat
from posttrain.checkpoints.load import load_checkpoint
from posttrain.cli import main
from posttrain.data.conversations import ChatDemo, load_sft_data
from posttrain.data.prompts import load_prompt_rows, reward_columns
from posttrain.errors import ConfigError, DataError
from posttrain.rewards import build_reward, math_answer_reward, parse_reward_spec
from posttrain.rewards.verifiers import gold_answer
from posttrain.tokenizers import load


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def losses(out):
    return [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines() if "loss" in json.loads(x)]


@pytest.fixture(scope="module")
def env(tmp_path_factory, chat_helpers):
    root = tmp_path_factory.mktemp("userdata")
    tok_dir = chat_helpers.build_tokenizer(root / "tok")
    conv = [
        {
            "messages": [
                {"role": "system", "content": "Add."},
                {"role": "user", "content": f"{a}+{b}?"},
                {"role": "assistant", "content": str(a + b)},
            ]
        }
        for a in range(6)
        for b in range(2)
    ]
    conv[0]["messages"] += [{"role": "user", "content": "sure?"}, {"role": "assistant", "content": "yes"}]
    return {
        "root": root,
        "tok_dir": tok_dir,
        "init": chat_helpers.init_checkpoint(root / "init", tok_dir),
        "tok": load(tok_dir / "tokenizer.json"),
        "sft": write_jsonl(root / "sft.jsonl", conv),
        "conv": conv,
        "eval": write_jsonl(
            root / "eval.jsonl",
            [{"prompt": [{"role": "user", "content": f"{a}+1?"}], "answer": a + 1} for a in range(3)],
        ),
    }


def test_sft_on_messages_masks_everything_but_assistant_tokens(tmp_path, env):
    from posttrain.trainers import sft

    cfg = sft.SFTConfig(
        out=str(tmp_path / "a"),
        init=env["init"],
        data=env["sft"],
        eval_data=env["eval"],
        steps=4,
        batch_size=4,
        eval_every=0,
        save_every=0,
        progress=False,
        warmup_steps=1,
    )
    s = sft.setup(cfg)
    transformers = pytest.importorskip("transformers")
    cfg_json = json.loads((env["tok_dir"] / "tokenizer_config.json").read_text())
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(env["tok_dir"] / "tokenizer.json"),
        **{k: v for k, v in cfg_json.items() if k.endswith("_token")},
    )
    hf.chat_template = cfg_json["chat_template"]
    for row, rec in enumerate(env["conv"]):  # token by token against transformers' assistant mask
        ref = hf.apply_chat_template(
            rec["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        n = int((s.ids[row] != s.tokenizer.pad_id).sum()) - 1
        assert s.ids[row, 0] == s.tokenizer.bos_id and s.loss_mask[row, 0] == 0
        assert s.ids[row, 1 : n + 1].tolist() == ref["input_ids"][:n]
        assert s.loss_mask[row, 1 : n + 1].tolist() == ref["assistant_masks"][:n]
        assert not s.loss_mask[row, n + 1 :].any()
    assert s.tokenizer.eos_id == env["tok"].token_to_id("<|im_end|>")  # generation stops at the end of a turn
    assert s.evals[0] == ("<|im_start|>user\n0+1?<|im_end|>\n<|im_start|>assistant\n", "1")

    out = tmp_path / "b"
    summary = sft.train_sft(sft.SFTConfig(**{**vars(cfg), "out": str(out)}))
    got = losses(out)
    assert got[-1] < got[0] and summary["num_demos"] == len(env["conv"])
    assert (out / "model" / "chat_template.jinja").read_text() == cfg_json["chat_template"]  # for the next stage


def test_dpo_on_conversational_pairs(tmp_path, env):
    from posttrain.data.preference import load_preference_pairs
    from posttrain.trainers.dpo import DPOConfig, train_dpo

    rows = [
        {
            "prompt": [{"role": "user", "content": f"{a}+1?"}],
            "chosen": [{"role": "assistant", "content": str(a + 1)}],
            "rejected": [{"role": "assistant", "content": str(a + 2)}],
        }
        for a in range(6)
    ]
    rows[1]["prompt"] = f"{1}+1?"  # a string prompt beside conversational replies: one user turn
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    pairs = load_preference_pairs(data, chat=resolve_chat("auto", env["tok"], [env["init"]]))
    assert pairs[0].prompt == "<|im_start|>user\n0+1?<|im_end|>\n<|im_start|>assistant\n"
    assert (pairs[0].chosen, pairs[0].rejected) == ("1", "2") and pairs[1].prompt.endswith(
        "1+1?<|im_end|>\n<|im_start|>assistant\n"
    )
    train_dpo(
        DPOConfig(
            out=str(tmp_path / "dpo"),
            init=env["init"],
            data=data,
            eval_data=env["eval"],
            loss="dpo",
            steps=4,
            batch_size=4,
            eval_every=0,
            save_every=0,
            progress=False,
            warmup_steps=1,
            lr=2e-3,
        )
    )
    got = losses(tmp_path / "dpo")
    assert got[0] == pytest.approx(math.log(2), abs=1e-6) and abs(got[-1] - got[0]) > 1e-4


REWARD_MODULE = """
CALLS = []

def length_and_level(prompts, completions, level, answer):
    CALLS.append({"prompts": list(prompts), "level": list(level), "answer": list(answer), "n": len(completions)})
    return [0.1 * len(c) + level_i for c, level_i in zip(completions, level)]
"""


def test_grpo_on_gsm8k_style_rows_passes_every_column_to_the_rewards(tmp_path, env, monkeypatch):
    from posttrain.trainers.policy_gradient import PolicyGradientConfig, train_policy_gradient

    (tmp_path / "user_rewards_t.py").write_text(REWARD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    rows = [
        {"question": f"What is {a}+2?", "answer": f"{a} and 2 make {a + 2}. #### {a + 2}", "level": a % 3}
        for a in range(6)
    ]
    rows[0]["question"] = [{"role": "system", "content": "Add."}, {"role": "user", "content": "What is 0+2?"}]
    data, held = write_jsonl(tmp_path / "train.jsonl", rows), write_jsonl(tmp_path / "test.jsonl", rows[:2])
    cfg = PolicyGradientConfig(
        out=str(tmp_path / "grpo"),
        init=env["init"],
        data=data,
        eval_data=held,
        prompt_field="question",
        reward="math:1.0,user_rewards_t:length_and_level:0.5",
        chat_template="chatml",
        steps=3,
        prompts_per_step=3,
        num_generations=4,
        max_new_tokens=6,
        eval_every=0,
        save_every=0,
        progress=False,
        dynamic_sampling=False,
        lr=1e-2,
        warmup_steps=0,
    )
    summary = train_policy_gradient(cfg)
    import user_rewards_t

    rollouts = [c for c in user_rewards_t.CALLS if c["n"] == 12]  # 3 prompts x 4 samples (evaluation: 1 call of 2)
    assert len(rollouts) == 3 and summary["heldout_n"] == 2
    for c in rollouts:
        for p in c["prompts"]:  # a plain row: the text the model saw; the conversational row: its messages (as TRL)
            assert p == rows[0]["question"] if isinstance(p, list) else p.endswith("<|im_start|>assistant\n")
            assert isinstance(p, list) or p.startswith("<|im_start|>")
        keys = [json.dumps(p) for p in c["prompts"]]
        by_prompt = {k: (lv, a) for k, lv, a in zip(keys, c["level"], c["answer"])}
        assert len(by_prompt) == 3 and all(keys.count(k) == 4 for k in by_prompt)  # G copies of each row
        for k, (lv, a) in by_prompt.items():
            row = next(
                r
                for r in rows
                if str(r["question"][-1]["content"] if isinstance(r["question"], list) else r["question"]) in k
            )
            assert (lv, a) == (row["level"], row["answer"])
    start, end = load_checkpoint(env["init"]).model, load_checkpoint(tmp_path / "grpo").model
    assert any(not torch.equal(a, b) for a, b in zip(start.state_dict().values(), end.state_dict().values()))
    assert all(math.isfinite(x) for x in losses(tmp_path / "grpo"))


def test_math_reads_the_gsm8k_final_answer_and_a_configurable_column():
    assert gold_answer("Natalia sold 48/2 = 24 clips in May.\n#### 72") == "72" and gold_answer("3/4") == "3/4"
    gsm = ["she sold 24 in May ... #### 72"]
    assert math_answer_reward(["q"], ["so the answer is 72"], answer=gsm) == [1.0]
    assert math_answer_reward(["q"], ["so the answer is 24"], answer=gsm) == [0.0]
    fn = build_reward("math", answer_field="solution")
    assert fn(["q"], ["#### 72"], solution=gsm, answer=["1"]) == [1.0]


def test_python_reward_spec_grammar_and_errors(tmp_path, monkeypatch):
    (tmp_path / "my_rewards_t.py").write_text(
        "def fn(prompts, completions, answer):\n    return [float(len(answer[0]))] * len(completions)\n"
        "NOT_CALLABLE = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert parse_reward_spec("math:0.5,my_rewards_t:fn,my_rewards_t:fn:2e-1") == {"math": 0.5, "my_rewards_t:fn": 0.2}
    assert parse_reward_spec(f"{tmp_path}/my_rewards_t.py:fn:-1") == {f"{tmp_path}/my_rewards_t.py:fn": -1.0}
    r = build_reward("my_rewards_t:fn:2,exact_match")
    assert r(["p"], ["ab"], answer=["ab"], level=[1]) == [2 * 2.0 + 1.0]  # `level` not in fn's signature: not passed
    assert build_reward(f"{tmp_path}/my_rewards_t.py:fn")(["p"], ["x"], answer=["abc"]) == [3.0]
    for spec, msg in [
        ("no_such_mod_t:fn", "reward 'no_such_mod_t:fn': cannot import module 'no_such_mod_t'"),
        ("my_rewards_t:nope", "reward 'my_rewards_t:nope': module 'my_rewards_t' has no 'nope'"),
        ("my_rewards_t:NOT_CALLABLE", "my_rewards_t.NOT_CALLABLE is a int, not a function"),
        ("nofile_t.py:fn", "reward 'nofile_t.py:fn': no file nofile_t.py"),
    ]:
        with pytest.raises(ConfigError, match=msg.replace(".", r"\.").replace("(", r"\(")):
            build_reward(spec)
    for spec, msg in [
        ("math:abc", "reward weight 'abc' for 'math' is not a number"),
        ("my-mod:fn", "reward 'my-mod:fn' is not MODULE:FUNCTION"),
        ("m:fn:inf", "is not MODULE:FUNCTION"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            parse_reward_spec(spec)


def test_sft_formats_and_rejects(tmp_path, capsys):
    rows = [
        {"prompt": "1+1=", "answer": 2},
        {"prompt": "2+2=", "completion": "4"},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
        {"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "assistant", "content": "a"}]},
        {"messages": []},
        {"messages": [{"role": "robot", "content": "x"}]},
        "not json",
        {"prompt": "x"},
    ]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    got = load_sft_data(path, on_bad_line="skip")
    assert list(got[:2]) == [("1+1=", "2"), ("2+2=", "4")] and got.lines == [1, 2, 3, 4]
    assert got[3] == ChatDemo([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], 1)
    rejected = (tmp_path / "d.jsonl.rejects.jsonl").read_text().splitlines()
    assert rejected[0] == "not json" and [json.loads(x) for x in rejected[1:]] == [rows[4], rows[5], rows[7]]
    assert "skipped 4 bad line(s) (first: line 5: field 'messages' is an empty conversation)" in capsys.readouterr().err
    with pytest.raises(DataError, match=r"d\.jsonl:5: field 'messages' is an empty conversation$"):
        load_sft_data(path)


def test_parquet_rows(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    rows = [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "bot", "content": "yo"}]},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    with pytest.raises(
        DataError, match=r"d\.parquet:2: messages\[1\]: role 'bot' is not one of system, user, assistant"
    ):
        load_sft_data(str(tmp_path / "d.parquet"))
    pq.write_table(pa.Table.from_pylist([{"q": "What?", "answer": "#### 1", "n": 3}]), tmp_path / "p.parquet")
    got = load_prompt_rows(str(tmp_path / "p.parquet"), prompt_field="q")
    assert got[0].prompt == "What?" and reward_columns(got, 2) == {"answer": ["#### 1"] * 2, "n": [3, 3]}


@pytest.mark.parametrize(
    "cmd, rows, message",
    [
        (
            "sft",
            [
                {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
                {"messages": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]},
            ],
            "2: messages[1]: role 'robot' is not one of system, user, assistant",
        ),
        (
            "sft",
            [{"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": "b"}]}],
            "1: messages[0]: 'content' must be a string, got int",
        ),
        ("dpo", [{"prompt": [], "chosen": "a", "rejected": "b"}], "1: field 'prompt' is an empty conversation"),
        ("rm", [{"prompt": "p", "chosen": 3, "rejected": "b"}], "1: field 'chosen' must be a string, got int"),
        ("grpo", [{"question": "q?", "answer": "1"}, {"answer": "2"}], "2: missing field 'question' (needs question)"),
        (
            "grpo",
            [{"question": [{"role": "user", "content": "q"}], "prompts": 1}],
            "1: column 'prompts' collides with the reward functions' argument of that name; rename it",
        ),
    ],
)
def test_bad_rows_name_file_and_line_and_exit_2(tmp_path, env, capsys, cmd, rows, message):
    data = write_jsonl(tmp_path / "bad.jsonl", rows)
    held = env["eval"] if cmd in ("sft", "dpo") else data
    argv = [cmd, "--out", str(tmp_path / "out"), "--data", data, "--eval-data", held, "--progress", "false"]
    argv += ["--init", env["init"]] + (["--prompt-field", "question", "--reward", "math"] if cmd == "grpo" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith(f"{data}:{message}") and "Traceback" not in "\n".join(err)
    assert not (tmp_path / "out").exists()  # nothing written for a run whose data is bad


def test_conversation_without_a_template_is_a_config_error(tmp_path):
    from posttrain.data.conversations import fit_chat_demos
    from posttrain.tokenizers.char import CharTokenizer

    path = write_jsonl(
        tmp_path / "d.jsonl", [{"messages": [{"role": "user", "content": "1"}, {"role": "assistant", "content": "2"}]}]
    )
    with pytest.raises(ConfigError, match=r"d\.jsonl:1: a conversation, but no chat template.*--chat-template chatml"):
        fit_chat_demos(CharTokenizer("0123456789"), load_sft_data(path), None, window=32)


def test_kto_rows_and_long_conversations(tmp_path, env):
    from posttrain.data.conversations import fit_chat_demos
    from posttrain.data.preference import load_kto_examples

    chat = resolve_chat("chatml", env["tok"])
    path = write_jsonl(
        tmp_path / "kto.jsonl",
        [
            {
                "prompt": [{"role": "user", "content": "2+3?"}],
                "completion": [{"role": "assistant", "content": "5"}],
                "label": True,
            },
            {"prompt": "2+3?", "completion": "6", "label": 0},
        ],
    )
    got = load_kto_examples(path, chat=chat)
    assert [(e.prompt, e.completion, e.label) for e in got] == [
        (chat.prompt_text("2+3?"), "5", True),
        (chat.prompt_text("2+3?"), "6", False),
    ]
    demos = load_sft_data(env["sft"])
    full, _, _ = fit_chat_demos(env["tok"], demos, chat, window=None)
    n = max(len(chat.encode(d.messages)[0]) for d in demos)
    with pytest.raises(DataError, match=r"sft\.jsonl:1: the sequence is \d+ tokens, over the model's window of 20"):
        fit_chat_demos(env["tok"], demos, chat, window=20)
    kept, ids, mask = fit_chat_demos(env["tok"], demos, chat, window=n - 1, long="skip")
    assert len(kept) == len(full) - 1 and kept.lines[0] == 2  # only the longest (line 1, two replies) is dropped
    cut, ids, mask = fit_chat_demos(env["tok"], demos, chat, window=n - 1, long="truncate")
    assert len(cut) == len(full) and ids.shape[1] == n - 1
    assert ids[0].tolist() == chat.encode(demos[0].messages)[0][: n - 1]  # a conversation keeps its first tokens
