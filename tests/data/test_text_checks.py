"""Data checks at load time: UTF-8 errors on the right line, the line-size cap, unknown characters,
lengths against the model's window (--long), non-string --text-field values, escaped printing of
untrusted text, and the one-line messages (WordPiece long words, dedup inputs, char tokenizer file)."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.cli import main
from posttrain.data.checks import Located, fit_sequences
from posttrain.data.demos import fit_demos
from posttrain.data.io import ReadStats, iter_jsonl
from posttrain.data.pairs import load_pairs
from posttrain.data.preference import PreferencePair, collate_preference, fit_pairs, load_preference_pairs
from posttrain.errors import DataError, UserError
from posttrain.evaluation import fit_prompts, sample_line
from posttrain.tasks.arithmetic import ALPHABET
from posttrain.text import printable
from posttrain.tokenizers.char import CharTokenizer

TOK = CharTokenizer(ALPHABET)


class Window:
    """Stands in for a model: only its ``config.max_seq_len`` is read."""

    def __init__(self, n):
        self.config = type("C", (), {"max_seq_len": n})()


def _jsonl(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


# --- invalid UTF-8 is reported on its own line --------------------------------------------------------------


@pytest.mark.parametrize("bad_line", [3, 1500])
@pytest.mark.parametrize("loader", ["iter_jsonl", "sft", "preference"])
def test_invalid_utf8_reported_on_its_line(tmp_path, bad_line, loader):
    rec = {"prompt": "1+2=" * 20, "answer": "3", "chosen": "3", "rejected": "4"}
    lines = [json.dumps(rec).encode()] * 2000
    lines[bad_line - 1] = b'{"prompt": "1+2=\xff", "answer": "3", "chosen": "3", "rejected": "4"}'
    p = tmp_path / "d.jsonl"
    p.write_bytes(b"\n".join(lines) + b"\n")
    read = {
        "iter_jsonl": lambda: list(iter_jsonl(p)),
        "sft": lambda: load_pairs(str(p), "training"),
        "preference": lambda: load_preference_pairs(p),
    }[loader]
    with pytest.raises(DataError) as e:
        read()
    assert str(e.value) == f"{p}:{bad_line}: not valid UTF-8 (invalid start byte at byte 17)"


def test_line_over_the_byte_cap_is_a_bad_line_read_in_bounded_memory(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_bytes(b'{"a": 1}\n{"a": "' + b"x" * 5000 + b'"}\n{"a": 3}\n')
    with pytest.raises(DataError, match=r"d.jsonl:2: line longer than 1000 bytes \(the per-record limit\)"):
        list(iter_jsonl(p, max_line_bytes=1000))
    stats, rej = ReadStats(), tmp_path / "rej.jsonl"
    got = list(iter_jsonl(p, max_line_bytes=1000, on_bad_line="skip", stats=stats, rejects=rej))
    assert got == [(1, {"a": 1}), (3, {"a": 3})]
    assert [n for n, _ in stats.bad_lines] == [2] and len(rej.read_bytes()) == 1001  # first 1000 bytes + newline


# --- unknown characters -------------------------------------------------------------------------------------


def test_unknown_characters_warn_once_with_counts(tmp_path, capsys):
    p = _jsonl(
        tmp_path / "d.jsonl",
        [
            {"prompt": "1+2=", "answer": "3"},
            {"prompt": "1 + 2 =", "answer": "3"},
            {"prompt": "4+4=\x1b", "answer": "8"},
        ],
    )
    demos, ids, mask = fit_demos(TOK, load_pairs(str(p), "training"), Window(64), "error")
    assert len(demos) == 3 and ids.shape[0] == 3
    err = capsys.readouterr().err
    assert err == (
        f"posttrain: warning: training data in {p}: 4 character(s) not in the tokenizer's alphabet "
        f"(e.g. ' ', '\\x1b') became <unk>, in 2 field(s) of 2 record(s); first at {p}:2\n"
    )


@pytest.mark.parametrize("field", ["prompt", "answer"])
def test_a_field_of_only_unknown_characters_fails(tmp_path, field):
    rec = {"prompt": "1+2=", "answer": "3"}
    rec[field] = "abc"
    p = _jsonl(tmp_path / "d.jsonl", [{"prompt": "1+2=", "answer": "3"}, rec])
    with pytest.raises(DataError) as e:
        fit_demos(TOK, load_pairs(str(p), "training"), Window(64), "error")
    assert str(e.value) == (
        f"{p}:2: every character of field {field!r} ('abc') is unknown to the tokenizer (all "
        f"<unk>): nothing to learn from; is this the right tokenizer for the data?"
    )


def test_chosen_and_rejected_that_encode_identically_fail(tmp_path):
    p = _jsonl(
        tmp_path / "p.jsonl",
        [{"prompt": "1+2=", "chosen": "3", "rejected": "4"}, {"prompt": "1+2=", "chosen": "3a", "rejected": "3b"}],
    )
    with pytest.raises(DataError) as e:
        fit_pairs(load_preference_pairs(p), TOK, window=64)
    assert str(e.value).startswith(f"{p}:2: 'chosen' and 'rejected' encode to the same tokens")


def test_subword_unknown_tokens_are_counted(capsys):
    from posttrain.tokenizers import BPETrainer

    tok = BPETrainer(vocab_size=40, workers=1).train(["1+2=3 4+4=8"] * 4)
    fit_sequences(tok, [("1+2= Ω", "3")], lambda r: (r[0], [("answer", r[1])]), window=64, what="training")
    assert "1 <unk> token(s), in 1 field(s) of 1 record(s); first at record 1" in capsys.readouterr().err


# --- lengths against the model's window ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    run = tmp_path_factory.mktemp("ck") / "run"
    tiny = [
        "--steps",
        "1",
        "--batch-size",
        "4",
        "--eval-every",
        "0",
        "--save-every",
        "0",
        "--progress",
        "false",
        "--model.n-layer",
        "1",
        "--model.d-model",
        "16",
        "--model.n-head",
        "2",
        "--task.digits",
        "1",
        "--task.num-demos",
        "8",
        "--task.num-eval",
        "4",
    ]
    assert main(["sft", "--out", str(run), *tiny]) == 0
    return run


def test_eval_prompt_longer_than_the_window_is_a_clean_error(checkpoint, tmp_path, capsys):
    p = _jsonl(tmp_path / "long.jsonl", [{"prompt": "1+2=", "answer": "3"}, {"prompt": "1+2=" * 25, "answer": "3"}])
    capsys.readouterr()
    assert main(["eval", str(checkpoint), "--data", str(p)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"posttrain eval: error: {p}:2: prompt has 100 characters (too many, checked before encoding), "
        f"over the model's window of 56 tokens (max_seq_len 64 - 8 new tokens); shorten it, or pass "
        f"--long truncate (keep the prompt's end) or --long skip\n"
    )
    assert main(["eval", str(checkpoint), "--data", str(p), "--long", "skip"]) == 0
    out = capsys.readouterr()
    assert "(0/1)" in out.out or "(1/1)" in out.out
    assert f"skipped 1 record(s) longer than the model's window of 56 tokens (first at {p}:2;" in out.err
    assert main(["eval", str(checkpoint), "--data", str(p), "--long", "truncate"]) == 0
    assert "/2) on" in capsys.readouterr().out


def test_token_count_over_the_window_names_the_lengths(tmp_path):
    p = _jsonl(tmp_path / "d.jsonl", [{"prompt": "1+2=" * 10, "answer": "3" * 30}])
    with pytest.raises(
        DataError,
        match=r"d.jsonl:1: prompt 41 \+ answer 31 = 72 tokens, over the model's window "
        r"of 64 tokens \(max_seq_len 64\)",
    ):
        fit_demos(TOK, load_pairs(str(p), "training"), Window(64), "error")


def test_multi_megabyte_prompt_fails_without_being_encoded(tmp_path):
    p = _jsonl(
        tmp_path / "p.jsonl",
        [
            {"prompt": "1+2=", "chosen": "3", "rejected": "4"},
            {"prompt": "1+2=" * 1_000_000, "chosen": "3", "rejected": "4"},
        ],
    )
    seen = []

    class Spy(CharTokenizer):
        def encode(self, text):
            seen.append(len(text))
            return super().encode(text)

    with pytest.raises(DataError, match=r"p.jsonl:2: prompt has 4000000 characters"):
        fit_pairs(load_preference_pairs(p), Spy(ALPHABET), window=64)
    assert max(seen) <= 64  # never encoded (nor turned into tensors)


@settings(max_examples=60, deadline=None)
@given(
    prompt=st.text(ALPHABET, max_size=80),
    chosen=st.text(ALPHABET, min_size=1, max_size=80),
    rejected=st.text(ALPHABET, min_size=1, max_size=80),
    window=st.integers(4, 70),
)
def test_truncate_fits_the_window_keeping_prompt_end_and_completion_start(prompt, chosen, rejected, window):
    if chosen == rejected:
        return
    pair = PreferencePair(prompt, chosen, rejected)
    out = fit_pairs([pair], TOK, window=window, long="truncate", what="t")
    p_full = [TOK.bos_id] + TOK.encode(prompt)
    c_full = [TOK.encode(chosen) + [TOK.eos_id], TOK.encode(rejected) + [TOK.eos_id]]
    if not out:  # dropped: the cut made chosen and rejected identical
        P = len(p_full)
        c_keep = window - max(window - max(map(len, c_full)), min(P, window // 2), 1)
        assert c_full[0][:c_keep] == c_full[1][:c_keep]
        return
    p, c, r = out[0].tokens
    assert len(p) + max(len(c), len(r)) <= window
    assert p[0] == TOK.bos_id and p_full[len(p_full) - (len(p) - 1) :] == p[1:]  # BOS + the prompt's last tokens
    assert c_full[0][: len(c)] == c and c_full[1][: len(r)] == r  # completions keep their first tokens
    if len(p_full) + max(map(len, c_full)) <= window:
        assert (p, c, r) == (p_full, *c_full)  # nothing cut when it fits
    b = collate_preference(out, TOK)
    assert b["input_ids"].shape[1] <= window


def test_skip_drops_and_counts(tmp_path, capsys):
    recs = [{"prompt": "1+2=", "answer": "3"}, {"prompt": "1" * 70, "answer": "3"}, {"prompt": "2+2=", "answer": "4"}]
    p = _jsonl(tmp_path / "d.jsonl", recs)
    demos, ids, _ = fit_demos(TOK, load_pairs(str(p), "training"), Window(64), "skip")
    assert list(demos) == [("1+2=", "3"), ("2+2=", "4")] and demos.lines == [1, 3] and ids.shape[0] == 2
    assert (
        f"skipped 1 record(s) longer than the model's window of 64 tokens (first at {p}:2;" in capsys.readouterr().err
    )


def test_eval_prompts_window_subtracts_the_generation_budget():
    pairs = Located([("1" * 50, "1"), ("1" * 60, "1")], "e.jsonl", [1, 2])
    assert list(fit_prompts(TOK, pairs, model=Window(64), max_new_tokens=8, long="skip")) == [("1" * 50, "1")]


# --- tokenizer train --text-field ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, kind",
    [(None, "null"), (123456, "a number"), ({"a": 1}, "an object"), ([1], "an array"), (True, "a boolean")],
)
def test_text_field_must_be_a_string(tmp_path, capsys, value, kind):
    p = _jsonl(tmp_path / "c.jsonl", [{"t": "hello world"}, {"t": value}])
    assert (
        main(
            [
                "tokenizer",
                "train",
                "--model",
                "bpe",
                "--vocab-size",
                "40",
                "--text-field",
                "t",
                "--workers",
                "1",
                "-o",
                str(tmp_path / "tok.json"),
                str(p),
            ]
        )
        == 2
    )
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(f"{p}:2: field 't' is {kind}, expected a string (the text to train on)")
    )
    assert not (tmp_path / "tok.json").exists()


# --- untrusted text is printed escaped ----------------------------------------------------------------------


def test_printable_escapes_terminal_sequences():
    assert printable("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert printable("\x1b]0;owned\x07x") == "\\x1b]0;owned\\x07x"
    assert printable("\x9b2J\u202eevil\r\n\t") == "\\x9b2J\\u202eevil\\r\\n\\t"
    assert printable("héllo 世界 🙂 a\u200db") == "héllo 世界 🙂 a\u200db"
    assert printable("a\udcffb\x7f\u2028") == "a\\udcffb\\x7f\\u2028"  # surrogateescape bytes, DEL, LS
    assert printable("x" * 10, limit=4) == "xxxx..."


@settings(max_examples=100, deadline=None)
@given(st.text())
def test_printable_output_has_no_control_characters(s):
    out = printable(s)
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or 0xD800 <= ord(c) <= 0xDFFF for c in out)
    if all(c.isprintable() or c == " " for c in s):
        assert out == s


def test_sample_lines_and_eval_print_escape_data(checkpoint, tmp_path, capsys):
    line = sample_line({"prompt": "1+1=\x1b[2J", "completion": "\x1b]0;t\x07", "answer": "2", "correct": False})
    assert line == "  1+1=\\x1b[2J\\x1b]0;t\\x07 want 2"
    p = _jsonl(tmp_path / "e.jsonl", [{"prompt": "1+1=\x1b[2J", "answer": "2\x1b]0;title\x07"}])
    capsys.readouterr()
    assert main(["eval", str(checkpoint), "--data", str(p)]) == 0
    out = capsys.readouterr()
    assert "\x1b" not in out.out and "\x1b" not in out.err and "\x07" not in out.out
    assert "'1+1=\\x1b[2J' -> " in out.out and "want '2\\x1b]0;title\\x07'" in out.out


# --- messages -----------------------------------------------------------------------------------------------


def test_wordpiece_on_only_long_words_says_so():
    from posttrain.tokenizers import WordPieceTrainer

    with pytest.raises(UserError) as e:
        WordPieceTrainer(vocab_size=50, workers=1).train(["x" * 150, "y" * 300])
    assert str(e.value).startswith(
        "cannot train WordPiece: every word is longer than max_input_chars_per_word=100 "
        "(the longest has 300 characters)"
    )


def test_dedup_messages(tmp_path, capsys):
    (tmp_path / "adir").mkdir()
    assert main(["dedup", str(tmp_path / "adir"), "--output", str(tmp_path / "o.jsonl"), "--no-progress"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"posttrain dedup: error: {tmp_path / 'adir'} is a directory, expected "
        f"a JSONL or Parquet file (pass the files inside it)"
    )
    p = _jsonl(tmp_path / "a.jsonl", [{"txt": "hello world"}])
    assert main(["dedup", str(p), "--output", str(tmp_path / "o.jsonl"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith(
        f"{p}:1: no text field 'text' (--text-field) and no chat/preference fields ('messages', "
        f"'prompt'+'completion' or 'prompt'+'chosen'/'rejected'); the record has fields 'txt': pass "
        f"--text-field NAME to deduplicate on one of them"
    )


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"type": "char"}, "char tokenizer file has no 'alphabet' (the string of characters it encodes)"),
        ({"type": "char", "alphabet": 5}, "char tokenizer 'alphabet' must be a string, got int"),
        ({"type": "char", "alphabet": "aa"}, "char tokenizer alphabet has repeated characters"),
        ({"type": "char", "alphabet": "ab", "special_tokens": 3}, "char tokenizer file has unexpected special tokens"),
    ],
)
def test_char_tokenizer_file_errors_name_the_file(tmp_path, doc, message):
    from posttrain.tokenizers import load

    p = tmp_path / "tokenizer.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(UserError) as e:
        load(p)
    assert str(e.value) == f"{p}: {message}"


def test_dpo_and_rm_refuse_records_over_the_window_before_training(checkpoint, tmp_path, capsys):
    big = _jsonl(
        tmp_path / "big.jsonl",
        [
            {"prompt": "1+2=", "chosen": "3", "rejected": "4"},
            {"prompt": "1+2=" * 1_000_000, "chosen": "3", "rejected": "4"},
        ],
    )
    ok = _jsonl(tmp_path / "ok.jsonl", [{"prompt": "1+2=", "chosen": "3", "rejected": "4"}])
    capsys.readouterr()
    assert (
        main(
            ["dpo", "--init", str(checkpoint), "--data", str(big), "--out", str(tmp_path / "d"), "--progress", "false"]
        )
        == 2
    )
    assert (
        f"posttrain dpo: error: {big}:2: prompt has 4000000 characters (too many, checked before encoding), over "
        f"the model's window of 64 tokens (max_seq_len 64);"
    ) in capsys.readouterr().err
    long = _jsonl(tmp_path / "long.jsonl", [{"prompt": "1+2=" * 16, "chosen": "3", "rejected": "45"}])
    assert (
        main(["rm", "--data", str(ok), "--eval-data", str(long), "--out", str(tmp_path / "r"), "--progress", "false"])
        == 2
    )
    assert (
        f"posttrain rm: error: {long}:1: prompt 65 + rejected 3 = 68 tokens, over the model's window of 64 tokens "
        f"(max_seq_len 64); shorten it, or pass --long truncate"
    ) in capsys.readouterr().err
