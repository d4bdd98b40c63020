"""LoRA adapters through the ``peft`` library: a trainable low-rank update on frozen base weights.

Key insight: a LoRA layer computes ``W x + (alpha / r) * B A x`` with W frozen, A (r x in) random and
B (out x r) zero at the start, so the adapted model *is* the base model until B moves, and switching the
adapters off gives the base model back exactly. That is the frozen reference of DPO/GRPO/PPO without a
second copy of the weights (the notes' "reference as a LoRA delta"): :func:`reference_model` returns
a view of the policy that runs it with its adapters disabled (``disable_adapter()``), in eval mode and
without gradients.

    apply_lora(model, LoRAConfig(r=8))        # peft injects LoRA layers in place; the base is frozen
    with adapters_disabled(model): ...        # the base model (the reference)
    merge_lora(model)                         # W <- W + (alpha / r) * B A, the LoRA layers removed

Adapters are injected *in place* (``peft.get_peft_model`` on the model): the model keeps its type (our
GPT, a transformers ``PreTrainedModel``), so the sampler, scoring, heads and trainers see the same object;
the ``PeftModel`` handle (for ``disable_adapter``, ``save_pretrained``, ``merge_and_unload``) is kept in the
model's ``__dict__`` (not a submodule: parameters and ``state_dict`` are unchanged by it). A checkpoint of
a LoRA model holds the base weights (``model.safetensors``, LoRA keys dropped) and the adapter
(``adapter_model.safetensors`` + ``adapter_config.json``, peft's own files), so transformers loads the
directory with the adapter applied and vLLM can serve the adapter. A run's final ``model/`` of a LoRA run on a
Hugging Face model directory holds the adapter only, pointing at that directory (``base_model_name_or_path``), as
TRL and peft save it (:func:`posttrain.models.loading.lora_base_dir`, :func:`save_adapter_only`); the periodic checkpoints keep the base.

The trainers' LoRA fields (``lora_r`` ... ``merge_lora``) are declared once, on :class:`LoRAConfig`; a
trainer config lists them with :func:`lora_knob` and reads them back with :func:`lora_config`.

Not handled: several adapters per model, QLoRA (quantised bases), DoRA/other peft tuners, LoRA on the
embeddings or the LM head (``target_modules`` may name them; not tested).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from posttrain.config import check_fields, knob
from posttrain.errors import UserError

ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
_HANDLE = "_posttrain_peft"  # the PeftModel, in the adapted model's __dict__

_LLAMA_LIKE = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DEFAULT_TARGETS: dict[str, tuple[str, ...]] = {
    "posttrain-gpt": ("qkv", "proj", "fc"),  # models/gpt.py: attn.qkv, attn.proj, mlp.fc, mlp.proj
    "gpt2": ("c_attn", "c_proj", "c_fc"),  # Conv1D layers (peft's fan_in_fan_out)
    **{k: _LLAMA_LIKE for k in ("qwen2", "qwen3", "llama", "mistral", "gemma", "gemma2", "phi3", "olmo2", "smollm3")},
}
"""Default ``target_modules`` per model type: attention projections and the MLP; others use peft's all-linear."""


@dataclass
class LoRAConfig:
    r: int = knob(
        0,
        "LoRA rank (0 = off: full fine-tuning); with r > 0 the base weights are frozen and only the "
        "adapters train (peft)",
        ge=0,
    )
    alpha: float = knob(16.0, "LoRA alpha: the update is (alpha / r) * B @ A", gt=0)
    dropout: float = knob(0.0, "dropout on the LoRA branch's input", ge=0, lt=1)
    target_modules: tuple[str, ...] = knob(
        (),
        "module names to adapt, comma-separated (default per architecture: "
        "q/k/v/o + MLP projections for Qwen2/Llama, c_attn,c_proj,c_fc for "
        "GPT-2, qkv,proj,fc for posttrain's GPT; other models all-linear)",
    )
    merge: bool = knob(
        False,
        "with LoRA: write model/ with the adapters merged into full weights (no adapter "
        "files) instead of base + adapter",
    )

    def __post_init__(self):
        check_fields(self, "lora_")


