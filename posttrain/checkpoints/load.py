"""Loading a checkpoint: the weights, tokenizer and state of a checkpoint or run directory, checked before use.

:func:`load_checkpoint` reads what :func:`posttrain.checkpoints.layout.find_checkpoint` finds, refusing a checkpoint of
the wrong kind (``accept_kinds``: a policy, i.e. a language model, or a reward model) or saved by another trainer
(``expect_trainer``, for ``--resume``); :func:`load_policy` is the one loader of a starting policy (a local Hugging Face
model directory or a posttrain checkpoint). Every file is read through :mod:`posttrain.checkpoints.files`, so a corrupt
one is a one-line :class:`~posttrain.errors.UserError` naming it. The layout of a checkpoint and its writing are
:mod:`posttrain.trainers.checkpoint`'s; this module sits below the trainers and the rewards that load checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from posttrain.checkpoints.files import failure_reason, read_json_file, reading, torch_load_dict
from posttrain.checkpoints.layout import (
    REWARD_HEAD_FILE,
    STATE_FILE,
    checkpoint_kind,
    checkpoint_state,
    command_of,
    find_checkpoint,
)
from posttrain.errors import UserError
from posttrain.models import load_model
from posttrain.models.loading import (
    ModelTokenizer,
    check_vocab_fits,
    is_hf_model_dir,
    load_hf_model,
    load_model_tokenizer,
)
from posttrain.models.lora import adapter_base, attach_adapter, is_adapter_only
from posttrain.tokenizers import load as load_tokenizer


@dataclass
class Checkpoint:
    """What a loaded checkpoint holds; optimizer/RNG state only if it was saved for resuming."""

    path: Path
    model: torch.nn.Module
    tokenizer: Any
    state: dict = field(default_factory=dict)
    optimizer_state: dict | None = None
    rng_state: dict | None = None

    @property
    def step(self) -> int:
        return int(self.state.get("step", 0))


def _load_adapter_only(p: Path, state: dict, device) -> Checkpoint:
    """An adapter-only ``model/``: its base (``base_model_name_or_path``) with the adapter attached."""
    base = load_policy(adapter_base(p), device=device)
    model = attach_adapter(base.model, p)
    tokenizer = _checkpoint_tokenizer(p)
    check_vocab_fits(tokenizer, model, p)
    return Checkpoint(path=p, model=model.to(device), tokenizer=tokenizer, state=state)


POLICY = ("policy",)
REWARD_MODEL = ("reward_model",)


def check_checkpoint(p: Path, state: dict, expect_trainer=None, accept_kinds=None, role: str | None = None) -> None:
    """Refuse a checkpoint of the wrong kind (``accept_kinds``) or saved by another trainer (``expect_trainer``)."""
    role = role or "this command"
    kind = checkpoint_kind(p, state)
    if accept_kinds is not None and kind not in accept_kinds:
        if kind == "reward_model":
            raise UserError(
                f"{p} is a reward-model checkpoint (from `posttrain rm`), not a policy: {role} needs a "
                f"language-model checkpoint such as an SFT run"
            )
        raise UserError(f"{p} is not a reward-model checkpoint (no {REWARD_HEAD_FILE}); train one with `posttrain rm`")
    if expect_trainer is not None:
        expected = (expect_trainer,) if isinstance(expect_trainer, str) else tuple(expect_trainer)
        got = state.get("trainer")
        if got not in expected:
            saved = f"saved by `posttrain {command_of(got)}`" if got else f"without a trainer in its {STATE_FILE}"
            hint = f"; --init {p} starts a new run from its weights" if kind == "policy" and got else ""
            raise UserError(
                f"{p} is a checkpoint {saved}: `posttrain {command_of(expected[0])} --resume` continues "
                f"only its own runs{hint}"
            )


def resolve_checkpoint(path: str | Path, prefer_latest: bool = False) -> Path:
    """A checkpoint directory, or a run directory's ``model/`` or newest checkpoint (see :func:`find_checkpoint`)."""
    return find_checkpoint(path, prefer_latest=prefer_latest)


