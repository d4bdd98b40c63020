"""Joining outcomes sweeps (``bench_outcomes.py --combine``): which sweeps ran one recipe, and their union as one.

Two sweeps can be reported together when every stage they share ran the same config on the same CPU kernels (other
kernels round otherwise, so a seed follows another trajectory). A stage's config is what its flags resolve to in
``posttrain STAGE`` (:func:`resolved_recipe`), as the sweep recorded it (``recipes``, since 2026-12-04) or, for an
older file, as this tree resolves its flags, a preset since removed spelled out as the flags it was
(:data:`RETIRED_PRESETS`). How a run uses the machine (threads, progress bars, SFT's restart workers) is not part of
its recipe.

    --sft-args "--preset slots --restarts 16"  and  --sft-args "--preset slots16"   -> one recipe (a note says so)
    --sft-args "--restarts 16"                 and  no flags                        -> another recipe: refused

Here: :func:`combine` (the union of several sweeps' per-seed runs, or a :class:`CombineError` naming the file),
:func:`combined_report` (that union as one ``outcomes.json``), :func:`resolved_recipe` and :func:`same_recipe`.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from benchmarks._outcomes_selection import SelectionError, first_difference, refuse_test


class CombineError(ValueError):
    """Sweeps that cannot be reported together (the message names the file)."""


_CONFIGS = {  # stage -> (module, config class): what `posttrain STAGE` resolves its flags into (posttrain/cli/)
    "sft": ("posttrain.trainers.sft", "SFTConfig"),
    "grpo": ("posttrain.trainers.policy_gradient", "PolicyGradientConfig"),
    "dpo": ("posttrain.trainers.dpo", "DPOConfig"),
    "rm": ("posttrain.trainers.reward", "RMConfig"),
    "ppo": ("posttrain.trainers.ppo", "PPOConfig"),
}


# Presets that recorded sweeps (docs/outcomes/*.json) named and this tree no longer has, spelled out as the flags they
# were, so that an old record's flags still resolve: (stage, preset) -> flags. `single` is the SFT field defaults.
RETIRED_PRESETS = {
    ("sft", "slots"): "--preset single --restarts 8 --restart-probe 0.5 --restart-keep 2 --model.digit-slots 2",
    ("grpo", "classic"): "--preset tiny --steps 500 --lr 1e-4 --dynamic-sampling false --alarms.collapse-fraction 0 "
    "--reward exact_match:1.0 --average-last 1 --prompt-filter false",
    ("dpo", "classic"): "--preset tiny --loss dpo",
}


def spell_retired(stage: str, argv: list[str]) -> list[str]:
    """``argv`` with every ``--preset NAME`` of :data:`RETIRED_PRESETS` replaced by its flags
    (``["--preset", "slots", "--restarts", "16"]`` -> ``["--preset", "single", "--restarts", "8", ..., "--restarts", "16"]``)."""
    out, i = [], 0
    while i < len(argv):
        flags = RETIRED_PRESETS.get((stage, argv[i + 1])) if argv[i] == "--preset" and i + 1 < len(argv) else None
        out += shlex.split(flags) if flags else argv[i : i + 1 + (flags is not None)]
        i += 2 if flags else 1
    return out


HOW_IT_RUNS = ("threads", "progress", "restart_jobs")
"""Fields that change how a run uses the machine, not what it trains: not part of a recipe."""


def resolved_recipe(stage: str, extra: str) -> dict | None:
    """The config ``posttrain STAGE --preset tiny EXTRA`` resolves to with this tree's presets (the sweep's own
    command, less seed and paths; a retired preset spelled out, :data:`RETIRED_PRESETS`), so `--preset slots
    --restarts 16` and `--preset slots16` compare equal; None when this tree's CLI does not take the flags."""
    import contextlib
    import dataclasses
    import importlib
    import io

    from posttrain.cli import build_parser
    from posttrain.cli._common import resolve
    from posttrain.errors import UserError

    argv = [stage, "--preset", "tiny", *spell_retired(stage, shlex.split(extra))]
    module, cls = _CONFIGS[stage]
    mod = importlib.import_module(module)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            args = build_parser(argv).parse_args(argv)
        recipe = dataclasses.asdict(resolve(getattr(mod, cls), mod.PRESETS, args))
    except (SystemExit, ValueError, UserError):  # argparse's exit on an unknown flag; an unknown preset; a bad value
        return None
    return {k: v for k, v in recipe.items() if k not in HOW_IT_RUNS}


def _shared(a: dict, b: dict) -> dict:
    """``a``'s settings that ``b`` records too (nested configs alike), less :data:`HOW_IT_RUNS`: a setting only one
    record has did not exist when the other ran (a knob added later, whose default keeps the old behaviour)."""
    return {
        k: _shared(v, b[k]) if isinstance(v, dict) and isinstance(b[k], dict) else v
        for k, v in a.items()
        if k in b and k not in HOW_IT_RUNS
    }