def lora_knob(name: str):
    """The trainer-config field ``lora_<name>`` (``merge_lora`` for ``merge``), declared by :class:`LoRAConfig`."""
    f = next(f for f in dataclasses.fields(LoRAConfig) if f.name == name)
    return dataclasses.field(default=f.default, metadata=f.metadata)


def lora_config(cfg) -> LoRAConfig:
    """The :class:`LoRAConfig` of a trainer config holding ``lora_r``, ``lora_alpha``, ... ``merge_lora``."""
    return LoRAConfig(
        r=cfg.lora_r,
        alpha=cfg.lora_alpha,
        dropout=cfg.lora_dropout,
        target_modules=tuple(cfg.lora_target_modules),
        merge=cfg.merge_lora,
    )


def _peft():
    try:
        import peft
    except ImportError:
        raise UserError("LoRA needs peft: pip install 'posttrain[hf]'") from None
    return peft


@contextlib.contextmanager
def _quiet_peft():
    """peft calls transformers' deprecated ``is_gradient_checkpointing``: not the user's concern."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def model_type(model: nn.Module) -> str:
    from posttrain.models.gpt import GPT

    return "posttrain-gpt" if isinstance(model, GPT) else str(getattr(getattr(model, "config", None), "model_type", ""))


def default_targets(model: nn.Module) -> tuple[str, ...] | str:
    return DEFAULT_TARGETS.get(model_type(model), "all-linear")


def peft_handle(model: nn.Module):
    """The ``PeftModel`` holding ``model``'s adapters, or None."""
    return model.__dict__.get(_HANDLE)


def has_lora(model: nn.Module) -> bool:
    return peft_handle(model) is not None


def _keep(model: nn.Module, pm) -> nn.Module:
    if pm.base_model.model is not model:
        raise RuntimeError("peft did not adapt the model in place")
    model.__dict__[_HANDLE] = pm
    return model


def apply_lora(model: nn.Module, cfg: LoRAConfig) -> nn.Module:
    """Inject LoRA layers into ``model`` in place (base frozen, adapters trainable); r = 0 returns it unchanged."""
    if cfg.r == 0 or has_lora(model):
        return model
    peft = _peft()
    targets = list(cfg.target_modules) if cfg.target_modules else default_targets(model)
    lc = peft.LoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=targets,
        fan_in_fan_out=model_type(model) == "gpt2",
        bias="none",
    )
    try:
        with _quiet_peft():
            pm = peft.get_peft_model(model, lc)
    except ValueError as e:  # "Target modules {...} not found in the base model"
        raise UserError(f"--lora-target-modules: {str(e).splitlines()[0]}") from None
    return _keep(model, pm)


def attach_adapter(model: nn.Module, directory: str | Path, trainable: bool = True) -> nn.Module:
    """Load the adapter saved in ``directory`` (``adapter_config.json`` + weights) onto ``model``, in place."""
    peft = _peft()
    try:
        with _quiet_peft():
            pm = peft.PeftModel.from_pretrained(model, str(directory), is_trainable=trainable)
    except Exception as e:
        raise UserError(f"{Path(directory) / ADAPTER_CONFIG}: cannot load the LoRA adapter ({e})") from None
    return _keep(model, pm)


def save_adapter(model: nn.Module, directory: str | Path) -> None:
    """``adapter_config.json`` + ``adapter_model.safetensors`` (peft's ``save_pretrained``) into ``directory``."""
    pm = peft_handle(model)
    pm.save_pretrained(str(directory), safe_serialization=True)
    readme = Path(directory) / "README.md"  # peft's model-card stub: not part of a checkpoint
    if readme.is_file():
        readme.unlink()


