"""Data files in and out: streaming JSONL with a bad-line policy, and atomic writes.

- ``iter_jsonl`` streams records one line at a time (never the whole file in memory), reading bytes and
  decoding each line on its own, so invalid UTF-8 is reported on its own line; a line over
  ``max_line_bytes`` (default 64 MiB) is rejected before it is decoded. A line that is too long, not UTF-8 or
  not a JSON object raises a :class:`DataError` naming the file and line, or, with
  ``on_bad_line="skip"``, is copied verbatim to a rejects file and counted: nothing is dropped silently.
- ``atomic_open`` / ``atomic_write_*`` write to a temporary file in the destination directory, fsync,
  then ``os.replace``: a reader sees the old file or the new one, never half of one. Only regular files
  and new paths are replaced: ``-`` is stdout and a device, FIFO or socket (``--output /dev/null``) is
  written in place as a stream; a symlink is followed, so its target is replaced and the link stays a
  link (a dangling link whose target's directory does not exist is refused: no directories are created
  where a link points). Files get the mode a plain ``open`` would give (an existing file's, else ``0666 & ~umask``).
  ``atomic_dir`` does the same for a directory (checkpoints; ``0777 & ~umask``), ``recover_dir`` undoes an
  interrupted directory replace and ``clean_stale_temps`` removes what killed writers left behind.

- ``iter_records`` reads JSONL or Parquet (``.parquet``/``.pq``, 1-based row numbers in errors) with the same
  policy, and ``load_records`` adds a per-record check (``validate(rec) -> (item, reason)``): a record
  that fails it is a bad line too (``FILE:LINE: reason``, or skipped to the rejects file), the mechanism
  every trainer's data loader shares with ``posttrain dedup``.

Not handled here: remote filesystems, preserving the owner of a file
replaced by another user (root), concurrent writers to one path (the last rename wins).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from posttrain.errors import ConfigError, DataError, UserError

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
                rec, reason = _parse_record(raw, too_long, max_line_bytes, required)
                if rec is None and reason is None:
                    stats.blank += 1
                    continue
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


def _parse_record(raw: bytes, too_long: bool, max_line_bytes: int, required: tuple[str, ...]):
    """One JSONL line -> (record, None), (None, why it is a bad line), or (None, None) for a blank line."""
    if too_long:
        return None, f"line longer than {max_line_bytes} bytes (the per-record limit), not read"
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"not valid UTF-8 ({e.reason} at byte {e.start + 1})"
    if not line.strip():
        return None, None
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        return None, f"not valid JSON ({e.msg} at column {e.colno})"
    except (ValueError, RecursionError) as e:  # an integer of > 4300 digits; nesting too deep
        return None, f"not valid JSON ({_json_limit(e)})"
    if not isinstance(rec, dict):
        return None, f"expected a JSON object, got {type(rec).__name__}"
    missing = [k for k in required if k not in rec]
    if missing:
        return None, f"missing field {missing[0]!r} (needs {', '.join(required)})"
    return rec, None


def is_parquet(path: str | Path) -> bool:
    return str(path).lower().endswith((".parquet", ".pq"))


def rejects_path(path: str | Path) -> str:
    """Where ``--on-bad-line skip`` writes the bad lines of a data file: beside it, ``FILE.rejects.jsonl``."""
    return str(path) + ".rejects.jsonl"


def _iter_parquet(p: Path, *, on_bad_line, rej, stats: ReadStats, required: tuple[str, ...]):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{p}: reading Parquet needs pyarrow: pip install 'posttrain[parquet]'") from None
    try:
        batches = pq.ParquetFile(p).iter_batches(batch_size=1024)
        row = 0
        for rb in batches:
            for rec in rb.to_pylist():
                row += 1
                stats.lines += 1
                missing = [k for k in required if rec.get(k) is None]
                if missing:
                    reason = f"missing field {missing[0]!r} (needs {', '.join(required)})"
                    if on_bad_line == "error":
                        raise DataError(f"{p}:{row}: {reason}")
                    stats.bad_lines.append((row, reason))
                    if rej is not None:
                        rej.write((json.dumps(rec, ensure_ascii=False, default=str) + "\n").encode())
                    continue
                stats.records += 1
                yield row, rec
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - pyarrow's errors on a file that is not Parquet
        raise DataError(f"{p}: not a readable Parquet file ({type(e).__name__}: {str(e).splitlines()[0]})") from None


def iter_records(
    path: str | Path,
    *,
    on_bad_line: BadLinePolicy = "error",
    rejects: str | Path | None = None,
    stats: ReadStats | None = None,
    required: Iterable[str] = (),
) -> Iterator[tuple[int, dict[str, Any]]]:
    """:func:`iter_jsonl`, or for a ``.parquet``/``.pq`` file its rows as dicts (``line`` = 1-based row);
    a Parquet row missing a required field (or holding null there) is a bad line, written to ``rejects``
    as a JSON line under ``skip``."""
    p = Path(path)
    if not is_parquet(p):
        yield from iter_jsonl(p, on_bad_line=on_bad_line, rejects=rejects, stats=stats, required=required)
        return
    if not p.exists():
        raise DataError(f"data file not found: {p}")
    stats = stats if stats is not None else ReadStats()
    rej = open(rejects, "wb") if (rejects and on_bad_line == "skip") else None
    try:
        yield from _iter_parquet(p, on_bad_line=on_bad_line, rej=rej, stats=stats, required=tuple(required))
    finally:
        if rej is not None:
            rej.close()


def load_records(
    path: str | Path,
    validate,
    *,
    required: Iterable[str] = (),
    on_bad_line: BadLinePolicy = "error",
    rejects: str | Path | None = None,
    stats: ReadStats | None = None,
    what: str = "data",
    allow_empty: bool = False,
    warn=None,
) -> tuple[list, list[int]]:
    """Read ``path`` (JSONL or Parquet) and check each record: ``validate(rec) -> (item, None)`` or
    ``(None, reason)``. Returns (items, their line numbers).

    A record that is malformed, lacks a ``required`` field or fails ``validate`` raises a DataError
    ``FILE:LINE: reason``; with ``on_bad_line="skip"`` it is written to ``rejects`` (default
    :func:`rejects_path`) and counted in ``stats.bad_lines``, and one warning says how many and where.
    """
    if on_bad_line not in ("error", "skip"):
        raise DataError(f"on_bad_line={on_bad_line!r}: choose 'error' or 'skip'")
    stats = stats if stats is not None else ReadStats()
    rej_path = (rejects or rejects_path(path)) if on_bad_line == "skip" else None
    items, lines, late = [], [], []
    for line_no, rec in iter_records(path, on_bad_line=on_bad_line, rejects=rej_path, stats=stats, required=required):
        try:
            item, reason = validate(rec)
        except ConfigError as e:  # not the record's fault (no chat template): never skipped
            raise ConfigError(f"{path}:{line_no}: {e}") from None
        except DataError as e:  # the record cannot be rendered (a template refusing it): a bad line
            item, reason = None, str(e)
        if reason is not None:
            if on_bad_line == "error":
                raise DataError(f"{path}:{line_no}: {reason}")
            stats.records -= 1
            stats.bad_lines.append((line_no, reason))
            late.append(rec)
            continue
        items.append(item)
        lines.append(line_no)
    if late:  # records that parsed but failed the check: appended to the rejects file iter_records wrote
        with open(rej_path, "a", encoding="utf-8") as fh:
            for rec in late:
                fh.write(json.dumps(rec, ensure_ascii=False, default=str) + "\n")
    if stats.bad_lines:
        first = min(stats.bad_lines)
        (warn or _warn)(
            f"{what} data {path}: skipped {len(stats.bad_lines)} bad line(s) (first: line {first[0]}: "
            f"{first[1]}); written to {rej_path}"
        )
    if not items and not allow_empty:
        raise DataError(f"{path}: no usable {what} records" + (" (every line was bad)" if stats.bad_lines else ""))
    return items, lines


def _warn(msg: str) -> None:
    print(f"posttrain: warning: {msg}", file=sys.stderr)


def read_jsonl(
    path: str | Path, *, required: Iterable[str] = (), allow_empty: bool = False, max_line_bytes: int = MAX_LINE_BYTES
) -> list[dict[str, Any]]:
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


def _umask() -> int:
    """The process umask, read without changing it where /proc allows (os.umask is set-and-return)."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_target(path: str | Path) -> tuple[Path | None, bool]:
    """Where a write to ``path`` goes: ``(real path, atomic?)``; ``(None, False)`` means stdout (``-``).

    A symlink is followed to the file it names (so the link stays a link and its target is replaced);
    an existing target that is not a regular file (a character device such as ``/dev/null``, a FIFO,
    a socket) is written as a stream, in place; a regular file or a new path is written atomically.
    """
    if str(path) == "-":
        return None, False
    p = Path(path)
    try:
        st = os.stat(p)  # follows symlinks
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        return p, False  # open() follows a link itself (a link to /proc/self/fd/1 may name a pipe)
    return (link_target(p) if p.is_symlink() else p), True


