"""Checkpoints: one directory each, written atomically, loaded without unpickling arbitrary objects.

Layout of a checkpoint directory::

    model.safetensors     weights (safetensors; fp32 CPU tensors whatever the run's device and dtype; tied weights once)
    config.json           {"model_type": "posttrain-gpt", "config": {...}}, or a Hugging Face model's own config
    tokenizer.json        the tokenizer (posttrain.tokenizers.load reads it)
    generation_config.json, tokenizer_config.json, ...   Hugging Face models: transformers' layout (models/loading.py)
    adapter_config.json, adapter_model.safetensors       LoRA adapters (models/lora.py; base weights in model.safetensors)
    trainer_state.json    step, trainer, run_id, run config, last metrics, plus trainer-specific state (JSON only)
    optimizer.pt          optimizer state_dict (tensors + plain containers: loaded with weights_only=True)
    rng.pt                torch RNG state(s) (same)
    reward_head.safetensors   reward models only (``posttrain rm``, :func:`save_reward_checkpoint`): the scalar head

A run directory keeps ``checkpoints/step-00000100/`` ... and a ``checkpoints/latest`` file naming the
newest; the final model goes to ``model/`` (which checkpoint of a run directory is used, and how run ids
guard it: :mod:`posttrain.checkpoints.layout` and :mod:`posttrain.trainers.run_dir`). Each checkpoint is built in a temp directory and renamed
into place, then ``latest`` is replaced atomically: a kill at any moment leaves the previous
checkpoint intact and ``latest`` pointing at a complete one.

This module writes checkpoints and starts a run's policy; loading is :mod:`posttrain.checkpoints.load` (below the
trainers, so the rewards, evaluation and export load checkpoints without importing a trainer): it checks what it
loads (``accept_kinds``: a policy, i.e. a language model, or a reward model, for ``--init``/eval; ``expect_trainer``,
the trainer recorded in ``trainer_state.json``, for ``--resume``). A corrupt file (truncated weights or optimizer
state, empty or garbage JSON, a pickle holding objects other than tensors) is a one-line :class:`UserError` naming
the file; torch's own message (which suggests ``weights_only=False``) is never shown: every reader of a checkpoint's
files goes through :mod:`posttrain.checkpoints.files`. A
periodic checkpoint that cannot be written (disk full, read-only) is a warning and the run goes on
(:meth:`CheckpointManager.save`); the final save raises.

A diverged model is never written: every save calls :func:`~posttrain.trainers.guards.require_finite_model`,
which refuses a model with a NaN/Inf parameter *or* whose forward pass over a few tokens gives NaN/Inf logits
(one step at ``lr=1e30`` leaves every weight finite near 1e28, and the forward overflows). The refusal is a
one-line :class:`~posttrain.errors.NonFiniteError` naming the directory and step; the last good checkpoint
stays as it was. ``eval`` and ``export`` run the same check on what they load (``refuse_nonfinite_model``).

Not handled: weights that are finite but implausible (a bit-flipped but well-formed file loads).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import errno
import json
import math
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from posttrain.checkpoints.files import failure_reason, load_tensors, load_torch_state
from posttrain.checkpoints.layout import REWARD_HEAD_FILE, STEP_NAME, warn
from posttrain.checkpoints.load import Checkpoint, load_policy
from posttrain.data.io import atomic_dir, atomic_write_text
from posttrain.errors import UserError
from posttrain.models import save_model
from posttrain.models.heads import REWARD_STATS_FILE, RewardModel, RewardStats
from posttrain.models.loading import lora_base_dir
from posttrain.models.lora import merge_lora, save_adapter_only
from posttrain.trainers.engine.device import portable
from posttrain.trainers.guards import (
    refuse_nonfinite_model,  # noqa: F401 - eval/export's
    require_finite_model,
    require_finite_parameters,
)


def save_checkpoint(
    directory: str | Path,
    model: torch.nn.Module,
    tokenizer,
    state: dict,
    optimizer: torch.optim.Optimizer | None = None,
    rng_state: dict | None = None,
) -> Path:
    """Write a complete checkpoint to ``directory`` atomically (replacing an older one there).

    A run's final ``model/`` of a LoRA run on a Hugging Face model directory is the adapter alone, pointing at that
    directory, with no optimizer or RNG state (those stay in ``checkpoints/``): TRL's and peft's layout."""
    directory = Path(directory)
    require_finite_model(model, directory, state.get("step"))  # a diverged model is refused, the old one kept
    base = lora_base_dir(model, state) if directory.name == FINAL_MODEL_DIR else None
    with atomic_dir(directory) as tmp, writing(directory):
        if base is not None:
            save_adapter_only(model, tmp, base)
            state, optimizer, rng_state = {**state, "lora_base": str(base)}, None, None
        else:
            save_model(model, tmp)
        tokenizer.save(tmp / "tokenizer.json")
        (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2, default=str) + "\n")
        if optimizer is not None:
            torch.save(portable(optimizer.state_dict()), tmp / "optimizer.pt")  # CPU tensors: any machine loads it
        if rng_state is not None:
            torch.save(rng_state, tmp / "rng.pt")
    return directory


FINAL_MODEL_DIR = "model"  # a run directory's final model (run_dir.py)


@contextlib.contextmanager
def writing(path: str | Path):
    """Report a failed checkpoint write as the OSError it is: safetensors and torch wrap ENOSPC/EROFS in their
    own exception types (SafetensorError, RuntimeError), which the periodic save and the CLI would not recognise."""
    try:
        yield
    except OSError:
        raise
    except (SafetensorError, RuntimeError) as e:
        raise OSError(errno.EIO, f"cannot write ({failure_reason(e)})", str(path)) from e


def rng_state(generators: dict[str, torch.Generator] | None = None) -> dict:
    st = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # a GPU run: its device's RNG (dropout there)
        st["cuda"] = torch.cuda.get_rng_state()
    for k, g in (generators or {}).items():
        st[k] = g.get_state()
    return st


def restore_rng(state: dict, generators: dict[str, torch.Generator] | None = None) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():  # a GPU run's checkpoint resumed on a GPU
        torch.cuda.set_rng_state(state["cuda"])
    for k, g in (generators or {}).items():
        if k in state:
            g.set_state(state[k])


def start_policy(cfg, command: str) -> Checkpoint | None:
    """A trainer's starting policy: ``cfg.model_path`` (``--model``) or ``cfg.init``; None when neither is set.

    A checkpoint trained with LoRA starts as one model: its adapter merged into the weights, so that a new run's
    own adapter (and the reference = adapters off) sit on top of *that* policy, not on the older base."""
    if cfg.model_path and cfg.init:
        raise UserError("--model and --init both name a starting policy: pass one")
    path = cfg.model_path or cfg.init
    if not path:
        return None
    flag = "--model" if cfg.model_path else "--init"
    ckpt = load_policy(path, pad_token=cfg.pad_token, role=f"{command} {flag}")
    ckpt.model = merge_lora(ckpt.model)
    unapplied = unapplied_model_settings(getattr(cfg, "model", None), ckpt.model)
    if unapplied:  # e.g. `sft --preset slots16 --model X`: the preset's digit slots cannot reshape X
        print(
            f"note: {', '.join(unapplied)} not applied: {flag} brings its own architecture (model.* shapes a fresh model)"
        )
    saved = ((ckpt.state or {}).get("config") or {}).get("task")  # the embedded task it was trained on
    task = getattr(cfg, "task", None)
    if isinstance(saved, dict) and task is not None and not getattr(cfg, "data", None):
        trained_on = saved.get("name", "arithmetic")  # checkpoints from before --task: arithmetic
        if trained_on != task.name:
            print(
                f"note: {flag} {path} was trained on the {trained_on} task, this run is on {task.name} "
                f"(--task {trained_on} to stay on it)"
            )
    return ckpt


def unapplied_model_settings(model_cfg, model) -> list[str]:
    """The ``model.*`` settings (``model_cfg``, a GPTConfig from a preset, file or flags) that are not their default and
    that a loaded ``model`` does not have: "model.digit_slots=2 (the model's: 0)". vocab_size comes from the tokenizer."""
    if model_cfg is None:
        return []
    default, have_cfg, out = type(model_cfg)(), getattr(model, "config", None), []
    for f in dataclasses.fields(model_cfg):
        want = getattr(model_cfg, f.name)
        if f.name == "vocab_size" or want == getattr(default, f.name):
            continue
        have = getattr(have_cfg, f.name, None) if dataclasses.is_dataclass(have_cfg) else None
        if want != have:
            out.append(f"model.{f.name}={want!r}" + (f" (the model's: {have!r})" if have is not None else ""))
    return out


def initial_model(init: Checkpoint | None, resumed: Checkpoint | None) -> torch.nn.Module:
    """A run's starting policy: ``init``'s model, or the ``--model``/``--init`` recorded in the resumed checkpoint's config."""
    if init is not None:
        return init.model
    c = resumed.state["config"]
    return merge_lora(load_policy(c.get("model_path") or c["init"], pad_token=c.get("pad_token")).model)


