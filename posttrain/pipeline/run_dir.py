"""The pipeline's run directory: which ``--out`` it may write, and which stage directories it may clear.

The rules (the trainers' own, :mod:`posttrain.trainers.run_dir`, carried over to a run of many stages):

- ``--out`` is new, empty, or a pipeline run: it holds ``.pipeline/`` (the runner's state, created on the first
  invocation), or only stage directories the pipeline finished (each with a ``DONE.json``: stages copied in from
  another run). Anything else is refused with one line: a finished ``posttrain sft`` run (``summary.json`` and
  no ``.pipeline/``), a directory of the user's files, a system directory (``/dev``, ``/proc``, ``/sys``);
- the runner holds ``--out``'s lock (:mod:`posttrain.run_lock`) for the whole invocation: a second pipeline (or a
  trainer) into it is one line naming the first one's pid;
- a stage directory is cleared before its stage runs again only when every file in it was written by the
  pipeline: a file its ``DONE.json`` lists (:func:`posttrain.pipeline.cache.manifest`), or, for a stage whose
  last run did not finish, a file written since that run started. Any other file (``sft/notes.txt``) stops the
  run with one line naming it, and nothing is deleted. Clearing takes the stage directory's lock, so a trainer
  still writing it (a worker of a killed pipeline) is named rather than deleted from under.

Not handled: a file the user writes into a stage directory *while* that stage's run is unfinished (it is then
taken for the stage's own); a stage directory that is a symlink is refused rather than cleared.
"""

from __future__ import annotations

import calendar
import os
import shutil
import time
from pathlib import Path

from posttrain import run_lock
from posttrain.errors import UserError
from posttrain.pipeline import cache

SYSTEM_DIRS = ("/dev", "/proc", "/sys")
ALLOWED_UNDER_SYSTEM = ("/dev/shm",)  # a RAM disk users choose on purpose
SLACK_S = 2.0  # filesystem timestamp granularity, and DONE.json's one-second "finished"


def system_dir(out: Path) -> str | None:
    """The system directory ``out`` lies in (``/dev``, ``/proc``, ``/sys``, or ``/`` itself), else None."""
    real = os.path.realpath(out)
    if real == "/":
        return "/"
    for allowed in ALLOWED_UNDER_SYSTEM:
        if real == allowed or real.startswith(allowed + "/"):
            return None
    for d in SYSTEM_DIRS:
        if real == d or real.startswith(d + "/"):
            return d
    return None


def _shown(names: list[str]) -> str:
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def check_out(out: Path, stage_names) -> None:
    """Refuse an ``--out`` the pipeline may not write (see the module docstring); write nothing."""
    where = system_dir(out)
    if where is not None:
        raise UserError(f"--out {out}: {where} is a system directory; choose a directory of your own")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a directory")
    if not out.is_dir():
        return
    run_lock.check_free(out)
    entries = sorted(e.name for e in out.iterdir())
    if not entries or (out / cache.STATE_DIR).is_dir():
        return
    if all(n in stage_names and (out / n / cache.DONE_FILE).is_file() for n in entries):
        return  # finished stages copied in from another run
    run = cache.read_json(out / "run.json")
    if run is not None or (out / "summary.json").is_file():
        trainer = (run or {}).get("trainer")
        what = f"a `posttrain {trainer}` run" if trainer else "a run with a summary.json"
        raise UserError(
            f"--out {out} is {what}, not a pipeline run (no {cache.STATE_DIR}/): choose another --out; "
            f"the pipeline would overwrite its files"
        )
    raise UserError(
        f"--out {out} is not empty and is not a pipeline run (it holds {_shown(entries)}): choose a new or empty "
        f"directory, or an earlier pipeline run's"
    )


def open_out(out: Path) -> run_lock.DirLock:
    """Create ``--out`` (and its ``.pipeline/``), and hold its lock: released by the caller when the run ends."""
    out.mkdir(parents=True, exist_ok=True)
    lock = run_lock.lock_dir(out)
    (out / cache.STATE_DIR).mkdir(exist_ok=True)
    return lock


def _timestamp(text) -> float | None:
    try:
        return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))
    except (TypeError, ValueError):
        return None


def foreign_files(d: Path, done: dict | None, started: dict | None) -> list[Path]:
    """The files in stage directory ``d`` the pipeline did not write (see the module docstring), sorted."""
    done = done or {}
    known = set(done.get("outputs") or {}) | set(done.get("files") or [])
    t0 = (started or {}).get("t0")
    t0 = t0 if isinstance(t0, (int, float)) else _timestamp((started or {}).get("started"))
    t1 = done.get("t1") if isinstance(done.get("t1"), (int, float)) else _timestamp(done.get("finished"))
    finished = t1 is not None and (t0 is None or t1 + SLACK_S >= t0)  # the last run that started, finished
    if finished and "outputs" in done:
        lo, hi = None, None  # its DONE.json lists every file it left: nothing else is the pipeline's
    elif finished:
        lo, hi = (t0 if t0 is not None else float("-inf")), t1  # a record without a list: what it wrote until then
    else:
        lo, hi = t0, float("inf")  # the last run stopped: what it wrote since it started
    out = []
    for f in sorted(d.rglob("*")):
        rel = f.relative_to(d).as_posix()
        if (f.is_dir() and not f.is_symlink()) or rel in known or rel == cache.DONE_FILE:
            continue
        if lo is not None and lo - SLACK_S <= f.lstat().st_mtime <= hi + SLACK_S:
            continue
        out.append(f)
    return out


def clear_stage(d: Path, name: str, done: dict | None, started: dict | None, why: str) -> None:
    """Delete stage directory ``d`` before ``name`` runs again, if everything in it is the pipeline's; else a
    one-line UserError naming the first other file (nothing deleted)."""
    if d.is_symlink() or not d.is_dir():
        raise UserError(
            f"{d} is {'a symlink' if d.is_symlink() else 'not a directory'}: the {name} stage must run again "
            f"({why}) and writes a directory there; move it away"
        )
    with run_lock.lock_dir(d):  # nobody else is writing it (a killed pipeline's worker would be named here)
        foreign = foreign_files(d, done, started)
        if foreign:
            more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
            raise UserError(
                f"{foreign[0]} was not written by the pipeline{more}: move it out of {d}, which the {name} stage "
                f"clears before it runs again ({why})"
            )
        shutil.rmtree(d)
