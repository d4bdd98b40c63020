"""One writer per run directory: an exclusive ``flock`` on the directory while a process writes into it.

A trainer takes the lock on its ``--out`` when it starts writing (:func:`posttrain.trainers.run_dir.begin_run`),
the pipeline on its ``--out`` for the whole invocation (and on a stage directory while it clears it). A second
process that would write the same directory gets one line naming the holder, and exit status 2::

    runs/sft is in use by another posttrain process (pid 4242): wait for it to finish, or stop it

The lock is ``fcntl.flock(LOCK_EX)`` on the directory itself (an ``O_RDONLY`` descriptor of it), not on a file
inside it: nothing is written, so a lock leaves no file behind to list, digest, clear or clean up after a
``kill -9``, and the kernel drops it when the holder exits however it exits, so a resume is never blocked by a
dead writer. The holder's pid is read from ``/proc/locks``. Within one process the lock is re-entrant (counted):
the pipeline clears a stage directory and then runs the stage's trainer in the same process; a
:class:`DirLock` lets go on :meth:`DirLock.release`, when it is garbage-collected, or at exit.

Not handled: filesystems where ``flock`` on a directory fails (some network filesystems): there the directory is
left unlocked rather than the run refused; a directory replaced by another one (``rm -rf`` and ``mkdir``) while
locked is a new directory, with its own lock; the holder's pid where ``/proc/locks`` cannot be read (non-Linux).
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import weakref
from pathlib import Path

from posttrain.errors import UserError

_HELD: dict[tuple[int, int], list[int]] = {}  # (st_dev, st_ino) of a locked directory -> [fd, holders]
_GUARD = threading.Lock()
_UNSUPPORTED = (errno.EBADF, errno.EINVAL, errno.ENOLCK, errno.EOPNOTSUPP)


def _id(d: Path) -> tuple[int, int]:
    st = os.stat(d)
    return st.st_dev, st.st_ino


def holder_pid(d: str | Path) -> int | None:
    """The pid holding an exclusive ``flock`` on directory ``d`` according to ``/proc/locks``, else None.

    A line reads ``1: FLOCK  ADVISORY  WRITE 4242 fe:00:2147622 0 EOF`` (pid, then major:minor:inode)."""
    dev, ino = _id(Path(d))
    exact = f"{os.major(dev):02x}:{os.minor(dev):02x}:{ino}"
    found = None
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) < 6 or parts[1] != "FLOCK" or parts[3] != "WRITE" or not parts[4].isdigit():
                    continue
                if parts[5] == exact:
                    return int(parts[4])
                if parts[5].rsplit(":", 1)[-1] == str(ino):  # another device numbering (overlay filesystems)
                    found = int(parts[4])
    except OSError:
        return None
    return found


def _busy(d: Path) -> UserError:
    pid = holder_pid(d)
    who = f"pid {pid}" if pid is not None else "pid unknown"
    return UserError(f"{d} is in use by another posttrain process ({who}): wait for it to finish, or stop it")


class DirLock:
    """A held lock on one directory (counted within this process); :meth:`release` lets it go."""

    def __init__(self, path: Path, ident: tuple[int, int], entry: list[int]):
        self.path = path
        self._finalizer = weakref.finalize(self, _release, ident, entry)

    def release(self) -> None:
        self._finalizer()

    def __enter__(self) -> DirLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def lock_dir(d: str | Path) -> DirLock:
    """Take the exclusive lock on the existing directory ``d``; a UserError naming the holder when another
    process has it. Re-entrant within this process."""
    d = Path(d)
    ident = _id(d)
    with _GUARD:
        held = _HELD.get(ident)
        if held is not None and os.fstat(held[0]).st_nlink == 0:
            del _HELD[ident]  # the directory held was deleted and its inode number reused: a new directory
            held = None
        if held is not None:
            held[1] += 1
            return DirLock(d, ident, held)
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _busy(d) from None
        except OSError as e:
            if e.errno not in _UNSUPPORTED:
                os.close(fd)
                raise
            # a filesystem without flock on directories: held as a no-op (see the module docstring)
        entry = _HELD[ident] = [fd, 1]
        return DirLock(d, ident, entry)


def _release(ident: tuple[int, int], entry: list[int]) -> None:
    with _GUARD:
        entry[1] -= 1
        if entry[1] == 0:
            if _HELD.get(ident) is entry:
                del _HELD[ident]
            os.close(entry[0])  # closing the last descriptor drops the flock


def check_free(d: str | Path) -> None:
    """Raise the one-line UserError if another process holds ``d``'s lock; take nothing, write nothing.
    (A missing directory is free.)"""
    d = Path(d)
    if not d.is_dir():
        return
    ident = _id(d)
    with _GUARD:
        if ident in _HELD and os.fstat(_HELD[ident][0]).st_nlink > 0:
            return
        try:
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return  # unreadable: whatever refuses it next says why
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _busy(d) from None
        except OSError:
            pass
        finally:
            os.close(fd)
