"""A fresh model on the user's own text (``--data``, no ``--tokenizer``): a byte-level tokenizer, never the embedded
task's 13 characters (with those, letters were all ``<unk>`` and the run stopped: "every character ... is unknown")."""

import json

import pytest

from posttrain.checkpoints.load import load_checkpoint
from posttrain.cli import main
from posttrain.tasks.arithmetic import ALPHABET, ArithmeticConfig
from posttrain.tasks.embedded import embedded_task
from posttrain.tasks.files import FileTask, fresh_tokenizer
from posttrain.tokenizers.char import CharTokenizer

WORDS = ["cat", "dog", "sun", "café", "tree", "moon", "star", "fish", "bird", "rain", "snow", "wind", "leaf", "rock"]
SMALL = [
    "--model.n-layer",
    "2",
    "--model.d-model",
    "64",
    "--model.n-head",
    "2",
    "--threads",
    "1",
    "--progress",
    "false",
]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_the_fresh_tokenizer_of_user_data_is_bytes_and_of_the_embedded_task_its_characters(tmp_path):
    tok = fresh_tokenizer(FileTask(_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "answer": "b"}])))
    assert tok.vocab_size == 259 and (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    for text in ["Shout café!", "naïve 日本 \t\n", "12+34=46", "\x00\x7f"]:
        assert tok.decode(tok.encode(text)) == text
        assert tok.encode(text) == [3 + b for b in text.encode("utf-8")]  # one id per byte, after the specials
    transformers_tokenizers = pytest.importorskip("tokenizers")  # the file it saves is a standard tokenizer.json
    tok.save(tmp_path / "tokenizer.json")
    hf = transformers_tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert hf.encode("Shout café!").ids == tok.encode("Shout café!")
    emb = fresh_tokenizer(embedded_task(ArithmeticConfig()))  # unchanged: the task's characters
    assert isinstance(emb, CharTokenizer) and emb.alphabet == ALPHABET


def test_sft_on_a_file_of_letters_trains_and_evaluates_without_a_tokenizer(tmp_path, capsys):
    rows = [{"prompt": f"Shout {w}!", "answer": w.upper()} for w in WORDS]
    data, held = _jsonl(tmp_path / "train.jsonl", rows), _jsonl(tmp_path / "eval.jsonl", rows[:6])
    out = tmp_path / "sft"
    argv = ["sft", "--data", data, "--eval-data", held, "--out", str(out), "--steps", "150", "--batch-size", "16"]
    assert main([*argv, "--eval-every", "0", "--save-every", "0", *SMALL]) == 0
    err = capsys.readouterr().err
    assert "<unk>" not in err and "unknown" not in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["heldout_n"] == 6 and summary["heldout_accuracy"] >= 0.5  # memorised: 1.0 on this machine
    ck = load_checkpoint(out)
    assert ck.tokenizer.vocab_size == 259 and ck.model.config.vocab_size == 259
    assert ck.tokenizer.decode(ck.tokenizer.encode("CAFÉ")) == "CAFÉ"
    # any text scores: characters the training file never had encode too
    other = _jsonl(tmp_path / "other.jsonl", [{"prompt": "Shout Ωmega!", "answer": "ΩMEGA"}])
    assert main(["eval", str(out), "--data", other, "--out", str(tmp_path / "ev")]) == 0
    assert json.loads((tmp_path / "ev" / "summary.json").read_text())["n"] == 1


def test_a_fresh_reward_model_on_pairs_of_letters_uses_bytes(tmp_path):
    pairs = [{"prompt": f"Shout {w}!", "chosen": w.upper(), "rejected": w} for w in WORDS]
    data, held = _jsonl(tmp_path / "p.jsonl", pairs), _jsonl(tmp_path / "h.jsonl", pairs[:4])
    out = tmp_path / "rm"
    argv = ["rm", "--data", data, "--eval-data", held, "--out", str(out), "--steps", "10", "--batch-size", "8"]
    assert main([*argv, "--eval-every", "0", "--save-every", "0", *SMALL]) == 0
    assert load_checkpoint(out, accept_kinds=("reward_model",)).tokenizer.vocab_size == 259
    assert json.loads((out / "summary.json").read_text())["heldout_pairs"] == 4
