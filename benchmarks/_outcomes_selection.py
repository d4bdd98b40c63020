"""Which split chose what in an outcomes sweep (``bench_outcomes.py``), and the rule that test never chooses.

Every choice a sweep's numbers rest on is made on the embedded task's dev split; the test (held-out) split is
reported and nothing else:

    choice                                  split       where
    SFT restart kept (restarts > 1)         dev         trainers/sft_restarts.py (or --val-data's split)
    SFT checkpoint (val_fraction > 0)       dev         trainers/sft.py (or --val-data's split)
    SFT runs taken from a sweep             as above    read from each run's config.resolved.json (--sft-from)
    any other final model                   none        the last step (grpo/ppo: the tail weight average)
    the recipe, between sweeps              dev         bench_outcomes.py --choose: a paired dev gain over the
                                                        incumbent beyond 2 standard errors
    the numbers reported                    test        every run's held-out accuracy

:func:`selection` derives that record from a stage's resolved config (``outcomes.json`` keeps it per stage as
``selection``), :func:`refuse_test` turns a record in which test chose anything into a :class:`SelectionError`
(the sweep does not start), :func:`taken_sft` does both for SFT runs another sweep made, and :func:`choose` picks a
recipe among finished sweeps by their dev scores, refusing a sweep that has none (it would have to choose on test)
or whose record says test chose something; a candidate replaces the incumbent (the first sweep) only when its dev
gain, paired by seed, clears the noise (``min_z`` standard errors), so that of near-equal recipes the one already
measured everywhere stays.

Worked example: ``--sft-args "--val-data heldout.jsonl"`` where a line of heldout.jsonl is a test problem ->
``selection("sft", recipe)["chose"]["restart"] == "test"`` -> the sweep exits 2 before any run.

Not handled: choices made outside the recorded flags (a person reading test numbers and editing a preset).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path


class SelectionError(ValueError):
    """A sweep that would choose, or did choose, on the test split (the message names what and where)."""


def _task(recipe: dict):
    from posttrain.config import from_dict
    from posttrain.tasks.embedded import TaskConfig

    return from_dict(TaskConfig, recipe.get("task") or {})


def file_split(path: str, recipe: dict) -> str:
    """The split the problems of ``path`` (JSONL of {prompt, answer}) lie in: "test" when any is a test problem of
    the recipe's task, "dev" when all are dev problems, else "train" (or a file of other problems)."""
    from posttrain.data.io import iter_jsonl
    from posttrain.tasks.embedded import split_of

    task = _task(recipe)
    splits = {split_of(str(rec.get("prompt", "")), task) for _, rec in iter_jsonl(path)}
    if "test" in splits:
        return "test"
    return "dev" if splits == {"dev"} else "train"


def selection(stage: str, recipe: dict | None) -> dict:
    """``{"chose": {what: split}, "selection_split": ..., "reported_split": "test"}`` of one stage's resolved config
    (None: flags this tree cannot resolve, recorded as unknown). ``selection_split`` is "dev" when every choice is
    made on dev or on nothing, else the other split named."""
    if recipe is None:
        return {"chose": {}, "selection_split": "unknown", "reported_split": "test"}
    chose = {"recipe": "dev"}  # a sweep's settings are compared on dev (--choose)
    on_user_data = bool(recipe.get("data"))
    if stage == "sft":
        source = file_split(recipe["val_data"], recipe) if recipe.get("val_data") else "dev"
        if on_user_data and not recipe.get("val_data"):
            source = "train"  # a slice of --data's demonstrations
        if recipe.get("restarts", 1) > 1:
            chose["restart"] = source
        chose["checkpoint"] = source if recipe.get("val_fraction", 0) > 0 else "none (the last step)"
    elif stage in ("grpo", "ppo"):
        tail = recipe.get("average_last", 1) > 1
        chose["checkpoint"] = "none (the tail weight average)" if tail else "none (the last step)"
    else:
        chose["checkpoint"] = "none (the last step)"
    used = {s for s in chose.values() if not s.startswith("none")}
    split = "dev" if used <= {"dev"} else sorted(used - {"dev"})[0]
    return {"chose": chose, "selection_split": split, "reported_split": "test"}


def first_difference(a, b, path: str = "") -> str:
    """Where two JSON-like values first differ, as ``dotted.path: b against a`` (keys in sorted order)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return first_difference(a.get(k), b.get(k), f"{path}{k}.")
    return f"{path.rstrip('.')}: {b!r} against {a!r}"


def taken_sft(run_dirs: list[Path], ignore: tuple[str, ...] = ()) -> tuple[dict | None, dict]:
    """The recipe and selection record of SFT runs a sweep takes from another (``--sft-from``), read from each run's
    own ``config.resolved.json`` (what it trained with, whatever made it). The recipe is the first run's less seed,
    paths and ``ignore`` (settings of how a run uses the machine); the record is unknown when a run has no config.
    SelectionError when a run chose on the test split (its --val-data holds held-out problems) or when the runs
    trained different recipes (a sweep over their seeds would mix them)."""
    recipe, record, first = None, None, None
    for run in run_dirs:
        try:
            cfg = json.loads((Path(run) / "config.resolved.json").read_text())
            rec = selection("sft", cfg)
        except (OSError, ValueError):  # no config, or its --val-data is gone: what chose its restart cannot be told
            return None, selection("sft", None)
        refuse_test({"sft": rec}, str(run))
        mine = {k: v for k, v in cfg.items() if k not in ("seed", "out", *ignore)}
        if recipe is None:
            recipe, record, first = mine, rec, run
        elif mine != recipe:
            raise SelectionError(
                f"{run}: another SFT recipe than {first} ({first_difference(recipe, mine)}); "
                "a sweep over their seeds would mix two recipes"
            )
    return recipe, record or selection("sft", None)


def refuse_test(records: dict[str, dict], where: str = "this sweep") -> None:
    """SelectionError when a stage's record says the test split chose anything."""
    for stage, rec in records.items():
        bad = [what for what, split in rec.get("chose", {}).items() if split == "test"]
        if bad:
            raise SelectionError(
                f"{where}: {stage}'s {', '.join(bad)} would be chosen on the test split (held-out problems); "
                "choose on the dev split and report test once"
            )


