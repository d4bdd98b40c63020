"""Models: posttrain's tiny GPT (``gpt.py``), Hugging Face causal LMs (``hf.py``, ``loading.py``), reward/value
heads (``heads.py``), LoRA adapters (``lora.py``).

``save_model`` / ``load_model`` read and write the weights + config part of a checkpoint directory:
``model.safetensors`` (never a pickle) and ``config.json``. posttrain's GPT writes ``{"model_type":
"posttrain-gpt", "config": ...}``; a Hugging Face model is written in transformers' own layout
(``save_pretrained``: its config.json, generation_config.json, model.safetensors), so
``AutoModelForCausalLM.from_pretrained`` opens the directory. Older checkpoints with the wrapped
``{"model_type": "hf", "config": ...}`` still load. Weights are written as fp32 CPU tensors whatever device and
dtype the model trained in, so a checkpoint from a GPU run loads on a CPU-only machine. A model with LoRA adapters also writes
``adapter_config.json`` + ``adapter_model.safetensors`` (base weights stay in model.safetensors), and loads back
with its adapters attached.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors.torch import load_model as _st_load_model
from safetensors.torch import save_file as _st_save_file
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
    from posttrain.models.lora import base_state_dict, has_lora, save_adapter

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    cfg = model_config_dict(model)
    if cfg["model_type"] == "hf":  # transformers' own layout, readable by from_pretrained and vLLM
        from posttrain.models.loading import save_hf_model

        return save_hf_model(model, d)
    if has_lora(model):
        sd = base_state_dict(model)
        sd.pop("lm_head.weight", None)  # tied to wte.weight
        _st_save_file({k: v.detach().contiguous() for k, v in sd.items()}, str(d / "model.safetensors"))
        save_adapter(model, d)
    elif all(t.device.type == "cpu" and t.dtype == torch.float32 for t in model.state_dict().values()):
        _st_save_model(model, str(d / "model.safetensors"))  # handles tied weights
    else:  # trained on a GPU or in another dtype: written as fp32 CPU tensors, loadable anywhere
        sd = {k: v.detach().to("cpu", torch.float32) for k, v in model.state_dict().items() if k != "lm_head.weight"}
        _st_save_file({k: v.contiguous() for k, v in sd.items()}, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def build_model_from_config_dict(cfg: dict, **overrides) -> torch.nn.Module:
    kind = cfg.get("model_type")
    if kind == "posttrain-gpt":
        fields = {**cfg["config"], **overrides}
        return GPT(GPTConfig(**fields))
    if kind == "hf":
        from posttrain.models.hf import hf_model_from_config_dict

        return hf_model_from_config_dict(cfg["config"])
    raise UserError(
        f"unknown model_type {kind!r} in config.json (expected 'posttrain-gpt', 'hf' or a Hugging Face "
        f"model's own config)"
    )


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
    from posttrain.models.loading import is_hf_model_dir, load_hf_model
    from posttrain.models.lora import ADAPTER_CONFIG, attach_adapter

    if is_hf_model_dir(d):  # transformers' layout (adapters attached there)
        return load_hf_model(d).to(device)
    model = build_model_from_config_dict(cfg, **overrides)
    missing, unexpected = _st_load_model(model, str(w_path), strict=False, device=str(device))
    # tied weights are stored once; anything else missing or extra is a real mismatch
    missing = [m for m in missing if not m.endswith("lm_head.weight")]
    if missing or unexpected:
        raise UserError(f"{w_path}: weights do not match config (missing {missing[:3]}, unexpected {unexpected[:3]})")
    if (d / ADAPTER_CONFIG).is_file():
        attach_adapter(model, d)
    return model.to(device)
