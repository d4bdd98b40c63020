import json
import os
import stat
import threading
from pathlib import Path

import pytest

from posttrain.data.io import (
    ReadStats,
    atomic_dir,
    atomic_open,
    atomic_write_json,
    atomic_write_jsonl,
    atomic_write_text,
    clean_stale_temps,
    iter_jsonl,
    read_jsonl,
    recover_dir,
    write_target,
)
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


# ---------------------------------------------------------------------------------------------
# atomic writes: what they may replace, and the modes they leave


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(p):
    return stat.S_IMODE(os.stat(p).st_mode)


def test_atomic_files_and_dirs_get_the_usual_modes(tmp_path, umask_022):
    atomic_write_text(tmp_path / "a.txt", "x")
    assert _mode(tmp_path / "a.txt") == 0o644  # not mkstemp's 0600
    with atomic_dir(tmp_path / "ckpt") as tmp:
        (tmp / "sub").mkdir()
        (tmp / "w.bin").write_bytes(b"w")
        os.chmod(tmp / "w.bin", 0o600)  # as safetensors writes its files
    assert _mode(tmp_path / "ckpt") == 0o755 and _mode(tmp_path / "ckpt" / "sub") == 0o755
    assert _mode(tmp_path / "ckpt" / "w.bin") == 0o644
    os.umask(0o027)
    atomic_write_text(tmp_path / "b.txt", "x")
    assert _mode(tmp_path / "b.txt") == 0o640
    os.chmod(tmp_path / "a.txt", 0o600)  # replacing a file keeps the mode its owner gave it
    atomic_write_text(tmp_path / "a.txt", "y")
    assert _mode(tmp_path / "a.txt") == 0o600 and (tmp_path / "a.txt").read_text() == "y"


def test_symlink_target_is_replaced_and_the_link_stays(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    atomic_write_json(link, {"a": 1})
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text()) == {"a": 1}
    real_dir = tmp_path / "real_ckpt"
    with atomic_dir(real_dir) as tmp:
        (tmp / "x").write_text("old")
    (tmp_path / "ckpt").symlink_to(real_dir)
    with atomic_dir(tmp_path / "ckpt") as tmp:
        (tmp / "x").write_text("new")
    assert (tmp_path / "ckpt").is_symlink() and (real_dir / "x").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "link.json", "real.json", "real_ckpt"]


def test_fifo_is_written_as_a_stream(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()), daemon=True)
    reader.start()
    n = atomic_write_jsonl(fifo, [{"a": 1}, {"b": 2}])
    reader.join(timeout=10)
    assert n == 2 and got == ['{"a": 1}\n{"b": 2}\n']
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # still a FIFO, not replaced by a regular file
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]


def test_character_device_and_link_to_it_are_written_in_place(tmp_path):
    if os.geteuid() == 0:  # root could replace /dev/null if this regressed: use a private null device
        dev = tmp_path / "null"
        try:
            os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        except OSError:
            pytest.skip("cannot mknod here")
    else:
        dev = Path("/dev/null")  # not writable by a plain user's rename: a regression fails, never replaces it
    link = tmp_path / "out.jsonl"
    link.symlink_to(dev)
    for target in (dev, link):
        with atomic_open(target, "wb") as fh:
            fh.write(b"discarded\n")
    assert stat.S_ISCHR(os.lstat(dev).st_mode) and link.is_symlink()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_dash_is_stdout(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    atomic_write_jsonl("-", [{"a": 1}])
    assert capsys.readouterr().out == '{"a": 1}\n'
    assert not (tmp_path / "-").exists()
    assert write_target("-") == (None, False)


def test_clean_stale_temps_removes_only_what_killed_writers_leave(tmp_path):
    (tmp_path / ".model.k2x_9abc.tmp").mkdir()  # a killed atomic_dir
    (tmp_path / ".model.k2x_9abc.tmp" / "model.safetensors").write_bytes(b"half")
    (tmp_path / ".latest.ab12cd34.tmp").write_text("step-")  # a killed atomic_open
    (tmp_path / "step-00000002").mkdir()
    (tmp_path / "step-00000002.old").mkdir()  # killed after the new one was in place
    (tmp_path / "step-00000004.old").mkdir()  # killed before: recover_dir's job, kept
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir(exist_ok=True)
    (outside / "keep").write_text("x")
    (tmp_path / ".link.abcdefgh.tmp").symlink_to(outside)
    for name in (".hidden.tmp", "notes.tmp", ".x.short.tmp"):
        (tmp_path / name).write_text("user file")
    removed = clean_stale_temps(tmp_path)
    assert removed == [".latest.ab12cd34.tmp", ".link.abcdefgh.tmp", ".model.k2x_9abc.tmp", "step-00000002.old"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".hidden.tmp",
        ".x.short.tmp",
        "notes.tmp",
        "step-00000002",
        "step-00000004.old",
    ]
    assert (outside / "keep").read_text() == "x"  # the link was removed, not followed


def test_sidecar_files_never_go_beside_a_device_or_stdout(tmp_path):
    from posttrain.data.io import sidecar

    assert sidecar(tmp_path / "kept.jsonl", ".stats.json") == str(tmp_path / "kept.jsonl") + ".stats.json"
    assert sidecar("-", ".stats.json") is None
    assert sidecar("/dev/null", ".stats.json") is None


def test_dedup_to_dev_null_writes_nothing_beside_it(tmp_path, capsys):
    import os

    from posttrain.cli import main

    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "a b c d e f"}\n{"text": "a b c d e f"}\n')
    before = set(os.listdir("/dev"))
    assert main(["dedup", str(src), "--output", "/dev/null"]) == 0
    assert set(os.listdir("/dev")) == before
    assert "stats ->" not in capsys.readouterr().out
    assert main(["dedup", str(src), "--output", "/dev/null", "--on-bad-line", "skip"]) == 2
    assert "needs --rejects FILE" in capsys.readouterr().err
