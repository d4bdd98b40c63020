"""Where a checkpoint is: a checkpoint directory, or the one a run directory's ``model/`` or ``checkpoints/latest`` names.

A run directory (``--out``) holds ``run.json`` (its run id and trainer), ``checkpoints/step-NNNNNNNN/`` with
``checkpoints/latest`` naming the newest, and the final ``model/``; every checkpoint's ``trainer_state.json`` records
its step, ``run_id`` and ``trainer``. :func:`find_checkpoint` picks the checkpoint a path means (only those of the
directory's own run; ``latest`` must name a complete ``step-*`` beside it, anything else is ignored with a warning).
Writing run directories and resuming them is :mod:`posttrain.trainers.run_dir`'s; loading what is found,
:mod:`posttrain.checkpoints.load`'s. No torch here: the CLI reads run directories while it parses flags.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from posttrain.data.io import recover_dir
from posttrain.errors import UserError

RUN_FILE = "run.json"
STATE_FILE = "trainer_state.json"
REWARD_HEAD_FILE = "reward_head.safetensors"
STEP_NAME = re.compile(r"step-\d{8}")
COMMANDS = {
    "sft": "sft",
    "sft_restarts": "sft --restarts",
    "rm": "rm",
    "rm_eval": "rm --eval-only",
    "dpo": "dpo",
    "policy_gradient": "grpo",
    "ppo": "ppo",
}
"""trainer name (as stored in run.json / trainer_state.json) -> the CLI command that runs it: the trainer registry's
``command_of`` (posttrain.trainers.engine.registry) spelled out here, since checkpoint reading sits below the trainers;
tests/test_layers.py checks the two agree."""


def read_json_file(path: Path, what: str = "checkpoint file") -> dict:
    """A JSON object from ``path``, or a one-line UserError naming the file (empty, garbage, not an object)."""
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: missing {what}") from None
    except json.JSONDecodeError as e:
        reason = "empty" if not e.doc.strip() else f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}"
        raise UserError(f"{path}: corrupt {what} ({reason})") from None
    except UnicodeDecodeError as e:
        reason = f"not valid UTF-8 at byte {e.start}"
        raise UserError(f"{path}: corrupt {what} ({reason})") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read {what} ({e.strerror or e})") from None
    if not isinstance(obj, dict):
        raise UserError(f"{path}: corrupt {what} (expected a JSON object, got {type(obj).__name__})")
    return obj


def warn(msg: str) -> None:
    print(f"warning: {msg}", file=sys.stderr, flush=True)


def command_of(trainer) -> str:
    return COMMANDS.get(trainer, str(trainer))


def _adapter_only(p: Path) -> bool:
    return (p / "adapter_config.json").is_file() and not (p / "config.json").is_file()


def is_checkpoint(p: Path) -> bool:
    """A plain checkpoint (``model.safetensors``) or a sharded one (``dcp/``, written under --fsdp), with ``config.json``;
    or a LoRA run's final ``model/``: the adapter alone (``adapter_config.json`` naming its base) and its state."""
    if _adapter_only(p) and (p / STATE_FILE).is_file():
        return True
    return ((p / "model.safetensors").is_file() or (p / "dcp").is_dir()) and (p / "config.json").is_file()


def checkpoint_state(p: Path) -> dict:
    """``trainer_state.json`` of checkpoint ``p`` ({} if it has none), checked to be an object with an integer step."""
    f = p / STATE_FILE
    if not f.exists():
        return {}
    state = read_json_file(f)
    if not isinstance(state.get("step", 0), int) or isinstance(state.get("step"), bool):
        raise UserError(f"{f}: corrupt checkpoint file ('step' is {state.get('step')!r}, not an integer)")
    return state


def checkpoint_kind(p: Path, state: dict) -> str:
    """'reward_model' (a ``posttrain rm`` checkpoint: a scalar head on the backbone) or 'policy' (a language model)."""
    return "reward_model" if (p / REWARD_HEAD_FILE).is_file() or state.get("reward_model") else "policy"


