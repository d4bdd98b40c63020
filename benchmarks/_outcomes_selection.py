"""Which split chose what in an outcomes sweep (``bench_outcomes.py``), and the rule that test never chooses.

Every choice a sweep's numbers rest on is made on the embedded task's dev split; the test (held-out) split is
reported and nothing else:

    choice                                  split       where
    SFT restart kept (restarts > 1)         dev         trainers/sft_restarts.py (or --val-data's split)
    SFT checkpoint (val_fraction > 0)       dev         trainers/sft.py (or --val-data's split)
    any other final model                   none        the last step (grpo/ppo: the tail weight average)
    the recipe, between sweeps              dev         bench_outcomes.py --choose: the best dev mean
    the numbers reported                    test        every run's held-out accuracy

:func:`selection` derives that record from a stage's resolved config (``outcomes.json`` keeps it per stage as
``selection``), :func:`refuse_test` turns a record in which test chose anything into a :class:`SelectionError`
(the sweep does not start), and :func:`choose` picks a recipe among finished sweeps by their dev scores, refusing a
sweep that has none (it would have to choose on test) or whose record says test chose something.

Worked example: ``--sft-args "--val-data heldout.jsonl"`` where a line of heldout.jsonl is a test problem ->
``selection("sft", recipe)["chose"]["restart"] == "test"`` -> the sweep exits 2 before any run.

Not handled: choices made outside the recorded flags (a person reading test numbers and editing a preset).
"""

from __future__ import annotations

import json
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


def refuse_test(records: dict[str, dict], where: str = "this sweep") -> None:
    """SelectionError when a stage's record says the test split chose anything."""
    for stage, rec in records.items():
        bad = [what for what, split in rec.get("chose", {}).items() if split == "test"]
        if bad:
            raise SelectionError(
                f"{where}: {stage}'s {', '.join(bad)} would be chosen on the test split (held-out problems); "
                "choose on the dev split and report test once"
            )


def choose(paths: list[str], stage: str) -> dict:
    """The sweep (an ``outcomes.json``) whose ``stage`` has the best mean dev accuracy (the first on ties), with its
    test numbers to report. SelectionError when a sweep has no dev scores for ``stage`` (choosing would look at test)
    or its record says test chose something."""
    rows = []
    for path in paths:
        try:
            report = json.loads(Path(path).read_text())
            runs = report["results"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SelectionError(f"{path}: not a bench_outcomes.py outcomes.json ({e})") from None
        refuse_test(report.get("selection") or {}, path)
        dev = [r[stage]["dev_accuracy"] for r in runs.values() if "dev_accuracy" in r.get(stage, {})]
        if not dev:
            raise SelectionError(
                f"{path}: no dev-split scores for {stage}; choosing among sweeps on its held-out numbers would select "
                "on the test split (rerun it with --dev)"
            )
        test = [r[stage]["accuracy"] for r in runs.values() if "accuracy" in r.get(stage, {})]
        rows.append(
            {
                "path": path,
                "flags": (report.get("extra_args") or {}).get(stage, ""),
                "dev_mean": statistics.fmean(dev),
                "dev_min": min(dev),
                "seeds": len(dev),
                "test_mean": statistics.fmean(test) if test else None,
                "test_min": min(test) if test else None,
            }
        )
    best = max(rows, key=lambda r: (r["dev_mean"], -rows.index(r)))
    return {"stage": stage, "chosen": best, "candidates": rows, "chosen_on": "dev", "reported_on": "test"}


def print_choice(picked: dict) -> None:
    """Each candidate's dev score, then the chosen sweep and its test accuracy (the one number to report)."""
    stage = picked["stage"]
    for c in picked["candidates"]:
        print(f"{c['path']}: {stage} dev {c['dev_mean']:.3f} (worst seed {c['dev_min']:.3f}, {c['seeds']} seeds)")
    best = picked["chosen"]
    test = f"{best['test_mean']:.3f} (worst seed {best['test_min']:.3f})" if best["test_mean"] is not None else "n/a"
    print(f"chosen on dev: {best['path']} ({stage} flags {best['flags']!r}); its test accuracy: {test}")