def same_recipe(stage, flags, first_flags, path, first_path, mine=None, theirs=None) -> str | None:
    """None when both sweeps ran ``stage`` alike; a note when other flags resolve to the same config; CombineError when
    they do not (naming the first setting that differs). ``mine`` / ``theirs``: the configs the sweeps recorded when they
    ran (outcomes.json "recipes", since 2026-12-04), which catch a preset that changed between them under the same flags;
    without them the flags are resolved with this tree's presets."""
    if flags == first_flags and (mine is None or theirs is None or mine == theirs):
        return None
    recorded = mine is not None and theirs is not None
    if recorded:
        mine, theirs = _shared(mine, theirs), _shared(theirs, mine)
        if flags == first_flags and mine == theirs:
            return None
    mine = mine if recorded else resolved_recipe(stage, flags)
    theirs = theirs if recorded else resolved_recipe(stage, first_flags)
    if mine is None or theirs is None:
        raise CombineError(f"{path}: {stage} ran with {flags!r}, {first_path} with {first_flags!r}: another recipe")
    if mine != theirs:
        raise CombineError(
            f"{path}: {stage} ran with {flags!r}, {first_path} with {first_flags!r}: another recipe "
            f"({first_difference(theirs, mine)})"
        )
    how = "as the sweeps recorded them" if recorded else "this tree's presets"
    return f"{stage} ran with {flags!r} in {path}, {first_flags!r} in {first_path}: the same config ({how})"


def report_sft(report: dict) -> set:
    """{"sft"} when the sweep took its SFT runs from another one (--sft-from): its recorded sft recipe says nothing."""
    return {"sft"} if report.get("sft_from") else set()


def combine(paths: list[str]) -> tuple[dict[int, dict[str, dict]], list[str]]:
    """Union of the per-seed results of several outcomes.json files -> (results, notes). CombineError when the
    sweeps ran other settings (a stage's config: recorded, or its flags resolved), on other CPU kernels, or disagree on a
    seed they share."""
    results: dict[int, dict[str, dict]] = {}
    first_cpu, notes, commits, measures = None, [], {}, {}
    ref: dict[str, tuple] = {}  # stage -> (path, flags, recorded config) of the first sweep that ran it
    for path in paths:
        try:
            report = json.loads(Path(path).read_text())
            runs, ver = report["results"], report.get("versions") or {}
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CombineError(f"{path}: not a bench_outcomes.py outcomes.json ({e})") from None
        used = {st for r in runs.values() for st in r}
        try:
            refuse_test(report.get("selection") or {}, path)
        except SelectionError as e:
            raise CombineError(str(e)) from None
        if report_sft(report) and "sft" in used:  # its SFT runs are another sweep's: their recipe is checked there
            notes.append(
                f"{path} took its SFT runs from {report['sft_from']} (--sft-from): combine that sweep to check them"
            )
        for st in sorted(used - report_sft(report)):
            flags = (report.get("extra_args") or {}).get(st, "")
            recipe = (report.get("recipes") or {}).get(st)
            if st not in ref:
                ref[st] = (path, flags, recipe)
                continue
            note = same_recipe(st, flags, ref[st][1], path, ref[st][0], recipe, ref[st][2])
            if note:
                notes.append(note)
        if first_cpu is None:
            first_cpu = (path, ver.get("cpu"))
        elif ver.get("cpu") != first_cpu[1]:
            raise CombineError(
                f"{path}: ran on {ver.get('cpu')!r}, {first_cpu[0]} on {first_cpu[1]!r}: other kernels, other trajectories"
            )
        commits.setdefault(ver.get("git_commit"), []).append(path)
        both = [r for st in runs.values() for name, r in st.items() if name != "rm" and "heldout_all" in r]
        if both:  # the trainers scored the whole split where their accuracy is its accuracy on every run
            whole = all(r.get("accuracy") == r["heldout_all"] for r in both)
            measure = "the whole held-out split" if whole else "a sample of the held-out split"
            measures.setdefault(measure, []).append(path)
        for seed, stages in runs.items():
            seed = int(seed)
            for st, r in stages.items():
                old = results.get(seed, {}).get(st)
                if old is not None and (old.get("accuracy"), old.get("heldout_all")) != (
                    r.get("accuracy"),
                    r.get("heldout_all"),
                ):
                    raise CombineError(f"{path}: seed {seed}'s {st} differs from an earlier file's")
                results.setdefault(seed, {})[st] = r
    if len(commits) > 1:
        notes.append(
            "the sweeps ran different commits: "
            + "; ".join(f"{c or 'unknown'} ({', '.join(p)})" for c, p in commits.items())
        )
    if len(measures) > 1:
        notes.append(
            "the trainers' accuracy is "
            + "; ".join(f"{m} in {', '.join(p)}" for m, p in measures.items())
            + ": compare the 'all held-out problems' rows"
        )
    return results, notes


def combined_report(paths: list[str], results: dict[int, dict[str, dict]], agg: dict) -> dict:
    """One outcomes.json for the union of the sweeps ``paths`` (checked alike by :func:`combine`): the first one's
    settings, every seed's runs, the aggregate over them, and the files and wall time they came from."""
    reports = [json.loads(Path(p).read_text()) for p in paths]
    first = reports[0]
    return {
        **{k: v for k, v in first.items() if k not in ("results", "aggregate", "curves")},
        "seeds": sorted(results),
        "results": {str(k): results[k] for k in sorted(results)},
        "aggregate": agg,
        "curves": [],
        "combined_from": [str(p) for p in paths],
        "sweep_wall_seconds": sum(r.get("sweep_wall_seconds") or 0.0 for r in reports),
    }
