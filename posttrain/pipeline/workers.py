"""Training stages in worker processes (``jobs`` > 1), which never outlive the pipeline that started them.

A worker is a spawned interpreter (no forked torch state) that runs one stage's ``train_*`` function into the
stage directory; its printed output goes to ``<run>/.pipeline/<stage>.log``, and its summary, wall time and peak
RSS come back to the runner, which writes ``DONE.json`` as for an inline stage.

Workers die with the pipeline, however it ends:

- killed (``kill -9``, the OOM killer): each worker asked the kernel, first thing, for ``SIGKILL`` when its
  parent dies (``prctl(PR_SET_PDEATHSIG)``, Linux), and exits at once if the parent was already gone;
- an error or Ctrl-C in the runner: :meth:`Workers.close` with ``abort`` kills the workers instead of waiting
  for them, so no stage goes on training (and writing its directory) after the command has failed.

A worker's trainer holds its stage directory's lock (:mod:`posttrain.run_lock`) while it writes, so even a
worker that survived (a platform without ``prctl``) makes a re-run say "in use by ... (pid N)" rather than start
a second writer in the same directory.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import functools
import os
import signal
import sys
import time
from pathlib import Path

from posttrain.pipeline import cache
from posttrain.trainers.common import usable_cores  # noqa: F401 - the pipeline's and the restart workers' share

PR_SET_PDEATHSIG = 1


@functools.cache
def libc_prctl():
    """libc's ``prctl``, or None where there is none (loaded before a fork: a forked child only calls it)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return None


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> None:
    """In a child process: have the kernel send ``sig`` when the parent dies; exit now if it already has.

    Linux only (``prctl``); elsewhere a no-op."""
    prctl = libc_prctl()
    if prctl is None:  # pragma: no cover - not Linux
        return
    prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def spawn_pool(jobs: int):
    """A pool of ``jobs`` spawned interpreters (no forked torch state), each dying with this process."""
    import concurrent.futures as cf
    import multiprocessing as mp

    return cf.ProcessPoolExecutor(
        max_workers=jobs, mp_context=mp.get_context("spawn"), initializer=die_with_parent, initargs=(os.getpid(),)
    )


def main_rerun_by_workers() -> Path | None:
    """The file a spawned worker runs again (as ``__mp_main__``) before any work: this program's script, or its
    ``-m`` module; None when it runs none (the REPL, ``-c``, a package's ``__main__`` such as ``python -m posttrain``,
    which multiprocessing skips)."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        if name == "__main__" or name.endswith(".__main__"):
            return None
        path = getattr(main.__spec__, "origin", None)
    else:
        path = getattr(main, "__file__", None)
    return Path(path) if path else None


def has_main_guard(path: Path) -> bool:
    """Whether the Python file ``path`` has a top-level ``if __name__ == "__main__":`` (so a worker that runs it again
    skips its work); False when it cannot be read or parsed."""
    try:
        tree = ast.parse(Path(path).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return False
    tests = {"__name__ == '__main__'", "'__main__' == __name__"}
    return any(isinstance(node, ast.If) and ast.unparse(node.test) in tests for node in tree.body)


def kill_pool(pool) -> None:
    """SIGKILL every worker process of ``pool``, wait for them, and drop its pending work."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    for p in procs:
        with contextlib.suppress(OSError, ValueError):
            p.kill()
    for p in procs:
        with contextlib.suppress(OSError, ValueError):
            p.join(timeout=10)
    pool.shutdown(wait=False, cancel_futures=True)


def run_in_worker(module: str, fn: str, cfg, out: Path, resume: bool, log: Path):
    """A training stage in a worker process: (summary, wall seconds, peak RSS MiB). Output -> ``log``."""
    import importlib
    import inspect
    import json

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    train = getattr(importlib.import_module(module), fn)
    kwargs = {}
    params = inspect.signature(train).parameters
    if resume and "resume" in params:
        kwargs["resume"] = str(out)
    elif out.is_dir() and any(out.iterdir()) and "overwrite" in params:
        kwargs["overwrite"] = True
    log.parent.mkdir(parents=True, exist_ok=True)
    cache.reset_peak_rss()
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as fh, contextlib.redirect_stdout(fh), contextlib.redirect_stderr(fh):
        summary = train(cfg, **kwargs)
    return json.loads(json.dumps(summary, default=str)), time.perf_counter() - t0, cache.peak_rss_mb()


class Workers:
    """Training stages running in worker processes: submit, wait for the ones a later stage needs, and close
    (waiting, or on an error killing them)."""

    def __init__(self, ctx, jobs: int, on_done):
        self.ctx, self.jobs, self.pending, self.pool = ctx, jobs, {}, None
        self.on_done = on_done  # (name, tag, d, key, fields, action, summary, wall, rss) -> None

    def can_take(self, stage) -> bool:
        return self.jobs > 1 and getattr(stage.run, "trainer", None) is not None

    def submit(self, tag, stage, scfg, d: Path, resume: bool, key, fields, action):
        if self.pool is None:
            self.pool = spawn_pool(self.jobs)
        module, fn = stage.run.trainer
        log = self.ctx.run_dir / cache.STATE_DIR / f"{stage.name}.log"
        fut = self.pool.submit(run_in_worker, module, fn, scfg, d, resume, log)
        self.pending[stage.name] = (fut, tag, d, key, fields, action)
        print(f"{tag}: running in a worker process (output: {log})", flush=True)

    def wait(self, names) -> None:
        for name in [n for n in names if n in self.pending]:
            fut, tag, d, key, fields, action = self.pending.pop(name)
            try:
                summary, wall, rss = fut.result()
            except BaseException:
                print(
                    f"{tag}: failed (see {self.ctx.run_dir / cache.STATE_DIR / (name + '.log')})",
                    file=sys.stderr,
                    flush=True,
                )
                raise
            self.on_done(name, tag, d, key, fields, action, summary, wall, rss)

    def close(self, abort: bool = False) -> None:
        """Wait for the running stages (their DONE.json written), or with ``abort`` kill them and return."""
        if abort:
            self.kill()
            return
        self.wait(list(self.pending))
        if self.pool is not None:
            self.pool.shutdown()

    def kill(self) -> None:
        """SIGKILL every worker process and drop the pool (a stage killed here resumes on the next run)."""
        self.pending.clear()
        if self.pool is None:
            return
        kill_pool(self.pool)
        self.pool = None
