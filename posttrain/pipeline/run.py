"""Run the stages in order, each cached, resumed or run by its content key (:mod:`posttrain.pipeline.cache`).

For each stage of :data:`~posttrain.pipeline.stages.STAGES`:

1. skipped (with a note) when unavailable in this build, turned off by the config, ``--skip``-ped, outside
   ``--only`` (an earlier completed result is still used by later stages), or missing a dependency;
2. its key is computed from its resolved config, input digests, dependency keys, seed and versions;
3. ``DONE.json`` with that key -> cached; a started record with that key and a checkpoint -> resumed
   (trainer ``resume=``); otherwise the stage directory is cleared (saying which key fields changed) and it runs;
4. ``DONE.json`` is written last, with the summary, wall time and peak RSS.

With ``jobs`` > 1 a training stage whose dependencies are complete runs in a worker process (spawned: a fresh
interpreter, no forked torch state) while the runner goes on to the next stages; a stage that needs a running
one waits for it. A worker's printed output goes to ``<run>/.pipeline/<stage>.log``; its summary, wall time
and peak RSS come back to the runner, which writes ``DONE.json`` as for an inline stage. The trainers are
deterministic functions of their configs, so the results do not depend on ``jobs``.

``--explain`` prints the decision (run / cached / resumed, and why) for every stage and runs nothing; a stage
after one that runs is "run" too, since its inputs will change. ``summary.json`` at the run's root collects
every stage's key metrics (``heldout_accuracy`` per stage), rewritten on every invocation.
"""

from __future__ import annotations

import contextlib
import platform
import shutil
import sys
import time
from pathlib import Path

from posttrain import __version__
from posttrain.data.io import atomic_write_json
from posttrain.errors import UserError
from posttrain.pipeline import cache
from posttrain.pipeline.base import LABELS, heldout_table
from posttrain.pipeline.stages import BY_NAME, RUN_ORDER, STAGES, Context, get
from posttrain.provenance import git_commit


def cpu_description() -> str:
    """The CPU's model name and the vector ISA torch's kernels dispatch to (e.g. ``AMD EPYC, torch kernels AVX2``).

    Trainings are bitwise reproducible on one machine, not across ISAs: AVX2 and AVX-512 kernels round matmuls
    differently, so the same seed follows another trajectory there (docs/pipeline.md)."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            name = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), name)
    except OSError:
        pass
    try:
        import torch

        isa = torch.backends.cpu.get_cpu_capability()
    except (ImportError, AttributeError):  # pragma: no cover - torch is a core dependency (2.4+ has it)
        isa = "unknown"
    return f"{name}, torch kernels {isa}"


def header(cfg, preset: str | None) -> dict:
    import os

    return {
        "commit": git_commit(),
        "machine": f"{platform.machine()} {platform.system()} {platform.release()}, "
        f"{os.cpu_count()} CPUs ({cpu_description()}), threads={cfg.threads}",
        "python": platform.python_version(),
        "torch": cache.torch_version(),
        "posttrain": __version__,
        "seed": cfg.seed,
        "preset": preset,
    }


def _has_checkpoint(d: Path) -> bool:
    """A trainer checkpoint in the stage directory; for SFT restarts, any restart's checkpoint or finished run."""
    if (d / "checkpoints").is_dir() and any((d / "checkpoints").glob("step-*")):
        return True
    return any((d / "restarts").glob("*/checkpoints/step-*")) or any((d / "restarts").glob("*/summary.json"))


def _say(ctx, msg: str) -> None:
    print(msg, flush=True)


@contextlib.contextmanager
def _stage_output(ctx, name: str):
    """--quiet: the stage's printed lines go to <run>/.pipeline/<stage>.log instead of the terminal."""
    if not ctx.quiet:
        yield
        return
    log = ctx.run_dir / cache.STATE_DIR / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w", encoding="utf-8") as fh, contextlib.redirect_stdout(fh):
        yield


def run_in_worker(module: str, fn: str, cfg, out: Path, resume: bool, log: Path):
    """A training stage in a worker process: (summary, wall seconds, peak RSS MiB). Output -> ``log``."""
    import importlib
    import inspect
    import os

    from posttrain.pipeline import cache as worker_cache

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    train = getattr(importlib.import_module(module), fn)
    kwargs = {}
    params = inspect.signature(train).parameters
    if resume and "resume" in params:
        kwargs["resume"] = str(out)
    elif out.is_dir() and any(out.iterdir()) and "overwrite" in params:
        kwargs["overwrite"] = True
    log.parent.mkdir(parents=True, exist_ok=True)
    worker_cache.reset_peak_rss()
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as fh, contextlib.redirect_stdout(fh), contextlib.redirect_stderr(fh):
        summary = train(cfg, **kwargs)
    return _plain(summary), time.perf_counter() - t0, worker_cache.peak_rss_mb()