def save_adapter_only(model: nn.Module, directory: str | Path, base: Path) -> None:
    """The adapter alone (peft's files), its ``adapter_config.json`` naming ``base`` (an absolute directory) as
    ``base_model_name_or_path``: what TRL/peft save, and what transformers (with peft) and posttrain load."""
    import json

    save_adapter(model, directory)
    f = Path(directory) / ADAPTER_CONFIG
    cfg = json.loads(f.read_text(encoding="utf-8"))
    cfg["base_model_name_or_path"] = str(base)
    f.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def is_adapter_only(directory: str | Path) -> bool:
    """A directory holding a LoRA adapter and no weights of its base (``model.safetensors``)."""
    d = Path(directory)
    return (d / ADAPTER_CONFIG).is_file() and not (d / "model.safetensors").is_file()


def adapter_base(directory: str | Path) -> Path:
    """The base model directory an adapter-only directory names; UserError when it is missing or not a directory."""
    import json

    f = Path(directory) / ADAPTER_CONFIG
    try:
        base = json.loads(f.read_text(encoding="utf-8")).get("base_model_name_or_path")
    except (OSError, ValueError) as e:
        raise UserError(f"{f}: cannot read the adapter's config ({e})") from None
    if not base or not Path(base).is_dir():
        raise UserError(
            f"{f}: its base model {base!r} is not a directory here: the adapter needs its base (base_model_name_or_path)"
        )
    return Path(base)


def base_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The base model's weights under their original names: LoRA tensors dropped, ``.base_layer.`` removed."""
    out = {}
    for k, v in model.state_dict().items():
        if "lora_" in k:
            continue
        out[k.replace(".base_layer.", ".")] = v
    return out


@contextlib.contextmanager
def adapters_disabled(model: nn.Module):
    """Run ``model`` as its base model: adapters off, eval mode, no gradients (restored afterwards)."""
    pm, was = peft_handle(model), model.training
    model.eval()
    try:
        with torch.no_grad(), pm.disable_adapter() if pm is not None else contextlib.nullcontext():
            yield model
    finally:
        model.train(was)


class BaseModelView:
    """The frozen reference as a view of a LoRA policy: called like the model, it runs the base weights.

    Not an ``nn.Module`` (it owns no parameters, so ``frozen()``/``requires_grad_`` never reach the policy's)."""

    training = False

    def __init__(self, model: nn.Module):
        self.model = model
        self.config = getattr(model, "config", None)

    def __call__(self, *args, **kwargs):
        with adapters_disabled(self.model):
            return self.model(*args, **kwargs)

    @property
    def forward(self):  # the sampler reads the forward signature
        fwd = self.model.forward

        def run(*a, **k):
            return self(*a, **k)

        run.__signature__ = inspect.signature(fwd)
        return run

    def parameters(self):
        return self.model.parameters()

    def eval(self):
        return self

    def train(self, mode: bool = True):
        return self

    def requires_grad_(self, flag: bool = True):
        return self


def reference_model(policy: nn.Module, build_copy):
    """The frozen reference: a :class:`BaseModelView` of ``policy`` when it has LoRA adapters (no copy in
    memory), else ``build_copy()`` (a frozen copy of the starting policy, as before)."""
    return BaseModelView(policy) if has_lora(policy) else build_copy()


def merge_lora(model: nn.Module) -> nn.Module:
    """Merge the adapters into the base weights (``merge_and_unload``) in place; a model without LoRA is returned."""
    pm = peft_handle(model)
    if pm is None:
        return model
    merged = pm.merge_and_unload()
    del model.__dict__[_HANDLE]
    return merged


def trainable_summary(model: nn.Module) -> str:
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    n_all = sum(p.numel() for p in model.parameters())
    return f"{n_train / 1e6:.3f}M of {n_all / 1e6:.2f}M params trainable"