def latest_checkpoint(root: Path) -> Path | None:
    """The checkpoint ``root/latest`` names (``step-NNNNNNNN`` beside it), else the newest complete ``step-*``."""
    f = root / "latest"
    if f.exists() or f.is_symlink():
        name = None
        if f.is_file() and not f.is_symlink():
            with open(f, "rb") as fh:
                name = fh.read(64).decode("ascii", errors="replace").strip()
        target = root / name if name and STEP_NAME.fullmatch(name) else None
        if target is None:
            warn(f"ignoring {f}: it must name a checkpoint beside it (step-NNNNNNNN), got {name!r}")
        elif target.is_symlink() or not is_checkpoint(recover_dir(target)):
            warn(f"ignoring {f}: {target} is {'a symlink' if target.is_symlink() else 'missing or incomplete'}")
            target = None
        if target is not None:
            return target
    steps = sorted(
        d
        for d in root.glob("step-*")
        if STEP_NAME.fullmatch(d.name) and not d.is_symlink() and is_checkpoint(recover_dir(d))
    )
    return steps[-1] if steps else None


def read_run(root: Path) -> dict | None:
    """``root/run.json``, or None where there is none (a checkpoint directory, an older run layout)."""
    f = root / RUN_FILE
    if not f.exists():
        return None
    info = read_json_file(f, "run file")
    if not isinstance(info.get("run_id"), str):
        raise UserError(f"{f}: corrupt run file (no run_id)")
    return info


def find_checkpoint(path: str | Path, prefer_latest: bool = False, run_id: str | None = None) -> Path:
    """A checkpoint directory, or a run directory's ``model/`` or newest ``checkpoints/`` entry of its own run.

    Candidates of a run directory are those whose run id is ``run_id`` (default: ``run.json``'s); with
    ``prefer_latest`` (resume) the newest by step wins, else ``model/`` first. A checkpoint named directly is
    returned as is, unless it carries a run id other than ``run_id``.
    """
    p = Path(path)
    if not p.exists() and not p.with_name(p.name + ".old").is_dir():
        raise UserError(f"checkpoint not found: {p}")
    if is_checkpoint(recover_dir(p)):
        own = checkpoint_state(p).get("run_id")
        if run_id is not None and own is not None and own != run_id:
            raise UserError(f"{p} belongs to run {own}, not to the run being resumed ({run_id})")
        return p
    info = read_run(p)
    if run_id is None and info is not None:
        run_id = info["run_id"]
    candidates = []
    if is_checkpoint(recover_dir(p / "model")):
        candidates.append(p / "model")
    latest = latest_checkpoint(p / "checkpoints")
    if latest is not None:
        candidates.append(latest)
    ids = {c: checkpoint_state(c).get("run_id") for c in candidates}
    if run_id is not None:
        for c in candidates:
            if ids[c] != run_id:
                warn(f"ignoring {c}: saved by run {ids[c] or '(none recorded)'}, not by this directory's run {run_id}")
        candidates = [c for c in candidates if ids[c] == run_id]
        if not candidates and ids:
            raise UserError(
                f"{p} holds no checkpoint of its run {run_id} (only of other runs: {', '.join(str(c) for c in ids)})"
            )
    elif len(set(ids.values())) > 1:
        raise UserError(f"{p} holds checkpoints of different runs and no {RUN_FILE}: name one, e.g. {candidates[-1]}")
    if not candidates and info is not None:
        raise UserError(
            f"{p} holds no checkpoint yet (its run stopped before the first save): run the same command without "
            f"--resume, which starts it again from step 0"
        )
    if not candidates:
        raise UserError(
            f"{p} holds no checkpoint (expected model.safetensors + config.json, model/ or checkpoints/latest)"
        )
    if not prefer_latest:
        return candidates[0]
    resumable = [c for c in candidates if not _adapter_only(c)]  # a LoRA run's adapter-only model/: no optimizer
    return max(resumable or candidates, key=lambda c: checkpoint_state(c).get("step", 0))
