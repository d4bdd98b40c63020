"""Device and precision, decided once per training run, and what a step costs: tokens/s, MFU, peak memory.

Key insight (mixed precision, Micikevicius et al. 2018): parameters and optimizer state stay fp32 (the "master
weights"); only the compute is lowered, under ``torch.autocast``. bf16 keeps fp32's 8-bit exponent and needs nothing
more; fp16's 5-bit exponent underflows small gradients, so its gradients are computed for ``S x loss`` and divided
by ``S`` before clipping (dynamic loss scaling: ``S`` halves when a step's gradients overflow, that step is dropped,
and doubles after 2000 clean steps: ``torch.amp.GradScaler``'s schedule). Frozen models (the reference, a reward
model) hold their weights in the compute dtype: nothing updates them, and half the memory is theirs to save.

How a run uses it, in one place (``engine/setup.py``): ``resolve_device(cfg.device)`` -> :class:`RunDevice` ->
:func:`place` (the trained model: fp32 on the device, gradient checkpointing, ``torch.compile``, every forward
under autocast, and its forwards counted) and :func:`place_frozen` (references: the compute dtype on the device).
The trainers call nothing new: ``common.grad_norm_and_clip`` unscales fp16 gradients (:func:`unscale_grads`),
``common.frozen`` places a reference, the loop adds :meth:`RunDevice.step_metrics` to each step's metrics and
``common.write_summary`` adds :meth:`RunDevice.summary`. On the CPU in fp32, :func:`place` changes nothing: the
model, its forward and every number stay bitwise what they were.

MFU and what a token costs in FLOPs: :mod:`posttrain.trainers.engine.throughput` (its docstring has the formula and
a worked number); the names there are also importable from here.

Tokens are counted where the compute is: every forward of the trained model with gradients on adds its input's
``B x T`` positions (padding included: the model computed them) and their FLOPs. Rollout tokens/s (GRPO, PPO) are the
completion tokens the sampler generated over its wall time (``rl/rollout_engine.py::sample``). Peak memory is
``torch.cuda.max_memory_allocated`` on CUDA (reset when a run starts); on the CPU the process's maximum resident set
size (``ru_maxrss``: the whole process since it started, not this run alone), named as such in ``peak_memory_kind``.

Not handled: the FLOPs of a reference or reward model's forward, of generation, or of a value head (MFU counts the
trained model's training forwards and backwards only); fp16 gradients of parameters outside the placed models (an
error names them: train in bf16).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from posttrain.errors import ConfigError
from posttrain.trainers.device_config import DEVICE_HELP, DTYPE_NAMES, check_device, check_device_spec, resolve_device  # noqa: F401  (re-exported)
from posttrain.trainers.engine.throughput import flop_shape, flops_per_token, matmul_params, peak_flops, peak_memory

DTYPES = dict(zip(DTYPE_NAMES, (torch.float32, torch.bfloat16, torch.float16)))


# ---------------------------------------------------------------------------------------------
# which device (check_device_spec, resolve_device: trainers/device_config.py, imported above)


def available_devices() -> list[str]:
    """The devices tests can run on here: ``["cpu"]``, plus ``"cuda"`` when a GPU is visible."""
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


FP16_UNSUPPORTED = ("rm", "ppo")
"""Trainers whose loss reaches parameters outside the placed model's output (a reward head fed by a backbone called
directly, a critic's shared head): the fp16 loss scale at the output would miss them. They train in bf16."""


def check_precision(trainer: str, dtype: str) -> None:
    """A ConfigError for ``--dtype fp16`` with a trainer of :data:`FP16_UNSUPPORTED`."""
    if dtype == "fp16" and trainer in FP16_UNSUPPORTED:
        raise ConfigError(f"--dtype fp16 is not supported by `posttrain {trainer}` (use --dtype bf16)")


# ---------------------------------------------------------------------------------------------
# the run's device: precision, loss scale, counters


