"""What every pipeline module shares: the :class:`Stage` declaration, the :class:`Context` a stage runs in,
the held-out table, small file helpers. (Stages themselves are declared in :mod:`.stages`.)"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

POLICY_STAGES = ("sft", "sft_raw", "dpo", "grpo", "ppo")
TRAINED = ("sft", "sft_raw", "rm", "dpo", "grpo", "ppo")
LABELS = {
    "sft": "SFT",
    "rm_best_of_n": "RM best-of-N over SFT samples",
    "rm_weighted_best_of_n": "RM best-of-N weighted (same samples)",
    "dpo": "DPO",
    "grpo": "GRPO",
    "ppo": "PPO",
    "sft_raw": "SFT on the raw corpus (contaminated)",
}


@dataclass(frozen=True)
class Metric:
    key: str  # dotted path into the stage's summary
    label: str
    fmt: str = "{}"


@dataclass(frozen=True)
class Stage:
    name: str
    title: str
    deps: tuple[str, ...]
    config: Callable[[Any], Any]
    run: Callable[..., dict]
    schema: tuple[Metric, ...]
    inputs: Callable[[Any], dict] = lambda ctx: {}
    available: Callable[[], str | None] = lambda: None
    resumable: bool = False
    optional_deps: bool = False  # eval/report: use whichever dependencies ran (the others were skipped)
    enabled: Callable[[Any], str | None] = lambda ctx: None  # why the config turns it off, else None


@dataclass
class Context:
    """What a stage sees: the pipeline config, the run directory, the DONE records of earlier stages."""

    cfg: Any
    run_dir: Path
    quiet: bool = False
    done: dict[str, dict] = field(default_factory=dict)  # stage -> DONE.json of this invocation
    statuses: dict[str, str] = field(default_factory=dict)
    stages: tuple = ()  # the declared stages (set by the runner)
    started: float = 0.0  # perf_counter at the start of this invocation
    header: dict = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)  # stage -> why it was skipped

    def dir(self, stage: str) -> Path:
        return self.run_dir / stage

    def model(self, stage: str) -> Path:
        return self.dir(stage) / "model"

    def summary(self, stage: str) -> dict | None:
        d = self.done.get(stage)
        return d["summary"] if d else None


def get(d: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def write_jsonl(path: Path, records) -> int:
    from posttrain.data.io import atomic_open

    n = 0
    with atomic_open(path, "w") as fh:
        for r in records:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
            n += 1
    return n


def heldout_table(ctx) -> dict[str, dict]:
    """stage -> {greedy, pass@1, pass@k, n} from the eval stage (else each trainer's own held-out accuracy)."""
    ev = (ctx.summary("eval") or {}).get("models", {})
    rows = {}
    for name in ("sft", "rm_best_of_n", "rm_weighted_best_of_n", "dpo", "grpo", "ppo", "sft_raw"):
        if name in ev:
            rows[name] = {
                "greedy": ev[name]["greedy_accuracy"],
                "pass@1": ev[name].get("pass@1"),
                "pass@k": ev[name].get("pass@k"),
                "n": ev[name]["n"],
            }
        elif ctx.summary(name) and "heldout_accuracy" in ctx.summary(name):
            rows[name] = {
                "greedy": ctx.summary(name)["heldout_accuracy"],
                "pass@1": None,
                "pass@k": None,
                "n": ctx.summary(name).get("heldout_n"),
            }
    return rows
