"""A conversation whose last turn is the user's has nothing to train on after it: refused with FILE:LINE under
``--on-bad-line error`` (the default), counted and warned about once (first FILE:LINE) under ``skip``."""

import json

import pytest

from posttrain.cli import main
from posttrain.data.conversations import ChatDemo, load_sft_data
from posttrain.errors import DataError


def _rows():
    def conv(a, end_with_user):
        m = [{"role": "user", "content": f"{a}+1?"}, {"role": "assistant", "content": str(a + 1)}]
        return {"messages": m + ([{"role": "user", "content": "and then?"}] if end_with_user else [])}

    return [conv(a, a in (2, 5)) for a in range(7)]


def _file(tmp_path):
    rows = _rows()
    f = tmp_path / "chat.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    bad = [i + 1 for i, r in enumerate(rows) if r["messages"][-1]["role"] == "user"]  # 1-based lines, by brute force
    return f, rows, bad


def test_error_names_the_first_such_line(tmp_path):
    f, _, bad = _file(tmp_path)
    with pytest.raises(DataError) as e:
        load_sft_data(str(f))
    assert str(e.value).startswith(f"{f}:{bad[0]}:") and "user turn" in str(e.value) and "\n" not in str(e.value)


def test_skip_counts_and_warns_once(tmp_path, capsys):
    f, rows, bad = _file(tmp_path)
    got = load_sft_data(str(f), on_bad_line="skip")
    assert len(got) == len(rows) - len(bad) and all(isinstance(d, ChatDemo) for d in got)
    assert all(d.messages[-1]["role"] == "assistant" for d in got)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"skipped {len(bad)} bad line(s)" in err[0] and f"line {bad[0]}" in err[0]
    rejects = tmp_path / "chat.jsonl.rejects.jsonl"
    assert len(rejects.read_text().splitlines()) == len(bad)


def test_sft_cli_refuses_by_default(tmp_path, capsys, chat_helpers):
    f, _, bad = _file(tmp_path)
    tok = chat_helpers.build_tokenizer(tmp_path / "tok")
    init = chat_helpers.init_checkpoint(tmp_path / "init", tok)
    argv = ["sft", "--init", init, "--data", str(f), "--eval-data", str(f), "--out", str(tmp_path / "run")]
    assert main([*argv, "--steps", "1", "--progress", "false"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{f.name}:{bad[0]}:" in err[0]