@dataclass
class LossScale:
    """fp16's dynamic loss scale, on ``torch.amp.GradScaler``'s schedule: start at 2**16, halve on an overflow (that
    step is dropped), double after ``growth_interval`` steps without one. An update decided after a step is applied
    before the next scaled forward, so every backward pass of one optimizer step sees the same scale."""

    scale: float = 2.0**16
    growth_interval: int = 2000
    clean: int = 0
    pending: bool | None = None  # an unscale happened: True = it overflowed, False = it did not
    overflows: int = 0

    def for_forward(self) -> float:
        if self.pending is not None:
            if self.pending:
                self.scale, self.clean = self.scale / 2, 0
            else:
                self.clean += 1
                if self.clean >= self.growth_interval:
                    self.scale, self.clean = self.scale * 2, 0
            self.pending = None
        return self.scale


@dataclass
class RunDevice:
    """One run's device and precision, and its counters since the last :meth:`step_metrics`."""

    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    dtype: str = "fp32"
    grad_checkpointing: bool = False
    compile: bool = False
    loss_scale: LossScale | None = None
    scaled: set = field(default_factory=set)  # ids of parameters under the fp16 loss scale
    tokens: int = 0
    flops: float = 0.0
    rollout_tokens: int = 0
    rollout_seconds: float = 0.0
    totals: dict = field(default_factory=lambda: {"tokens": 0, "flops": 0.0, "seconds": 0.0, "rollout": [0, 0.0]})

    def __post_init__(self):
        self.device = torch.device(self.device)
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype={self.dtype!r} is not valid; choose one of: {', '.join(DTYPES)}")
        if self.dtype == "fp16" and self.loss_scale is None:
            self.loss_scale = LossScale()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    @property
    def compute_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def plain(self) -> bool:
        """The CPU in fp32 without checkpointing or compile: nothing to change (the bitwise path)."""
        return self.device.type == "cpu" and self.dtype == "fp32" and not self.grad_checkpointing and not self.compile

    def autocast(self):
        """The compute context: ``torch.autocast`` in the compute dtype, or nothing for fp32."""
        if self.dtype == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    def count(self, input_ids: torch.Tensor, n_params: int, shape: tuple[int, int, int]) -> None:
        B, T = input_ids.shape[0], input_ids.shape[-1]
        self.tokens += B * T
        self.flops += B * T * flops_per_token(n_params, *shape, T)

    def count_rollout(self, tokens: int, seconds: float) -> None:
        self.rollout_tokens += int(tokens)
        self.rollout_seconds += seconds

    def step_metrics(self, seconds: float) -> dict:
        """The counters of one step that took ``seconds`` as metrics, then reset: ``train_tokens_per_s`` (positions
        through the trained models' forwards with gradients), ``mfu`` (left out where the peak is unknown: the CPU),
        ``rollout_tokens_per_s`` (when the step sampled), ``loss_scale`` (fp16)."""
        tot = self.totals
        tot["tokens"] += self.tokens
        tot["flops"] += self.flops
        tot["seconds"] += seconds
        out = {}
        if self.tokens:
            out["train_tokens_per_s"] = self.tokens / max(seconds, 1e-9)
            mfu = self._mfu(self.flops, seconds)
            if mfu is not None:  # None on the CPU and on a GPU the peak table does not list
                out["mfu"] = mfu
        if self.rollout_tokens:
            out["rollout_tokens_per_s"] = self.rollout_tokens / max(self.rollout_seconds, 1e-9)
            tot["rollout"][0] += self.rollout_tokens
            tot["rollout"][1] += self.rollout_seconds
        if self.loss_scale is not None:
            out["loss_scale"] = self.loss_scale.scale
        self.tokens, self.flops, self.rollout_tokens, self.rollout_seconds = 0, 0.0, 0, 0.0
        return out

    def _mfu(self, flops: float, seconds: float) -> float | None:
        peak = peak_flops(self.device, self.dtype)
        return None if peak is None or seconds <= 0 else flops / seconds / peak

    def summary(self) -> dict:
        """What ``summary.json`` keeps: the device, dtype, tokens/s and MFU over all steps, peak memory."""
        tot, (mem, kind) = self.totals, peak_memory(self.device)
        out = {"device": str(self.device), "dtype": self.dtype}
        if tot["tokens"]:
            out["train_tokens_per_s"] = tot["tokens"] / max(tot["seconds"], 1e-9)
            out["mfu"] = self._mfu(tot["flops"], tot["seconds"])
        if tot["rollout"][0]:
            out["rollout_tokens_per_s"] = tot["rollout"][0] / max(tot["rollout"][1], 1e-9)
        out["peak_memory_gb"] = None if mem is None else mem / 2**30
        out["peak_memory_kind"] = kind
        if self.loss_scale is not None:
            out["fp16_overflow_steps"] = self.loss_scale.overflows
        return out


