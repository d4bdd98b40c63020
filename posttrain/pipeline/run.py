"""Run the stages in order, each cached, resumed or run by its content key (:mod:`posttrain.pipeline.cache`).

For each stage of :data:`~posttrain.pipeline.stages.STAGES`:

1. skipped (with a note) when unavailable in this build, turned off by the config, ``--skip``-ped, outside
   ``--only`` (an earlier completed result is still used by later stages), or missing a dependency;
2. its key is computed from its resolved config, input digests, dependency keys, seed and versions;
3. ``DONE.json`` with that key and its outputs unchanged (re-hashed: :func:`~posttrain.pipeline.cache.verify`)
   -> cached; a started record with that key and a checkpoint -> resumed (trainer ``resume=``); otherwise the
   stage directory is cleared (saying which key fields or outputs changed) and it runs. Clearing deletes only
   what the pipeline wrote (:mod:`posttrain.pipeline.run_dir`): a file of the user's in a stage directory stops
   the run with one line naming it;
4. ``DONE.json`` is written last, with the summary, wall time, peak RSS and the digests of the outputs.

``--out`` must be new, empty or a pipeline run, and the runner holds its lock (:mod:`posttrain.run_lock`) while
it runs: a second pipeline into the same directory is one line naming the first one's pid.

With ``jobs`` > 1 a training stage whose dependencies are complete runs in a worker process
(:mod:`posttrain.pipeline.workers`: spawned, a fresh interpreter with no forked torch state, killed with the
pipeline) while the runner goes on to the next stages; a stage that needs a running one waits for it. A worker's
printed output goes to ``<run>/.pipeline/<stage>.log``; its summary, wall time and peak RSS come back to the
runner, which writes ``DONE.json`` as for an inline stage. The trainers are deterministic functions of their
configs, so the results do not depend on ``jobs``.

``--explain`` prints the decision (run / cached / resumed, and why) for every stage and runs nothing; a stage
after one that runs is "run" too, since its inputs will change. ``summary.json`` at the run's root collects
every stage's key metrics (``heldout_accuracy`` per stage), rewritten on every invocation.
"""

from __future__ import annotations

import contextlib
import importlib
import platform
import sys
import time
from pathlib import Path

from posttrain import __version__
from posttrain.data.io import atomic_write_json
from posttrain.errors import UserError
from posttrain.pipeline import cache, run_dir
from posttrain.pipeline.base import LABELS, heldout_table
from posttrain.pipeline.stages import BY_NAME, RUN_ORDER, STAGES, Context, get
from posttrain.pipeline.workers import Workers
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


def _check_names(names, what: str) -> None:
    bad = [n for n in names if n not in BY_NAME]
    if bad:
        raise UserError(f"{what} {bad[0]!r}: not a stage; stages: {', '.join(BY_NAME)}")


def _reward_specs(value):
    """Every string under a ``reward`` key of a scrubbed config (the pipeline's, grpo's, ppo's)."""
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "reward" and isinstance(v, str):
                yield v
            else:
                yield from _reward_specs(v)


def importable_reward_modules(cfg) -> None:
    """Put the current directory on ``sys.path`` before any key is computed when a reward names a module
    (``mymod:fn``): the trainers import it from there (``load_python_reward``), so its source file must be found,
    and keyed, the same way, not only after a stage has imported it (an unchanged reward then looked changed, and
    an edited one cached)."""
    from posttrain.rewards.registry import is_python_reward, parse_reward_spec

    for spec in _reward_specs(cache.scrub(cfg)):
        try:
            names = parse_reward_spec(spec)
        except UserError:
            continue  # the stage that reads it says what is wrong
        if any(is_python_reward(n) and not n.rpartition(":")[0].endswith(".py") for n in names):
            if "" not in sys.path and "." not in sys.path:
                sys.path.insert(0, "")  # the current directory, as load_python_reward has it
            importlib.invalidate_caches()
            return


def run_pipeline(
    cfg, out: str | Path, *, only=(), skip=(), explain: bool = False, quiet: bool = False, preset: str | None = None
) -> dict:
    """Run (or with ``explain`` only describe) the pipeline into ``out``; returns the run summary.

    ``out`` must be new, empty or a pipeline run (:mod:`posttrain.pipeline.run_dir`); while the stages run the
    runner holds its lock, and a training stage's trainer holds its stage directory's."""
    _check_names(only, "--only")
    _check_names(skip, "--skip")
    out = Path(out)
    run_dir.check_out(out, BY_NAME)
    importable_reward_modules(cfg)
    lock = None if explain else run_dir.open_out(out)
    try:
        return _run(cfg, out, only, skip, explain, quiet, preset)
    finally:
        if lock is not None:
            lock.release()