def save_with_extras(directory, write_extras, **kwargs) -> Path:
    """:func:`save_checkpoint` plus ``write_extras(tmp_dir)``'s files, as one atomic directory; errors (a refused
    non-finite model, a failed write) name ``directory``, never the temporary one."""
    require_finite_model(kwargs["model"], directory, (kwargs.get("state") or {}).get("step"))
    try:
        with atomic_dir(directory) as tmp, writing(directory):
            save_checkpoint(tmp, **kwargs)
            write_extras(tmp)
    except OSError as e:
        if e.filename is None:
            raise
        raise OSError(e.errno, e.strerror or str(e), str(directory)) from e  # not the temporary directory
    return Path(directory)


SNAPSHOT_WEIGHTS, SNAPSHOT_OPTIMIZER = "good_model.safetensors", "good_optimizer.pt"  # in periodic checkpoints
SNAPSHOT_CRITIC, SNAPSHOT_CRITIC_OPTIMIZER = "good_critic.safetensors", "good_critic_optimizer.pt"  # PPO's, beside them


def save_reward_checkpoint(
    directory: str | Path,
    model: RewardModel,
    tokenizer,
    state: dict,
    optimizer=None,
    rng_state: dict | None = None,
    stats: RewardStats | None = None,
) -> Path:
    """Backbone LM checkpoint + ``reward_head.safetensors`` (+ ``reward_stats.json``), as one atomic directory; a
    model or reward mean/std that is not finite is never written."""
    directory = Path(directory)
    require_finite_parameters(model, directory)  # backbone and head: never write a diverged model
    if stats is not None and not (math.isfinite(stats.mean) and math.isfinite(stats.std)):
        raise UserError(f"refusing to save {directory}: the reward mean/std are not finite ({stats.mean}, {stats.std})")
    with atomic_dir(directory) as tmp:
        save_checkpoint(
            tmp,
            model=model.backbone.model,
            tokenizer=tokenizer,
            state={**state, "reward_model": True},
            optimizer=optimizer,
            rng_state=rng_state,
        )
        with writing(directory):
            save_file(
                {k: v.detach().contiguous() for k, v in model.head.state_dict().items()}, str(tmp / REWARD_HEAD_FILE)
            )
        if stats is not None:
            stats.save(tmp / REWARD_STATS_FILE)
    return directory


