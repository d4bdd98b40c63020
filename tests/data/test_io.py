import json

import pytest

from posttrain.data.io import ReadStats, atomic_dir, atomic_write_json, iter_jsonl, read_jsonl, recover_dir
from posttrain.errors import DataError


def test_bad_line_error_names_file_and_line(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"a": 1}\n\n{"a": 2\n')
    with pytest.raises(DataError, match=r"d.jsonl:3: not valid JSON"):
        list(iter_jsonl(f))


def test_skip_policy_writes_rejects_and_counts(tmp_path):
    f, rej = tmp_path / "d.jsonl", tmp_path / "rejects.jsonl"
    f.write_text('{"a": 1}\n[1, 2]\nnot json\n{"b": 2}\n{"a": 3}\n')
    st = ReadStats()
    got = list(iter_jsonl(f, on_bad_line="skip", rejects=rej, stats=st, required=("a",)))
    assert [r["a"] for _, r in got] == [1, 3]
    assert [ln for ln, _ in st.bad_lines] == [2, 3, 4]
    assert rej.read_text().splitlines() == ["[1, 2]", "not json", '{"b": 2}']


def test_missing_empty_and_non_utf8(tmp_path):
    with pytest.raises(DataError, match="not found"):
        read_jsonl(tmp_path / "nope.jsonl")
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(DataError, match="empty"):
        read_jsonl(tmp_path / "e.jsonl")
    (tmp_path / "b.jsonl").write_bytes(b'{"a": 1}\n\xff\xfe\n')
    with pytest.raises(DataError, match="UTF-8"):
        read_jsonl(tmp_path / "b.jsonl")


def test_atomic_dir_keeps_old_on_failure(tmp_path):
    d = tmp_path / "ckpt"
    with atomic_dir(d) as tmp:
        (tmp / "x").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_dir(d) as tmp:
            (tmp / "x").write_text("new")
            raise RuntimeError("killed mid-save")
    assert (d / "x").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temp left behind
    with atomic_dir(d) as tmp:
        (tmp / "x").write_text("new")
    assert (d / "x").read_text() == "new"


def test_recover_dir_after_interrupted_replace(tmp_path):
    d = tmp_path / "ckpt"
    old = tmp_path / "ckpt.old"
    old.mkdir()
    (old / "x").write_text("prev")
    assert (recover_dir(d) / "x").read_text() == "prev"


def test_atomic_write_json(tmp_path):
    atomic_write_json(tmp_path / "s.json", {"a": 1})
    assert json.loads((tmp_path / "s.json").read_text()) == {"a": 1}
