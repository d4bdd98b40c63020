"""Models: posttrain's tiny GPT (``gpt.py``), Hugging Face causal LMs (``hf.py``), reward/value heads (``heads.py``).

``save_model`` / ``load_model`` read and write the weights + config part of a checkpoint directory:
``model.safetensors`` (never a pickle) and ``config.json`` with ``{"model_type": "posttrain-gpt" | "hf", ...}``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors.torch import load_model as _st_load_model
from safetensors.torch import save_model as _st_save_model

from posttrain.errors import UserError
from posttrain.models.gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig", "save_model", "load_model", "model_config_dict"]


def model_config_dict(model: torch.nn.Module) -> dict:
    if isinstance(model, GPT):
        return {"model_type": "posttrain-gpt", "config": dataclasses.asdict(model.config)}
    cfg = getattr(model, "config", None)
    if cfg is not None and hasattr(cfg, "to_dict"):  # a transformers PreTrainedModel
        return {"model_type": "hf", "config": cfg.to_dict()}
    raise TypeError(f"cannot save model of type {type(model).__name__}")


def save_model(model: torch.nn.Module, directory: str | Path) -> None:
    """Write ``model.safetensors`` and ``config.json`` into ``directory`` (caller makes it atomic)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    _st_save_model(model, str(d / "model.safetensors"))  # handles tied weights
    (d / "config.json").write_text(json.dumps(model_config_dict(model), indent=2) + "\n")


def build_model_from_config_dict(cfg: dict, **overrides) -> torch.nn.Module:
    kind = cfg.get("model_type")
    if kind == "posttrain-gpt":
        fields = {**cfg["config"], **overrides}
        return GPT(GPTConfig(**fields))
    if kind == "hf":
        from posttrain.models.hf import hf_model_from_config_dict

        return hf_model_from_config_dict(cfg["config"])
    raise UserError(f"unknown model_type {kind!r} in config.json (expected 'posttrain-gpt' or 'hf')")


def load_model(directory: str | Path, device: str | torch.device = "cpu", **overrides) -> torch.nn.Module:
    """Rebuild the model from ``config.json`` and load ``model.safetensors`` (strict)."""
    d = Path(directory)
    cfg_path, w_path = d / "config.json", d / "model.safetensors"
    if not cfg_path.is_file() or not w_path.is_file():
        raise UserError(f"{d} is not a checkpoint: needs config.json and model.safetensors")
    try:
        cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{cfg_path}: not valid JSON ({e})") from None
    model = build_model_from_config_dict(cfg, **overrides)
    missing, unexpected = _st_load_model(model, str(w_path), strict=False, device=str(device))
    # tied weights are stored once; anything else missing or extra is a real mismatch
    missing = [m for m in missing if not m.endswith("lm_head.weight")]
    if missing or unexpected:
        raise UserError(f"{w_path}: weights do not match config (missing {missing[:3]}, unexpected {unexpected[:3]})")
    return model.to(device)
