"""Disk and pipe faults at the CLI boundary: one line on stderr and exit 2, or a quiet exit 141 on a closed pipe.

Permissions are not enforced for root (these tests may run as root), so a read-only or full disk is made by
raising the OSError the kernel would raise (monkeypatched in-process); paths under a file (ENOTDIR), an
``--out`` that is a file (EEXIST), ``/dev/full`` and a pipe closed early are real.
"""

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

import posttrain
from posttrain.cli import as_os_error, describe_os_error, main

ROOT = str(Path(posttrain.__file__).resolve().parent.parent)
SFT = [
    "--preset",
    "tiny",
    "--restarts",
    "1",
    "--steps",
    "1",
    "--batch-size",
    "8",
    "--eval-every",
    "0",
    "--progress",
    "false",
    "--model.n-layer",
    "1",
    "--model.d-model",
    "32",
    "--model.n-head",
    "2",
    "--task.num-demos",
    "8",
    "--task.num-eval",
    "4",
]


def _one_error_line(capsys, expected: str) -> None:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert err.splitlines()[-1] == expected, err


@pytest.fixture
def tok(tmp_path):
    """A small BPE tokenizer and a corpus whose encoding is far larger than a pipe's buffer (64 KiB)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"{i} hello world foo bar\n" for i in range(20000)))
    path = tmp_path / "tok.json"
    assert main(["tokenizer", "train", "--model", "bpe", "--vocab-size", "40", "--output", str(path), str(corpus)]) == 0
    return path, corpus


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return [sys.executable, "-m", "posttrain", *map(str, args)], env


def test_broken_pipe_exits_quietly_with_141(tok):
    """`posttrain tokenizer encode ... | head -1`: the reader goes away after one line."""
    path, corpus = tok
    cmd, env = _cli("tokenizer", "encode", "--tokenizer", path, corpus)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()  # as `head -1` exits
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141, err
    assert first.strip() and err == b""  # no traceback, no "Exception ignored", no progress line


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("big", [True, False], ids=["while_writing", "at_the_final_flush"])
def test_stdout_to_dev_full_is_one_line(tok, tmp_path, big):
    path, corpus = tok
    if not big:  # small enough to sit in the stdout buffer until the final flush
        corpus = tmp_path / "small.txt"
        corpus.write_text("hello\n")
    cmd, env = _cli("tokenizer", "encode", "--tokenizer", path, corpus)
    with open("/dev/full", "wb") as full:
        proc = subprocess.run(cmd, env=env, stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr == f"posttrain tokenizer: error: writing standard output: {os.strerror(errno.ENOSPC)}\n"


def test_out_that_is_a_file(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("x")
    assert main(["sft", *SFT, "--out", str(f)]) == 2
    # the run-directory check refuses it before anything is written (trainers/run_dir.py)
    _one_error_line(capsys, f"posttrain sft: error: --out {f} exists and is not a directory")
    assert f.read_text() == "x"


def test_out_under_a_file(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("x")
    assert (
        main(
            [
                "tokenizer",
                "train",
                "--model",
                "bpe",
                "--vocab-size",
                "30",
                "--output",
                str(f / "sub" / "t.json"),
                str(f),
            ]
        )
        == 2
    )
    # the atomic writer looks at the target first (a regular file, a device or new?): the kernel names it
    _one_error_line(
        capsys, f"posttrain tokenizer: error: {f / 'sub' / 't.json'}: {os.strerror(errno.ENOTDIR)} ({f} is a file)"
    )


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES, errno.ENOSPC])
def test_out_dir_that_cannot_be_created(tmp_path, capsys, monkeypatch, code):
    """A read-only file system, a directory without write permission, a full disk: as the kernel reports them."""
    (tmp_path / "ro").mkdir()  # the mount point exists; nothing can be made inside it
    out = tmp_path / "ro" / "run"
    real = os.mkdir

    def mkdir(p, *a, **kw):
        if str(p).startswith(str(tmp_path / "ro")):
            raise OSError(code, os.strerror(code), str(p))
        return real(p, *a, **kw)

    monkeypatch.setattr(os, "mkdir", mkdir)
    assert main(["sft", *SFT, "--out", str(out)]) == 2
    _one_error_line(capsys, f"posttrain sft: error: {out}: {os.strerror(code)}")


def test_disk_full_while_writing_an_open_file_names_it(tmp_path, capsys, monkeypatch):
    """f.write() raises ENOSPC without a filename: the boundary names the open file (the temp name of an
    atomic write is shown as its target)."""
    import posttrain.cli.tokenizer as tokenizer_cli

    target = tmp_path / ".tok.json.abc123_x.tmp"

    def run(args):
        with open(target, "w") as f:
            f.write("partial")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(tokenizer_cli, "run", run)
    assert main(["tokenizer", "encode", "--tokenizer", "t.json"]) == 2
    _one_error_line(capsys, f"posttrain tokenizer: error: writing {tmp_path / 'tok.json'}: {os.strerror(errno.ENOSPC)}")


def test_library_io_errors_become_os_errors(tmp_path):
    """safetensors and torch.save wrap a full disk in their own exception types."""
    from safetensors import SafetensorError

    def save_file(filename):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    with pytest.raises(SafetensorError) as info:
        save_file(str(tmp_path / "model.safetensors"))
    e = as_os_error(info.value)
    assert describe_os_error(e) == f"{tmp_path / 'model.safetensors'}: {os.strerror(errno.ENOSPC)}"

    def torch_save(f):  # on a disk with room the cause is unknown: reported as EIO with torch's words
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")

    with pytest.raises(RuntimeError) as info:
        torch_save(tmp_path / "optimizer.pt")
    assert describe_os_error(as_os_error(info.value)) == (
        f"{tmp_path / 'optimizer.pt'}: write failed ([enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534)"
    )
    assert (
        as_os_error(RuntimeError("PytorchStreamReader failed reading zip archive")) is None
    )  # a corrupt file: not I/O
    assert as_os_error(ValueError("x")) is None


def test_a_bug_keeps_its_traceback(monkeypatch):
    import posttrain.cli.tokenizer as tokenizer_cli

    monkeypatch.setattr(tokenizer_cli, "run", lambda args: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        main(["tokenizer", "encode", "--tokenizer", "t.json"])


def test_posttrain_traceback_keeps_the_traceback_of_io_errors(tmp_path, monkeypatch):
    f = tmp_path / "afile"
    f.write_text("x")
    monkeypatch.setenv("POSTTRAIN_TRACEBACK", "1")
    with pytest.raises(NotADirectoryError):
        main(["tokenizer", "train", "--model", "bpe", "--vocab-size", "30", "--output", str(f / "t.json"), str(f)])