def load_checkpoint(
    path: str | Path,
    device="cpu",
    with_training_state: bool = False,
    prefer_latest: bool = False,
    *,
    expect_trainer: str | tuple | None = None,
    accept_kinds: tuple | None = None,
    role: str | None = None,
    **model_overrides,
) -> Checkpoint:
    """Load a checkpoint (or a run directory's), checking its kind/trainer first; corrupt files -> UserError."""
    p = resolve_checkpoint(path, prefer_latest=prefer_latest)
    state = checkpoint_state(p)
    check_checkpoint(p, state, expect_trainer=expect_trainer, accept_kinds=accept_kinds, role=role)
    if with_training_state and not (p / "optimizer.pt").is_file():
        raise UserError(f"{p} has no optimizer state: it cannot be resumed (only used as --init)")
    if is_adapter_only(p):
        return _load_adapter_only(p, state, device)
    model_cfg = read_json_file(p / "config.json")
    if not isinstance(model_cfg.get("model_type"), str):
        raise UserError(f"{p / 'config.json'}: corrupt checkpoint file (no model_type)")
    try:
        model = load_model(p, device=device, **model_overrides)
    except UserError:
        raise
    except Exception as e:  # which file? the weights if their header does not parse, else the config
        weights = p / "model.safetensors"
        try:
            with safe_open(str(weights), "pt"):
                pass
        except Exception as we:
            raise UserError(f"{weights}: corrupt or unreadable checkpoint file ({failure_reason(we)})") from None
        raise UserError(f"{p / 'config.json'}: does not describe the saved model ({failure_reason(e)})") from None
    tokenizer = _checkpoint_tokenizer(p)
    check_vocab_fits(tokenizer, model, p)
    ckpt = Checkpoint(path=p, model=model, tokenizer=tokenizer, state=state)
    if with_training_state:
        ckpt.optimizer_state = torch_load_dict(p / "optimizer.pt", map_location=device)
        if not {"state", "param_groups"} <= set(ckpt.optimizer_state):
            raise UserError(f"{p / 'optimizer.pt'}: corrupt checkpoint file (not an optimizer state_dict)")
        if (p / "rng.pt").is_file():
            ckpt.rng_state = torch_load_dict(p / "rng.pt")
            if not isinstance(ckpt.rng_state.get("torch"), torch.Tensor):
                raise UserError(f"{p / 'rng.pt'}: corrupt checkpoint file (no torch RNG state)")
    return ckpt


def _checkpoint_tokenizer(p: Path):
    if (p / "tokenizer_config.json").is_file():  # a Hugging Face model directory's tokenizer (models/loading.py)
        return load_model_tokenizer(p)
    with reading(p / "tokenizer.json"):
        return load_tokenizer(p / "tokenizer.json")


def load_policy(path: str | Path, pad_token: str | None = None, role: str | None = None, device="cpu") -> Checkpoint:
    """The one loader of a starting policy (``--model``/``--init``): a local Hugging Face model directory (config.json,
    safetensors, tokenizer files; no training state) or a posttrain checkpoint / run directory. ``pad_token`` names
    the pad token of a tokenizer that has none (models/loading.py)."""
    p = Path(path)
    if is_hf_model_dir(p) and not (p / STATE_FILE).is_file():
        if not p.is_dir():
            raise UserError(f"model directory not found: {p}")
        tokenizer = load_model_tokenizer(p, pad_token=pad_token)
        model = load_hf_model(p)
        check_vocab_fits(tokenizer, model, p)
        return Checkpoint(path=p, model=model.to(device), tokenizer=tokenizer)
    ckpt = load_checkpoint(p, device=device, accept_kinds=POLICY, role=role)
    if pad_token is not None:
        if not isinstance(ckpt.tokenizer, ModelTokenizer):
            raise UserError(
                f"--pad-token applies to a Hugging Face model directory's tokenizer; {ckpt.path}'s has "
                f"its own pad token"
            )
        ckpt.tokenizer = load_model_tokenizer(ckpt.path, pad_token=pad_token)
    return ckpt