class _Workers:
    """Training stages running in worker processes: submit, and wait for the ones a later stage needs."""

    def __init__(self, ctx, jobs: int):
        self.ctx, self.jobs, self.pending, self.pool = ctx, jobs, {}, None

    def can_take(self, stage) -> bool:
        return self.jobs > 1 and getattr(stage.run, "trainer", None) is not None

    def submit(self, tag, stage, scfg, d: Path, resume: bool, key, fields, action):
        import concurrent.futures as cf
        import multiprocessing as mp

        if self.pool is None:
            self.pool = cf.ProcessPoolExecutor(max_workers=self.jobs, mp_context=mp.get_context("spawn"))
        module, fn = stage.run.trainer
        log = self.ctx.run_dir / cache.STATE_DIR / f"{stage.name}.log"
        fut = self.pool.submit(run_in_worker, module, fn, scfg, d, resume, log)
        self.pending[stage.name] = (fut, tag, d, key, fields, action)
        _say(self.ctx, f"{tag}: running in a worker process (output: {log})")

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
            d.mkdir(parents=True, exist_ok=True)
            self.ctx.done[name] = cache.write_done(d, key, fields, summary, wall, rss, action)
            self.ctx.statuses[name] = "resumed" if action == "resumed" else "ran"
            _say(self.ctx, f"{tag}: done in {wall:.1f} s")

    def close(self) -> None:
        self.wait(list(self.pending))
        if self.pool is not None:
            self.pool.shutdown()


def _check_names(names, what: str) -> None:
    bad = [n for n in names if n not in BY_NAME]
    if bad:
        raise UserError(f"{what} {bad[0]!r}: not a stage; stages: {', '.join(BY_NAME)}")


def run_pipeline(
    cfg, out: str | Path, *, only=(), skip=(), explain: bool = False, quiet: bool = False, preset: str | None = None
) -> dict:
    """Run (or with ``explain`` only describe) the pipeline into ``out``; returns the run summary."""
    _check_names(only, "--only")
    _check_names(skip, "--skip")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a directory")
    if not explain:
        out.mkdir(parents=True, exist_ok=True)
    ctx = Context(
        cfg=cfg, run_dir=out, quiet=quiet, stages=STAGES, started=time.perf_counter(), header=header(cfg, preset)
    )
    will_run: list[str] = []
    notes = ctx.notes
    workers = _Workers(ctx, 1 if explain else getattr(cfg, "jobs", 1))
    try:
        _run_stages(ctx, cfg, out, only, skip, explain, will_run, notes, workers)
    finally:
        workers.close()
    if explain:
        return {"explain": ctx.statuses, "notes": notes}
    result = run_summary(ctx, notes)
    atomic_write_json(out / "summary.json", result)
    print_table(result, out)
    return result


