"""Bad input gives one clear error (exit 2) or a warning naming the cause; CLI train/encode/decode smoke runs;
any trained tokenizer satisfies the protocol the SFT/RL stack uses."""

import json

import pytest

from posttrain.cli import main
from posttrain.errors import UserError
from posttrain.tokenizers import TRAINERS, BPETrainer, ByteLevelBPETrainer, Tokenizer, WordPieceTrainer, load


@pytest.mark.parametrize("kind", list(TRAINERS))
def test_empty_corpus_is_an_error(kind):
    with pytest.raises(UserError, match="empty"):
        TRAINERS[kind](vocab_size=500, workers=1).train(["", ""])


@pytest.mark.parametrize(
    "trainer",
    [
        BPETrainer(vocab_size=5, workers=1),
        ByteLevelBPETrainer(vocab_size=100, workers=1),
        WordPieceTrainer(vocab_size=8, workers=1),
    ],
)
def test_vocab_below_alphabet_is_an_error(trainer, train_texts):
    with pytest.raises(UserError, match="below the alphabet size"):
        trainer.train(train_texts[:50])


def test_unsupported_tokenizer_json(tmp_path):
    p = tmp_path / "tokenizer.json"
    p.write_text(json.dumps({"model": {"type": "WordLevel", "vocab": {"a": 0}}}))
    with pytest.raises(UserError, match="unsupported tokenizer model type 'WordLevel'"):
        load(p)
    p.write_text(
        json.dumps(
            {
                "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                "normalizer": {"type": "Precompiled", "precompiled_charsmap": ""},
            }
        )
    )
    with pytest.raises(UserError, match="unsupported normalizer 'Precompiled'"):
        load(p)
    p.write_text("not json")
    with pytest.raises(UserError, match="not a valid tokenizer JSON"):
        load(p)


def test_char_tokenizer_still_loads(tmp_path):
    from posttrain.tokenizers import CharTokenizer

    CharTokenizer("0123456789+-=").save(tmp_path / "c.json")
    assert load(tmp_path / "c.json").encode("12+3") == [5, 6, 14, 7]


@pytest.mark.parametrize("kind", list(TRAINERS))
def test_protocol_and_special_ids(kind, train_texts, tmp_path):
    tok = TRAINERS[kind](vocab_size=600, workers=1).train(train_texts)
    assert isinstance(tok, Tokenizer)
    assert tok.pad_id is not None and tok.eos_id is not None and tok.bos_id is not None
    ids = tok.encode("hello world")
    assert ids and all(0 <= i < tok.vocab_size for i in ids)
    assert tok.bos_id not in ids and tok.eos_id not in ids  # encode adds no special tokens
    assert tok.decode([tok.bos_id] + ids + [tok.eos_id]) == tok.decode(ids)
    for i in ids:
        assert tok.token_to_id(tok.id_to_token(i)) == i
    tok.save(tmp_path)  # a directory -> tokenizer.json inside, like a checkpoint
    assert load(tmp_path).encode("hello world") == ids


def test_cli_train_encode_decode(tmp_path, train_texts, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in train_texts))
    out = tmp_path / "tok.json"
    rc = main(
        [
            "tokenizer",
            "train",
            "--model",
            "unigram",
            "--vocab-size",
            "500",
            "--byte-fallback",
            "--text-field",
            "text",
            "--workers",
            "1",
            "-o",
            str(out),
            str(corpus),
        ]
    )
    assert rc == 0 and out.is_file()
    assert "trained unigram tokenizer: vocab 500" in capsys.readouterr().out
    src = tmp_path / "in.txt"
    src.write_text("hello tokenizer world\nsecond line 机器\n")
    assert main(["tokenizer", "encode", "--tokenizer", str(out), str(src)]) == 0
    ids_text = capsys.readouterr().out
    assert len(ids_text.splitlines()) == 2
    (tmp_path / "ids.txt").write_text(ids_text)
    assert main(["tokenizer", "decode", "--tokenizer", str(out), str(tmp_path / "ids.txt")]) == 0
    assert capsys.readouterr().out == "hello tokenizer world\nsecond line 机器\n"
    assert main(["tokenizer", "encode", "--tokens", "--tokenizer", str(out), str(src)]) == 0
    assert capsys.readouterr().out.startswith("▁")


def test_cli_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"caf\xe9 au lait\nplain line\n")
    out = tmp_path / "t.json"
    assert (
        main(
            [
                "tokenizer",
                "train",
                "--model",
                "wordpiece",
                "--vocab-size",
                "60",
                "--workers",
                "1",
                "-o",
                str(out),
                str(bad),
            ]
        )
        == 0
    )
    assert "1 input line(s) were not valid UTF-8" in capsys.readouterr().err
    assert (
        main(
            [
                "tokenizer",
                "train",
                "--model",
                "wordpiece",
                "--pattern",
                "gpt2",
                "--vocab-size",
                "60",
                "-o",
                str(out),
                str(bad),
            ]
        )
        == 2
    )
    assert "--pattern does not apply to --model wordpiece" in capsys.readouterr().err
    (tmp_path / "ids.txt").write_text("1 99999\n")
    assert main(["tokenizer", "decode", "--tokenizer", str(out), str(tmp_path / "ids.txt")]) == 2
    assert "outside the vocabulary" in capsys.readouterr().err