def link_target(link: Path) -> Path:
    """Where symlink ``link`` leads (fully resolved); a one-line UserError when its target's directory does not
    exist: writing through a dangling link never creates the directories it points into.

    Example: ``out.jsonl -> /data/gone/out.jsonl`` with no ``/data/gone`` -> "out.jsonl is a symbolic link to
    /data/gone/out.jsonl, whose directory does not exist: refusing to create it; fix the link or write elsewhere"."""
    real = Path(os.path.realpath(link))
    if not real.parent.is_dir():
        raise UserError(
            f"{link} is a symbolic link to {real}, whose directory does not exist: refusing to create it; fix the "
            f"link or write elsewhere"
        )
    return real


def sidecar(output: str | Path, suffix: str) -> str | None:
    """The default path of a file written beside ``output`` (``kept.jsonl`` -> ``kept.jsonl.stats.json``),
    or None when ``output`` is stdout or a device/FIFO: ``--output /dev/null`` must not create
    ``/dev/null.stats.json``."""
    real, atomic = write_target(output)
    return str(output) + suffix if atomic else None


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", encoding: str | None = "utf-8"):
    """Open ``path`` for writing so that a reader never sees half a file (see :func:`write_target`).

    Regular files and new paths: a temp file ``.NAME.XXXXXXXX.tmp`` beside the target, fsynced and
    renamed onto it on clean exit (removed on an exception). It gets the permissions the target would
    get from a plain ``open``: an existing file's mode, or ``0666 & ~umask`` for a new one (not
    mkstemp's 0600). ``-`` is stdout and a device/FIFO/socket is opened and written in place: no
    rename, so ``--output /dev/null`` never replaces the device.
    """
    target, atomic = write_target(path)
    binary = "b" in mode
    enc = None if binary else encoding
    if target is None:  # stdout: written through, never closed
        fh = sys.stdout.buffer if binary else sys.stdout
        yield fh
        fh.flush()
        return
    if not atomic:
        with open(target, mode, encoding=enc) as fh:
            yield fh
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        perm = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        perm = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, perm)
        with os.fdopen(fd, mode, encoding=enc) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
        _fsync_dir(target.parent)
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