def take_snapshot(model, opt, critic=None) -> dict:
    """The RL collapse guard's snapshot: copies of the weights and the optimizer state, and with ``critic`` =
    (module, optimizer) (PPO's value model) of those too, so that a restore puts policy and critic back together."""
    from posttrain.models.lora import has_lora

    lora = has_lora(model)  # LoRA: the adapters are all that trains (no copy of the frozen base)
    snap = {
        "model": {
            k: v.detach().clone().contiguous() for k, v in model.state_dict().items() if not lora or "lora_" in k
        },
        "optimizer": copy.deepcopy(opt.state_dict()),
    }
    if critic is not None:
        snap["critic"] = {k: v.detach().clone().contiguous() for k, v in critic[0].state_dict().items()}
        snap["critic_optimizer"] = copy.deepcopy(critic[1].state_dict())
    return snap


def write_snapshot(tmp: Path, snapshot: dict | None) -> None:
    """A snapshot's files inside a checkpoint being written (nothing for None)."""
    if snapshot is None:
        return
    save_file(snapshot["model"], str(tmp / SNAPSHOT_WEIGHTS))
    torch.save(snapshot["optimizer"], tmp / SNAPSHOT_OPTIMIZER)
    if "critic" in snapshot:
        save_file(snapshot["critic"], str(tmp / SNAPSHOT_CRITIC))
        torch.save(snapshot["critic_optimizer"], tmp / SNAPSHOT_CRITIC_OPTIMIZER)


