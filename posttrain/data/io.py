"""Data files in and out: streaming JSONL with a bad-line policy, and atomic writes.

- ``iter_jsonl`` streams records one line at a time (never the whole file in memory), reading bytes and
  decoding each line on its own, so invalid UTF-8 is reported on its own line; a line over
  ``max_line_bytes`` (default 64 MiB) is rejected before it is decoded. A line that is too long, not UTF-8 or
  not a JSON object raises a :class:`DataError` naming the file and line, or, with
  ``on_bad_line="skip"``, is copied verbatim to a rejects file and counted: nothing is dropped silently.
- ``atomic_write_*`` write to a temporary file in the destination directory, fsync, then ``os.replace``:
  a reader sees the old file or the new one, never half of one. ``atomic_dir`` does the same for a
  directory (checkpoints).

Not handled here: Parquet (see the dedup I/O), remote filesystems.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from posttrain.errors import DataError

BadLinePolicy = Literal["error", "skip"]


@dataclass
class ReadStats:
    """Counts kept while streaming a file; ``bad_lines`` holds (line_no, reason) of skipped lines."""

    lines: int = 0
    records: int = 0
    blank: int = 0
    bad_lines: list[tuple[int, str]] = field(default_factory=list)


MAX_LINE_BYTES = 64 << 20
"""Default cap on one JSONL line (64 MiB): a longer line is a bad line, rejected before it is decoded or
parsed, so one huge record cannot exhaust memory. ``iter_jsonl(max_line_bytes=...)`` changes it."""


def _json_limit(e: Exception) -> str:
    """What a JSON parser limit error means, in one line (Python's int-digits limit; recursion depth)."""
    return "nested too deeply" if isinstance(e, RecursionError) else str(e).split(":")[0].lower()


def _read_line(fh, cap: int) -> tuple[bytes, bool]:
    """One line of a binary file, at most ``cap`` bytes kept: (bytes, too_long). A too-long line is read
    to its end in bounded chunks and dropped; the returned bytes are then just its first ``cap``."""
    line = fh.readline(cap + 1)
    if len(line) <= cap or line.endswith(b"\n"):
        return line, False
    head = line[:cap]
    while line and not line.endswith(b"\n"):
        line = fh.readline(1 << 20)
    return head, True


def iter_jsonl(
    path: str | Path,
    *,
    on_bad_line: BadLinePolicy = "error",
    rejects: str | Path | None = None,
    stats: ReadStats | None = None,
    required: Iterable[str] = (),
    max_line_bytes: int = MAX_LINE_BYTES,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_no, record)`` for each JSON object line of ``path`` (1-based line numbers).

    Blank lines are ignored. ``required`` names keys every record must have: a record without one is
    a bad line like malformed JSON. With ``on_bad_line="skip"`` bad lines go to ``rejects`` (if given).
    Each line is read as bytes and decoded on its own, so invalid UTF-8 is reported on its own line; a
    line over ``max_line_bytes`` is a bad line (in ``rejects`` only its first ``max_line_bytes`` bytes).
    """
    p = Path(path)
    if not p.exists():
        raise DataError(f"data file not found: {p}")
    if p.is_dir():
        raise DataError(f"{p} is a directory, expected a JSONL file")
    if on_bad_line not in ("error", "skip"):
        raise DataError(f"on_bad_line={on_bad_line!r}: choose 'error' or 'skip'")
    required = tuple(required)
    stats = stats if stats is not None else ReadStats()
    rej = open(rejects, "wb") if (rejects and on_bad_line == "skip") else None
    try:
        with open(p, "rb") as fh:
            line_no = 0
            while True:
                raw, too_long = _read_line(fh, max_line_bytes)
                if not raw:
                    break
                line_no += 1
                stats.lines += 1
                reason = None
                if too_long:
                    reason = f"line longer than {max_line_bytes} bytes (the per-record limit), not read"
                else:
                    try:
                        line = raw.decode("utf-8")
                    except UnicodeDecodeError as e:
                        reason = f"not valid UTF-8 ({e.reason} at byte {e.start + 1})"
                if reason is None:
                    if not line.strip():
                        stats.blank += 1
                        continue
                    try:
                        rec = json.loads(line)
                        if not isinstance(rec, dict):
                            reason = f"expected a JSON object, got {type(rec).__name__}"
                        else:
                            missing = [k for k in required if k not in rec]
                            if missing:
                                reason = f"missing field {missing[0]!r} (needs {', '.join(required)})"
                    except json.JSONDecodeError as e:
                        reason = f"not valid JSON ({e.msg} at column {e.colno})"
                    except (ValueError, RecursionError) as e:  # an integer of > 4300 digits; nesting too deep
                        reason = f"not valid JSON ({_json_limit(e)})"
                if reason is not None:
                    if on_bad_line == "error":
                        raise DataError(f"{p}:{line_no}: {reason}")
                    stats.bad_lines.append((line_no, reason))
                    if rej is not None:
                        rej.write(raw if raw.endswith(b"\n") else raw + b"\n")
                    continue
                stats.records += 1
                yield line_no, rec
    finally:
        if rej is not None:
            rej.close()


def read_jsonl(path: str | Path, *, required: Iterable[str] = (), allow_empty: bool = False,
               max_line_bytes: int = MAX_LINE_BYTES) -> list[dict[str, Any]]:
    """All records of a (small) JSONL file; raises DataError on a bad line or, unless allowed, no records."""
    recs = [r for _, r in iter_jsonl(path, required=required, max_line_bytes=max_line_bytes)]
    if not recs and not allow_empty:
        raise DataError(f"{path}: no records (the file is empty)")
    return recs


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", encoding: str | None = "utf-8"):
    """Open a temp file beside ``path``; on clean exit fsync and rename it onto ``path``."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
        _fsync_dir(p.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_open(path, "w") as fh:
        fh.write(text)


def atomic_write_json(path: str | Path, obj: Any, indent: int | None = 2) -> None:
    atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=False, default=str) + "\n")


def atomic_write_jsonl(path: str | Path, records: Iterable[dict]) -> int:
    n = 0
    with atomic_open(path, "w") as fh:
        for r in records:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
            n += 1
    return n


@contextlib.contextmanager
def atomic_dir(path: str | Path):
    """Yield a temp directory beside ``path``; on clean exit it is renamed to ``path``.

    If ``path`` already exists it is replaced: the old one is first renamed aside and removed only
    after the new one is in place, so a kill at any moment leaves a complete directory at ``path``
    or at ``path`` + ``.old`` (which :func:`recover_dir` puts back).
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent))
    try:
        yield tmp
        _fsync_dir(tmp)
        old = p.with_name(p.name + ".old")
        if p.exists():
            if old.exists():
                shutil.rmtree(old)
            os.replace(p, old)
        os.replace(tmp, p)
        _fsync_dir(p.parent)
        if old.exists():
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def recover_dir(path: str | Path) -> Path:
    """If a replace was interrupted after moving ``path`` aside, move it back. Returns ``path``."""
    p = Path(path)
    old = p.with_name(p.name + ".old")
    if not p.exists() and old.exists():
        os.replace(old, p)
    return p