def _run(cfg, out: Path, only, skip, explain: bool, quiet: bool, preset) -> dict:
    ctx = Context(
        cfg=cfg, run_dir=out, quiet=quiet, stages=STAGES, started=time.perf_counter(), header=header(cfg, preset)
    )
    will_run: list[str] = []
    notes = ctx.notes

    def finished(name, tag, d, key, fields, action, summary, wall, rss):
        d.mkdir(parents=True, exist_ok=True)
        ctx.done[name] = cache.write_done(d, key, fields, summary, wall, rss, action)
        ctx.statuses[name] = "resumed" if action == "resumed" else "ran"
        _say(ctx, f"{tag}: done in {wall:.1f} s")

    pool = Workers(ctx, 1 if explain else getattr(cfg, "jobs", 1), finished)
    try:
        _run_stages(ctx, cfg, out, only, skip, explain, will_run, notes, pool, finished)
    except BaseException:
        pool.close(abort=True)  # no worker goes on writing its stage after the command failed
        raise
    pool.close()
    if explain:
        return {"explain": ctx.statuses, "notes": notes}
    result = run_summary(ctx, notes)
    atomic_write_json(out / "summary.json", result)
    print_table(result, out)
    return result


def _run_stages(ctx, cfg, out: Path, only, skip, explain: bool, will_run: list, notes: dict, pool: Workers, finished):
    for i, stage in enumerate(RUN_ORDER, 1):  # STAGES' dependency order, the stages after SFT longest first
        name, d = stage.name, out / stage.name
        tag = f"[{i}/{len(STAGES)}] {name}"
        pool.wait(stage.deps)  # a stage never starts before the stages it reads have finished
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
        stale = cache.verify(d, done) if done is not None and done.get("key") == key else None
        if stale == []:
            ctx.done[name], ctx.statuses[name] = done, "cached"
            _say(ctx, f"{tag}: cached ({done.get('wall_s', 0):.1f} s when it ran)")
            continue
        changed = [f"its outputs changed since it ran: {', '.join(stale)}"] if stale else None
        if only and name not in only:
            ctx.statuses[name], notes[name] = "skipped", "not in --only"
            state = "no" if not done else "changed" if stale else "stale"
            _say(ctx, f"{tag}: not run (not in --only; {state} earlier result{f': {changed[0]}' if stale else ''})")
            continue
        started = cache.read_json(cache.started_file(out, name))
        resume = (
            stage.resumable and not stale and started is not None and started.get("key") == key and _has_checkpoint(d)
        )
        why = (
            changed
            or cache.changed_fields((done or started or {}).get("fields"), fields)
            or [
                "same key, but the earlier run stopped before its DONE.json"
                + ("" if stage.resumable else " and this stage does not resume")
            ]
        )
        action = "resumed" if resume else "run"
        if explain:
            ctx.statuses[name] = action
            will_run.append(name)
            _say(ctx, f"{tag}: {action}" + ("" if resume else f" ({'; '.join(why)})"))
            continue
        if not resume and (d.is_symlink() or d.exists()) and (d.is_symlink() or not d.is_dir() or any(d.iterdir())):
            run_dir.clear_stage(d, name, done, started, "; ".join(why))
            _say(ctx, f"{tag}: {'outputs' if stale else 'key'} changed ({'; '.join(why)}): cleared {d}")
        if resume:
            _say(ctx, f"{tag}: resuming from its checkpoint in {d} (same key)")
        cache.mark_started(out, name, key, fields, since=started.get("t0") if resume else None)
        if pool.can_take(stage):
            pool.submit(tag, stage, scfg, d, resume, key, fields, action)
            continue
        pool.wait(list(pool.pending))  # an inline stage runs alone (its peak RSS and output are its own)
        _say(ctx, f"{tag}: start — {stage.title}")
        cache.reset_peak_rss()
        t0 = time.perf_counter()
        try:
            with _stage_output(ctx, name):
                summary = stage.run(ctx, scfg, d, resume)
        except BaseException:
            print(f"{tag}: failed after {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
            raise
        finished(name, tag, d, key, fields, action, _plain(summary), time.perf_counter() - t0, cache.peak_rss_mb())


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
        f"problems; one seed: benchmarks/bench_pipeline.py for mean ± sd over seeds)"
    )
    print(f"{'model':<38} {'greedy':>7} {'pass@1':>7} {'pass@k':>7}")
    for name, row in result["heldout"].items():
        cells = [f"{row[k]:.3f}" if isinstance(row.get(k), float) else "-" for k in ("greedy", "pass@1", "pass@k")]
        print(f"{LABELS.get(name, name):<38} {cells[0]:>7} {cells[1]:>7} {cells[2]:>7}")
    print(f"total {result['total_seconds']:.1f} s\nsummary: {out / 'summary.json'}\nreport:  {result['report']}")