def save_with_snapshot(directory, snapshot: dict | None, **kwargs) -> Path:
    """:func:`save_checkpoint` plus the collapse guard's snapshot (for an exact resume), one atomic directory."""
    return save_with_extras(directory, lambda tmp: write_snapshot(tmp, snapshot), **kwargs)


def restore_snapshot(model, opt, snapshot: dict, critic=None) -> None:
    """Put a :func:`take_snapshot` back: the weights it holds (under LoRA only the adapters) and the optimizer, and
    with ``critic`` = (module, optimizer) the critic's too (when the snapshot has them)."""
    from posttrain.models.lora import has_lora

    model.load_state_dict(snapshot["model"], strict=not has_lora(model))
    opt.load_state_dict(copy.deepcopy(snapshot["optimizer"]))
    if critic is not None and "critic" in snapshot:
        critic[0].load_state_dict(snapshot["critic"])
        critic[1].load_state_dict(copy.deepcopy(snapshot["critic_optimizer"]))


def load_snapshot(path: Path) -> dict | None:
    if not (path / SNAPSHOT_WEIGHTS).is_file():
        return None
    snap = {"model": load_tensors(path / SNAPSHOT_WEIGHTS), "optimizer": load_torch_state(path / SNAPSHOT_OPTIMIZER)}
    if (path / SNAPSHOT_CRITIC).is_file():
        snap["critic"] = load_tensors(path / SNAPSHOT_CRITIC)
        snap["critic_optimizer"] = load_torch_state(path / SNAPSHOT_CRITIC_OPTIMIZER)
    return snap


class CheckpointManager:
    """Periodic checkpoints under ``run_dir/checkpoints``, keeping the newest ``keep``."""

    def __init__(self, run_dir: str | Path, keep: int = 2):
        self.root = Path(run_dir) / "checkpoints"
        self.keep = keep

    def save(self, step: int, save_fn=None, **kwargs) -> Path | None:
        """Write ``step-NNNNNNNN`` with ``save_fn`` (default :func:`save_checkpoint`), point ``latest`` at it, prune.

        A save that fails with an OSError (disk full, read-only, permissions) warns on one line and returns
        None: the run goes on and the next save tries again; ``latest`` keeps naming the previous checkpoint.
        """
        name = f"step-{step:08d}"
        try:
            path = (save_fn or save_checkpoint)(self.root / name, **kwargs)
            atomic_write_text(self.root / "latest", name + "\n")
        except OSError as e:
            where = f" ({e.filename})" if getattr(e, "filename", None) else ""
            warn(f"checkpoint {name} not saved: {e.strerror or e}{where}; training goes on, the next save retries")
            return None
        self._prune(current=name)
        return path

    def _prune(self, current: str) -> None:
        ckpts = sorted(d for d in self.root.glob("step-*") if d.is_dir() and STEP_NAME.fullmatch(d.name))
        for d in ckpts[: max(0, len(ckpts) - self.keep)]:
            if d.name != current:
                shutil.rmtree(d, ignore_errors=True)