def _run_stages(ctx, cfg, out: Path, only, skip, explain: bool, will_run: list, notes: dict, workers: _Workers):
    for i, stage in enumerate(RUN_ORDER, 1):  # STAGES' dependency order, the stages after SFT longest first
        name, d = stage.name, out / stage.name
        tag = f"[{i}/{len(STAGES)}] {name}"
        workers.wait(stage.deps)  # a stage never starts before the stages it reads have finished
        reason = stage.available() or stage.enabled(ctx) or ("--skip" if name in skip else None)
        missing = [x for x in stage.deps if x not in ctx.done and x not in will_run] if not stage.optional_deps else []
        if reason is None and missing:
            reason = f"needs {', '.join(missing)}"
        if reason is not None:
            ctx.statuses[name], notes[name] = "skipped", reason
            _say(ctx, f"{tag}: skipped ({reason})")
            continue
        deps = {x: ctx.done[x]["key"] for x in stage.deps if x in ctx.done}
        upstream = [x for x in stage.deps if x in will_run]
        done = cache.read_done(d)
        if explain and upstream:
            ctx.statuses[name] = "run"
            will_run.append(name)
            _say(ctx, f"{tag}: run (after {', '.join(upstream)}, which run{'s' if len(upstream) == 1 else ''})")
            continue
        scfg = stage.config(ctx)
        fields = cache.key_fields(
            name, scfg, {k: v for k, v in stage.inputs(ctx).items() if Path(v).exists()}, deps, cfg.seed
        )
        from posttrain.pipeline.distributed import stage_fields  # nproc_per_stage > 1: world size in grpo/ppo keys

        fields = stage_fields(name, fields, cfg)
        key = cache.key_of(fields)
        if done is not None and done.get("key") == key:
            ctx.done[name], ctx.statuses[name] = done, "cached"
            _say(ctx, f"{tag}: cached ({done.get('wall_s', 0):.1f} s when it ran)")
            continue
        if only and name not in only:
            ctx.statuses[name], notes[name] = "skipped", "not in --only"
            _say(ctx, f"{tag}: not run (not in --only; {'stale' if done else 'no'} earlier result)")
            continue
        started = cache.read_json(cache.started_file(out, name))
        resume = stage.resumable and started is not None and started.get("key") == key and _has_checkpoint(d)
        why = cache.changed_fields((done or started or {}).get("fields"), fields) or [
            "same key, but the earlier run stopped before its DONE.json"
            + ("" if stage.resumable else " and this stage does not resume")
        ]
        action = "resumed" if resume else "run"
        if explain:
            ctx.statuses[name] = action
            will_run.append(name)
            _say(ctx, f"{tag}: {action}" + ("" if resume else f" ({'; '.join(why)})"))
            continue
        if not resume and d.exists() and any(d.iterdir()):
            _say(ctx, f"{tag}: key changed ({'; '.join(why)}): clearing {d}")
            shutil.rmtree(d)
        if resume:
            _say(ctx, f"{tag}: resuming from its checkpoint in {d} (same key)")
        cache.mark_started(out, name, key, fields)
        if workers.can_take(stage):
            workers.submit(tag, stage, scfg, d, resume, key, fields, action)
            continue
        workers.wait(list(workers.pending))  # an inline stage runs alone (its peak RSS and output are its own)
        _say(ctx, f"{tag}: start — {stage.title}")
        cache.reset_peak_rss()
        t0 = time.perf_counter()
        try:
            with _stage_output(ctx, name):
                summary = stage.run(ctx, scfg, d, resume)
        except BaseException:
            print(f"{tag}: failed after {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
            raise
        wall = time.perf_counter() - t0
        d.mkdir(parents=True, exist_ok=True)
        ctx.done[name] = cache.write_done(d, key, fields, _plain(summary), wall, cache.peak_rss_mb(), action)
        ctx.statuses[name] = "resumed" if resume else "ran"
        _say(ctx, f"{tag}: done in {wall:.1f} s")


def _plain(x):
    import json

    return json.loads(json.dumps(x, default=str))


def run_summary(ctx, notes: dict) -> dict:
    table = heldout_table(ctx)
    stages = {}
    for stage in STAGES:
        name = stage.name
        entry = {"status": ctx.statuses.get(name, "skipped")}
        if name in notes:
            entry["note"] = notes[name]
        done = ctx.done.get(name)
        if done:
            s = done["summary"]
            entry.update(
                {
                    "key": done["key"],
                    "wall_s": done["wall_s"],
                    "peak_rss_mb": done.get("peak_rss_mb"),
                    "metrics": {m.key: get(s, m.key) for m in stage.schema},
                }
            )
            if name in table:
                entry["heldout_accuracy"] = table[name]["greedy"]
        stages[name] = entry
    if "rm_best_of_n" in table:
        stages["rm"]["best_of_n_accuracy"] = table["rm_best_of_n"]["greedy"]
    if "rm_weighted_best_of_n" in table:
        stages["rm"]["weighted_best_of_n_accuracy"] = table["rm_weighted_best_of_n"]["greedy"]
    return {
        **ctx.header,
        "total_seconds": round(time.perf_counter() - ctx.started, 2),
        "stages": stages,
        "heldout": table,
        "contamination": (ctx.summary("eval") or {}).get("contamination"),
        "report": str(ctx.run_dir / "report" / "report.html"),
    }


def print_table(result: dict, out: Path) -> None:
    print(
        f"\nseed {result['seed']}  (held-out accuracy on {next(iter(result['heldout'].values()), {}).get('n')} "
        f"problems; one seed: benchmarks/bench_outcomes.py for mean ± sd)"
    )
    print(f"{'model':<38} {'greedy':>7} {'pass@1':>7} {'pass@k':>7}")
    for name, row in result["heldout"].items():
        cells = [f"{row[k]:.3f}" if isinstance(row.get(k), float) else "-" for k in ("greedy", "pass@1", "pass@k")]
        print(f"{LABELS.get(name, name):<38} {cells[0]:>7} {cells[1]:>7} {cells[2]:>7}")
    print(f"total {result['total_seconds']:.1f} s\nsummary: {out / 'summary.json'}\nreport:  {result['report']}")
