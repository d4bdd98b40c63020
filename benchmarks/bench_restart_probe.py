"""Where should successive halving rank SFT restarts? Every restart finished, each probe step's choice judged after.

``posttrain sft --restarts R --restart-probe f`` trains every restart to step P = f · steps, ranks them there on the
dev split and finishes only the best; a restart left at its probe is never seen at the end. This benchmark finishes
them all, so that any probe step can be judged by what its choice became:

    .venv/bin/python benchmarks/bench_outcomes.py --stages sft --seeds 0 1 2 3 4 --jobs 2 --work W \\
        --sft-args "--keep-checkpoints 30"                  # the default recipe, every periodic checkpoint kept
    .venv/bin/python benchmarks/bench_restart_probe.py --work W --jobs 2 --write probe.json

For each seed's ``W/seedS/sft`` (a restarts run) it trains each restart the probe left unfinished on to the last
step (resumed from its probe checkpoint: bitwise the uninterrupted run), scores every kept checkpoint up to the probe
and every final model on the dev problems the run ranked on (the probe's own score must come out equal: the check
that this is the ranking the run made), and prints, per rule, which restart each seed would keep, that restart's
final dev accuracy (mean, worst seed, and paired by seed against the run's own probe) and its held-out (test)
accuracy. Rules: rank at each checkpoint step (the run's probe among them); "full": every restart finished, ranked at
the end (R times the steps; its dev column chose and scored on the same problems, so only its test column is
unbiased); "full, first K": the same over restarts 0..K-1. The test column is for reporting: choose on dev.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from _outcomes_selection import paired_gain  # noqa: E402


def _config(run_dir: Path):
    from posttrain.checkpoints.files import read_json
    from posttrain.config import from_dict
    from posttrain.trainers.sft_config import SFTConfig

    return from_dict(SFTConfig, read_json(run_dir / "config.resolved.json", "run config"))


def finish(restart_dir: str) -> str:
    """Train one restart on to its last step from its latest checkpoint, on one thread; -> its directory."""
    from posttrain.trainers.sft import train_sft

    d = Path(restart_dir)
    cfg = dataclasses.replace(_config(d), threads=1, progress=False, out=str(d))
    train_sft(cfg, resume=str(d))
    return restart_dir


def score_seed(sft_dir: Path) -> dict:
    """{restart: {"dev": {step: acc, ..., "final": acc}, "test": acc}} for one restarts run, every restart finished."""
    from posttrain.checkpoints.files import read_json
    from posttrain.trainers.sft_restarts import PROBE_KEYS, SUMMARY_KEYS, _score, validation_problems

    cfg = _config(sft_dir)  # scored on torch's threads: the scores are the same on any count
    val = validation_problems(cfg)
    out = {}
    for k in range(cfg.restarts):
        d = sft_dir / "restarts" / str(k)
        probe = read_json(d / "probe.json", "probe record", PROBE_KEYS)
        dev = {}
        for ck in sorted((d / "checkpoints").glob("step-*")):
            step = int(ck.name.split("-")[1])
            if step <= probe["step"]:
                dev[str(step)] = _score(ck, val, cfg.max_new_tokens)
        if dev.get(str(probe["step"])) != probe["val_accuracy"]:
            raise SystemExit(f"{d}: its probe scored {probe['val_accuracy']}, rescored {dev.get(str(probe['step']))}")
        dev["final"] = _score(d / "model", val, cfg.max_new_tokens)
        test = read_json(d / "summary.json", "summary", SUMMARY_KEYS)["heldout_accuracy"]
        out[str(k)] = {"dev": dev, "test": test}
    return out


def pick(restarts: dict, at: str, among: list[str]) -> str:
    """The restart a rule keeps: the best dev accuracy at ``at``, the earliest on ties (as the trainer ranks)."""
    return min(among, key=lambda k: (-restarts[k]["dev"][at], int(k)))


def rules(scores: dict, probe_step: str) -> list[tuple[str, str, list[str]]]:
    """(name, the dev score it ranks on, the restarts it ranks) for every rule the table shows."""
    first = next(iter(scores.values()))
    ks = sorted(first, key=int)
    steps = sorted({s for r in first.values() for s in r["dev"] if s != "final"}, key=int)
    out = [(f"probe at step {s}" + (" (the run's)" if s == probe_step else ""), s, ks) for s in steps]
    out.append((f"full ({len(ks)} restarts)", "final", ks))
    out += [(f"full, first {n}", "final", ks[:n]) for n in range(len(ks) - 1, 0, -1)]
    return out


def table(scores: dict, probe_step: str) -> list[dict]:
    seeds = sorted(scores, key=lambda s: int(s.removeprefix("seed")))
    mine = {s: pick(scores[s], probe_step, sorted(scores[s], key=int)) for s in seeds}
    rows = []
    for name, at, among in rules(scores, probe_step):
        picks = {s: pick(scores[s], at, among) for s in seeds}
        dev = [scores[s][picks[s]]["dev"]["final"] for s in seeds]
        test = [scores[s][picks[s]]["test"] for s in seeds]
        gain = paired_gain({s: scores[s][mine[s]]["dev"]["final"] for s in seeds}, dict(zip(seeds, dev)))
        diff = [d - scores[s][mine[s]]["dev"]["final"] for s, d in zip(seeds, dev)]
        rows.append(
            {
                "rule": name,
                "picks": [int(picks[s]) for s in seeds],
                "dev": dev,
                "test": test,
                "paired": diff,
                "paired_se": gain["se"],
            }
        )
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True, help="a bench_outcomes.py --stages sft work directory (restarts runs)")
    ap.add_argument("--jobs", type=int, default=1, help="restarts finished at a time (one thread each)")
    ap.add_argument("--write", help="also write the scores and the table here (JSON)")
    args = ap.parse_args(argv)
    from posttrain.checkpoints.files import read_json
    from posttrain.errors import UserError
    from posttrain.trainers import sft_restarts

    if args.jobs < 1:
        ap.error(f"--jobs {args.jobs}: at least 1")
    runs = [r for r in Path(args.work).glob("seed*/sft") if r.parent.name.removeprefix("seed").isdigit()]
    runs.sort(key=lambda r: int(r.parent.name.removeprefix("seed")))
    bad = [r for r in runs if not (r / "restarts").is_dir() or not any((r / "restarts").glob("*/probe.json"))]
    if not runs or bad:
        ap.error(
            f"--work {args.work}: no SFT restarts run with a probe at {bad[0] if bad else args.work + '/seed*/sft'}"
        )
    try:  # every run's config and probe records read before anything trains: a corrupt one is exit 2 at once
        probe_step = str(sft_restarts.probe_step(_config(runs[0])))
        for r in runs:
            _config(r)
            for probe in sorted((r / "restarts").glob("*/probe.json")):
                read_json(probe, "probe record", sft_restarts.PROBE_KEYS)
    except UserError as e:
        ap.error(str(e))
    todo = [
        str(d)
        for r in runs
        for d in sorted((r / "restarts").iterdir())
        if d.is_dir() and not (d / "summary.json").is_file()
    ]
    print(f"finishing {len(todo)} restarts, {args.jobs} at a time", flush=True)
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
        for i, d in enumerate(pool.map(finish, todo), 1):
            print(f"  {i}/{len(todo)} {d}", flush=True)
    scores = {r.parent.name: score_seed(r) for r in runs}
    rows = table(scores, probe_step)
    print(
        f"\n{len(scores)} seeds, restarts ranked on each run's dev problems; paired: final dev against the run's probe"
    )
    print("| rule | kept restart by seed | final dev (worst) | paired dev gain (se), points | test ± sd (worst) |")
    print("|---|---|---|---|---|")
    for r in rows:
        se = "-" if r["paired_se"] is None else f"{100 * r['paired_se']:.1f}"
        print(
            f"| {r['rule']} | {' '.join(map(str, r['picks']))} | {statistics.mean(r['dev']):.3f} ({min(r['dev']):.3f}) "
            f"| {100 * statistics.mean(r['paired']):+.1f} ({se}) | "
            f"{statistics.mean(r['test']):.3f} ± {statistics.stdev(r['test']) if len(r['test']) > 1 else 0:.3f} "
            f"({min(r['test']):.3f}) |"
        )
    print("(full rules choose and score on the same dev problems: their dev columns are optimistic, test is not)")
    if args.write:
        from bench_outcomes import portable, versions

        from posttrain.data.io import atomic_write_json

        argv = ["python", "benchmarks/bench_restart_probe.py", *(argv if argv is not None else sys.argv[1:])]
        work = Path(args.work).resolve()
        roots = {work: "WORK", Path(args.work): "WORK"}
        record = {"command": portable([str(a) for a in argv], roots), "versions": versions()}
        atomic_write_json(Path(args.write), {**record, "scores": scores, "table": rows})
        print(f"record: {args.write}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