_ACTIVE: RunDevice | None = None


def activate(rd: RunDevice | None) -> RunDevice | None:
    """Make ``rd`` the device of the training run in this process (None: no run); returns it."""
    global _ACTIVE
    _ACTIVE = rd
    return rd


def active() -> RunDevice | None:
    """The device of the training run in this process, or None outside one."""
    return _ACTIVE


@contextlib.contextmanager
def rollout_timer(count_tokens):
    """Time a sampling call for ``rollout_tokens_per_s``: ``with rollout_timer(lambda: n_tokens): ...``."""
    import time

    t0 = time.perf_counter()
    yield
    if _ACTIVE is not None:
        _ACTIVE.count_rollout(count_tokens(), time.perf_counter() - t0)


# ---------------------------------------------------------------------------------------------
# placing models


def _placed_class(cls: type) -> type:
    """A subclass of ``cls`` (same name, so ``save_pretrained`` records the same architecture) whose forward runs
    under the run's autocast, counts its training tokens and scales fp16 gradients at the output."""
    if getattr(cls, "_posttrain_placed", False):
        return cls

    def forward(self, *args, **kwargs):
        rd: RunDevice = self.__dict__["_posttrain_device"]
        if rd.device.type != "cpu":  # a batch built on the CPU: its tensors go where the model is
            args, kwargs = _to(args, rd.device), _to(kwargs, rd.device)
        training = self.training and torch.is_grad_enabled()
        scaled = training and rd.loss_scale is not None and self.__dict__.get("_posttrain_scale_out", False)
        scale = rd.loss_scale.for_forward() if scaled else None
        if training and self.__dict__.get("_posttrain_counted", False):
            ids = kwargs.get("input_ids", args[0] if args else None)
            if isinstance(ids, torch.Tensor) and not ids.is_floating_point():  # token ids (a head's input is not)
                n_params, *shape = self.__dict__["_posttrain_flop_shape"]
                rd.count(ids, n_params, tuple(shape))
        with rd.autocast():
            out = cls.forward(self, *args, **kwargs)
        return _scale_outputs(out, scale) if scale is not None else out

    body = {"forward": forward, "_posttrain_placed": True, "__module__": cls.__module__}
    if hasattr(cls, "make_cache"):  # the sampler's KV cache (generate.py): on the device, in the compute dtype

        def make_cache(self, *args, **kwargs):
            with self.__dict__["_posttrain_device"].autocast():
                return cls.make_cache(self, *args, **kwargs)

        body["make_cache"] = make_cache
    return type(cls.__name__, (cls,), body)


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient times ``scale`` backward (fp16 loss scaling at a model's output)."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.scale, None


def _scale_outputs(out, scale: float):
    if isinstance(out, torch.Tensor):
        return _ScaleGrad.apply(out, scale) if out.is_floating_point() and out.requires_grad else out
    if isinstance(out, (tuple, list)):
        return type(out)(_scale_outputs(o, scale) for o in out)
    if isinstance(out, dict):  # a Hugging Face ModelOutput (its items are its attributes)
        for k in list(out.keys()):
            out[k] = _scale_outputs(out[k], scale)
        return out
    if hasattr(out, "__dataclass_fields__"):  # posttrain's LMOutput and head outputs
        for k in out.__dataclass_fields__:
            setattr(out, k, _scale_outputs(getattr(out, k), scale))
    return out


def enable_grad_checkpointing(model: nn.Module) -> None:
    """Per-block activation checkpointing: posttrain's GPT and Hugging Face models through their own
    ``gradient_checkpointing_enable()`` (the outermost such module of each branch)."""
    done = False
    for m in model.modules():
        if hasattr(m, "gradient_checkpointing_enable") and not getattr(m, "_posttrain_ckpt", False):
            if hasattr(m, "activation_checkpointing_enable"):  # transformers >= 5's name (the old one warns)
                m.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:  # posttrain's GPT, older transformers
                m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            for sub in m.modules():
                sub._posttrain_ckpt = True
            done = True
    if not done:
        raise ConfigError(f"--grad-checkpointing: {type(model).__name__} has no transformer blocks to checkpoint")


def transformer_roots(model: nn.Module) -> list[nn.Module]:
    """The outermost transformers inside ``model`` (posttrain's GPT, a Hugging Face model): ``model`` itself for a
    policy, the backbone's model for a reward or value model. Their forwards are the ones every path calls (a
    trainer may call a wrapper's backbone directly), so that is where autocast and the token count sit."""
    roots: list[str] = []
    out = []
    for name, m in model.named_modules():
        if any(name == r or name.startswith(r + ".") for r in roots if r) or ("" in roots):
            continue
        if _is_transformer(m):
            roots.append(name)
            out.append(m)
    return out


def _is_transformer(m: nn.Module) -> bool:
    c = getattr(m, "config", None)
    return c is not None and (hasattr(c, "n_layer") or hasattr(c, "num_hidden_layers"))


def _swap(m: nn.Module, rd: RunDevice, counted: bool, scale_out: bool, shape_of: nn.Module | None = None) -> None:
    """``m``'s class becomes its placed twin (:func:`_placed_class`), reading these settings from ``m``; a counted
    module's FLOPs per token are those of ``shape_of`` (default ``m``; a model with no transformer config: 6N)."""
    m.__class__ = _placed_class(type(m))
    m.__dict__["_posttrain_device"] = rd
    m.__dict__["_posttrain_counted"] = counted
    m.__dict__["_posttrain_scale_out"] = scale_out
    if counted:
        src = shape_of if shape_of is not None else m
        m.__dict__["_posttrain_flop_shape"] = (matmul_params(src), *_shape_or_zero(src))


def place(model: nn.Module, rd: RunDevice) -> nn.Module:
    """The trained model on ``rd``'s device in fp32, with gradient checkpointing and ``torch.compile`` when asked.
    ``model`` and each of its :func:`transformer_roots` run their forwards under autocast; the roots (or ``model``,
    when it has none) count their training forwards (tokens, FLOPs); ``model``'s outputs carry the fp16 loss scale.
    On the CPU in fp32 every number is bitwise what the unplaced model computes."""
    if rd.grad_checkpointing:
        enable_grad_checkpointing(model)
    model.to(rd.device)
    roots = transformer_roots(model)
    for r in roots:  # a Hugging Face model's base model is counted: a reward backbone calls it directly
        inner = getattr(r, "base_model", r)
        _swap(r, rd, counted=inner is r, scale_out=r is model)
        if inner is not r:
            _swap(inner, rd, counted=True, scale_out=False, shape_of=r)
    if not any(r is model for r in roots):
        _swap(model, rd, counted=not roots, scale_out=True)
    mark_scaled(model, rd)
    if rd.compile:
        _compile(model)
    return model


def mark_scaled(model: nn.Module, rd: RunDevice | None = None) -> None:
    """fp16: ``model``'s parameters are under the loss scale at its output (:func:`unscale_grads` unscales them);
    called again once FSDP has replaced them by their shards. Nothing to do without a loss scale."""
    rd = rd if rd is not None else _ACTIVE
    if rd is not None and rd.loss_scale is not None:
        rd.scaled |= {id(p) for p in model.parameters()}


def _shape_or_zero(model: nn.Module) -> tuple[int, int, int]:
    try:
        return flop_shape(model)
    except TypeError:
        return 0, 0, 0  # not a transformer: 6N only


def _compile(model: nn.Module) -> None:
    """``torch.compile`` each transformer block (the top-level forward, the cache and the counting stay eager),
    or the whole model when it has no ``blocks``."""
    blocks = [m for m in model.modules() if isinstance(getattr(m, "blocks", None), nn.ModuleList)]
    if blocks:
        for b in blocks[0].blocks:
            b.compile()
    else:
        model.compile()


def place_frozen(model: nn.Module, rd: RunDevice) -> nn.Module:
    """A frozen model (reference, reward model) on ``rd``'s device with its weights in the compute dtype and its
    forwards (and its transformers') under autocast; nothing counted. On the CPU in fp32, untouched."""
    if rd.device.type == "cpu" and rd.dtype == "fp32":
        return model
    model.to(device=rd.device, dtype=rd.compute_dtype)
    roots = transformer_roots(model)
    for m in {id(m): m for m in [model, *roots, *(getattr(r, "base_model", r) for r in roots)]}.values():
        _swap(m, rd, counted=False, scale_out=False)
    return model


def to_device(obj, dev: torch.device | None = None):
    """``obj`` (a tensor, or tuples, lists, dicts and dataclasses holding tensors) with its tensors on ``dev`` (default:
    the active run's device); anything else as it is. On the CPU (or outside a run) ``obj`` itself: nothing moves.
    The engine moves a trainer's inputs once; a placed model moves the tensors it is called with."""
    dev = dev if dev is not None else (_ACTIVE.device if _ACTIVE is not None else None)
    if dev is None or dev.type == "cpu":
        return obj
    return _to(obj, dev)


def _to(obj, dev: torch.device):
    if isinstance(obj, torch.Tensor):
        return obj if obj.device == dev else obj.to(dev, non_blocking=True)
    if isinstance(obj, dict):
        return {k: _to(v, dev) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        moved = [_to(v, dev) for v in obj]
        return obj if all(a is b for a, b in zip(moved, obj)) else type(obj)(moved)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: _to(getattr(obj, f.name), dev) for f in dataclasses.fields(obj) if f.init}
        changed = {k: v for k, v in changes.items() if v is not getattr(obj, k)}
        return dataclasses.replace(obj, **changed) if changed else obj
    return obj


def portable(obj):
    """``obj`` (a state dict, an optimizer state, nested dicts and lists) with every tensor on the CPU and every
    floating one in fp32: what checkpoints hold, loadable on any machine. CPU fp32 tensors are returned as they are."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", torch.float32) if obj.is_floating_point() else obj.detach().to("cpu")
    if isinstance(obj, dict):
        return {k: portable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(portable(v) for v in obj)
    return obj


def unscale_grads(params: list[torch.nn.Parameter]) -> bool:
    """fp16: divide the gradients by the loss scale (before clipping); returns False when the run has no loss
    scale. A gradient of a parameter outside the placed models was never scaled: a ConfigError names it."""
    rd = _ACTIVE
    if rd is None or rd.loss_scale is None:
        return False
    grads = [p.grad for p in params if p.grad is not None]
    if any(id(p) not in rd.scaled for p in params if p.grad is not None):
        raise ConfigError("--dtype fp16: this trainer updates parameters outside its placed models; use --dtype bf16")
    if grads:
        torch._foreach_mul_(grads, 1.0 / rd.loss_scale.scale)
    return True


def after_clip(params: list[torch.nn.Parameter], norm: float) -> float:
    """fp16: a non-finite gradient norm is an overflow, not a divergence: drop the gradients (the optimizer skips
    parameters without one: weights and moments stay), halve the scale, report the norm as 0. Else ``norm``."""
    rd = _ACTIVE
    if rd is None or rd.loss_scale is None:
        return norm
    ok = math.isfinite(norm)
    rd.loss_scale.pending = not ok
    if ok:
        return norm
    rd.loss_scale.overflows += 1
    for p in params:
        p.grad = None
    return 0.0
