"""A run on the user's model and data takes nothing from the embedded arithmetic task: one test per trainer.

Each runs ``posttrain CMD --model DIR --data FILE`` (a random 2-layer Qwen2 saved with ``save_pretrained``, files of
words: no digit, no ``+``) with no ``--eval-data`` and no arithmetic flag, and checks against oracles that do not go
through the code under test:

- the resolved config (``config.resolved.json``) has no embedded-task section, and every value the trainer's
  ``tiny`` preset would set is the dataclass field's own default (the presets are arithmetic recipes);
- nothing printed is an arithmetic problem (no ``a+b=``), and the run says where its held-out set came from;
- the held-out set is made of the user's rows (the evaluated samples' prompts are prompts of --data) and those
  rows were not trained on.
"""

import dataclasses
import json
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parents[1] / "models"))  # the suite runs with --import-mode=importlib
from _hfdirs import make_model_dir  # noqa: E402

from posttrain.cli import main  # noqa: E402

WORDS = ["red", "blue", "green", "gold", "grey", "pink", "teal", "navy", "plum", "rose", "sand", "jade"]
ARITHMETIC = re.compile(r"\d+\s*[+-]\s*\d+\s*=")
COMMON = ["--progress", "false", "--eval-every", "0", "--save-every", "0", "--steps", "2"]
GEN = ["--max-new-tokens", "2"]


def _jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    d = tmp_path_factory.mktemp("user")
    convs = [
        {"messages": [{"role": "user", "content": f"colour of {w}?"}, {"role": "assistant", "content": w}]}
        for w in WORDS * 2
    ]
    pairs = [{"prompt": f"name {w}", "chosen": w, "rejected": WORDS[i - 1]} for i, w in enumerate(WORDS)] * 2
    prompts = [{"prompt": f"say {w}", "answer": w} for w in WORDS * 2]
    return {
        "model": make_model_dir(d / "mymodel", "qwen2"),
        "chat": _jsonl(d / "chat.jsonl", convs),
        "pairs": _jsonl(d / "pairs.jsonl", pairs),
        "prompts": _jsonl(d / "prompts.jsonl", prompts),
    }


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v and all(isinstance(x, str) for x in v):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def _field_default(cls, dotted: str):
    for part in dotted.split("."):
        f = {f.name: f for f in dataclasses.fields(cls)}[part]
        value = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        cls = type(value)
    return value


def _run(capsys, cmd: str, out: Path, *flags) -> tuple[dict, str, dict]:
    assert main([cmd, "--out", str(out), *map(str, flags), *COMMON]) == 0
    o, e = capsys.readouterr()
    cfg = json.loads((out / "config.resolved.json").read_text())
    return cfg, o + e, json.loads((out / "summary.json").read_text())


def _no_embedded_task(cfg: dict, printed: str, cls, presets: dict, passed: set, embedded: tuple):
    assert not set(embedded) & set(cfg), f"embedded-task settings in the resolved config: {set(embedded) & set(cfg)}"
    for key, value in _flat(presets["tiny"]).items():
        if key.split(".")[0] in passed or key.split(".")[0] in embedded:  # given on the command line, or left out
            continue
        got = cfg
        for part in key.split("."):
            got = got[part]
        want = _field_default(cls, key)
        assert got == (list(want) if isinstance(want, tuple) else want), f"{key}={got!r}: the tiny preset's {value!r}?"
    assert not ARITHMETIC.search(printed), ARITHMETIC.search(printed)[0]
    assert "embedded" not in printed and "preset" not in printed


def test_sft(user, tmp_path, capsys):
    from posttrain.trainers.sft import PRESETS, SFTConfig

    cfg, printed, summary = _run(
        capsys, "sft", tmp_path / "sft", "--model", user["model"], "--data", user["chat"], *GEN
    )
    _no_embedded_task(cfg, printed, SFTConfig, PRESETS, {"steps"}, ("task", "val_problems"))
    assert (cfg["weight_decay"], cfg["restarts"]) == (0.1, 1)  # not the tiny preset's 3.0 and 4
    n = summary["heldout_n"]
    assert 0 < n < len(WORDS) * 2 and summary["num_demos"] == len(WORDS) * 2 - n  # held-out rows are not trained on
    assert f"held-out accuracy on {n} of the {len(WORDS) * 2} rows of {user['chat']}" in printed
    asked = {f"colour of {w}?" for w in WORDS}
    assert summary["samples"] and all(any(q in s["prompt"] for q in asked) for s in summary["samples"])


def test_rm(user, tmp_path, capsys):
    from posttrain.trainers.reward import PRESETS, RMConfig

    flags = ["--model", user["model"], "--data", user["pairs"], "--batch-size", "4"]
    cfg, printed, summary = _run(capsys, "rm", tmp_path / "rm", *flags)
    _no_embedded_task(
        cfg, printed, RMConfig, PRESETS, {"steps", "batch_size", "eval_every", "save_every"},
        ("task", "pairs", "train_pairs", "eval_prompts", "source"),
    )  # fmt: skip
    assert cfg["sft_coef"] == 0.0  # not the tiny recipe's GRM regulariser
    assert "held-out pairwise accuracy on" in printed and f"rows of {user['pairs']}" in printed
    held = int(re.search(r"held-out pairwise accuracy on (\d+) of", printed)[1])
    assert 0 < held < len(WORDS) * 2
    assert f"RM: {len(WORDS) * 2 - held} training pairs, {held} held-out pairs" in printed


def test_dpo(user, tmp_path, capsys):
    from posttrain.trainers.dpo import PRESETS, DPOConfig

    flags = ["--model", user["model"], "--data", user["pairs"], "--batch-size", "4", *GEN]
    cfg, printed, summary = _run(capsys, "dpo", tmp_path / "dpo", *flags)
    _no_embedded_task(cfg, printed, DPOConfig, PRESETS, {"steps", "batch_size"}, ("task", "pairs"))
    assert cfg["loss"] == "dpo"  # not the embedded recipe's rpo
    assert f"rows of {user['pairs']} (not trained on)" in printed
    asked = {f"name {w}" for w in WORDS}
    assert summary["samples"] and all(any(q in s["prompt"] for q in asked) for s in summary["samples"])


@pytest.mark.parametrize("cmd", ["grpo", "ppo"])
def test_rl(user, tmp_path, capsys, cmd):
    if cmd == "grpo":
        from posttrain.trainers.policy_gradient import PRESETS
        from posttrain.trainers.policy_gradient import PolicyGradientConfig as cls
    else:
        from posttrain.trainers.ppo import PRESETS
        from posttrain.trainers.ppo import PPOConfig as cls
    flags = [
        "--model",
        user["model"],
        "--data",
        user["prompts"],
        "--prompts-per-step",
        "2",
        "--num-generations",
        "2",
        *GEN,
    ]
    cfg, printed, summary = _run(capsys, cmd, tmp_path / cmd, *flags)
    _no_embedded_task(cfg, printed, cls, PRESETS, {"steps"}, ("task",))
    assert "digits" not in (cfg["reward"] or "")  # the embedded task's partial credit per digit
    assert f"rows of {user['prompts']} (not trained on)" in printed
