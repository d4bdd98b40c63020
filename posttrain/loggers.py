"""Where a run's metrics go: ``metrics.jsonl`` always, plus TensorBoard and Weights & Biases when asked.

``--logger jsonl,tensorboard,wandb`` (any combination, comma-separated) picks the sinks; ``metrics.jsonl`` is
written whatever the choice (every command's contract, and what the pipeline's plots and reports read). The
run's resolved config goes to each sink as TRL/accelerate send theirs: ``wandb.init(config=...)``, and a
TensorBoard text entry ``config``.

Metric names: ``metrics.jsonl`` keeps the trainer's own keys (``loss``, ``heldout_accuracy``, ``eval_loss``...);
TensorBoard and W&B get them named as transformers' integrations name TRL's logs (:func:`trl_name`):

    "loss" -> "train/loss"      "rewards/margins" -> "train/rewards/margins"
    "eval_loss" -> "eval/loss"  "eval_rewards/accuracies" -> "eval/rewards/accuracies"
    "heldout_accuracy" -> "eval/accuracy"

W&B: the project is ``$WANDB_PROJECT`` (default ``posttrain``), the run's name its ``--out`` folder's name, and
its files go under ``OUT/wandb``; ``WANDB_MODE=offline`` logs without a network. The run id is kept in
``OUT/wandb/run_id`` so ``--resume`` continues the same W&B run. Under ``torchrun`` only rank 0 logs.

Not handled: other sinks (MLflow, Comet...), logging samples or histograms, and W&B sweeps.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from posttrain.data.io import atomic_write_text
from posttrain.errors import ConfigError, UserError

LOGGERS = ("jsonl", "tensorboard", "wandb")
LOGGER_HELP = (
    "metrics sinks, comma-separated: jsonl | tensorboard | wandb (e.g. jsonl,wandb); metrics.jsonl is always "
    "written, and the run's config goes to each sink"
)


def parse_loggers(spec: str) -> tuple[str, ...]:
    """``"jsonl, wandb"`` -> ("jsonl", "wandb"); ConfigError naming an unknown sink. jsonl is always first.

    Example: ``parse_loggers("tensorboard")`` -> ("jsonl", "tensorboard").
    """
    names = [n.strip() for n in str(spec).split(",") if n.strip()]
    bad = [n for n in names if n not in LOGGERS]
    if bad or not names:
        raise ConfigError(
            f"logger={spec!r}: {bad[0] if bad else 'empty'} is not a sink; choose from {', '.join(LOGGERS)} "
            "(several joined by commas)"
        )
    return tuple(dict.fromkeys(["jsonl", *names]))


def check_loggers(name: str, value) -> None:
    """The knob check of a ``logger`` field (:func:`posttrain.config.knob`'s ``check``)."""
    try:
        parse_loggers(value)
    except ConfigError as e:
        raise ConfigError(str(e).replace("logger=", f"{name}=", 1)) from None


def trl_name(key: str) -> str:
    """A metric's name as TRL's logs show it in TensorBoard and W&B (transformers' ``rewrite_logs``).

    Examples: "loss" -> "train/loss"; "eval_loss" -> "eval/loss"; "heldout_accuracy" -> "eval/accuracy";
    "eval/rewards/margins" -> unchanged.
    """
    if key.startswith(("train/", "eval/")):
        return key
    for prefix in ("eval_", "heldout_"):
        if key.startswith(prefix):
            return "eval/" + key[len(prefix) :]
    return "train/" + key


def _numbers(rec: dict[str, Any]) -> dict[str, float]:
    return {trl_name(k): v for k, v in rec.items() if k != "step" and isinstance(v, (int, float))}


def _run_config(out_dir: Path) -> dict:
    """The run's resolved config as it was saved (``config.resolved.json``), or {} before it exists."""
    f = out_dir / "config.resolved.json"
    try:
        return json.loads(f.read_text()) if f.is_file() else {}
    except (OSError, ValueError):
        return {}


def _record(raw: bytes) -> dict | str:
    """One line of ``metrics.jsonl`` as its record, or why it is not one ("not valid JSON: Expecting ',' ...")."""
    try:
        rec = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        return f"not valid UTF-8 at byte {e.start}"
    except json.JSONDecodeError as e:
        return f"not valid JSON: {e.msg}: column {e.colno}"
    if not isinstance(rec, dict):
        return f"a JSON {type(rec).__name__}, not an object"
    step = rec.get("step", 0)
    if isinstance(step, bool) or not isinstance(step, (int, float)):
        return f"its step is {step!r}, not a number"
    return rec


def metrics_upto(path: Path, step: int) -> list[str]:
    """The lines of ``path`` (a ``metrics.jsonl``) whose step is at most ``step``: what a run resumed at ``step``
    keeps. An unreadable last line is what a process killed mid-write leaves: it is dropped with a one-line warning.
    An unreadable line before the last is damage no kill makes: a one-line :class:`~posttrain.errors.UserError`
    naming ``file:line`` (exit 2), the file unchanged. Blank lines are skipped.

    Example: lines ``{"step": 1}``, ``{"step": 2}``, ``{"step": 3, "lo`` and step=2 -> the first two, and
    "warning: .../metrics.jsonl:3: dropping its last line, cut short by a write that did not finish (not valid
    JSON: Unterminated string starting at: column 13)"."""
    lines = path.read_bytes().split(b"\n")
    numbered = [(i, raw) for i, raw in enumerate(lines, 1) if raw.strip()]
    kept = []
    for k, (i, raw) in enumerate(numbered):
        rec = _record(raw)
        if isinstance(rec, str):
            if k < len(numbered) - 1:
                raise UserError(
                    f"{path}:{i}: not a metrics record ({rec}); lines after it are intact, so this is not a cut-short "
                    f"write: fix or delete that line, then resume again"
                )
            print(
                f"warning: {path}:{i}: dropping its last line, cut short by a write that did not finish ({rec})",
                file=sys.stderr,
                flush=True,
            )
            continue
        if rec.get("step", 0) <= step:
            kept.append(raw.decode("utf-8").strip())
    return kept


class TensorBoardSink:
    def __init__(self, out_dir: Path, config: dict):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UserError("--logger tensorboard needs the tensorboard package: pip install tensorboard") from None
        self.writer = SummaryWriter(log_dir=str(out_dir / "tensorboard"))
        if config:
            self.writer.add_text("config", "```\n" + json.dumps(config, indent=2, default=str) + "\n```", 0)

    def log(self, step: int, rec: dict) -> None:
        for k, v in _numbers(rec).items():
            self.writer.add_scalar(k, v, step)

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, out_dir: Path, config: dict, resume: bool):
        try:
            import wandb
        except ImportError:
            raise UserError("--logger wandb needs the wandb package: pip install wandb") from None
        self.wandb = wandb
        root = out_dir / "wandb"
        root.mkdir(parents=True, exist_ok=True)
        id_file = root / "run_id"
        run_id = id_file.read_text().strip() if resume and id_file.is_file() else None
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "posttrain"),
            name=out_dir.resolve().name,
            dir=str(out_dir),
            config=config,
            id=run_id,
            resume="allow" if run_id else None,
            reinit="finish_previous",
        )
        id_file.write_text(self.run.id + "\n")

    def log(self, step: int, rec: dict) -> None:
        values = _numbers(rec)
        if values:
            self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class MetricsLogger:
    """Append-only ``metrics.jsonl`` (+ the sinks ``kind`` names); under ``torchrun`` only rank 0 writes.

    On resume (``resume_step``) lines past the resumed step are dropped first (:func:`metrics_upto`), so the file
    reads like one uninterrupted run; a fresh run starts a fresh file.
    """

    def __init__(self, out_dir: str | Path, kind: str = "jsonl", resume_step: int | None = None):
        from posttrain.trainers import distributed

        out = Path(out_dir)
        self.path = out / "metrics.jsonl"
        self._fh, self.sinks = None, []
        names = parse_loggers(kind)
        if not distributed.world().is_main:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None and self.path.exists():
            kept = metrics_upto(self.path, resume_step)
            atomic_write_text(self.path, "".join(ln + "\n" for ln in kept))
        elif resume_step is None and self.path.exists():
            self.path.unlink()  # a fresh run starts a fresh log
        self._fh = open(self.path, "a", encoding="utf-8")
        config = _run_config(out)
        if "tensorboard" in names:
            self.sinks.append(TensorBoardSink(out, config))
        if "wandb" in names:
            self.sinks.append(WandbSink(out, config, resume=resume_step is not None))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if self._fh is None:
            return
        rec = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        self._fh.write(json.dumps(rec) + "\n")
        self._fh.flush()
        for sink in self.sinks:
            sink.log(step, rec)

    def close(self) -> None:
        if self._fh is None:
            return
        self._fh.close()
        self._fh = None
        for sink in self.sinks:
            sink.close()


def _plain(v):
    import numpy as np
    import torch

    if isinstance(v, torch.Tensor):
        return v.item() if v.numel() == 1 else v.tolist()
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    return v
