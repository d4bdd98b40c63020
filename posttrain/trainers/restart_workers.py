"""SFT restarts in worker processes: how many train at a time, and one phase of them (the probes, then the
finalists) run that many at a time, with one progress bar over their steps.

Key insight: a restart is a function of its config alone, so J restarts trained at once in J spawned interpreters
(no forked torch state, each dying with this process: ``pipeline/workers.py``) end bit for bit as they would one
at a time (tested), in about 1/J of the wall time on J free cores; only the machine's use changes, never the model.

``restart_jobs`` J > 0 is taken as given. 0 (the default, auto) resolves per phase to

    J = min(restarts in the phase, usable cores // threads)     (the cores this process may run on;
                                                                  threads None counts 1, and each worker
                                                                  then gets usable cores // J threads)

and to 1 (one at a time, in this process) when a worker would not pay or not work: the run trains on a GPU (the
restarts would share one device), a restart trains fewer than :data:`MIN_WORKER_STEPS` steps in the phase (a
worker's start, ~3 s of imports, costs more than it saves), under ``torchrun`` (each restart then runs on every
process), or when a worker would run this program's script again (a script without an
``if __name__ == "__main__":`` guard: a spawned interpreter imports ``__main__`` first).

A worker's output goes to ``restarts/K.log`` beside its run; this process shows the phase's progress, read from the
restarts' ``metrics.jsonl`` every :data:`POLL_S` seconds, and on a failure kills the other workers and names the
failed restart's log.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import json
from pathlib import Path

from posttrain.errors import ConfigError
from posttrain.progress import progress

MIN_WORKER_STEPS = 100  # auto: a restart trains at least this many steps in a phase to get its own worker
POLL_S = 1.0  # how often the parent reads the workers' step counts


def auto_jobs(cfg, n: int, steps: int, world) -> int:
    """How many of a phase's ``n`` restarts train at once, each training ``steps`` steps in the phase: ``cfg``'s
    ``restart_jobs``, or for 0 the module docstring's rule; 1 under torchrun. Explicit J > 1 from a script that a
    worker would run again is a ConfigError naming the script (rather than a worker dying in its own start-up)."""
    from posttrain.pipeline.workers import has_main_guard, main_rerun_by_workers, usable_cores

    if world.distributed or n <= 1:
        return 1
    if cfg.restart_jobs:
        jobs = cfg.restart_jobs
    elif steps < MIN_WORKER_STEPS or not _on_cpu(cfg):
        return 1
    else:  # threads None (every usable core): one thread a restart at the most restarts at once
        jobs = max(1, min(n, usable_cores() // (cfg.threads or 1)))
    script = main_rerun_by_workers() if jobs > 1 else None
    if script is None or has_main_guard(script):
        return jobs
    if cfg.restart_jobs:
        raise ConfigError(
            f"restart_jobs={cfg.restart_jobs} trains restarts in spawned worker processes, which run {script} "
            'again first: put the train_sft call under `if __name__ == "__main__":` (or restart_jobs=1)'
        )
    print(
        f"SFT restarts one at a time: worker processes would run {script} again first; put the train_sft call "
        f'under `if __name__ == "__main__":` to train {jobs} at once'
    )
    return 1


def _on_cpu(cfg) -> bool:
    from posttrain.trainers.device_config import resolve_device

    return resolve_device(cfg.device).type == "cpu"


def worker_log(sub) -> Path:
    """Where restart ``sub``'s worker writes its output: ``restarts/K.log``, beside ``restarts/K/``."""
    return Path(sub.out).parent / f"{Path(sub.out).name}.log"


def _in_worker(fn, sub, train_sft, *args):
    """In a worker process: ``fn(sub, train_sft, *args)`` with the worker's output in ``restarts/K.log`` (``train_sft``
    arrives pickled by name, so this module never imports the trainer that imports it)."""
    log = worker_log(sub)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", encoding="utf-8") as fh, contextlib.redirect_stdout(fh), contextlib.redirect_stderr(fh):
        return fn(sub, train_sft, *args)  # appended: a restart's probe, then its finish


def last_step(run_dir) -> int:
    """The step of the last record in ``run_dir/metrics.jsonl`` (0 when there is none yet): a worker's progress."""
    try:
        with open(Path(run_dir) / "metrics.jsonl", "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - 4096))
            tail = fh.read().splitlines()
    except OSError:
        return 0
    for line in reversed(tail):
        with contextlib.suppress(ValueError, KeyError, TypeError):
            return int(json.loads(line)["step"])
    return 0


def run_phase(fn, subs: dict, jobs: int, label, span: tuple[int, int], train_sft, *args) -> dict:
    """{k: fn(subs[k], train_sft, *args)}: in this process one after another (``jobs`` 1), else ``jobs`` at a time in
    spawned worker processes (all killed at once if one fails, or on Ctrl-C). Each restart trains the steps
    ``span`` = (start, stop) in the phase (the progress bar's measure); ``label(k, sub)`` names a restart."""
    if jobs <= 1 or len(subs) <= 1:
        out = {}
        for k, sub in subs.items():
            print(f"SFT restart {label(k, sub)}", flush=True)
            out[k] = fn(sub, train_sft, *args)
        return out
    from posttrain.pipeline.workers import kill_pool, spawn_pool

    jobs = min(jobs, len(subs))
    print(f"SFT restarts, {jobs} at a time in worker processes (output: {worker_log(next(iter(subs.values())))}, ...):")
    for k, sub in subs.items():
        print(f"  {label(k, sub)}", flush=True)
    show = next(iter(subs.values())).progress
    pool = spawn_pool(jobs)
    futures = {
        k: pool.submit(
            _in_worker,
            fn,
            dataclasses.replace(sub, progress=False, threads=worker_threads(sub, jobs)),
            train_sft,
            *args,
        )
        for k, sub in subs.items()
    }
    try:
        _watch(futures, subs, span, show)
        failed = [k for k, fut in futures.items() if fut.done() and fut.exception() is not None]
        if failed:  # the first failed restart, in order, is reported; the others are killed, not waited for
            print(f"SFT restart {failed[0] + 1} failed (its output: {worker_log(subs[failed[0]])})", flush=True)
            futures[failed[0]].result()
        out = {k: fut.result() for k, fut in futures.items()}
        pool.shutdown()
    except BaseException:
        kill_pool(pool)
        raise
    return out


def worker_threads(sub, jobs: int) -> int:
    """A worker's torch threads: the run's ``threads``, or for None (every usable core) its share of the cores."""
    from posttrain.pipeline.workers import usable_cores

    return sub.threads or max(1, usable_cores() // jobs)


def _watch(futures: dict, subs: dict, span: tuple[int, int], show: bool) -> None:
    """Wait until every restart is done or one has failed, showing the phase's steps done over all restarts."""
    start, stop = span
    each = max(0, stop - start)

    def done() -> int:
        return sum(min(each, max(0, last_step(sub.out) - start)) for sub in subs.values())

    pending = set(futures.values())
    with progress(total=each * len(subs), desc="SFT restarts", unit="step", disable=not show) as bar:
        while pending:
            finished, pending = cf.wait(pending, timeout=POLL_S, return_when=cf.FIRST_EXCEPTION)
            bar.update(done() - bar.n)
            if any(f.exception() is not None for f in finished):
                return