def _dev_by_seed(report: dict, stage: str) -> dict[str, float]:
    return {s: r[stage]["dev_accuracy"] for s, r in report["results"].items() if "dev_accuracy" in r.get(stage, {})}


def paired_gain(incumbent: dict[str, float], challenger: dict[str, float]) -> dict:
    """The challenger's dev gain over the incumbent, paired by seed (the same SFT starts): mean, its standard error
    (sample sd / sqrt(n) of the per-seed differences) and z = mean / se (inf when every difference is equal and
    positive). Seeds only one of them ran are left out."""
    seeds = sorted(set(incumbent) & set(challenger), key=str)
    diffs = [challenger[s] - incumbent[s] for s in seeds]
    if len(diffs) < 2:
        return {"seeds": len(diffs), "mean": diffs[0] if diffs else None, "se": None, "z": None}
    mean, se = statistics.fmean(diffs), statistics.stdev(diffs) / len(diffs) ** 0.5
    z = mean / se if se > 0 else (math.inf if mean > 0 else 0.0 if mean == 0 else -math.inf)
    return {"seeds": len(diffs), "mean": mean, "se": se, "z": z}


def choose(paths: list[str], stage: str, min_z: float = 2.0) -> dict:
    """The sweep (an ``outcomes.json``) to keep for ``stage``, chosen on dev, with its test numbers to report.

    The first sweep is the incumbent (the current default). Another replaces it only when its dev accuracy beats the
    incumbent's by more than the noise of the comparison: the mean of the per-seed differences (paired by seed, the
    runs starting from the same SFT runs) over ``min_z`` standard errors of that mean. Among those that clear it, the
    best mean dev accuracy wins (the first on ties); when none does, the incumbent stays. ``min_z=0`` is the plain
    best-mean rule for any positive paired gain. With ``min_z > 0`` a challenger needs at least 2 seeds shared with
    the incumbent (one difference has no noise estimate). SelectionError when a sweep has no dev scores for
    ``stage`` (choosing would look at test) or its record says test chose something."""
    rows, devs = [], []
    for path in paths:
        try:
            report = json.loads(Path(path).read_text())
            runs = report["results"]
            dev = _dev_by_seed(report, stage)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise SelectionError(f"{path}: not a bench_outcomes.py outcomes.json ({e})") from None
        refuse_test(report.get("selection") or {}, path)
        if not dev:
            raise SelectionError(
                f"{path}: no dev-split scores for {stage}; choosing among sweeps on its held-out numbers would select "
                "on the test split (rerun it with --dev)"
            )
        test = [r[stage]["accuracy"] for r in runs.values() if "accuracy" in r.get(stage, {})]
        devs.append(dev)
        rows.append(
            {
                "path": path,
                "flags": (report.get("extra_args") or {}).get(stage, ""),
                "dev_mean": statistics.fmean(dev.values()),
                "dev_min": min(dev.values()),
                "seeds": len(dev),
                "test_mean": statistics.fmean(test) if test else None,
                "test_min": min(test) if test else None,
            }
        )
    for row, dev in zip(rows[1:], devs[1:]):
        gain = paired_gain(devs[0], dev)
        if min_z > 0 and gain["seeds"] < 2:
            raise SelectionError(
                f"{row['path']}: {gain['seeds']} seed(s) shared with the incumbent {rows[0]['path']}; at least 2 are "
                "needed to tell a dev gain from noise (run the same seeds, or --min-z 0)"
            )
        row["paired_gain"] = gain
        row["clears"] = gain["mean"] is not None and gain["mean"] > 0 and (min_z == 0 or gain["z"] > min_z)
    rows[0]["clears"] = True
    best = max((r for r in rows if r["clears"]), key=lambda r: (r["dev_mean"], -rows.index(r)))
    return {
        "stage": stage,
        "chosen": best,
        "candidates": rows,
        "incumbent": rows[0]["path"],
        "min_z": min_z,
        "chosen_on": "dev",
        "reported_on": "test",
    }


def print_choice(picked: dict) -> None:
    """Each candidate's dev score, then the chosen sweep and its test accuracy (the one number to report)."""
    stage = picked["stage"]
    for c in picked["candidates"]:
        line = f"{c['path']}: {stage} dev {c['dev_mean']:.3f} (worst seed {c['dev_min']:.3f}, {c['seeds']} seeds)"
        gain = c.get("paired_gain")
        if gain is None:
            line += "  the incumbent"
        elif gain["se"] is not None:
            verdict = "clears" if c["clears"] else "within noise" if gain["mean"] > 0 else "no gain"
            line += (
                f"  paired gain {gain['mean'] * 100:+.1f} ± {gain['se'] * 100:.1f} points (se, {gain['seeds']} "
                f"seeds; z {gain['z']:.1f}): {verdict} (needs z > {picked['min_z']:g})"
            )
        print(line)
    best = picked["chosen"]
    test = f"{best['test_mean']:.3f} (worst seed {best['test_min']:.3f})" if best["test_mean"] is not None else "n/a"
    print(f"chosen on dev: {best['path']} ({stage} flags {best['flags']!r}); its test accuracy: {test}")