def _usual_modes(root: Path) -> None:
    """Give a directory tree the modes plain mkdir/open would: 0777/0666 & ~umask (mkdtemp makes 0700, and
    safetensors writes its files 0600)."""
    mask = _umask()
    os.chmod(root, 0o777 & ~mask)
    for dirpath, dirnames, filenames in os.walk(root):  # does not descend into symlinked directories
        for names, mode in ((dirnames, 0o777), (filenames, 0o666)):
            for name in names:
                path = os.path.join(dirpath, name)
                if not os.path.islink(path):
                    os.chmod(path, mode & ~mask)


@contextlib.contextmanager
def atomic_dir(path: str | Path):
    """Yield a temp directory beside ``path``; on clean exit it is renamed to ``path``.

    If ``path`` already exists it is replaced: the old one is first renamed aside and removed only
    after the new one is in place, so a kill at any moment leaves a complete directory at ``path``
    or at ``path`` + ``.old`` (which :func:`recover_dir` puts back). A symlink at ``path`` is followed
    (its target is replaced, the link stays). The tree gets the usual modes, ``0777``/``0666 & ~umask``
    (not mkdtemp's 0700, nor the 0600 some writers use), so other users can read a checkpoint.
    """
    p = Path(path)
    if p.is_symlink():
        p = link_target(p)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent))
    try:
        yield tmp
        _usual_modes(tmp)
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
    if not p.exists() and old.is_dir() and not old.is_symlink():
        os.replace(old, p)
    return p


_TEMP_NAME = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")  # what atomic_open / atomic_dir create (mkstemp's names)


def clean_stale_temps(directory: str | Path) -> list[str]:
    """Remove what killed writers left in ``directory``: ``.NAME.XXXXXXXX.tmp`` files and directories,
    and ``NAME.old`` directories whose ``NAME`` is complete again. Symlinks are unlinked, never followed.
    Call it only where no other writer is active (a run's own directory at start). Returns the names removed.
    """
    d = Path(directory)
    removed = []
    if not d.is_dir():
        return removed
    for entry in sorted(d.iterdir()):
        name = entry.name
        stale_old = name.endswith(".old") and entry.is_dir() and (d / name[:-4]).exists()
        if not (_TEMP_NAME.fullmatch(name) or stale_old):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
        removed.append(name)
    return removed
